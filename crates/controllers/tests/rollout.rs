//! Rollouts end to end with the real kubectl 1.33: the API server and every controller run
//! in-process, pods get their status set by a kwok-style loop (Running and Ready as soon as
//! they exist; a pod being deleted is removed at once, as a kubelet would after stopping it).
//! kubectl's own rollout commands are the judges: `get rs`, `set image`, `rollout status`,
//! `rollout history`, `rollout undo`, `rollout pause`/`resume`, and the cascade of a delete.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use svcnet_controllers::{ControllerOptions, run};

mod common;

const KUBECTL: &str = "/usr/lib/google-cloud-sdk/bin/kubectl.1.33";

struct Cluster {
    server: Option<svcnet_apiserver::RunningServer>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    kubeconfig: PathBuf,
    dir: tempfile::TempDir,
}

impl Cluster {
    async fn start() -> Result<Self> {
        let common::TestServer {
            client,
            server,
            kubeconfig,
            dir,
        } = common::start_server().await?;
        Api::<Node>::all(client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "kwok-node"}}))?,
            )
            .await?;
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let opts = ControllerOptions {
            node_name: "kwok-node".into(),
            ..Default::default()
        };
        let c = client.clone();
        let controllers = tokio::spawn(async move {
            if let Err(e) = run(c, opts, async {
                let _ = rx.await;
            })
            .await
            {
                panic!("controllers failed: {e}");
            }
        });
        let kwok = tokio::spawn(kwok(client));
        Ok(Self {
            server: Some(server),
            stop: Some(stop),
            tasks: vec![controllers, kwok],
            kubeconfig,
            dir,
        })
    }

    async fn stop(mut self) -> Result<()> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let mut tasks = std::mem::take(&mut self.tasks);
        if let Some(kwok) = tasks.pop() {
            kwok.abort();
        }
        for t in tasks {
            t.await?;
        }
        if let Some(s) = self.server.take() {
            s.shutdown().await?;
        }
        Ok(())
    }
}

/// Plays every node's kubelet: bound pods become Running and Ready with an IP, pods being
/// deleted are removed.
async fn kwok(client: kube::Client) {
    let pods: Api<Pod> = Api::all(client.clone());
    let mut ip = 10u32;
    loop {
        if let Ok(list) = pods.list(&ListParams::default()).await {
            for p in list.items {
                let ns = p.metadata.namespace.clone().unwrap_or_default();
                let name = p.metadata.name.clone().unwrap_or_default();
                let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
                if p.metadata.deletion_timestamp.is_some() {
                    let _ = api
                        .delete(
                            &name,
                            &DeleteParams {
                                grace_period_seconds: Some(0),
                                ..Default::default()
                            },
                        )
                        .await;
                    continue;
                }
                let bound = p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some();
                let ready = p
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                if bound && !ready {
                    ip += 1;
                    let addr = format!("10.244.{}.{}", ip / 250, ip % 250 + 2);
                    let status = json!({"status": {
                        "phase": "Running", "podIP": addr, "podIPs": [{"ip": addr}],
                        "conditions": [{"type": "Ready", "status": "True",
                                        "lastTransitionTime": "2026-01-01T00:00:00Z"}]
                    }});
                    let _ = api
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                        .await;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

struct Kubectl<'a> {
    kubeconfig: &'a Path,
}

impl Kubectl<'_> {
    fn run(&self, args: &[&str]) -> (bool, String, String) {
        let out = Command::new(KUBECTL)
            .args(args)
            .env("KUBECONFIG", self.kubeconfig)
            .env("HOME", self.kubeconfig.parent().unwrap())
            .output()
            .expect("kubectl runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.run(args);
        assert!(ok, "kubectl {args:?} failed:\n{out}\n{err}");
        out
    }

    fn fails(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.run(args);
        assert!(!ok, "kubectl {args:?} should fail:\n{out}");
        err
    }

    /// Reruns `args` until `check` accepts the output, failing after 30 s with the last one.
    fn until(&self, args: &[&str], check: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (_, out, err) = self.run(args);
            if check(&out) {
                return out;
            }
            if Instant::now() > deadline {
                panic!("kubectl {args:?} never satisfied the check; last:\n{out}\n{err}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `kubectl get rs -l app=<app>` as (name, desired, current, ready) rows.
    fn replicasets(&self, app: &str) -> Vec<(String, String, String, String)> {
        let out = self.ok(&["get", "rs", "-l", &format!("app={app}"), "--no-headers"]);
        out.lines()
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let s = |i: usize| f.get(i).copied().unwrap_or("").to_string();
                (s(0), s(1), s(2), s(3))
            })
            .collect()
    }

    fn revision_of(&self, rs: &str) -> String {
        self.ok(&[
            "get",
            "rs",
            rs,
            "-o",
            "jsonpath={.metadata.annotations.deployment\\.kubernetes\\.io/revision}",
        ])
    }
}

fn rs_row(name: &str, n: u32) -> (String, String, String, String) {
    (
        name.to_string(),
        n.to_string(),
        n.to_string(),
        n.to_string(),
    )
}

const DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: myapp
spec:
  replicas: 3
  selector:
    matchLabels: {app: myapp}
  template:
    metadata:
      labels: {app: myapp}
    spec:
      containers:
      - name: c
        image: nginx:1
"#;

async fn with_cluster(f: impl FnOnce(&Kubectl<'_>, &Path) + Send + 'static) -> Result<()> {
    if !Path::new(KUBECTL).exists() {
        bail!("{KUBECTL} is missing: the end-to-end test needs kubectl 1.33");
    }
    let c = Cluster::start().await?;
    let kubeconfig = c.kubeconfig.clone();
    let dir = c.dir.path().to_path_buf();
    let result = tokio::task::spawn_blocking(move || {
        f(
            &Kubectl {
                kubeconfig: &kubeconfig,
            },
            &dir,
        )
    })
    .await;
    c.stop().await?;
    result?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_rollout_history_undo_pause_resume() -> Result<()> {
    with_cluster(|k, dir| {
        let manifest = dir.join("deploy.yaml");
        std::fs::write(&manifest, DEPLOYMENT).unwrap();
        k.ok(&["apply", "-f", &manifest.to_string_lossy()]);
        let out = k.ok(&["rollout", "status", "deployment/myapp", "--timeout=60s"]);
        assert!(
            out.contains("deployment \"myapp\" successfully rolled out"),
            "{out}"
        );

        // One ReplicaSet, named after the template hash, with 3 ready pods.
        let rs = k.replicasets("myapp");
        assert_eq!(rs.len(), 1, "{rs:?}");
        let first = rs[0].0.clone();
        assert_eq!(rs[0], rs_row(&first, 3));
        let hash = first.strip_prefix("myapp-").unwrap().to_string();
        let header = k.ok(&["get", "rs"]);
        assert!(
            header
                .lines()
                .next()
                .unwrap()
                .split_whitespace()
                .collect::<Vec<_>>()
                == ["NAME", "DESIRED", "CURRENT", "READY", "AGE"],
            "{header}"
        );
        let pods = k.ok(&["get", "pods", "-l", "app=myapp", "-o", "name"]);
        assert_eq!(pods.lines().count(), 3, "{pods}");
        for p in pods.lines() {
            let rest = p
                .strip_prefix(&format!("pod/{first}-"))
                .unwrap_or_else(|| panic!("{p}"));
            assert_eq!(rest.len(), 5, "{p}");
        }
        let labels = k.ok(&[
            "get",
            "pods",
            "-l",
            &format!("pod-template-hash={hash}"),
            "-o",
            "name",
        ]);
        assert_eq!(labels.lines().count(), 3, "{labels}");
        let cond = k.ok(&[
            "get",
            "deployment",
            "myapp",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Progressing\")].message}",
        ]);
        assert_eq!(
            cond,
            format!("ReplicaSet \"{first}\" has successfully progressed.")
        );

        // A new image: a second ReplicaSet takes over, the first is scaled to 0.
        let out = k.ok(&["set", "image", "deployment/myapp", "c=nginx:2"]);
        assert!(out.contains("image updated"), "{out}");
        let out = k.ok(&["rollout", "status", "deployment/myapp", "--timeout=60s"]);
        assert!(out.contains("successfully rolled out"), "{out}");
        let rs = k.until(&["get", "rs", "-l", "app=myapp", "--no-headers"], |o| {
            o.lines().count() == 2
        });
        let rs_rows = k.replicasets("myapp");
        let second = rs_rows.iter().find(|r| r.0 != first).unwrap().0.clone();
        assert!(rs_rows.contains(&rs_row(&first, 0)), "{rs}");
        assert!(rs_rows.contains(&rs_row(&second, 3)), "{rs}");
        assert_eq!(k.revision_of(&first), "1");
        assert_eq!(k.revision_of(&second), "2");

        let history = k.ok(&["rollout", "history", "deployment/myapp"]);
        let revisions: Vec<&str> = history
            .lines()
            .skip_while(|l| !l.starts_with("REVISION"))
            .skip(1)
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert_eq!(revisions, ["1", "2"], "{history}");
        let rev2 = k.ok(&["rollout", "history", "deployment/myapp", "--revision=2"]);
        assert!(rev2.contains("nginx:2"), "{rev2}");
        // The change cause goes from the Deployment to its current ReplicaSet's history entry.
        k.ok(&[
            "annotate",
            "deployment/myapp",
            "kubernetes.io/change-cause=image nginx:2",
        ]);
        k.until(&["rollout", "history", "deployment/myapp"], |o| {
            o.lines()
                .any(|l| l.starts_with('2') && l.contains("image nginx:2"))
        });
        let describe = k.ok(&["describe", "deployment", "myapp"]);
        assert!(
            describe.contains(&format!("NewReplicaSet:   {second} (3/3 replicas created)")),
            "{describe}"
        );

        // Undo: back to the first template, which reuses the first ReplicaSet as revision 3.
        let out = k.ok(&["rollout", "undo", "deployment/myapp"]);
        assert!(out.contains("rolled back"), "{out}");
        let out = k.ok(&["rollout", "status", "deployment/myapp", "--timeout=60s"]);
        assert!(out.contains("successfully rolled out"), "{out}");
        k.until(&["get", "rs", "-l", "app=myapp", "--no-headers"], |_| {
            let rows = k.replicasets("myapp");
            rows.len() == 2
                && rows.contains(&rs_row(&first, 3))
                && rows.contains(&rs_row(&second, 0))
        });
        assert_eq!(k.revision_of(&first), "3");
        let history = k.ok(&["rollout", "history", "deployment/myapp"]);
        let revisions: Vec<&str> = history
            .lines()
            .skip_while(|l| !l.starts_with("REVISION"))
            .skip(1)
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert_eq!(revisions, ["2", "3"], "{history}");
        let image = k.ok(&[
            "get",
            "deployment",
            "myapp",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        ]);
        assert_eq!(image, "nginx:1");

        // Paused: a template change makes no ReplicaSet; undo is refused; resume rolls it out.
        let out = k.ok(&["rollout", "pause", "deployment/myapp"]);
        assert!(out.contains("paused"), "{out}");
        k.ok(&["set", "image", "deployment/myapp", "c=nginx:3"]);
        std::thread::sleep(Duration::from_secs(1));
        assert_eq!(
            k.replicasets("myapp").len(),
            2,
            "no new ReplicaSet while paused"
        );
        let err = k.fails(&["rollout", "undo", "deployment/myapp"]);
        assert!(err.contains("paused"), "{err}");
        let out = k.ok(&["rollout", "resume", "deployment/myapp"]);
        assert!(out.contains("resumed"), "{out}");
        let out = k.ok(&["rollout", "status", "deployment/myapp", "--timeout=60s"]);
        assert!(out.contains("successfully rolled out"), "{out}");
        let rows = k.until(&["get", "rs", "-l", "app=myapp", "--no-headers"], |o| {
            o.lines().count() == 3
        });
        let third = k
            .replicasets("myapp")
            .into_iter()
            .find(|r| r.0 != first && r.0 != second)
            .unwrap();
        assert_eq!(third.1, "3", "{rows}");
        assert_eq!(k.revision_of(&third.0), "4");

        // Scaling keeps the ReplicaSet and resizes it.
        k.ok(&["scale", "deployment/myapp", "--replicas=5"]);
        k.until(&["get", "rs", &third.0, "--no-headers"], |o| {
            o.split_whitespace().take(4).collect::<Vec<_>>() == [third.0.as_str(), "5", "5", "5"]
        });

        // Deleting the Deployment takes its ReplicaSets and their pods with it.
        k.ok(&["delete", "deployment", "myapp"]);
        k.until(
            &["get", "rs,pods", "-l", "app=myapp", "--no-headers"],
            |o| o.trim().is_empty(),
        );
    })
    .await
}

const STATEFULSET: &str = r#"
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: web
spec:
  replicas: 2
  serviceName: nginx
  selector:
    matchLabels: {app: nginx}
  template:
    metadata:
      labels: {app: nginx}
    spec:
      containers:
      - name: c
        image: nginx:1
"#;

/// What kubectl prints once a StatefulSet's pods are all at the update revision (the API
/// server defaults `rollingUpdate.partition` to 0, as upstream, so kubectl takes its
/// partitioned path).
const STS_DONE: &str = "partitioned roll out complete: 2 new pods have been updated";

fn history_revisions(out: &str) -> Vec<String> {
    out.lines()
        .skip_while(|l| !l.starts_with("REVISION"))
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statefulset_history_through_controller_revisions() -> Result<()> {
    with_cluster(|k, dir| {
        let manifest = dir.join("sts.yaml");
        std::fs::write(&manifest, STATEFULSET).unwrap();
        k.ok(&["apply", "-f", &manifest.to_string_lossy()]);
        let out = k.ok(&["rollout", "status", "statefulset/web", "--timeout=60s"]);
        assert!(out.contains(STS_DONE), "{out}");

        // One ControllerRevision, controlled by the StatefulSet, named in its status and on
        // its pods.
        let crs = k.ok(&["get", "controllerrevisions", "--no-headers"]);
        let rows: Vec<Vec<&str>> = crs
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(rows.len(), 1, "{crs}");
        assert_eq!(&rows[0][1..3], ["statefulset.apps/web", "1"], "{crs}");
        let first = rows[0][0].to_string();
        assert!(first.starts_with("web-"), "{first}");
        let status = k.ok(&[
            "get",
            "sts",
            "web",
            "-o",
            "jsonpath={.status.currentRevision} {.status.updateRevision}",
        ]);
        assert_eq!(status, format!("{first} {first}"));
        let labelled = k.ok(&[
            "get",
            "pods",
            "-l",
            &format!("controller-revision-hash={first}"),
            "-o",
            "name",
        ]);
        assert_eq!(labelled.lines().count(), 2, "{labelled}");

        // A new image: revision 2, rolled out to both pods.
        k.ok(&["set", "image", "statefulset/web", "c=nginx:2"]);
        let out = k.ok(&["rollout", "status", "statefulset/web", "--timeout=60s"]);
        assert!(out.contains(STS_DONE), "{out}");
        let history = k.ok(&["rollout", "history", "statefulset/web"]);
        assert_eq!(history_revisions(&history), ["1", "2"], "{history}");
        let rev2 = k.ok(&["rollout", "history", "statefulset/web", "--revision=2"]);
        assert!(rev2.contains("nginx:2"), "{rev2}");
        let second = k.ok(&[
            "get",
            "sts",
            "web",
            "-o",
            "jsonpath={.status.updateRevision}",
        ]);
        assert_ne!(second, first);

        // Undo: the first revision's template comes back, renumbered 3.
        let out = k.ok(&["rollout", "undo", "statefulset/web"]);
        assert!(out.contains("rolled back"), "{out}");
        let out = k.ok(&["rollout", "status", "statefulset/web", "--timeout=60s"]);
        assert!(out.contains(STS_DONE), "{out}");
        let history = k.until(&["rollout", "history", "statefulset/web"], |o| {
            history_revisions(o) == ["2", "3"]
        });
        let _ = history;
        let image = k.ok(&[
            "get",
            "sts",
            "web",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        ]);
        assert_eq!(image, "nginx:1");
        let update = k.ok(&[
            "get",
            "sts",
            "web",
            "-o",
            "jsonpath={.status.updateRevision}",
        ]);
        assert_eq!(update, first, "the first revision is reused");

        // Deleting the StatefulSet takes its history and pods with it.
        k.ok(&["delete", "statefulset", "web"]);
        k.until(&["get", "controllerrevisions,pods", "--no-headers"], |o| {
            o.trim().is_empty()
        });
    })
    .await
}

//! Pods as upstream serves them: graceful deletion confirmed by the node agent (kube-rs and
//! the real kubectl 1.33), through namespace deletion and garbage collection too.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{
    Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent, WatchParams,
};
use serde_json::json;

const KUBECTL: &str = "/usr/lib/google-cloud-sdk/bin/kubectl.1.33";

fn pod(name: &str, node: &str, extra: serde_json::Value) -> Pod {
    let mut v = json!({"metadata": {"name": name},
                       "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}});
    if let (Some(m), Some(e)) = (v["spec"].as_object_mut(), extra.as_object()) {
        m.extend(e.clone());
    }
    serde_json::from_value(v).unwrap()
}

fn grace(g: i64, uid: Option<&str>) -> DeleteParams {
    DeleteParams {
        grace_period_seconds: Some(g as u32),
        preconditions: uid.map(|u| Preconditions {
            uid: Some(u.into()),
            resource_version: None,
        }),
        ..Default::default()
    }
}

fn deleting(p: &Pod) -> (bool, Option<i64>) {
    (
        p.metadata.deletion_timestamp.is_some(),
        p.metadata.deletion_grace_period_seconds,
    )
}

async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn bound_pods_terminate_until_the_agent_confirms() {
    let ts = common::TestServer::start().await;
    let pods: Api<Pod> = Api::namespaced(ts.client().await, "default");
    let pp = PostParams::default();
    let created = pods
        .create(
            &pp,
            &pod(
                "web",
                "node-a",
                json!({"terminationGracePeriodSeconds": 20}),
            ),
        )
        .await
        .unwrap();
    let uid = created.metadata.uid.clone().unwrap();
    let rv = created.metadata.resource_version.clone().unwrap();
    let wp = WatchParams::default().fields("metadata.name=web");
    let mut events = pods.watch(&wp, &rv).await.unwrap().boxed();

    // The first DELETE marks the pod and keeps it: 200 with the object, a MODIFIED event.
    let marked = pods
        .delete("web", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .expect("the object, not a Status");
    assert_eq!(deleting(&marked), (true, Some(20)));
    let ev = tokio::time::timeout(Duration::from_secs(10), events.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    match ev {
        WatchEvent::Modified(p) => assert_eq!(deleting(&p), (true, Some(20))),
        other => panic!("expected MODIFIED, got {other:?}"),
    }
    let deadline = |p: &Pod| p.metadata.deletion_timestamp.clone().unwrap().0;
    let first_deadline = deadline(&marked);

    // A longer grace does not extend it; a shorter one shortens it (and the deadline).
    let same = pods.delete("web", &grace(60, None)).await.unwrap();
    assert_eq!(deleting(&same.left().unwrap()), (true, Some(20)));
    let shorter = pods
        .delete("web", &grace(5, None))
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(deleting(&shorter), (true, Some(5)));
    assert!(deadline(&shorter) < first_deadline);

    // The agent's status updates on a terminating pod do not delete it.
    pods.patch_status(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running"}})),
    )
    .await
    .unwrap();
    assert!(pods.get_opt("web").await.unwrap().is_some());

    // The agent confirms with grace 0 and a uid precondition; a stale uid is a 409.
    let err = pods
        .delete("web", &grace(0, Some("not-the-uid")))
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(s) => assert_eq!((s.code, s.reason.as_str()), (409, "Conflict")),
        other => panic!("{other:?}"),
    }
    pods.delete("web", &grace(0, Some(&uid))).await.unwrap();
    assert!(pods.get_opt("web").await.unwrap().is_none());
    let mut saw_deleted = false;
    while let Ok(Some(Ok(ev))) = tokio::time::timeout(Duration::from_secs(5), events.next()).await {
        if let WatchEvent::Deleted(p) = ev {
            assert_eq!(p.metadata.uid.as_deref(), Some(uid.as_str()));
            saw_deleted = true;
            break;
        }
    }
    assert!(saw_deleted, "the watch saw the pod go");

    // Unbound and terminal pods go at once.
    pods.create(&pp, &pod("unbound", "", json!({})))
        .await
        .unwrap();
    pods.delete("unbound", &DeleteParams::default())
        .await
        .unwrap();
    assert!(pods.get_opt("unbound").await.unwrap().is_none());
    pods.create(&pp, &pod("done", "node-a", json!({})))
        .await
        .unwrap();
    pods.patch_status(
        "done",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
    )
    .await
    .unwrap();
    pods.delete("done", &DeleteParams::default()).await.unwrap();
    assert!(pods.get_opt("done").await.unwrap().is_none());

    // A finalizer holds a confirmed pod until it is removed.
    let mut held = pod("held", "node-a", json!({}));
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    pods.create(&pp, &held).await.unwrap();
    pods.delete("held", &DeleteParams::default()).await.unwrap();
    pods.delete("held", &grace(0, None)).await.unwrap();
    let p = pods.get("held").await.unwrap();
    assert_eq!(deleting(&p), (true, Some(0)));
    pods.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(pods.get_opt("held").await.unwrap().is_none());
    ts.stop().await;
}

#[tokio::test]
async fn namespace_deletion_and_gc_use_graceful_deletion() {
    let ts = common::TestServer::start().await;
    let client = ts.client().await;
    let pp = PostParams::default();
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &pp,
        &serde_json::from_value(json!({"metadata": {"name": "work"}})).unwrap(),
    )
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "work");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "work");
    let p = pods
        .create(&pp, &pod("runner", "node-a", json!({})))
        .await
        .unwrap();
    cms.create(
        &pp,
        &serde_json::from_value(json!({"metadata": {"name": "cfg"}})).unwrap(),
    )
    .await
    .unwrap();
    nss.delete("work", &DeleteParams::default()).await.unwrap();
    eventually("the config map goes and the pod terminates", || async {
        let cm_gone = cms.get_opt("cfg").await.unwrap().is_none();
        let pod = pods.get_opt("runner").await.unwrap();
        cm_gone && pod.is_some_and(|p| deleting(&p) == (true, Some(30)))
    })
    .await;
    assert!(
        nss.get_opt("work").await.unwrap().is_some(),
        "the namespace waits for its terminating pod"
    );
    pods.delete("runner", &grace(0, p.metadata.uid.as_deref()))
        .await
        .unwrap();
    eventually("the namespace goes once the pod is confirmed", || async {
        nss.get_opt("work").await.unwrap().is_none()
    })
    .await;

    // A pod whose owner is gone terminates (a scale-down leaves it to the agent).
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let owner = cms
        .create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": "owner"}})).unwrap(),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut owned = pod("owned", "node-a", json!({}));
    owned.metadata.owner_references = Some(vec![
        serde_json::from_value(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
                                      "uid": owner.metadata.uid.unwrap()}),
        )
        .unwrap(),
    ]);
    pods.create(&pp, &owned).await.unwrap();
    cms.delete("owner", &DeleteParams::default()).await.unwrap();
    eventually("the orphaned pod terminates", || async {
        pods.get("owned")
            .await
            .is_ok_and(|p| deleting(&p) == (true, Some(30)))
    })
    .await;
    ts.stop().await;
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(KUBECTL)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("HOME", kubeconfig.parent().unwrap())
        .output()
        .expect("kubectl runs");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_delete_waits_for_the_agent() {
    assert!(
        Path::new(KUBECTL).exists(),
        "{KUBECTL} is missing: this test needs kubectl 1.33"
    );
    let ts = common::TestServer::start().await;
    let pods: Api<Pod> = Api::namespaced(ts.client().await, "default");
    let pp = PostParams::default();
    for name in ["a", "b", "c"] {
        pods.create(&pp, &pod(name, "node-a", json!({})))
            .await
            .unwrap();
    }
    let kc = ts.server().kubeconfig_path().to_path_buf();

    // --wait=false returns at once and leaves the pod terminating.
    let k = kc.clone();
    let (ok, out) =
        tokio::task::spawn_blocking(move || kubectl(&k, &["delete", "pod", "a", "--wait=false"]))
            .await
            .unwrap();
    assert!(ok && out.contains("pod \"a\" deleted"), "{out}");
    assert_eq!(deleting(&pods.get("a").await.unwrap()), (true, Some(30)));
    let k = kc.clone();
    let (ok, out) = tokio::task::spawn_blocking(move || kubectl(&k, &["get", "pod", "a"]))
        .await
        .unwrap();
    assert!(ok && out.contains("Terminating"), "{out}");

    // Plain delete waits until the agent (here: this task) confirms.
    let confirmer = {
        let pods = pods.clone();
        tokio::spawn(async move {
            loop {
                if let Ok(p) = pods.get("b").await
                    && p.metadata.deletion_timestamp.is_some()
                {
                    tokio::time::sleep(Duration::from_millis(700)).await;
                    // The moment the confirmation is sent: kubectl, watching, may
                    // see it before this task runs again, so time it beforehand.
                    let sent = Instant::now();
                    pods.delete("b", &grace(0, p.metadata.uid.as_deref()))
                        .await
                        .unwrap();
                    return sent;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let k = kc.clone();
    let (ok, out, kubectl_done) = tokio::task::spawn_blocking(move || {
        let (ok, out) = kubectl(&k, &["delete", "pod", "b", "--timeout=20s"]);
        (ok, out, Instant::now())
    })
    .await
    .unwrap();
    let confirmation_sent = confirmer.await.unwrap();
    assert!(ok && out.contains("pod \"b\" deleted"), "{out}");
    assert!(
        kubectl_done >= confirmation_sent,
        "kubectl returned before the confirmation was sent"
    );
    assert!(pods.get_opt("b").await.unwrap().is_none());

    // --force --grace-period=0 removes it at once.
    let k = kc.clone();
    let (ok, out) = tokio::task::spawn_blocking(move || {
        kubectl(&k, &["delete", "pod", "c", "--force", "--grace-period=0"])
    })
    .await
    .unwrap();
    assert!(ok && out.contains("pod \"c\" force deleted"), "{out}");
    assert!(pods.get_opt("c").await.unwrap().is_none());
    ts.stop().await;
}

/// A log source over `<dir>/<namespace>_<pod>/<container>[.previous].log`, as an agent's.
fn log_source(dir: std::path::PathBuf) -> svcnet_apiserver::LogSource {
    svcnet_apiserver::LogSource::new(move |t| {
        let suffix = if t.previous { ".previous" } else { "" };
        let path = dir
            .join(format!("{}_{}", t.namespace, t.pod))
            .join(format!("{}{suffix}.log", t.container));
        if path.exists() {
            Ok(path)
        } else {
            Err(format!(
                "container \"{}\" in pod \"{}\" is waiting to start",
                t.container, t.pod
            ))
        }
    })
}

fn write_log(dir: &Path, pod: &str, container: &str, text: &str) -> std::path::PathBuf {
    let d = dir.join(format!("default_{pod}"));
    std::fs::create_dir_all(&d).unwrap();
    let path = d.join(format!("{container}.log"));
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_logs_for_kube_rs_and_kubectl() {
    let logs = tempfile::tempdir().unwrap();
    let ldir = logs.path().to_path_buf();
    let ts = common::TestServer::start_with(|c| c.log_source = Some(log_source(ldir))).await;
    let client = ts.client().await;
    let core = client.list_core_api_resources("v1").await.unwrap();
    let log = core
        .resources
        .iter()
        .find(|r| r.name == "pods/log")
        .unwrap();
    assert_eq!(
        (log.kind.as_str(), log.verbs.clone()),
        ("Pod", vec!["get".to_string()])
    );
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let pp = PostParams::default();
    pods.create(&pp, &pod("one", "", json!({}))).await.unwrap();
    let two = json!({"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "x"}]});
    pods.create(&pp, &pod("two", "", two)).await.unwrap();
    let lines: String = (1..=5).map(|i| format!("line {i}\n")).collect();
    write_log(logs.path(), "one", "c", &lines);
    write_log(logs.path(), "two", "a", "from a\n");
    write_log(logs.path(), "two", "b", "from b\n");

    // kube-rs: whole log, tail, limit, container choice and the errors.
    let lp = kube::api::LogParams::default();
    assert_eq!(pods.logs("one", &lp).await.unwrap(), lines);
    let tail = kube::api::LogParams {
        tail_lines: Some(2),
        ..Default::default()
    };
    assert_eq!(pods.logs("one", &tail).await.unwrap(), "line 4\nline 5\n");
    let limited = kube::api::LogParams {
        limit_bytes: Some(8),
        ..Default::default()
    };
    assert_eq!(pods.logs("one", &limited).await.unwrap(), "line 1\nl");
    let b = kube::api::LogParams {
        container: Some("b".into()),
        ..Default::default()
    };
    assert_eq!(pods.logs("two", &b).await.unwrap(), "from b\n");
    let status = |e: kube::Error| match e {
        kube::Error::Api(s) => (s.code, s.message),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        status(pods.logs("two", &lp).await.unwrap_err()),
        (
            400,
            "a container name must be specified for pod two, choose one of: [a b]".into()
        )
    );
    assert_eq!(
        status(pods.logs("nope", &lp).await.unwrap_err()),
        (404, "pods \"nope\" not found".into())
    );
    let prev = kube::api::LogParams {
        previous: true,
        ..Default::default()
    };
    let (code, msg) = status(pods.logs("one", &prev).await.unwrap_err());
    assert_eq!(code, 400);
    assert!(msg.contains("is waiting to start"), "{msg}");

    // The real kubectl: logs, --tail, a multi-container pod (kubectl picks the first).
    let kc = ts.server().kubeconfig_path().to_path_buf();
    let k = kc.clone();
    let expected = lines.clone();
    tokio::task::spawn_blocking(move || {
        let (ok, out) = kubectl(&k, &["logs", "one"]);
        assert!(ok && out == expected, "{out}");
        let (ok, out) = kubectl(&k, &["logs", "one", "--tail=1"]);
        assert!(ok && out == "line 5\n", "{out}");
        let (ok, out) = kubectl(&k, &["logs", "two", "-c", "b"]);
        assert!(ok && out == "from b\n", "{out}");
        let (ok, out) = kubectl(&k, &["logs", "two"]);
        assert!(ok && out.contains("from a\n"), "{out}");
        let (ok, out) = kubectl(&k, &["logs", "gone"]);
        assert!(!ok && out.contains("pods \"gone\" not found"), "{out}");
    })
    .await
    .unwrap();

    // kubectl logs -f: appended lines arrive, and it ends when the pod goes.
    let log = logs.path().join("default_one/c.log");
    let mut child = std::process::Command::new(KUBECTL)
        .args(["logs", "-f", "one", "--tail=1"])
        .env("KUBECONFIG", &kc)
        .env("HOME", kc.parent().unwrap())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut got = Vec::new();
        for line in std::io::BufReader::new(stdout).lines() {
            got.push(line.unwrap());
            if got.len() == 3 {
                break;
            }
        }
        got
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        f.write_all(b"line 6\nline 7\n").unwrap();
    }
    let got = tokio::task::spawn_blocking(move || reader.join().unwrap())
        .await
        .unwrap();
    assert_eq!(got, ["line 5", "line 6", "line 7"]);
    pods.delete("one", &DeleteParams::default()).await.unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(10) {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("kubectl logs -f did not end after the pod was deleted");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success());
    ts.stop().await;
}

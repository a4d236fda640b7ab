//! The controllers' Events as the real kubectl shows them: `kubectl events` and `kubectl
//! describe` list the Deployment controller's ScalingReplicaSet, the ReplicaSet and StatefulSet
//! controllers' SuccessfulCreate/SuccessfulDelete and the scheduler's Scheduled, with
//! upstream's messages and components, against the real API server in-process.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use svcnet_controllers::{ControllerOptions, run};

mod common;

fn kubectl(kubeconfig: &PathBuf, args: &[&str], stdin: Option<&str>) -> Result<String> {
    let mut cmd = Command::new("kubectl");
    cmd.arg("--kubeconfig").arg(kubeconfig).args(args);
    let out = match stdin {
        None => cmd.output()?,
        Some(text) => {
            use std::io::Write;
            let mut child = cmd
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()?;
            child
                .stdin
                .take()
                .context("stdin")?
                .write_all(text.as_bytes())?;
            child.wait_with_output()?
        }
    };
    if !out.status.success() {
        bail!("kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `kubectl args` until its output contains every one of `wanted` (30 s at most).
fn eventually_shows(kubeconfig: &PathBuf, args: &[&str], wanted: &[&str]) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = kubectl(kubeconfig, args, None)?;
        if wanted.iter().all(|w| out.contains(w)) {
            return Ok(out);
        }
        if Instant::now() > deadline {
            bail!("kubectl {args:?} never showed {wanted:?}:\n{out}");
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

const MANIFEST: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: myapp}
spec:
  replicas: 2
  selector: {matchLabels: {app: myapp}}
  template:
    metadata: {labels: {app: myapp}}
    spec: {containers: [{name: c, image: nginx}]}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: web}
spec:
  replicas: 1
  serviceName: web
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: c, image: nginx}]}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_shows_the_controllers_events() -> Result<()> {
    let common::TestServer {
        client,
        server,
        kubeconfig: kc_path,
        dir: _dir,
    } = common::start_server().await?;
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let opts = ControllerOptions {
        node_name: "events-node".into(),
        ..Default::default()
    };
    let controllers = tokio::spawn(async move {
        run(client, opts, async {
            let _ = rx.await;
        })
        .await
    });

    let kc = kc_path.clone();
    let checked = tokio::task::spawn_blocking(move || -> Result<()> {
        kubectl(&kc, &["apply", "-f", "-"], Some(MANIFEST))?;
        let rs = eventually_shows(&kc, &["get", "rs", "-o", "name"], &["myapp-"])?;
        let rs = rs
            .lines()
            .next()
            .context("a ReplicaSet")?
            .trim_start_matches("replicaset.apps/")
            .to_string();
        let scaled = format!("Scaled up replica set {rs} from 0 to 2");
        let created = format!("Created pod: {rs}-");
        let assigned = format!("Successfully assigned default/{rs}-");
        let events = eventually_shows(
            &kc,
            &["events"],
            &[
                "ScalingReplicaSet",
                &scaled,
                "SuccessfulCreate",
                &created,
                "Scheduled",
                &assigned,
                "create Pod web-0 in StatefulSet web successful",
                "Successfully assigned default/web-0 to events-node",
            ],
        )?;
        eprintln!("kubectl events:\n{events}");
        // describe finds each object's own events, with the component that recorded them.
        eventually_shows(
            &kc,
            &["describe", "deployment", "myapp"],
            &["ScalingReplicaSet", "deployment-controller", &scaled],
        )?;
        eventually_shows(
            &kc,
            &["describe", "rs", &rs],
            &["SuccessfulCreate", "replicaset-controller", &created],
        )?;
        let pod = eventually_shows(
            &kc,
            &["describe", "pod", "web-0"],
            &["Scheduled", "default-scheduler"],
        )?;
        assert!(
            pod.contains("Successfully assigned default/web-0 to events-node"),
            "{pod}"
        );
        eventually_shows(
            &kc,
            &["describe", "statefulset", "web"],
            &["SuccessfulCreate", "statefulset-controller"],
        )?;
        // Scaling down: the Deployment scales its ReplicaSet, which deletes a pod.
        kubectl(&kc, &["scale", "deployment", "myapp", "--replicas=1"], None)?;
        let down = format!("Scaled down replica set {rs} from 2 to 1");
        let deleted = format!("Deleted pod: {rs}-");
        eventually_shows(&kc, &["events"], &[&down, "SuccessfulDelete", &deleted])?;
        Ok(())
    })
    .await?;
    let _ = stop.send(());
    let _ = controllers.await;
    server.shutdown().await?;
    checked
}

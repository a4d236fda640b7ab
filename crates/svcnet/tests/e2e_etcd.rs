//! End to end on etcd: `svcnet up --etcd-servers` against Debian's `etcd` on loopback, driven
//! by the real kubectl (create, get, watch a Service), restarted on the same etcd (the object
//! and its resourceVersion are still there), with the Service in etcd under kube-apiserver's
//! key; then `svcnet apiserver` on the same etcd and data dir serves the same object at the same
//! resourceVersion. Skipped with a printed reason when the `etcd` binary is missing (a failure
//! under `SVCNET_REQUIRE_ETCD=1`).
#![allow(clippy::unwrap_used)] // test: a failure here is a test failure

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{KUBECTL, Up, free_port, free_udp_port, wait_for};
use svcnet_store::local_etcd::{LocalEtcd, etcd_for_test};

/// `svcnet apiserver` on a data dir; killed on drop.
struct Apiserver(Child);

impl Drop for Apiserver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn kubectl_at(kubeconfig: &std::path::Path, server: &str, args: &[&str]) -> std::process::Output {
    Command::new(KUBECTL)
        .env("KUBECONFIG", kubeconfig)
        .arg(format!("--server={server}"))
        .args(args)
        .output()
        .unwrap()
}

fn ok_at(kubeconfig: &std::path::Path, server: &str, args: &[&str]) -> String {
    let out = kubectl_at(kubeconfig, server, args);
    assert!(
        out.status.success(),
        "kubectl {args:?} at {server} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_on_etcd_keeps_objects_and_resource_versions_across_restarts() {
    let Some(bin) = etcd_for_test("up_on_etcd_keeps_objects_and_resource_versions_across_restarts")
    else {
        return;
    };
    let etcd = LocalEtcd::start(&bin, 1).await.expect("etcd");
    let endpoint = etcd.endpoint(0);
    let (dns, upstream) = (free_udp_port(), free_udp_port());
    let mut up = Up::start(&[
        "--disable",
        "proxy,agent",
        "--dns-listen",
        &dns.to_string(),
        "--dns-upstream",
        &upstream.to_string(),
        "--etcd-servers",
        &endpoint,
        "--etcd-compaction-interval",
        "0s",
    ]);
    let server = format!("https://{}", up.api);
    let kubeconfig = up.kubeconfig();
    assert!(
        !up.data_dir.path().join("store.redb").exists(),
        "the objects are in etcd, not in the data dir"
    );

    ok_at(
        &kubeconfig,
        &server,
        &["create", "service", "clusterip", "web", "--tcp=80:8080"],
    );
    let rv_ip = |server: &str| {
        ok_at(
            &kubeconfig,
            server,
            &[
                "get",
                "service",
                "web",
                "-o",
                "jsonpath={.metadata.resourceVersion} {.spec.clusterIP}",
            ],
        )
    };
    let before = rv_ip(&server);

    // kubectl's watch sees a change made by another kubectl.
    let watch_out = up.data_dir.path().join("watch.out");
    let mut watch = Command::new(KUBECTL)
        .env("KUBECONFIG", &kubeconfig)
        .arg(format!("--server={server}"))
        .args([
            "get",
            "service",
            "web",
            "--watch",
            "--output-watch-events",
            "-o",
            "json",
        ])
        .stdout(std::fs::File::create(&watch_out).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the watch's initial ADDED", || {
        let s = std::fs::read_to_string(&watch_out).ok()?;
        s.replace(' ', "").contains("\"ADDED\"").then_some(s)
    });
    ok_at(
        &kubeconfig,
        &server,
        &["label", "service", "web", "tier=front"],
    );
    wait_for("the watch's MODIFIED", || {
        let s = std::fs::read_to_string(&watch_out).ok()?;
        let compact = s.replace([' ', '\n'], "");
        (compact.contains("\"MODIFIED\"") && compact.contains("\"tier\":\"front\"")).then_some(s)
    });
    let _ = watch.kill();
    let _ = watch.wait();
    let labelled = rv_ip(&server);
    assert_ne!(labelled, before);

    // The Service is in etcd under kube-apiserver's key, its mod_revision the resourceVersion.
    let mut raw = etcd_client::Client::connect([endpoint.clone()], None)
        .await
        .unwrap();
    let resp = raw
        .get("/registry/services/specs/default/web", None)
        .await
        .unwrap();
    let kv = resp.kvs().first().expect("the service's key in etcd");
    let rv: String = labelled.split(' ').next().unwrap().to_string();
    assert_eq!(kv.mod_revision().to_string(), rv);
    let stored: serde_json::Value = serde_json::from_slice(kv.value()).unwrap();
    assert_eq!(stored["kind"], "Service");
    assert_eq!(stored["metadata"].get("resourceVersion"), None);

    // Restarted on the same etcd: the object, its resourceVersion and cluster IP are there.
    up.restart();
    assert_eq!(rv_ip(&server), labelled);
    ok_at(
        &kubeconfig,
        &server,
        &["create", "service", "clusterip", "api", "--tcp=443"],
    );

    // A second API server process on the same etcd and data dir (its PKI) serves the same.
    let listen = free_port();
    let mut apiserver = Apiserver(
        Command::new(env!("CARGO_BIN_EXE_svcnet"))
            .arg("apiserver")
            .arg("--data-dir")
            .arg(up.data_dir.path())
            .args(["--listen", &listen.to_string(), "--etcd-servers", &endpoint])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let second = format!("https://{listen}");
    let started = Instant::now();
    loop {
        let out = kubectl_at(&kubeconfig, &second, &["get", "--raw", "/readyz"]);
        if out.status.success() {
            break;
        }
        if let Ok(Some(status)) = apiserver.0.try_wait() {
            panic!("svcnet apiserver exited: {status}");
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "svcnet apiserver not ready"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(rv_ip(&second), labelled);
    let names = ok_at(&kubeconfig, &second, &["get", "services", "-o", "name"]);
    assert!(
        names.contains("service/api") && names.contains("service/web"),
        "{names}"
    );
    drop(apiserver);
    // The first server goes on (`svcnet apiserver` pointed the kubeconfig at itself: the
    // commands here name the server they mean).
    assert_eq!(rv_ip(&server), labelled);
    drop(up);
}

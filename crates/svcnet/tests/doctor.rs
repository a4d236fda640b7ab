//! `svcnet doctor` against a real `svcnet up` (API server and controllers; no node agent, so
//! pods stay Pending, as on a cluster whose nodes cannot run them): one namespace per mistake,
//! the finding it must produce, the exit code scripts rely on, JSON output, and clear errors
//! for bad input.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::{Command, Output};

use common::Up;

const MISTAKES: &[(&str, &str, &str)] = &[
    (
        "typo",
        "selector-matches-nothing",
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: myapp}
spec:
  replicas: 1
  selector: {matchLabels: {app: myapp, release: stable}}
  template:
    metadata: {labels: {app: myapp, release: stable}}
    spec: {containers: [{name: web, image: nginx, ports: [{name: http, containerPort: 80}]}]}
---
apiVersion: v1
kind: Service
metadata: {name: myapp}
spec:
  selector: {app: myapp, release: stabel}
  ports: [{port: 80, targetPort: http}]
"#,
    ),
    (
        "unready",
        "no-ready-pods",
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: web, image: nginx, ports: [{name: http, containerPort: 80}]}]}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: htpp}]
"#,
    ),
    (
        "nosvc",
        "statefulset-service-missing",
        r#"
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: web}
spec:
  serviceName: nginx
  replicas: 1
  selector: {matchLabels: {app: nginx}}
  template:
    metadata: {labels: {app: nginx}}
    spec: {containers: [{name: nginx, image: nginx}]}
"#,
    ),
    (
        "notheadless",
        "statefulset-service-not-headless",
        r#"
apiVersion: v1
kind: Service
metadata: {name: nginx}
spec:
  selector: {app: nginx}
  ports: [{port: 80}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: web}
spec:
  serviceName: nginx
  replicas: 1
  selector: {matchLabels: {app: nginx}}
  template:
    metadata: {labels: {app: nginx}}
    spec: {containers: [{name: nginx, image: nginx}]}
"#,
    ),
    (
        "extip",
        "external-name-is-ip",
        r#"
apiVersion: v1
kind: Service
metadata: {name: db}
spec: {type: ExternalName, externalName: 192.168.1.5}
"#,
    ),
];

fn doctor(up: &Up, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_svcnet"))
        .arg("doctor")
        .args(args)
        .arg("--kubeconfig")
        .arg(up.kubeconfig())
        .output()
        .unwrap()
}

/// Doctor finds nothing in `ns` and exits 0.
fn assert_nothing_found(up: &Up, ns: &str) {
    let out = doctor(up, &["-n", ns]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        text(&out.stdout).contains("0 error(s), 0 warning(s)"),
        "{}",
        text(&out.stdout)
    );
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn doctor_finds_each_mistake_and_exits_non_zero() {
    let up = Up::start(&["--disable", "proxy,dns,agent"]);
    let dir = tempfile::tempdir().unwrap();
    for (ns, _, manifest) in MISTAKES {
        up.ok(&["create", "namespace", ns]);
        let file = dir.path().join(format!("{ns}.yaml"));
        std::fs::write(&file, manifest).unwrap();
        up.ok(&["apply", "-n", ns, "-f", file.to_str().unwrap()]);
    }
    // The Deployments' pods exist (Pending) before the check.
    common::wait_for("the deployments' pods", || {
        let pods = up.ok(&["get", "pods", "-n", "unready", "-o", "name"]);
        (pods.lines().count() == 2).then_some(pods)
    });
    for (ns, check, _) in MISTAKES {
        let out = doctor(&up, &["-n", ns, "-o", "json"]);
        let findings: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
                panic!("{ns}: not JSON: {}{}", text(&out.stdout), text(&out.stderr))
            });
        let checks: Vec<&str> = findings
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["check"].as_str().unwrap())
            .collect();
        assert!(
            checks.contains(check),
            "{ns}: expected {check}, found {checks:?}"
        );
        assert_eq!(out.status.code(), Some(1), "{ns}: an error finding exits 1");
    }
    // The named targetPort nothing declares is found beside the unready pods.
    let out = doctor(&up, &["-n", "unready", "svc/web"]);
    let shown = text(&out.stdout);
    assert!(shown.contains("\"htpp\""), "{shown}");
    assert!(shown.contains("fix: "), "{shown}");
    assert!(shown.contains("1 service(s) checked"), "{shown}");
    // The nearest labels are named.
    let out = doctor(&up, &["-n", "typo"]);
    assert!(
        text(&out.stdout).contains("release=stabel"),
        "{}",
        text(&out.stdout)
    );

    // A healthy namespace: the seeds' external database (selector-less, hand-written
    // Endpoints) has nothing to find, and doctor exits 0.
    up.ok(&["create", "namespace", "healthy"]);
    up.ok(&[
        "apply",
        "-n",
        "healthy",
        "-f",
        &common::example("mysql-external.yaml"),
    ]);
    assert_nothing_found(&up, "healthy");
    // -A sees every namespace's findings.
    let out = doctor(&up, &["-A", "-o", "json"]);
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for (ns, _, _) in MISTAKES {
        assert!(
            all.as_array()
                .unwrap()
                .iter()
                .any(|f| f["object"].as_str().unwrap().contains(&format!("/{ns}/"))),
            "-A misses {ns}"
        );
    }

    // Bad input: clear errors.
    let out = doctor(&up, &["-n", "healthy", "svc/nope"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("service healthy/nope not found"),
        "{}",
        text(&out.stderr)
    );
    let out = doctor(&up, &["pod/x"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("is not a service"),
        "{}",
        text(&out.stderr)
    );
}

/// SIGTERM or SIGSTOP/SIGCONT to a process.
fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {sig} {pid}");
}

/// Kills and reaps a child when the test ends, however it ends.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn findings(out: &Output) -> Vec<(String, String, String)> {
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("not JSON: {}{}", text(&out.stdout), text(&out.stderr)));
    v.as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["check"].as_str().unwrap().to_string(),
                f["object"].as_str().unwrap().to_string(),
                f["message"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// A node proxy (`svcnet proxy`, userspace mode without privileges, its service CIDR on
/// loopback) reports through its Lease: doctor is quiet while it keeps up, says its rules are
/// stale while it is frozen (SIGSTOP) and an Endpoints change waits, quiet again once it
/// catches up, and says it is not running once it stopped (SIGTERM). ExternalName targets are
/// looked up as pods would: in the cluster domain as the Service they name, anything else at
/// the resolver (here a local stand-in for the upstream DNS, through `--nameserver`).
#[test]
fn doctor_checks_the_proxies_and_external_names() {
    const CIDR: &str = "127.143.0.0/16";
    let up = Up::start(&["--disable", "proxy,dns,agent", "--service-cidr", CIDR]);
    let node = up.ok(&["get", "nodes", "-o", "jsonpath={.items[0].metadata.name}"]);
    assert!(!node.is_empty());

    // ExternalName targets.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let upstream = rt
        .block_on(svcnet_dns::fake_upstream::FakeUpstream::start(vec![
            hickory_proto::rr::Record::from_rdata(
                hickory_proto::rr::Name::from_ascii("db.example.org.").unwrap(),
                60,
                hickory_proto::rr::RData::A(hickory_proto::rr::rdata::A::new(192, 0, 2, 10)),
            ),
        ]))
        .unwrap();
    up.ok(&["create", "namespace", "ext"]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ext.yaml");
    let names = [
        ("good", "db.example.org"),
        ("gone", "nothere.example.org"),
        ("in-cluster", "kubernetes.default.svc.cluster.local"),
        ("in-cluster-gone", "db.nowhere.svc.cluster.local"),
    ];
    let manifest: Vec<String> = names
        .iter()
        .map(|(name, target)| {
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\nspec: {{type: ExternalName, externalName: {target}}}\n"
            )
        })
        .collect();
    std::fs::write(&file, manifest.join("---\n")).unwrap();
    up.ok(&["apply", "-n", "ext", "-f", file.to_str().unwrap()]);
    let ns = upstream.addr().to_string();
    let out = doctor(&up, &["-n", "ext", "-o", "json", "--nameserver", &ns]);
    let unresolved: Vec<String> = findings(&out)
        .into_iter()
        .filter(|(check, _, _)| check == "external-name-does-not-resolve")
        .map(|(_, object, _)| object)
        .collect();
    assert_eq!(
        unresolved,
        vec!["svc/ext/gone", "svc/ext/in-cluster-gone"],
        "{}",
        text(&out.stdout)
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(upstream.queries() > 0, "the resolver was asked");
    let shown = text(&doctor(&up, &["-n", "ext", "svc/in-cluster-gone"]).stdout);
    assert!(
        shown.contains("no Service db in namespace nowhere"),
        "{shown}"
    );

    // A proxy that keeps up: nothing to report.
    let proxy = Command::new(env!("CARGO_BIN_EXE_svcnet"))
        .args(["proxy", "--kubeconfig"])
        .arg(up.kubeconfig())
        .args([
            "--node-name",
            &node,
            "--mode",
            "userspace",
            "--unprivileged",
        ])
        .args(["--service-cidr", CIDR, "--min-sync-period", "100ms"])
        .args(["--healthz-bind-address", "", "--metrics-bind-address", ""])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let proxy = Reaped(proxy);
    let pid = proxy.0.id();
    up.ok(&["create", "namespace", "healthy"]);
    up.ok(&[
        "apply",
        "-n",
        "healthy",
        "-f",
        &common::example("mysql-external.yaml"),
    ]);
    let lease = format!("svcnet-proxy-{node}");
    let slice_rev = || -> u64 {
        up.ok(&[
            "get",
            "endpointslices",
            "-n",
            "healthy",
            "-l",
            "kubernetes.io/service-name=mysql",
            "-o",
            "jsonpath={.items[*].metadata.resourceVersion}",
        ])
        .split_whitespace()
        .filter_map(|r| r.parse().ok())
        .max()
        .unwrap_or(u64::MAX)
    };
    let applied = || -> u64 {
        up.ok(&[
            "get",
            "lease",
            "-n",
            "kube-system",
            &lease,
            "--ignore-not-found",
            "-o",
            r"jsonpath={.metadata.annotations.proxy\.svcnet\.io/endpointslices-revision}",
        ])
        .trim()
        .parse()
        .unwrap_or(0)
    };
    common::wait_for("the proxy to report the mirrored EndpointSlice", || {
        (applied() >= slice_rev()).then(|| "applied".to_string())
    });
    let mode = up.ok(&[
        "get",
        "lease",
        "-n",
        "kube-system",
        &lease,
        "-o",
        r"jsonpath={.metadata.annotations.proxy\.svcnet\.io/mode}",
    ]);
    assert_eq!(mode, "userspace");
    assert_nothing_found(&up, "healthy");

    // Frozen: the lease is still fresh, but an endpoint change does not reach the rules.
    let before = slice_rev();
    signal(pid, "-STOP");
    up.ok(&[
        "patch",
        "endpoints",
        "mysql",
        "-n",
        "healthy",
        "--type",
        "merge",
        "-p",
        r#"{"subsets":[{"addresses":[{"ip":"192.168.43.102"}],"ports":[{"port":3306}]}]}"#,
    ]);
    common::wait_for("the mirrored slice to change", || {
        (slice_rev() > before).then(|| "changed".to_string())
    });
    let out = doctor(&up, &["-n", "healthy", "-o", "json"]);
    signal(pid, "-CONT");
    let found = findings(&out);
    assert!(
        found
            .iter()
            .any(|(check, object, msg)| check == "proxy-rules-stale"
                && object == "svc/healthy/mysql"
                && msg.contains(&format!("node {node}"))),
        "{found:?}"
    );
    common::wait_for("the proxy to catch up", || {
        (applied() >= slice_rev()).then(|| "caught up".to_string())
    });
    assert_nothing_found(&up, "healthy");

    // Stopped: the lease says so at once.
    signal(pid, "-TERM");
    let mut proxy = proxy;
    let status = proxy.0.wait().unwrap();
    assert!(status.success(), "svcnet proxy exited with {status}");
    let out = doctor(&up, &["-n", "healthy", "-o", "json"]);
    assert_eq!(out.status.code(), Some(1));
    let found = findings(&out);
    assert!(
        found
            .iter()
            .any(|(check, object, msg)| check == "proxy-not-running"
                && *object == format!("node/{node}")
                && msg.contains("stopped")),
        "{found:?}"
    );
}

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
    let out = doctor(&up, &["-n", "healthy"]);
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

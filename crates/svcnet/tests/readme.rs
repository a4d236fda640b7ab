//! The README is a contract (needs root): its worked example is run as written (see
//! `common/walkthrough.rs`), and Ctrl-C then removes everything `svcnet up` made. A README
//! edit that breaks the example fails this test.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::is_root;
use common::walkthrough::{leftovers, run_worked_example, shape, shapes, tally, worked_example};

#[test]
fn the_readme_worked_example_runs_as_written() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let ran = run_worked_example(|_, commands| commands.to_string());
    // The default data dir, relative, under the directory up.sh ran from.
    assert!(ran.root().join("svcnet-data/kubeconfig").exists());
    // Ctrl-C stops it and it removes everything it made.
    assert_eq!(
        ran.teardown.stop(),
        Some(true),
        "svcnet up did not stop on SIGINT"
    );
    let after = leftovers();
    assert!(after.is_empty(), "left behind: {after:?}");
}

#[test]
fn shapes_keep_what_must_not_vary() {
    assert_eq!(
        shape(
            "myapp-deploy-84f7699f48-cd7ls   1/1     Running   0          7s    10.244.1.3   svcnet-node1"
        ),
        "myapp-deploy-HASH-ID 1/1 Running N N 10.244.N.H svcnet-nodeN"
    );
    assert_eq!(
        shape("pod=myapp-deploy-84f7699f48-cd7ls ip=10.244.1.3 client=10.244.1.1:51703"),
        "pod=myapp-deploy-HASH-ID ip=10.244.N.H client=NODE:P"
    );
    assert_eq!(
        shape("pod=web-0 ip=10.244.1.3 client=172.30.0.2:6157"),
        shape("pod=web-1 ip=10.244.2.3 client=10.244.2.1:1").replace("web-1", "web-0")
    );
    assert_eq!(
        shape("pod=a ip=10.244.1.3 client=10.244.2.2:60740"),
        "pod=a ip=10.244.N.H client=POD:P"
    );
    // Over flannel's VXLAN a node masquerades to other nodes' pods from its VTEP's `.0`.
    assert_eq!(
        shape("pod=a ip=10.244.1.3 client=10.244.2.0:60740"),
        "pod=a ip=10.244.N.H client=NODE:P"
    );
    assert_eq!(
        shape("myapp   10.244.1.2:80,10.244.1.3:80,10.244.2.2:80   7s"),
        "myapp 10.244.N.H:80,10.244.N.H:80,10.244.N.H:80 N"
    );
    assert_eq!(
        shape(
            "myapp-loadbalance   LoadBalancer   10.96.1.1    10.200.0.1      8765:30086/TCP   7s"
        ),
        "myapp-loadbalance LoadBalancer 10.96.1.1 10.200.0.1 8765:30086/TCP N"
    );
    assert_eq!(shape("     11 pod=web-0"), "N pod=web-0");
    assert_eq!(tally("     11 pod=a\n      9 pod=b\n     10 pod=c\n"), 30);
    assert_eq!(
        tally("      8 pod=a\n     11 pod=b\n      5 pod=c\nNAME   READY\n"),
        24,
        "six requests without an answer must not look like the README's 30"
    );
    assert_eq!(
        shape("MYAPP_SERVICE_HOST=10.96.1.0"),
        "MYAPP_SERVICE_HOST=10.96.1.0"
    );
    assert_ne!(
        shape("10.96.1.0"),
        shape("10.96.1.1"),
        "cluster IPs are compared as they are"
    );
    assert_ne!(
        shapes("a\nb\n"),
        shapes("a\n"),
        "the number of lines is part of the shape"
    );
}

#[test]
fn the_worked_example_is_found() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(repo.join("README.md")).unwrap();
    let steps = worked_example(&readme);
    assert!(steps.len() >= 5, "{steps:?}");
    assert!(
        steps[0].commands.contains("./scripts/up.sh"),
        "{:?}",
        steps[0]
    );
    assert!(
        steps.iter().all(|s| s.expected.is_some()),
        "every sh block shows its output"
    );
    // The run command: it names the package and binary to run (a bare `cargo run` is
    // ambiguous in this workspace, which also builds the agent's test server).
    let up = std::fs::read_to_string(repo.join("scripts/up.sh")).unwrap();
    let cargo = up
        .lines()
        .find(|l| l.trim_start().starts_with("exec cargo run"))
        .expect("up.sh runs cargo");
    assert!(
        cargo.contains("-p svcnet") && cargo.contains("--bin svcnet"),
        "{cargo}"
    );
}

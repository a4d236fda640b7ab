//! `svcnet trace` end to end (needs root): `svcnet up --nodes 2` with the seeds'
//! `examples/myapp.yaml`, on this test's own prefix and address ranges, in nftables and in
//! iptables mode; the trace reads each node's rules from its namespace and answers the
//! questions of issue 12: the path, the frontend, each endpoint's share, masquerade and why,
//! the verdicts when nothing matches, why ping does not answer, and clear usage errors.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::process::{Command, Output};

use common::{Net, Up, free_udp_port, is_root, wait_for};
use serde_json::Value;

const WHY_HAIRPIN: &str = "hairpin";
const WHY_OFF_CLUSTER: &str = "outside the cluster CIDR";

fn trace(up: &Up, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_svcnet"))
        .arg("trace")
        .arg("--data-dir")
        .arg(up.data_dir.path())
        .args(args)
        .output()
        .unwrap()
}

fn trace_json(up: &Up, args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.extend(["-o", "json"]);
    let out = trace(up, &a);
    assert!(
        out.status.success(),
        "svcnet trace {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn branches(v: &Value) -> Vec<Value> {
    v["branches"].as_array().unwrap().clone()
}

/// Every branch of a trace ends in one outcome: that outcome and the branches' verdict.
fn only_verdict(v: &Value) -> (String, String) {
    let b = branches(v);
    let outcomes: BTreeSet<String> = b
        .iter()
        .map(|b| b["outcome"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(outcomes.len(), 1, "{v:#}");
    (
        outcomes.into_iter().next().unwrap(),
        b[0]["verdict"].as_str().unwrap().to_string(),
    )
}

fn check_mode(net: &Net, mode: &str) {
    let dns = free_udp_port();
    let mut up = net.up_with("2", dns, &["--proxy-mode", mode]);
    let nodes = wait_for("two ready nodes", || {
        let n = up.ok(&[
            "get",
            "nodes",
            "--no-headers",
            "-o",
            "custom-columns=N:.metadata.name",
        ]);
        (n.lines().count() == 2).then_some(n)
    });
    let nodes: Vec<&str> = nodes.lines().map(str::trim).collect();
    up.ok(&["apply", "-f", &common::example("myapp.yaml")]);
    let cip = up.ok(&["get", "svc", "myapp", "-o", "jsonpath={.spec.clusterIP}"]);
    let eps = wait_for("3 ready myapp endpoints", || {
        let ep = up.ok(&[
            "get",
            "endpoints",
            "myapp",
            "-o",
            "jsonpath={.subsets[*].addresses[*].ip}",
        ]);
        (ep.split_whitespace().count() == 3).then_some(ep)
    });
    let pod_ips: BTreeSet<String> = eps.split_whitespace().map(str::to_string).collect();
    let dst = format!("{cip}:80");
    let expected: BTreeSet<String> = pod_ips.iter().map(|ip| format!("{ip}:80")).collect();

    // A pod-CIDR client that is no endpoint, on each node: three endpoints, a third each,
    // not masqueraded, the cluster IP frontend, through the services dispatch.
    for node in &nodes {
        let v = wait_for("the node's rules to hold 3 endpoints", || {
            let v = trace_json(&up, &["--node", node, "10.158.0.250", &dst]);
            (branches(&v).len() == 3).then(|| v.to_string())
        });
        let v: Value = serde_json::from_str(&v).unwrap();
        assert_eq!(
            v["dataplane"],
            if mode == "nftables" {
                "nftables"
            } else {
                "iptables"
            }
        );
        assert_eq!(v["node"], *node);
        let mut got = BTreeSet::new();
        for b in branches(&v) {
            assert_eq!(b["outcome"], "endpoint", "{b:#}");
            assert!(
                (b["share"].as_f64().unwrap() - 1.0 / 3.0).abs() < 1e-6,
                "{b:#}"
            );
            assert_eq!(b["masquerade"], false, "{b:#}");
            let fe = b["frontend"].as_str().unwrap();
            assert!(fe.starts_with("cluster IP of default/myapp"), "{fe}");
            let chains: Vec<&str> = b["path"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| h["chain"].as_str().unwrap())
                .collect();
            let dispatch = if mode == "nftables" {
                "services"
            } else {
                "SVCNET-SERVICES"
            };
            assert!(chains.contains(&dispatch), "{chains:?}");
            got.insert(b["endpoint"].as_str().unwrap().to_string());
        }
        assert_eq!(got, expected);
        // The pod network's part: an endpoint on this node is on its bridge, one on the other
        // node is routed to that node (host-gw, the default).
        let placed = up.ok(&[
            "get",
            "pods",
            "-l",
            "app=myapp",
            "--no-headers",
            "-o",
            "custom-columns=IP:.status.podIP,NODE:.spec.nodeName",
        ]);
        for line in placed.lines() {
            let (ip, on) = line.split_once(' ').unwrap();
            let how = v["forwarding"][ip].as_str().unwrap_or_default();
            let want = if on.trim() == *node {
                "a pod on this node"
            } else {
                "host-gw"
            };
            assert!(how.contains(want), "{ip} on {on} from {node}: {how}\n{v:#}");
        }
    }

    // Hairpin: an endpoint calling its own service is masqueraded on its own branch only.
    let me = pod_ips.iter().next().unwrap();
    let v = trace_json(&up, &[me, &dst]);
    for b in branches(&v) {
        let to_me = b["endpoint"].as_str().unwrap() == format!("{me}:80");
        assert_eq!(b["masquerade"], to_me, "{b:#}");
        if to_me {
            assert!(
                b["masqueradeReason"]
                    .as_str()
                    .unwrap()
                    .contains(WHY_HAIRPIN),
                "{b:#}"
            );
        }
    }
    // Off-cluster source (the host on the underlay): every branch masqueraded, and why.
    let v = trace_json(&up, &["172.29.13.1", &dst]);
    for b in branches(&v) {
        assert_eq!(b["masquerade"], true, "{b:#}");
        assert!(
            b["masqueradeReason"]
                .as_str()
                .unwrap()
                .contains(WHY_OFF_CLUSTER),
            "{b:#}"
        );
    }
    // Nothing matches: another port of the cluster IP is rejected, an unallocated service IP
    // dropped, a pod IP is not a service (routed).
    let (o, why) = only_verdict(&trace_json(&up, &["10.158.0.250", &format!("{cip}:81")]));
    assert_eq!(o, "rejected");
    assert!(why.contains("no port"), "{why}");
    let (o, why) = only_verdict(&trace_json(&up, &["10.158.0.250", "10.148.255.254:80"]));
    assert_eq!(o, "dropped");
    assert!(why.contains("no service holds"), "{why}");
    let (o, why) = only_verdict(&trace_json(&up, &["10.158.0.250", &format!("{me}:80")]));
    assert_eq!(o, "routed");
    assert!(why.contains("not a service"), "{why}");
    // UDP to the TCP-only service: rejected (no port of that protocol).
    let (o, _) = only_verdict(&trace_json(&up, &["--proto", "udp", "10.158.0.250", &dst]));
    assert_eq!(o, "rejected");

    // Ping: traced as ICMP, rejected by the node, and explained.
    let out = trace(&up, &["--explain-ping", "10.158.0.250", &cip]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("svcnet trace --explain-ping ({mode}):\n{text}");
    assert!(text.contains("packet: icmp 10.158.0.250 -> "), "{text}");
    assert!(text.contains("verdict (100.0%): rejected"), "{text}");
    assert!(text.contains("Destination Port Unreachable"), "{text}");

    // The readable form.
    let out = trace(&up, &["10.158.0.250", &dst]);
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("svcnet trace 10.158.0.250 {dst} ({mode}):\n{text}");
    assert!(
        text.contains("frontend: cluster IP of default/myapp"),
        "{text}"
    );
    assert!(text.contains("endpoints (3 can be chosen):"), "{text}");
    assert_eq!(text.matches("33.3%").count(), 3, "{text}");
    assert!(text.contains("not masqueraded"), "{text}");
    assert!(text.contains("forwarded: `"), "{text}");

    // Session affinity: after one connection from node 1 (its underlay address), that client
    // is recorded in the kernel (nft set / xt_recent list) and traces to one endpoint.
    let sticky = r#"
apiVersion: v1
kind: Service
metadata: {name: sticky}
spec:
  selector: {app: myapp, release: stabel}
  sessionAffinity: ClientIP
  ports: [{name: http, port: 80, targetPort: 80}]
"#;
    let file = up.data_dir.path().join("sticky.yaml");
    std::fs::write(&file, sticky).unwrap();
    up.ok(&["apply", "-f", file.to_str().unwrap()]);
    let sip = up.ok(&["get", "svc", "sticky", "-o", "jsonpath={.spec.clusterIP}"]);
    let sdst = format!("{sip}:80");
    let node1 = format!("{}-node1", net.prefix);
    let client = "172.29.13.2";
    wait_for("the sticky service answers from node 1", || {
        let out = Command::new("ip")
            .args(["netns", "exec", &node1, "curl", "-s", "-m", "2"])
            .args(["--interface", client, &format!("http://{sdst}/")])
            .output()
            .unwrap();
        let body = String::from_utf8_lossy(&out.stdout).to_string();
        body.contains("pod=").then_some(body)
    });
    let v = trace_json(&up, &["--node", nodes[0], client, &sdst]);
    assert_eq!(v["packet"]["fromNode"], true, "{v:#}");
    let b = branches(&v);
    assert_eq!(b.len(), 1, "{v:#}");
    assert_eq!(b[0]["affinityHit"], true, "{v:#}");
    assert_eq!(b[0]["share"].as_f64().unwrap(), 1.0, "{v:#}");
    assert!(
        expected.contains(b[0]["endpoint"].as_str().unwrap()),
        "{v:#}"
    );
    // Another client is not recorded: spread over the three.
    assert_eq!(
        branches(&trace_json(
            &up,
            &["--node", nodes[0], "10.158.0.250", &sdst]
        ))
        .len(),
        3
    );

    // Bad input: clear usage errors, non-zero exit.
    for (args, says) in [
        (vec!["not-an-ip", dst.as_str()], "is not an IP address"),
        (vec!["10.158.0.250", cip.as_str()], "has no port"),
        (vec!["10.158.0.250", "nowhere:80"], "is not IP:PORT"),
        (
            vec!["--node", "nosuch", "10.158.0.250", dst.as_str()],
            "unknown node \"nosuch\"",
        ),
    ] {
        let out = trace(&up, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    net.stop(&mut up);
}

/// Userspace mode: the trace ends at the proxy's listener (it picks the endpoint itself).
fn check_userspace(net: &Net) {
    let dns = free_udp_port();
    let mut up = net.up_with("2", dns, &["--proxy-mode", "userspace"]);
    up.ok(&["apply", "-f", &common::example("myapp.yaml")]);
    let cip = up.ok(&["get", "svc", "myapp", "-o", "jsonpath={.spec.clusterIP}"]);
    let dst = format!("{cip}:80");
    let v = wait_for("the redirect to the userspace listener", || {
        let out = trace(&up, &["-o", "json", "10.158.0.250", &dst]);
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        (v["branches"][0]["outcome"] == "redirected").then(|| v.to_string())
    });
    let v: Value = serde_json::from_str(&v).unwrap();
    assert_eq!(v["dataplane"], "userspace", "{v:#}");
    let b = &branches(&v)[0];
    assert_eq!(branches(&v).len(), 1, "{v:#}");
    assert!(b["endpoint"].as_str().unwrap().starts_with(':'), "{b:#}");
    assert!(
        b["verdict"]
            .as_str()
            .unwrap()
            .contains("userspace proxy's listener"),
        "{b:#}"
    );
    let fe = b["frontend"].as_str().unwrap();
    assert!(fe.contains(&format!("ip daddr {cip} tcp dport 80")), "{fe}");
    let (o, why) = only_verdict(&trace_json(&up, &["10.158.0.250", &format!("{cip}:81")]));
    assert_eq!(o, "rejected");
    assert!(why.contains("no port"), "{why}");
    let (o, why) = only_verdict(&trace_json(&up, &["10.158.0.250", "10.148.255.254:80"]));
    assert_eq!(o, "dropped");
    assert!(why.contains("no service holds"), "{why}");
    net.stop(&mut up);
}

#[test]
fn trace_explains_myapp_on_two_nodes() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let net = Net {
        prefix: "e2etr",
        underlay: "172.29.13.0/24",
        pods: "10.158.0.0/16",
        services: "10.148.0.0/16",
        lb: "10.149.0.0/24",
    };
    check_mode(&net, "nftables");
    check_mode(&net, "iptables");
    check_userspace(&net);
}

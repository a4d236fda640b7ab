//! The enforcer against the real kernel, judged by the evaluator: upstream's 3×3 model in
//! network namespaces (pods on the agent's bridge), every ordered pair probed on TCP and UDP
//! 80/81, by pod IP and through a Service IP (DNAT before the policy), after each of
//! upstream's e2e cases (`network_policy.go`), with the "update" cases applied as
//! incremental changes.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use common::lab::{Lab, Proxy, Via};
use common::{blocks, policy};
use serde_json::{Value, json};
use svcnet_agent::routes::PodNetwork;
use svcnet_netns::test_support::{Session, tcp_ask, vm_guest};
use svcnet_netpol::Policy;
use svcnet_netpol_nft::names;

fn p(ns: &str, name: &str, spec: Value) -> Policy {
    policy(ns, name, spec)
}

/// Sets the policies, syncs incrementally, and checks the whole matrix both ways.
fn case(lab: &mut Lab, name: &str, policies: Vec<Policy>) {
    lab.model.policies = policies;
    check(lab, name);
}

fn check(lab: &mut Lab, name: &str) {
    let subset = subset(lab);
    if subset.is_some_and(|cases| !probed(cases, name)) {
        // Not synced either: the next probed case's sync carries this change with its own
        // (the renderer diffs models), as a burst of watch events would.
        return;
    }
    let report = lab.sync();
    assert!(!report.full, "{name}: a change must not recreate the table");
    let started = std::time::Instant::now();
    if lab.proxy == Proxy::Nft {
        lab.check(name, Via::PodIp);
        lab.check(name, Via::ServiceIp);
    } else {
        // Under IPVS a probe to a pod IP takes the path it takes under any proxy (proven on
        // the host); what IPVS changes is the Service path. (Mixing the two would also meet
        // IPVS's own connection table, which conntrack -F leaves: a pod-IP probe from the
        // source port of an earlier Service probe has its reply rewritten to the Service IP.)
        lab.check(name, Via::ServiceIp);
    }
    if subset.is_some() {
        eprintln!("case {name:?}: ok in {:.1?}", started.elapsed());
        PROBED.with(|p| p.borrow_mut().push(name.to_string()));
    }
}

thread_local! {
    /// The cases probed in the QEMU tier on this thread, so that a misspelt name in
    /// [`IPVS_CASES`] or [`IPIP_CASES`] fails instead of quietly probing less.
    static PROBED: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The cases probed under IPVS by default (the others' changes reach the kernel with the
/// next probed case's sync, so the update cases start from the right state): each hook and match the IPVS path meets — ingress and
/// egress denied and allowed by selector on one node and across two, both ends disagreeing,
/// a numeric, a named (resolved on the destination pod, after DNAT) and a ranged port, UDP,
/// an `ipBlock` destination, a pod relabelled, a policy deleted, and the last state (whose
/// table the test compares with a full sync's). The QEMU tier's emulated CPUs run this ~80×
/// slower than the host: the default set takes 2.5 min with the lab's setup, and
/// `SVCNET_NETPOL_ALL_CASES=1` probes all 48 cases (4 min; all passed).
const IPVS_CASES: &[&str] = &[
    "default-deny-ingress",
    "default-deny-all",
    "allow from pods in server namespace by podSelector",
    "ports",
    "ingress on one named port",
    "deny egress by podSelector",
    "deny egress on the client even if the server allows",
    "UDP ports",
    "endPort",
    "egress to a CIDR block",
    "deny ingress to updated pod",
    "stop enforcing after delete",
    "final",
];

/// The cases probed across nodes over Calico's IPIP by default, both through the pod IP and
/// the Service IP (DNATed on the client's node, so both paths cross `tunl0` with pod
/// addresses): ingress and egress judged on each end's node, both ends disagreeing, UDP, an
/// `ipBlock`, a policy deleted, the last state.
const IPIP_CASES: &[&str] = &[
    "default-deny-ingress",
    "allow from pods in server namespace by podSelector",
    "deny egress by podSelector",
    "deny egress on the client even if the server allows",
    "UDP ports",
    "egress to a CIDR block",
    "stop enforcing after delete",
    "final",
];

/// The cases probed under the userspace proxy by default: as under IPVS, each hook and
/// match its path meets, both ends' sides, a named port (resolved on the endpoint the proxy
/// chose), UDP, an `ipBlock`, the update cases. A UDP probe the proxy denies waits out its
/// time-out (1 s; the proxy cannot reject it): the default set takes 106 s, all 50 cases
/// took 155 s with a 500 ms wait (all passed)
/// (`SVCNET_NETPOL_ALL_CASES=1`).
const USERSPACE_CASES: &[&str] = IPVS_CASES;

/// The subset of cases a lab probes by default (in the QEMU tier its CPUs are emulated; the
/// userspace proxy's denied UDP probes wait); `None`: all.
fn subset(lab: &Lab) -> Option<&'static [&'static str]> {
    if lab.proxy == Proxy::Ipvs {
        Some(IPVS_CASES)
    } else if lab.proxy == Proxy::Userspace {
        Some(USERSPACE_CASES)
    } else if lab.network == PodNetwork::Ipip {
        Some(IPIP_CASES)
    } else {
        None
    }
}

fn probed(cases: &[&str], name: &str) -> bool {
    cases.contains(&name) || std::env::var("SVCNET_NETPOL_ALL_CASES").as_deref() == Ok("1")
}

fn label_pod(lab: &mut Lab, id: &str, key: &str, value: &str) {
    let (ns, name) = id.split_once('/').unwrap();
    let pod = lab
        .model
        .pods
        .iter_mut()
        .find(|p| p.namespace == ns && p.name == name)
        .unwrap();
    pod.labels.insert(key.into(), value.into());
}

fn pod_a_from(peer: Value) -> Value {
    json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [peer]}]})
}

#[test]
fn upstream_cases_in_the_kernel_match_the_evaluator() {
    upstream_cases(&mut Lab::new());
}

/// The same across two nodes (host-gw routes): a pair on two nodes is judged by the source's
/// node for its egress and by the destination's for its ingress.
#[test]
fn upstream_cases_across_two_nodes_match_the_evaluator() {
    upstream_cases(&mut Lab::with_nodes(2));
}

/// Under IPVS (kube-proxy's IPVS mode), which DNATs a connection to a Service IP at input and
/// sends it on from output, so that no forward hook sees it: the output chains judge it, on
/// the client's node for a pod there (both ends, when the server is there too); a server on
/// the other node has its ingress judged there in the forward hook, as with the other
/// proxies. Two nodes, so both kinds of pair. In the QEMU tier (Debian's kernel: ip_vs and
/// nf_tables for ip); skipped on the host.
#[test]
fn ipvs_upstream_cases_across_two_nodes_match_the_evaluator() {
    if vm_guest() {
        upstream_cases(&mut Lab::with(2, Proxy::Ipvs, PodNetwork::HostGw));
    }
}

/// Under svcnet's userspace proxy (privileged, as `svcnet up --proxy-mode userspace`), which
/// accepts a Service connection on the client's node and opens its own from the node's `cni0`
/// address: the proxy judges (client → the endpoint it chose) with the evaluator, the tables
/// leave its two legs to it. Two nodes (host-gw), so the proxy's connection crosses to the
/// other node for half the pairs. Through the Service IPs only: the pod-IP path is the one
/// every proxy shares.
#[test]
fn userspace_upstream_cases_across_two_nodes_match_the_evaluator() {
    upstream_cases(&mut Lab::with(2, Proxy::Userspace, PodNetwork::HostGw));
}

/// Across two nodes over Calico's IPIP pod network (`tunl0`, onlink routes via the peer's
/// underlay address): what crosses nodes is decapsulated on the server's node and judged in
/// its forward hook with the pods' own addresses, as over the other pod networks. The nftables
/// proxy (a prerouting DNAT). In the QEMU tier (this host's kernel has no `ipip`; user-mode
/// Linux has no nf_tables for ip); skipped on the host.
#[test]
fn ipip_upstream_cases_across_two_nodes_match_the_evaluator() {
    if vm_guest() {
        let mut lab = Lab::with(2, Proxy::Nft, PodNetwork::Ipip);
        upstream_cases(&mut lab);
        // The cross-node pairs went through the tunnel, not around it.
        let tunl0 = svcnet_agent::ip::ip_json(
            Some(&lab.node.netns),
            &["-s", "link", "show", "dev", "tunl0"],
        )
        .unwrap();
        let received = tunl0[0]["stats64"]["rx"]["packets"].as_u64().unwrap();
        assert!(received > 100, "tunl0 received {received} packets");
    }
}

fn upstream_cases(lab: &mut Lab) {
    assert!(lab.sync().full);
    let via = if lab.proxy == Proxy::Nft {
        Via::PodIp
    } else {
        Via::ServiceIp
    };
    lab.check("no policies", via);
    let ns_y = json!({"namespaceSelector": {"matchLabels": {"ns": "y"}}});
    let not_x = json!({"matchExpressions": [{"key": "ns", "operator": "NotIn", "values": ["x"]}]});
    let deny_all_x = || {
        p(
            "x",
            "deny-all",
            json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
        )
    };
    let cases: Vec<(&str, Vec<Policy>)> = vec![
        (
            "default-deny-ingress",
            vec![p("x", "deny-ingress", json!({"podSelector": {}}))],
        ),
        ("default-deny-all", vec![deny_all_x()]),
        (
            "allow from pods in server namespace by podSelector",
            vec![p(
                "x",
                "a-from-b",
                pod_a_from(json!({"podSelector": {"matchLabels": {"pod": "b"}}})),
            )],
        ),
        (
            "allow ingress for a target",
            vec![
                p("x", "deny-ingress", json!({"podSelector": {}})),
                p(
                    "x",
                    "target",
                    json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"ports": [{"port": 80}]}]}),
                ),
            ],
        ),
        (
            "allow ingress from pods in all namespaces",
            vec![p(
                "x",
                "all-ns",
                json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {}}]}]}),
            )],
        ),
        (
            "only from a different namespace by namespaceSelector",
            vec![p(
                "x",
                "from-y",
                json!({"podSelector": {}, "ingress": [{"from": [ns_y.clone()]}]}),
            )],
        ),
        (
            "podSelector with matchExpressions",
            vec![p(
                "x",
                "a-from-b",
                pod_a_from(
                    json!({"podSelector": {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["b"]}]}}),
                ),
            )],
        ),
        (
            "namespaceSelector with matchExpressions",
            vec![p(
                "x",
                "from-y",
                json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "In", "values": ["y"]}]}}]}]}),
            )],
        ),
        (
            "podSelector or namespaceSelector",
            vec![p(
                "x",
                "or",
                json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [
                {"namespaceSelector": not_x.clone()}, {"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
            )],
        ),
        (
            "podSelector and namespaceSelector",
            vec![p(
                "x",
                "and",
                pod_a_from(
                    json!({"namespaceSelector": not_x.clone(), "podSelector": {"matchLabels": {"pod": "b"}}}),
                ),
            )],
        ),
        (
            "multiple podSelectors and namespaceSelectors",
            vec![p(
                "x",
                "multi",
                pod_a_from(json!({"namespaceSelector": not_x.clone(),
                "podSelector": {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["b", "c"]}]}})),
            )],
        ),
        (
            "any podSelectors",
            vec![p(
                "x",
                "b-or-c",
                json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [
                {"podSelector": {"matchLabels": {"pod": "b"}}}, {"podSelector": {"matchLabels": {"pod": "c"}}}]}]}),
            )],
        ),
        (
            "only from a pod in a different namespace",
            vec![p(
                "x",
                "y-a",
                pod_a_from(
                    json!({"namespaceSelector": {"matchLabels": {"ns": "y"}}, "podSelector": {"matchLabels": {"pod": "a"}}}),
                ),
            )],
        ),
        (
            "ports",
            vec![p(
                "x",
                "port-81",
                json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [ns_y.clone()], "ports": [{"port": 81}]}]}),
            )],
        ),
        (
            "multiple stacked policies with overlapping podSelectors",
            vec![
                p(
                    "x",
                    "port-80",
                    json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [ns_y.clone()], "ports": [{"port": 80}]}]}),
                ),
                p(
                    "x",
                    "port-81",
                    json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [ns_y.clone()], "ports": [{"port": 81}]}]}),
                ),
            ],
        ),
        (
            "allow-all",
            vec![p(
                "x",
                "allow-all",
                json!({"podSelector": {}, "ingress": [{}]}),
            )],
        ),
        (
            "ingress on one named port",
            vec![p(
                "x",
                "named",
                json!({"podSelector": {}, "ingress": [{"ports": [{"port": "serve-81-tcp"}]}]}),
            )],
        ),
        (
            "ingress from namespace on one named port",
            vec![p(
                "x",
                "named-y",
                json!({"podSelector": {}, "ingress": [{"from": [ns_y.clone()], "ports": [{"port": "serve-80-tcp"}]}]}),
            )],
        ),
        (
            "egress on one named port",
            vec![p(
                "x",
                "egress-named",
                json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{"ports": [{"port": "serve-80-tcp"}]}]}),
            )],
        ),
        (
            "deny ingress from pods in other namespaces",
            vec![p(
                "x",
                "same-ns",
                json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}),
            )],
        ),
        (
            "deny egress by podSelector",
            vec![p(
                "x",
                "deny-egress-a",
                json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"]}),
            )],
        ),
        (
            "deny egress from all pods in a namespace",
            vec![p(
                "x",
                "deny-egress",
                json!({"podSelector": {}, "policyTypes": ["Egress"]}),
            )],
        ),
        (
            "ingress and egress together",
            vec![p(
                "x",
                "both",
                json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Ingress", "Egress"],
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}],
                "egress": [{"ports": [{"protocol": "UDP", "port": 53}]}]}),
            )],
        ),
        (
            "deny egress on the client even if the server allows",
            vec![
                p(
                    "x",
                    "deny-egress-a",
                    json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"]}),
                ),
                p(
                    "y",
                    "allow-all",
                    json!({"podSelector": {}, "ingress": [{}]}),
                ),
            ],
        ),
        (
            "egress to a server in another namespace by pod and namespace",
            vec![p(
                "x",
                "to-y-a",
                json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"],
                "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}, "podSelector": {"matchLabels": {"pod": "a"}}}]}]}),
            )],
        ),
        (
            "any port on a specific protocol",
            vec![p(
                "x",
                "tcp-only",
                json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"ports": [{"protocol": "TCP"}]}]}),
            )],
        ),
        (
            "multiple ingress policies with allow-all taking precedence",
            vec![
                p(
                    "x",
                    "port-80",
                    json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"ports": [{"port": 80}]}]}),
                ),
                p(
                    "x",
                    "allow-all",
                    json!({"podSelector": {}, "ingress": [{}]}),
                ),
            ],
        ),
        (
            "multiple egress policies with allow-all taking precedence",
            vec![
                p(
                    "x",
                    "port-80",
                    json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"], "egress": [{"ports": [{"port": 80}]}]}),
                ),
                p(
                    "x",
                    "allow-all",
                    json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{}]}),
                ),
            ],
        ),
        (
            "ingress and egress controlled independently",
            vec![p(
                "x",
                "not-to-b",
                json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"],
                "egress": [{"to": [{"podSelector": {"matchExpressions": [{"key": "pod", "operator": "NotIn", "values": ["b"]}]}}]}]}),
            )],
        ),
        (
            "SCTP is not treated as TCP",
            vec![p(
                "x",
                "sctp-only",
                json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"ports": [{"protocol": "SCTP", "port": 80}]}]}),
            )],
        ),
        (
            "UDP-only policy does not allow TCP",
            vec![p(
                "x",
                "udp-81",
                json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"ports": [{"protocol": "UDP", "port": 81}]}]}),
            )],
        ),
        (
            "namespaceSelector matchLabels on the default namespace label",
            vec![p(
                "x",
                "by-name",
                json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "y"}}}]}]}),
            )],
        ),
        (
            "namespaceSelector matchExpressions on the default namespace label",
            vec![p(
                "x",
                "by-name-expr",
                json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"],
                "egress": [{"to": [{"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["y"]}]}}]}]}),
            )],
        ),
        (
            "UDP ports",
            vec![p(
                "x",
                "udp-81-from-y",
                json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [ns_y.clone()], "ports": [{"protocol": "UDP", "port": 81}]}]}),
            )],
        ),
        (
            "endPort",
            vec![p(
                "x",
                "80-81",
                json!({"podSelector": {}, "ingress": [{"ports": [{"port": 80, "endPort": 81}, {"protocol": "UDP", "port": 79, "endPort": 80}]}]}),
            )],
        ),
    ];
    for (name, policies) in cases {
        case(lab, name, policies);
    }

    // ipBlock cases, with the pods' real addresses.
    let xb = lab.pod("x/b").ip;
    let node_cidr = lab.node.pod_cidr.to_string();
    let to_xb = || {
        p(
            "x",
            "to-x-b",
            json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"],
            "egress": [{"to": [{"ipBlock": {"cidr": format!("{xb}/32")}}]}]}),
        )
    };
    let except_xb = p(
        "x",
        "except-x-b",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Egress"],
        "egress": [{"to": [{"ipBlock": {"cidr": node_cidr, "except": [format!("{xb}/32")]}}]}]}),
    );
    case(lab, "egress to a CIDR block", vec![to_xb()]);
    case(lab, "except clause", vec![except_xb.clone()]);
    case(
        lab,
        "IP in both CIDR and except is allowed by a second policy",
        vec![except_xb, to_xb()],
    );
    case(
        lab,
        "ingress from a CIDR block",
        vec![p(
            "y",
            "from-x-b",
            json!({"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": format!("{xb}/32")}}], "ports": [{"port": 80, "endPort": 81}]}]}),
        )],
    );

    // The update cases: one object changes, the kernel follows incrementally.
    case(
        lab,
        "policy before update",
        vec![p(
            "x",
            "mutate",
            json!({"podSelector": {}, "ingress": [{}]}),
        )],
    );
    case(
        lab,
        "enforce updated policy",
        vec![p("x", "mutate", json!({"podSelector": {}, "ingress": []}))],
    );
    case(
        lab,
        "before namespace label",
        vec![p(
            "x",
            "ns2",
            pod_a_from(json!({"namespaceSelector": {"matchLabels": {"ns2": "updated"}}})),
        )],
    );
    let y = lab
        .model
        .namespaces
        .iter_mut()
        .find(|n| n.name == "y")
        .unwrap();
    y.labels.insert("ns2".into(), "updated".into());
    check(lab, "ingress from updated namespace");
    case(
        lab,
        "before pod label",
        vec![p(
            "x",
            "pod2",
            pod_a_from(json!({"podSelector": {"matchLabels": {"pod2": "updated"}}})),
        )],
    );
    label_pod(lab, "x/b", "pod2", "updated");
    check(lab, "ingress from updated pod");
    case(
        lab,
        "before target label",
        vec![p(
            "x",
            "isolate",
            json!({"podSelector": {"matchLabels": {"target": "isolated"}}, "policyTypes": ["Ingress"]}),
        )],
    );
    label_pod(lab, "x/a", "target", "isolated");
    check(lab, "deny ingress to updated pod");
    case(lab, "before delete", vec![deny_all_x()]);
    case(lab, "stop enforcing after delete", vec![]);

    // What the incremental changes left equals what one full sync makes.
    let exec = lab.enforcer.executor().clone();
    case(
        lab,
        "final",
        vec![
            deny_all_x(),
            p(
                "y",
                "from-x",
                json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "x"}}}]}]}),
            ),
        ],
    );
    let incremental = exec
        .list_table(names::FAMILY, names::TABLE)
        .unwrap()
        .unwrap();
    lab.enforcer.invalidate();
    assert!(lab.sync().full);
    let full = exec
        .list_table(names::FAMILY, names::TABLE)
        .unwrap()
        .unwrap();
    assert_eq!(blocks(&incremental), blocks(&full));
    assert!(lab.enforcer.cleanup().unwrap());
    assert!(!lab.enforcer.cleanup().unwrap());
    if let Some(cases) = subset(lab) {
        let probed = PROBED.with(|p| p.borrow().clone());
        for name in cases {
            assert!(probed.iter().any(|p| p == name), "no case {name:?}");
        }
    }
}

#[test]
fn established_connections_survive_a_new_deny_new_ones_do_not() {
    let mut lab = Lab::new();
    lab.cut_denied = Some(false);
    lab.sync();
    let server = SocketAddr::new(IpAddr::V4(lab.pod("x/a").ip), 80);
    let client = svcnet_netns::NetNs::open(lab.pod("y/b").netns.name()).unwrap();
    // A session opened before the policy, kept open on a thread inside the client.
    let (ask, answers) = std::sync::mpsc::channel::<()>();
    let (tell, replies) = std::sync::mpsc::channel::<bool>();
    let t = std::time::Duration::from_secs(2);
    let session = client
        .spawn(move || {
            let mut s = Session::connect(server, t).unwrap();
            while answers.recv().is_ok() {
                let _ = tell.send(s.ask().is_ok());
            }
        })
        .unwrap();
    ask.send(()).unwrap();
    assert!(replies.recv().unwrap());
    lab.model.policies = vec![p("x", "deny-ingress", json!({"podSelector": {}}))];
    lab.sync();
    ask.send(()).unwrap();
    assert!(
        replies.recv_timeout(Duration::from_secs(5)).unwrap(),
        "the established session was cut"
    );
    let fresh = client.run(move || tcp_ask(server, t)).unwrap();
    assert!(
        fresh.is_err(),
        "a new connection passed the deny: {fresh:?}"
    );
    drop(ask);
    session.join().unwrap();
}

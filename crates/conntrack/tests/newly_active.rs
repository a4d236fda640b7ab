//! UDP conntrack when a service goes from no endpoints to some, against the REAL kernel. A
//! client that sent to a node port before anything DNATed it has a conntrack entry without
//! NAT (the datagram was delivered to the node itself); the kernel keeps matching its later
//! datagrams to that entry, so they bypass the new DNAT rules until the entry times out. The
//! cleanup of "newly active" services deletes it and the very same socket reaches the backend.
//! Needs root (CI runs as root); namespaces are removed on drop.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use svcnet_conntrack::{clear_stale, delete_args};
use svcnet_netns::test_support::{Lab, NODE_IP, udp_ask_with};
use svcnet_nft::{Family, FullMode, NftExecutor, Renderer};
use svcnet_proxy::fixtures::*;
use svcnet_proxy::{CoreConfig, IpFamily, ProxyState, StaleConntrack};

#[test]
fn delete_args_without_an_endpoint_match_every_entry_of_the_frontend() {
    let all = StaleConntrack {
        family: IpFamily::V4,
        frontend_ip: Some("10.96.0.10".parse().unwrap()),
        frontend_port: 53,
        endpoint: None,
    };
    assert_eq!(
        delete_args(&all).join(" "),
        "-D -p udp --orig-dst 10.96.0.10 --orig-port-dst 53"
    );
    let node_port = StaleConntrack {
        family: IpFamily::V6,
        frontend_ip: None,
        frontend_port: 30053,
        endpoint: Some("fd00:244:1::2".parse().unwrap()),
    };
    assert_eq!(
        delete_args(&node_port).join(" "),
        "-D -f ipv6 -p udp --orig-port-dst 30053 --dst-nat fd00:244:1::2"
    );
}

fn conntrack_entries(lab: &Lab, port: u16) -> String {
    // `conntrack -L` prints the entries on stdout and a summary on stderr; exit 0 either way.
    let out = svcnet_netns::command(Some(lab.node.name()), "conntrack")
        .args(["-L", "-p", "udp", "--orig-port-dst", &port.to_string()])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn udp_node_port_reaches_the_backend_once_the_service_becomes_active() {
    let mut lab = Lab::new().expect("creating namespaces needs root");
    lab.add_pod().unwrap();
    lab.external().unwrap();
    let _backend = lab.serve_udp(0, 5353, "b1").unwrap();
    let exec = NftExecutor::new(Some(lab.node.name().to_string()));
    let mut state = ProxyState::new(CoreConfig {
        node_name: "n1".into(),
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        ..Default::default()
    });
    let mut r = Renderer::new(Family::Ip);
    let plan = r.plan_full(&state.desired(IpFamily::V4), FullMode::Recreate);
    exec.apply(&plan.tx).unwrap();
    r.commit(plan);

    // Before the service exists, a client keeps one socket and sends to the node port: the
    // node itself receives the datagrams (nothing listens, no answer) and conntrack records
    // the flow without NAT.
    let node_port: SocketAddr = SocketAddr::from((NODE_IP, 30053));
    let ext = lab.external().unwrap();
    let sock = ext.run(|| UdpSocket::bind("0.0.0.0:0").unwrap()).unwrap();
    let short = Duration::from_millis(300);
    assert!(udp_ask_with(&sock, node_port, short).is_err());
    let entries = conntrack_entries(&lab, 30053);
    assert!(
        entries.contains("UNREPLIED") && !entries.contains("dport=5353"),
        "expected an un-NATed entry: {entries}"
    );

    // The service appears with an endpoint: rules programmed (a partial sync).
    state
        .update_service(&service("kube-system", "dns", |s| {
            s.cluster_ip(&["10.96.0.10"])
                .node_port("dns", "UDP", 53, 30053);
        }))
        .unwrap();
    state.update_slice(&slice("kube-system", "dns-1", "dns", |s| {
        s.port("dns", "UDP", 5353)
            .endpoint(&lab.pod(0).ipv4.to_string(), "n1", |_| {});
    }));
    let changes = state.take_changes();
    let desired = state.desired_for(IpFamily::V4, changes.services.keys());
    let plan = r
        .plan_partial(&state.node_state(IpFamily::V4), &desired)
        .unwrap();
    exec.apply(&plan.tx).unwrap();
    r.commit(plan);

    // The old entry still captures the client's datagrams: the rules alone do not help it.
    assert!(
        udp_ask_with(&sock, node_port, short).is_err(),
        "the stale entry should still black-hole the flow before the cleanup"
    );

    // The cleanup of the newly active service deletes it; the same socket now reaches b1.
    let stale = state.stale_conntrack(&changes);
    assert!(
        stale
            .iter()
            .any(|s| s.frontend_ip.is_none() && s.frontend_port == 30053 && s.endpoint.is_none()),
        "{stale:?}"
    );
    let deleted = clear_stale(Some(lab.node.name()), &stale).unwrap();
    assert!(deleted >= 1, "nothing deleted: {stale:?}");
    let reply = udp_ask_with(&sock, node_port, Duration::from_secs(2)).unwrap();
    assert_eq!(reply.identity, "b1");
    let entries = conntrack_entries(&lab, 30053);
    assert!(entries.contains("sport=5353"), "now DNATed: {entries}");
}

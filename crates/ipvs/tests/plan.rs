//! Plans as values, on the fake IPVS table (pure, any host): graceful termination (a removed
//! TCP endpoint drains at weight 0, a UDP one is deleted), partial renders that touch only the
//! changed service, idempotence, and the algorithm fallback IPVS reports (random → rr).
#![allow(clippy::unwrap_used)]

mod common;

use svcnet_flows::{NODE, TCP_PORT, UDP_PORT, pod_ip, world};
use svcnet_ipvs::plan::diff_servers;
use svcnet_ipvs::{FakeIpvs, Ipvs};
use svcnet_proxy::fixtures::{service, slice};
use svcnet_proxy::{Algorithm, IpFamily};

#[test]
fn removed_endpoints_drain_over_tcp_and_go_at_once_over_udp() {
    let mut state = world();
    state.take_changes();
    let mut r = common::renderer();
    let first = r.render_all(&state.desired(IpFamily::V4));
    let (ops, applied, _) = diff_servers(&Default::default(), &first.servers);
    let mut fake = FakeIpvs::new();
    fake.apply(&ops).unwrap();
    // web loses p3, dns loses p2.
    state.update_slice(&slice("default", "web-1", "web", |b| {
        b.port("http", "TCP", TCP_PORT as i32)
            .endpoint(&pod_ip(1).to_string(), NODE, |_| {})
            .endpoint(&pod_ip(2).to_string(), "n2", |_| {});
    }));
    state.update_slice(&slice("kube-system", "dns-1", "dns", |b| {
        b.port("dns", "UDP", UDP_PORT as i32)
            .endpoint(&pod_ip(1).to_string(), NODE, |_| {});
    }));
    let changes = state.take_changes();
    let f = IpFamily::V4;
    let next = r.render_changes(
        &state.node_state(f),
        &state.desired_for(f, changes.services.keys()),
    );
    let (ops, after, drains) = diff_servers(&applied, &next.servers);
    let text: Vec<String> = ops.iter().map(ToString::to_string).collect();
    assert_eq!(
        text,
        [
            "-e -t 10.96.0.10:80 -r 10.244.3.2:8080 -m -w 0",
            "-d -u 10.96.0.20:53 -r 10.244.2.2:5353",
        ],
        "only the changed services' real servers"
    );
    assert_eq!(drains.len(), 1);
    fake.apply(&ops).unwrap();
    // The draining real server stays (weight 0) in the model; the same desired state again
    // changes nothing.
    let (again, _, _) = diff_servers(&after, &next.servers);
    assert!(again.is_empty(), "{again:?}");
    assert!(
        fake.dump()
            .contains("-a -t 10.96.0.10:80 -r 10.244.3.2:8080 -m -w 0\n")
    );
    // The endpoint comes back: weight 1 again, not a second real server.
    state.update_slice(&slice("default", "web-1", "web", |b| {
        b.port("http", "TCP", TCP_PORT as i32);
        for i in 1..=3 {
            b.endpoint(
                &pod_ip(i).to_string(),
                if i == 1 { NODE } else { "n2" },
                |_| {},
            );
        }
    }));
    let changes = state.take_changes();
    let back = r.render_changes(
        &state.node_state(f),
        &state.desired_for(f, changes.services.keys()),
    );
    let (ops, _, _) = diff_servers(&after, &back.servers);
    let text: Vec<String> = ops.iter().map(ToString::to_string).collect();
    assert_eq!(text, ["-e -t 10.96.0.10:80 -r 10.244.3.2:8080 -m -w 1"]);
    fake.apply(&ops).unwrap();
}

#[test]
fn random_falls_back_to_rr_with_the_report_and_maglev_is_mh() {
    let mut state = svcnet_proxy::ProxyState::new(svcnet_flows::config());
    for (name, ip, algo) in [("r", "10.96.0.50", "random"), ("m", "10.96.0.51", "maglev")] {
        let mut svc = service("default", name, |b| {
            b.cluster_ip(&[ip]).port("", "TCP", 80);
        });
        svc.metadata.annotations = Some(
            [(
                svcnet_proxy::algorithm::ANNOTATION.to_string(),
                algo.to_string(),
            )]
            .into_iter()
            .collect(),
        );
        state.update_service(&svc).unwrap();
        state.update_slice(&slice("default", &format!("{name}-1"), name, |b| {
            b.port("", "TCP", TCP_PORT as i32)
                .endpoint(&pod_ip(1).to_string(), NODE, |_| {});
        }));
    }
    let mut r = common::renderer();
    let rendered = r.render_all(&state.desired(IpFamily::V4));
    let fallbacks = r.fallbacks(None);
    assert_eq!(fallbacks.len(), 1, "{fallbacks:?}");
    let (spn, fb) = &fallbacks[0];
    assert_eq!(spn.service.name, "r");
    assert_eq!(
        (fb.requested, fb.used),
        (Algorithm::Random, Algorithm::RoundRobin)
    );
    let sched = |ip: &str| {
        let key = svcnet_ipvs::ServiceKey::new(svcnet_ipvs::Protocol::Tcp, ip.parse().unwrap(), 80);
        rendered.servers[&key].service.to_string()
    };
    assert_eq!(sched("10.96.0.50"), "-t 10.96.0.50:80 -s rr");
    assert_eq!(
        sched("10.96.0.51"),
        "-t 10.96.0.51:80 -s mh -b mh-fallback,mh-port"
    );
}

/// The companion rules and the ipset text of the flows world, as applied (the kernel tier
/// runs them; this pins their shape on any host).
#[test]
fn companion_rules_and_ipsets() {
    let mut r = common::renderer();
    let rendered = r.render_all(&world().desired(IpFamily::V4));
    let rules = svcnet_ipvs::rules::payload(&rendered, IpFamily::V4).to_string();
    for line in [
        "-A SVCIPVS-MARK-MASQ -j CONNMARK --set-xmark 0x4000/0x4000",
        "-A SVCIPVS-SERVICES -m set --match-set SVCIPVS-MASQ-OFF-CLUSTER dst,dst -m set ! --match-set SVCIPVS-CLUSTER-CIDRS src -j SVCIPVS-MARK-MASQ",
        "-A SVCIPVS-POSTROUTING -m set --match-set SVCIPVS-LOOP-BACK dst,dst,src -j MASQUERADE",
        "-A SVCIPVS-FILTER -m conntrack --ctstate NEW -m set --match-set SVCIPVS-VIPS dst -m set ! --match-set SVCIPVS-FRONTENDS dst,dst -j REJECT --reject-with icmp-port-unreachable",
        "-A SVCIPVS-FORWARD -d 10.96.0.0/12 -j DROP",
        // The affinity port's frontends share one mark; its persistent server's port is set.
        "-A SVCIPVS-MARK -m conntrack --ctstate NEW -d 10.96.0.19 -p tcp -m tcp --dport 80 -j MARK --set-mark 0x53000002",
        "-A SVCIPVS-PORTS -p tcp -m mark --mark 0x53000002 -j DNAT --to-destination :8080",
    ] {
        assert!(rules.lines().any(|l| l == line), "{line}\nnot in\n{rules}");
    }
    let sets = svcnet_ipvs::plan::ipset_text(IpFamily::V4, None, &rendered);
    for line in [
        "create SVCIPVS-VIPS hash:ip family inet -exist",
        "add SVCIPVS-LOOP-BACK-T 10.244.1.2,tcp:8080,10.244.1.2 -exist",
        "add SVCIPVS-DROP-T 192.168.50.1,tcp:30082 -exist",
        "add SVCIPVS-LB-ALLOW-T 203.0.113.7,tcp:80,192.168.50.0/24 -exist",
        "swap SVCIPVS-VIPS SVCIPVS-VIPS-T",
    ] {
        assert!(sets.lines().any(|l| l == line), "{line}\nnot in\n{sets}");
    }
}

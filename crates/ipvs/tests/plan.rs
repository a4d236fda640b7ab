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

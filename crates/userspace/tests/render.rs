//! Pure tests: routes from the desired state and the privileged-mode nftables transaction.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;

use common::*;
use expect_test::expect;
use svcnet_lb::Algorithm;
use svcnet_proxy::IpFamily;
use svcnet_proxy::fixtures::*;
use svcnet_userspace::Mode;
use svcnet_userspace::rules::{NodeChecks, render};
use svcnet_userspace::table::{Bind, Class, routes};

fn objects() -> Vec<svcnet_proxy::DesiredFamily> {
    let web = service("default", "web", |s| {
        s.type_("LoadBalancer")
            .cluster_ip(&["10.96.0.10"])
            .node_port("http", "TCP", 80, 30080)
            .external_ips(&["192.168.50.10"])
            .lb_ingress(&["192.168.50.20"])
            .source_ranges(&["192.168.50.0/28"]);
    });
    let dns = annotate(
        service("default", "dns", |s| {
            s.cluster_ip(&["10.96.0.11"]).port("dns", "UDP", 53);
        }),
        "maglev",
    );
    let empty = service("default", "empty", |s| {
        s.cluster_ip(&["10.96.0.12"]).port("http", "TCP", 80);
    });
    let slices = [
        slice("default", "web-1", "web", |s| {
            s.port("http", "TCP", 8080)
                .endpoint("10.244.1.2", NODE, |_| {})
                .endpoint("10.244.2.2", "n2", |_| {});
        }),
        slice("default", "dns-1", "dns", |s| {
            s.port("dns", "UDP", 5353)
                .endpoint("10.244.1.2", NODE, |_| {});
        }),
    ];
    desired(&[web, dns, empty], &slices)
}

#[test]
fn routes_carry_frontends_endpoints_and_algorithm() {
    let r = routes(&objects(), &Mode::Privileged);
    let summary: Vec<String> = r
        .iter()
        .map(|r| {
            format!(
                "{} {:?} {} eps={} fronts={} listeners={:?}",
                r.key.service,
                r.key.class,
                r.algorithm,
                r.endpoints.len(),
                r.frontends.len(),
                r.listeners.iter().map(|l| l.bind).collect::<Vec<_>>()
            )
        })
        .collect();
    expect![[r#"
        default/dns/udp/dns Internal maglev eps=1 fronts=1 listeners=[Ephemeral(V4)]
        default/empty/tcp/http Internal rr eps=0 fronts=1 listeners=[]
        default/web/tcp/http Internal rr eps=2 fronts=1 listeners=[Ephemeral(V4)]
        default/web/tcp/http External rr eps=2 fronts=3 listeners=[Ephemeral(V4)]"#]]
    .assert_eq(&summary.join("\n"));
    let dns = r
        .iter()
        .find(|r| r.key.service.service.name == "dns")
        .unwrap();
    assert_eq!(dns.algorithm, Algorithm::Maglev);
    // Unprivileged: every frontend address bound directly, node ports on the given addresses.
    let r = routes(
        &objects(),
        &Mode::Unprivileged {
            node_port_addresses: vec!["127.0.0.1".parse().unwrap()],
        },
    );
    let web_ext = r
        .iter()
        .find(|r| r.key.service.service.name == "web" && r.key.class == Class::External)
        .unwrap();
    let binds: Vec<Bind> = web_ext.listeners.iter().map(|l| l.bind).collect();
    assert_eq!(
        binds,
        [
            Bind::Exact("192.168.50.10:80".parse().unwrap()),
            Bind::Exact("192.168.50.20:80".parse().unwrap()),
            Bind::Exact("127.0.0.1:30080".parse().unwrap()),
        ]
    );
}

#[test]
fn privileged_rules_redirect_frontends_and_refuse_empty_services() {
    let specs = routes(&objects(), &Mode::Privileged);
    let ports: BTreeMap<_, _> = specs
        .iter()
        .filter(|s| !s.listeners.is_empty())
        .enumerate()
        .map(|(i, s)| (s.key.clone(), 40_000 + i as u16))
        .collect();
    expect![[r#"
        table ip svcnet-userspace {}
        flush table ip svcnet-userspace
        table ip svcnet-userspace {
        	chain frontends {
        		ip daddr 10.96.0.11 udp dport 53 redirect to :40000
        		ip daddr 10.96.0.10 tcp dport 80 redirect to :40001
        		ip daddr 192.168.50.10 tcp dport 80 redirect to :40002
        		ip daddr 192.168.50.20 tcp dport 80 redirect to :40002
        		fib daddr type local tcp dport 30080 redirect to :40002
        	}
        	chain no-endpoints {
        		ip daddr 10.96.0.12 tcp dport 80 reject with tcp reset
        		ip daddr 192.168.50.20 tcp dport 80 ip saddr != { 192.168.50.0/28 } drop
        	}
        	chain cluster-ips-check {
        		ip daddr { 10.96.0.10, 10.96.0.11, 10.96.0.12 } reject
        		ip daddr { 127.96.0.0/16, 10.96.0.0/12 } drop
        	}
        	chain nat-prerouting {
        		type nat hook prerouting priority -100; policy accept;
        		jump frontends
        	}
        	chain nat-output {
        		type nat hook output priority -100; policy accept;
        		jump frontends
        	}
        	chain filter-prerouting {
        		type filter hook prerouting priority -110; policy accept;
        		jump no-endpoints
        	}
        	chain filter-output {
        		type filter hook output priority -110; policy accept;
        		jump no-endpoints
        	}
        	chain filter-forward {
        		type filter hook forward priority -110; policy accept;
        		jump cluster-ips-check
        	}
        	chain filter-output-post-dnat {
        		type filter hook output priority -90; policy accept;
        		jump cluster-ips-check
        	}
        }
    "#]]
    .assert_eq(&render(
        IpFamily::V4,
        &specs,
        &ports,
        &NodeChecks::of(&objects()[0]),
    ));
}

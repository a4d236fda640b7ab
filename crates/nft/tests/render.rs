//! Snapshot tests of the rendered ruleset and of each partial sync's transaction, each applied
//! to `FakeNft` (which rejects dangling references), plus the property that partial syncs
//! converge to exactly what a fresh full sync produces.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use common::{config, full};
use expect_test::{Expect, expect};
use svcnet_nft::render::STANDING_LEN;
use svcnet_nft::{FakeNft, Family, FullMode, Renderer};
use svcnet_proxy::fixtures::*;
use svcnet_proxy::{IpFamily, ProxyState};

fn web_state() -> ProxyState {
    let mut s = ProxyState::new(config());
    s.update_service(&service("default", "web", |s| {
        s.cluster_ip(&["10.96.0.10"]).port("http", "TCP", 80);
    }))
    .unwrap();
    s.update_slice(&slice("default", "web-1", "web", |s| {
        s.port("http", "TCP", 8080)
            .endpoint("10.244.1.2", "n1", |_| {})
            .endpoint("10.244.2.2", "n2", |_| {});
    }));
    s
}

/// A partial sync of the state's changes: snapshots its transaction and checks it converges
/// to a fresh full sync.
fn partial(state: &mut ProxyState, r: &mut Renderer, fake: &mut FakeNft, expect: Expect) {
    let tx = common::partial(state, r, fake, None);
    expect.assert_eq(&tx.to_string());
    common::assert_converged(state, r, fake);
}

#[test]
fn full_ruleset_cluster_ip() {
    let (_, fake, text) = full(&web_state(), None);
    expect![[r#"
        add table ip svcnet
        delete table ip svcnet
        add table ip svcnet { comment "svcnet service proxy" ; }
        add set ip svcnet cluster-ips { type ipv4_addr ; }
        add map ip svcnet sc-backends-tcp { typeof ip daddr . meta l4proto . th dport . numgen random mod 1 : ip daddr . tcp dport ; }
        add map ip svcnet sc-backends-udp { typeof ip daddr . meta l4proto . th dport . numgen random mod 1 : ip daddr . udp dport ; }
        add map ip svcnet sc-backends-sctp { typeof ip daddr . meta l4proto . th dport . numgen random mod 1 : ip daddr . sctp dport ; }
        add map ip svcnet np-sc-backends-tcp { typeof meta l4proto . th dport . numgen random mod 1 : ip daddr . tcp dport ; }
        add map ip svcnet np-sc-backends-udp { typeof meta l4proto . th dport . numgen random mod 1 : ip daddr . udp dport ; }
        add map ip svcnet np-sc-backends-sctp { typeof meta l4proto . th dport . numgen random mod 1 : ip daddr . sctp dport ; }
        add map ip svcnet backends-tcp { typeof ip daddr . meta l4proto . th dport . numgen random mod 1 : ip daddr . tcp dport ; }
        add map ip svcnet backends-udp { typeof ip daddr . meta l4proto . th dport . numgen random mod 1 : ip daddr . udp dport ; }
        add map ip svcnet backends-sctp { typeof ip daddr . meta l4proto . th dport . numgen random mod 1 : ip daddr . sctp dport ; }
        add map ip svcnet np-backends-tcp { typeof meta l4proto . th dport . numgen random mod 1 : ip daddr . tcp dport ; }
        add map ip svcnet np-backends-udp { typeof meta l4proto . th dport . numgen random mod 1 : ip daddr . udp dport ; }
        add map ip svcnet np-backends-sctp { typeof meta l4proto . th dport . numgen random mod 1 : ip daddr . sctp dport ; }
        add set ip svcnet masq-always { typeof ip daddr . meta l4proto . th dport ; }
        add set ip svcnet masq-off-cluster { typeof ip daddr . meta l4proto . th dport ; }
        add set ip svcnet masq-local-source { typeof ip daddr . meta l4proto . th dport ; }
        add set ip svcnet no-endpoint-reject { typeof ip daddr . meta l4proto . th dport ; }
        add set ip svcnet no-endpoint-drop { typeof ip daddr . meta l4proto . th dport ; }
        add set ip svcnet local-refuse-reject { typeof ip daddr . meta l4proto . th dport ; }
        add set ip svcnet local-refuse-drop { typeof ip daddr . meta l4proto . th dport ; }
        add set ip svcnet np-masq-always { typeof meta l4proto . th dport ; }
        add set ip svcnet np-masq-off-cluster { typeof meta l4proto . th dport ; }
        add set ip svcnet np-masq-local-source { typeof meta l4proto . th dport ; }
        add set ip svcnet np-no-endpoint-reject { typeof meta l4proto . th dport ; }
        add set ip svcnet np-no-endpoint-drop { typeof meta l4proto . th dport ; }
        add set ip svcnet np-local-refuse-reject { typeof meta l4proto . th dport ; }
        add set ip svcnet np-local-refuse-drop { typeof meta l4proto . th dport ; }
        add set ip svcnet firewall { typeof ip daddr . meta l4proto . th dport ; }
        add set ip svcnet firewall-allow { typeof ip daddr . meta l4proto . th dport . ip saddr ; flags interval ; }
        add set ip svcnet hairpin { typeof ip saddr . ip daddr ; }
        add map ip svcnet sc-aff { type ipv4_addr . inet_proto . inet_service : verdict ; }
        add map ip svcnet np-sc-aff { type inet_proto . inet_service : verdict ; }
        add map ip svcnet svc-aff { type ipv4_addr . inet_proto . inet_service : verdict ; }
        add map ip svcnet np-aff { type inet_proto . inet_service : verdict ; }
        add map ip svcnet aff-record { type ipv4_addr . inet_proto . inet_service : verdict ; }
        add map ip svcnet np-aff-record { type inet_proto . inet_service : verdict ; }
        add set ip svcnet svc-n1 { typeof ip daddr . meta l4proto . th dport ; }
        add set ip svcnet svc-n2 { typeof ip daddr . meta l4proto . th dport ; }
        add set ip svcnet svc-n3 { typeof ip daddr . meta l4proto . th dport ; }
        add set ip svcnet svc-n4 { typeof ip daddr . meta l4proto . th dport ; }
        add set ip svcnet svc-n5 { typeof ip daddr . meta l4proto . th dport ; }
        add set ip svcnet svc-n6 { typeof ip daddr . meta l4proto . th dport ; }
        add set ip svcnet svc-n7 { typeof ip daddr . meta l4proto . th dport ; }
        add set ip svcnet svc-n8 { typeof ip daddr . meta l4proto . th dport ; }
        add chain ip svcnet masquerading
        add chain ip svcnet services
        add chain ip svcnet affinity-record
        add chain ip svcnet firewall-check
        add chain ip svcnet endpoints-check
        add chain ip svcnet output-endpoints-check
        add chain ip svcnet cluster-ips-check
        add chain ip svcnet filter-prerouting { type filter hook prerouting priority -110 ; }
        add chain ip svcnet filter-input { type filter hook input priority -110 ; }
        add chain ip svcnet filter-forward { type filter hook forward priority -110 ; }
        add chain ip svcnet filter-output { type filter hook output priority -110 ; }
        add chain ip svcnet filter-output-post-dnat { type filter hook output priority -90 ; }
        add chain ip svcnet affinity-prerouting { type filter hook prerouting priority -99 ; }
        add chain ip svcnet affinity-output { type filter hook output priority -99 ; }
        add chain ip svcnet nat-prerouting { type nat hook prerouting priority -100 ; }
        add chain ip svcnet nat-output { type nat hook output priority -100 ; }
        add chain ip svcnet nat-postrouting { type nat hook postrouting priority 100 ; }
        add chain ip svcnet masquerading { meta mark & 0x4000 == 0 return ; meta mark set meta mark ^ 0x4000 ; masquerade fully-random ; }
        add chain ip svcnet services { ip daddr . meta l4proto . th dport @masq-always meta mark set meta mark | 0x4000 ; ip saddr != { 10.244.0.0/16 } ip daddr . meta l4proto . th dport @masq-off-cluster meta mark set meta mark | 0x4000 ; fib saddr type local ip daddr . meta l4proto . th dport @masq-local-source meta mark set meta mark | 0x4000 ; fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport @np-masq-always meta mark set meta mark | 0x4000 ; ip saddr != { 10.244.0.0/16 } fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport @np-masq-off-cluster meta mark set meta mark | 0x4000 ; fib saddr type local fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport @np-masq-local-source meta mark set meta mark | 0x4000 ; ip saddr { 10.244.0.0/16 } ip daddr . meta l4proto . th dport vmap @sc-aff ; fib saddr type local ip daddr . meta l4proto . th dport vmap @sc-aff ; ip saddr { 10.244.0.0/16 } fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @np-sc-aff ; fib saddr type local fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @np-sc-aff ; ip daddr . meta l4proto . th dport vmap @svc-aff ; meta l4proto tcp ip daddr . meta l4proto . th dport @svc-n1 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 1 map @backends-tcp ; meta l4proto udp ip daddr . meta l4proto . th dport @svc-n1 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 1 map @backends-udp ; meta l4proto tcp ip daddr . meta l4proto . th dport @svc-n2 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @backends-tcp ; meta l4proto udp ip daddr . meta l4proto . th dport @svc-n2 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @backends-udp ; meta l4proto tcp ip daddr . meta l4proto . th dport @svc-n3 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 3 map @backends-tcp ; meta l4proto udp ip daddr . meta l4proto . th dport @svc-n3 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 3 map @backends-udp ; meta l4proto tcp ip daddr . meta l4proto . th dport @svc-n4 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 4 map @backends-tcp ; meta l4proto udp ip daddr . meta l4proto . th dport @svc-n4 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 4 map @backends-udp ; meta l4proto tcp ip daddr . meta l4proto . th dport @svc-n5 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 5 map @backends-tcp ; meta l4proto udp ip daddr . meta l4proto . th dport @svc-n5 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 5 map @backends-udp ; meta l4proto tcp ip daddr . meta l4proto . th dport @svc-n6 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 6 map @backends-tcp ; meta l4proto udp ip daddr . meta l4proto . th dport @svc-n6 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 6 map @backends-udp ; meta l4proto tcp ip daddr . meta l4proto . th dport @svc-n7 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 7 map @backends-tcp ; meta l4proto udp ip daddr . meta l4proto . th dport @svc-n7 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 7 map @backends-udp ; meta l4proto tcp ip daddr . meta l4proto . th dport @svc-n8 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 8 map @backends-tcp ; meta l4proto udp ip daddr . meta l4proto . th dport @svc-n8 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 8 map @backends-udp ; fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @np-aff ; }
        add chain ip svcnet affinity-record { meta l4proto tcp ct state new ct status dnat ct original ip daddr . meta l4proto . ct original proto-dst vmap @aff-record ; meta l4proto udp ct state new ct status dnat ct original ip daddr . meta l4proto . ct original proto-dst vmap @aff-record ; meta l4proto tcp ct state new ct status dnat ct original ip daddr != @cluster-ips meta l4proto . ct original proto-dst vmap @np-aff-record ; meta l4proto udp ct state new ct status dnat ct original ip daddr != @cluster-ips meta l4proto . ct original proto-dst vmap @np-aff-record ; }
        add chain ip svcnet firewall-check { ip daddr . meta l4proto . th dport @firewall ip daddr . meta l4proto . th dport . ip saddr != @firewall-allow drop ; }
        add chain ip svcnet endpoints-check { ip daddr . meta l4proto . th dport @no-endpoint-reject reject ; ip daddr . meta l4proto . th dport @no-endpoint-drop drop ; ip daddr . meta l4proto . th dport @local-refuse-reject reject ; ip daddr . meta l4proto . th dport @local-refuse-drop drop ; fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport @np-no-endpoint-reject reject ; fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport @np-no-endpoint-drop drop ; fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport @np-local-refuse-reject reject ; fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport @np-local-refuse-drop drop ; }
        add chain ip svcnet output-endpoints-check { ip daddr . meta l4proto . th dport @no-endpoint-reject reject ; ip daddr . meta l4proto . th dport @no-endpoint-drop drop ; fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport @np-no-endpoint-reject reject ; fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport @np-no-endpoint-drop drop ; }
        add chain ip svcnet cluster-ips-check { ip daddr @cluster-ips reject ; ip daddr { 10.96.0.0/12 } drop ; }
        add chain ip svcnet filter-prerouting { ct state new jump firewall-check ; }
        add chain ip svcnet filter-input { ct state new jump endpoints-check ; }
        add chain ip svcnet filter-forward { ct state invalid drop ; ct state new jump endpoints-check ; ct state new jump cluster-ips-check ; }
        add chain ip svcnet filter-output { ct state new jump output-endpoints-check ; ct state new jump firewall-check ; }
        add chain ip svcnet filter-output-post-dnat { ct state new jump cluster-ips-check ; }
        add chain ip svcnet affinity-prerouting { jump affinity-record ; }
        add chain ip svcnet affinity-output { jump affinity-record ; }
        add chain ip svcnet nat-prerouting { jump services ; }
        add chain ip svcnet nat-output { jump services ; }
        add chain ip svcnet nat-postrouting { jump masquerading ; ct status dnat ip saddr . ip daddr @hairpin masquerade fully-random ; }
        add map ip svcnet backends-tcp { typeof ip daddr . meta l4proto . th dport . numgen random mod 1 : ip daddr . tcp dport ; elements = { 10.96.0.10 . tcp . 80 . 0 : 10.244.1.2 . 8080, 10.96.0.10 . tcp . 80 . 1 : 10.244.2.2 . 8080 } ; }
        add set ip svcnet cluster-ips { type ipv4_addr ; elements = { 10.96.0.10 } ; }
        add set ip svcnet hairpin { typeof ip saddr . ip daddr ; elements = { 10.244.1.2 . 10.244.1.2, 10.244.2.2 . 10.244.2.2 } ; }
        add set ip svcnet masq-off-cluster { typeof ip daddr . meta l4proto . th dport ; elements = { 10.96.0.10 . tcp . 80 } ; }
        add set ip svcnet svc-n2 { typeof ip daddr . meta l4proto . th dport ; elements = { 10.96.0.10 . tcp . 80 comment "cluster IP of default/web/tcp/http" } ; }
    "#]]
    .assert_eq(&text);
    assert!(fake.chain_names().len() > 10);
}

/// The transaction text after the base objects (the per-service part).
/// What the services add to the fixed table: elements, the dispatch chains' rules.
fn services_part(text: &str) -> String {
    text.lines()
        .filter(|l| {
            l.contains("elements = ")
                || l.starts_with("add chain ip svcnet services {")
                || l.starts_with("add chain ip svcnet affinity-record {")
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn full_ruleset_every_frontend_kind() {
    let mut s = ProxyState::new(config());
    // LoadBalancer with eTP=Local, source ranges, node port and an external IP.
    s.update_service(&service("shop", "lb", |s| {
        s.cluster_ip(&["10.96.0.20"])
            .lb_ingress(&["203.0.113.7"])
            .node_port("https", "TCP", 443, 30443)
            .external_ips(&["198.51.100.9"])
            .external_local()
            .source_ranges(&["192.168.50.0/24"]);
    }))
    .unwrap();
    s.update_slice(&slice("shop", "lb-1", "lb", |s| {
        s.port("https", "TCP", 8443)
            .endpoint("10.244.1.5", "n1", |_| {})
            .endpoint("10.244.2.5", "n2", |_| {});
    }));
    // ClientIP affinity, UDP.
    s.update_service(&service("kube-system", "dns", |s| {
        s.cluster_ip(&["10.96.0.10"])
            .port("dns", "UDP", 53)
            .affinity(Some(60));
    }))
    .unwrap();
    s.update_slice(&slice("kube-system", "dns-1", "dns", |s| {
        s.port("dns", "UDP", 5353)
            .endpoint("10.244.1.3", "n1", |_| {});
    }));
    // No endpoints at all: reject (cluster IP and node port).
    s.update_service(&service("default", "empty", |s| {
        s.cluster_ip(&["10.96.0.30"])
            .node_port("", "TCP", 80, 30080);
    }))
    .unwrap();
    // internalTrafficPolicy=Local without local endpoints: drop.
    s.update_service(&service("default", "itl", |s| {
        s.cluster_ip(&["10.96.0.40"])
            .port("p", "TCP", 80)
            .internal_local();
    }))
    .unwrap();
    s.update_slice(&slice("default", "itl-1", "itl", |s| {
        s.port("p", "TCP", 80).endpoint("10.244.2.9", "n2", |_| {});
    }));
    let (_, _, text) = full(&s, None);
    expect![[r#"
        add chain ip svcnet services { ip daddr . meta l4proto . th dport @masq-always meta mark set meta mark | 0x4000 ; ip saddr != { 10.244.0.0/16 } ip daddr . meta l4proto . th dport @masq-off-cluster meta mark set meta mark | 0x4000 ; fib saddr type local ip daddr . meta l4proto . th dport @masq-local-source meta mark set meta mark | 0x4000 ; fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport @np-masq-always meta mark set meta mark | 0x4000 ; ip saddr != { 10.244.0.0/16 } fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport @np-masq-off-cluster meta mark set meta mark | 0x4000 ; fib saddr type local fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport @np-masq-local-source meta mark set meta mark | 0x4000 ; ip saddr { 10.244.0.0/16 } ip daddr . meta l4proto . th dport vmap @sc-aff ; fib saddr type local ip daddr . meta l4proto . th dport vmap @sc-aff ; ip saddr { 10.244.0.0/16 } meta l4proto tcp ip daddr . meta l4proto . th dport @sc-n2 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @sc-backends-tcp ; fib saddr type local meta l4proto tcp ip daddr . meta l4proto . th dport @sc-n2 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @sc-backends-tcp ; ip saddr { 10.244.0.0/16 } fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @np-sc-aff ; fib saddr type local fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @np-sc-aff ; ip saddr { 10.244.0.0/16 } meta l4proto tcp fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport @np-sc-n2 dnat ip to meta l4proto . th dport . numgen random mod 2 map @np-sc-backends-tcp ; fib saddr type local meta l4proto tcp fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport @np-sc-n2 dnat ip to meta l4proto . th dport . numgen random mod 2 map @np-sc-backends-tcp ; ip daddr . meta l4proto . th dport vmap @svc-aff ; meta l4proto tcp ip daddr . meta l4proto . th dport @svc-n1 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 1 map @backends-tcp ; meta l4proto udp ip daddr . meta l4proto . th dport @svc-n1 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 1 map @backends-udp ; meta l4proto tcp ip daddr . meta l4proto . th dport @svc-n2 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @backends-tcp ; meta l4proto udp ip daddr . meta l4proto . th dport @svc-n2 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @backends-udp ; meta l4proto tcp ip daddr . meta l4proto . th dport @svc-n3 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 3 map @backends-tcp ; meta l4proto udp ip daddr . meta l4proto . th dport @svc-n3 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 3 map @backends-udp ; meta l4proto tcp ip daddr . meta l4proto . th dport @svc-n4 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 4 map @backends-tcp ; meta l4proto udp ip daddr . meta l4proto . th dport @svc-n4 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 4 map @backends-udp ; meta l4proto tcp ip daddr . meta l4proto . th dport @svc-n5 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 5 map @backends-tcp ; meta l4proto udp ip daddr . meta l4proto . th dport @svc-n5 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 5 map @backends-udp ; meta l4proto tcp ip daddr . meta l4proto . th dport @svc-n6 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 6 map @backends-tcp ; meta l4proto udp ip daddr . meta l4proto . th dport @svc-n6 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 6 map @backends-udp ; meta l4proto tcp ip daddr . meta l4proto . th dport @svc-n7 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 7 map @backends-tcp ; meta l4proto udp ip daddr . meta l4proto . th dport @svc-n7 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 7 map @backends-udp ; meta l4proto tcp ip daddr . meta l4proto . th dport @svc-n8 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 8 map @backends-tcp ; meta l4proto udp ip daddr . meta l4proto . th dport @svc-n8 dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 8 map @backends-udp ; fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @np-aff ; meta l4proto tcp fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport @np-n1 dnat ip to meta l4proto . th dport . numgen random mod 1 map @np-backends-tcp ; }
        add chain ip svcnet affinity-record { meta l4proto tcp ct state new ct status dnat ct original ip daddr . meta l4proto . ct original proto-dst vmap @aff-record ; meta l4proto udp ct state new ct status dnat ct original ip daddr . meta l4proto . ct original proto-dst vmap @aff-record ; meta l4proto tcp ct state new ct status dnat ct original ip daddr != @cluster-ips meta l4proto . ct original proto-dst vmap @np-aff-record ; meta l4proto udp ct state new ct status dnat ct original ip daddr != @cluster-ips meta l4proto . ct original proto-dst vmap @np-aff-record ; }
        add map ip svcnet aff-record { type ipv4_addr . inet_proto . inet_service : verdict ; elements = { 10.96.0.10 . udp . 53 : jump aff-rec-MKS3HLPM-kube-system/dns/udp/dns } ; }
        add map ip svcnet backends-tcp { typeof ip daddr . meta l4proto . th dport . numgen random mod 1 : ip daddr . tcp dport ; elements = { 10.96.0.20 . tcp . 443 . 0 : 10.244.1.5 . 8443, 10.96.0.20 . tcp . 443 . 1 : 10.244.2.5 . 8443, 198.51.100.9 . tcp . 443 . 0 : 10.244.1.5 . 8443, 203.0.113.7 . tcp . 443 . 0 : 10.244.1.5 . 8443 } ; }
        add map ip svcnet backends-udp { typeof ip daddr . meta l4proto . th dport . numgen random mod 1 : ip daddr . udp dport ; elements = { 10.96.0.10 . udp . 53 . 0 : 10.244.1.3 . 5353 } ; }
        add set ip svcnet cluster-ips { type ipv4_addr ; elements = { 10.96.0.10, 10.96.0.20, 10.96.0.30, 10.96.0.40 } ; }
        add set ip svcnet firewall { typeof ip daddr . meta l4proto . th dport ; elements = { 203.0.113.7 . tcp . 443 } ; }
        add set ip svcnet firewall-allow { typeof ip daddr . meta l4proto . th dport . ip saddr ; flags interval ; elements = { 203.0.113.7 . tcp . 443 . 192.168.50.0/24 } ; }
        add set ip svcnet hairpin { typeof ip saddr . ip daddr ; elements = { 10.244.1.3 . 10.244.1.3, 10.244.1.5 . 10.244.1.5, 10.244.2.5 . 10.244.2.5 } ; }
        add set ip svcnet masq-local-source { typeof ip daddr . meta l4proto . th dport ; elements = { 198.51.100.9 . tcp . 443, 203.0.113.7 . tcp . 443 } ; }
        add set ip svcnet masq-off-cluster { typeof ip daddr . meta l4proto . th dport ; elements = { 10.96.0.10 . udp . 53, 10.96.0.20 . tcp . 443 } ; }
        add set ip svcnet no-endpoint-drop { typeof ip daddr . meta l4proto . th dport ; elements = { 10.96.0.40 . tcp . 80 } ; }
        add set ip svcnet no-endpoint-reject { typeof ip daddr . meta l4proto . th dport ; elements = { 10.96.0.30 . tcp . 80 } ; }
        add map ip svcnet np-backends-tcp { typeof meta l4proto . th dport . numgen random mod 1 : ip daddr . tcp dport ; elements = { tcp . 30443 . 0 : 10.244.1.5 . 8443 } ; }
        add set ip svcnet np-masq-local-source { typeof meta l4proto . th dport ; elements = { tcp . 30443 } ; }
        add set ip svcnet np-n1 { typeof meta l4proto . th dport ; elements = { tcp . 30443 comment "node port of shop/lb/tcp/https" } ; }
        add set ip svcnet np-no-endpoint-reject { typeof meta l4proto . th dport ; elements = { tcp . 30080 } ; }
        add map ip svcnet np-sc-backends-tcp { typeof meta l4proto . th dport . numgen random mod 1 : ip daddr . tcp dport ; elements = { tcp . 30443 . 0 : 10.244.1.5 . 8443, tcp . 30443 . 1 : 10.244.2.5 . 8443 } ; }
        add set ip svcnet np-sc-n2 { typeof meta l4proto . th dport ; elements = { tcp . 30443 comment "node port of shop/lb/tcp/https" } ; }
        add map ip svcnet sc-backends-tcp { typeof ip daddr . meta l4proto . th dport . numgen random mod 1 : ip daddr . tcp dport ; elements = { 198.51.100.9 . tcp . 443 . 0 : 10.244.1.5 . 8443, 198.51.100.9 . tcp . 443 . 1 : 10.244.2.5 . 8443, 203.0.113.7 . tcp . 443 . 0 : 10.244.1.5 . 8443, 203.0.113.7 . tcp . 443 . 1 : 10.244.2.5 . 8443 } ; }
        add set ip svcnet sc-n2 { typeof ip daddr . meta l4proto . th dport ; elements = { 198.51.100.9 . tcp . 443 comment "external IP of shop/lb/tcp/https", 203.0.113.7 . tcp . 443 comment "load-balancer IP (with loadBalancerSourceRanges) of shop/lb/tcp/https" } ; }
        add map ip svcnet svc-aff { type ipv4_addr . inet_proto . inet_service : verdict ; elements = { 10.96.0.10 . udp . 53 : jump aff-cluster-7CNWVFNA-kube-system/dns/udp/dns } ; }
        add set ip svcnet svc-n1 { typeof ip daddr . meta l4proto . th dport ; elements = { 10.96.0.10 . udp . 53 comment "cluster IP of kube-system/dns/udp/dns", 198.51.100.9 . tcp . 443 comment "external IP of shop/lb/tcp/https", 203.0.113.7 . tcp . 443 comment "load-balancer IP (with loadBalancerSourceRanges) of shop/lb/tcp/https" } ; }
        add set ip svcnet svc-n2 { typeof ip daddr . meta l4proto . th dport ; elements = { 10.96.0.20 . tcp . 443 comment "cluster IP of shop/lb/tcp/https" } ; }
    "#]]
    .assert_eq(&services_part(&text));
}

#[test]
fn partial_syncs_touch_only_what_changed() {
    let mut state = web_state();
    state.take_changes();
    let (mut r, mut fake, _) = full(&state, None);

    // Scale up: one endpoint more.
    state.update_slice(&slice("default", "web-1", "web", |s| {
        s.port("http", "TCP", 8080)
            .endpoint("10.244.1.2", "n1", |_| {})
            .endpoint("10.244.2.2", "n2", |_| {})
            .endpoint("10.244.3.2", "n3", |_| {});
    }));
    partial(
        &mut state,
        &mut r,
        &mut fake,
        expect![[r#"
            delete element ip svcnet svc-n2 { 10.96.0.10 . tcp . 80 }
            add map ip svcnet backends-tcp { typeof ip daddr . meta l4proto . th dport . numgen random mod 1 : ip daddr . tcp dport ; }
            add set ip svcnet hairpin { typeof ip saddr . ip daddr ; }
            add set ip svcnet svc-n3 { typeof ip daddr . meta l4proto . th dport ; }
            add map ip svcnet backends-tcp { typeof ip daddr . meta l4proto . th dport . numgen random mod 1 : ip daddr . tcp dport ; elements = { 10.96.0.10 . tcp . 80 . 2 : 10.244.3.2 . 8080 } ; }
            add set ip svcnet hairpin { typeof ip saddr . ip daddr ; elements = { 10.244.3.2 . 10.244.3.2 } ; }
            add set ip svcnet svc-n3 { typeof ip daddr . meta l4proto . th dport ; elements = { 10.96.0.10 . tcp . 80 comment "cluster IP of default/web/tcp/http" } ; }
        "#]],
    );

    // A second service appears.
    state
        .update_service(&service("default", "api", |s| {
            s.cluster_ip(&["10.96.0.11"]).port("", "TCP", 443);
        }))
        .unwrap();
    partial(
        &mut state,
        &mut r,
        &mut fake,
        expect![[r#"
            add set ip svcnet cluster-ips { type ipv4_addr ; }
            add set ip svcnet no-endpoint-reject { typeof ip daddr . meta l4proto . th dport ; }
            add set ip svcnet cluster-ips { type ipv4_addr ; elements = { 10.96.0.11 } ; }
            add set ip svcnet no-endpoint-reject { typeof ip daddr . meta l4proto . th dport ; elements = { 10.96.0.11 . tcp . 443 } ; }
        "#]],
    );

    // All endpoints of web go away: its chains are removed, it now rejects.
    state.delete_slice("default", "web-1");
    partial(
        &mut state,
        &mut r,
        &mut fake,
        expect![[r#"
            delete element ip svcnet backends-tcp { 10.96.0.10 . tcp . 80 . 0 }
            delete element ip svcnet backends-tcp { 10.96.0.10 . tcp . 80 . 1 }
            delete element ip svcnet backends-tcp { 10.96.0.10 . tcp . 80 . 2 }
            delete element ip svcnet hairpin { 10.244.1.2 . 10.244.1.2 }
            delete element ip svcnet hairpin { 10.244.2.2 . 10.244.2.2 }
            delete element ip svcnet hairpin { 10.244.3.2 . 10.244.3.2 }
            delete element ip svcnet masq-off-cluster { 10.96.0.10 . tcp . 80 }
            delete element ip svcnet svc-n3 { 10.96.0.10 . tcp . 80 }
            add set ip svcnet no-endpoint-reject { typeof ip daddr . meta l4proto . th dport ; }
            add set ip svcnet no-endpoint-reject { typeof ip daddr . meta l4proto . th dport ; elements = { 10.96.0.10 . tcp . 80 } ; }
        "#]],
    );

    // Services are deleted: nothing of them is left.
    state.delete_service(&svcnet_proxy::NamespacedName::new("default", "web"));
    state.delete_service(&svcnet_proxy::NamespacedName::new("default", "api"));
    partial(
        &mut state,
        &mut r,
        &mut fake,
        expect![[r#"
            delete element ip svcnet cluster-ips { 10.96.0.10 }
            delete element ip svcnet cluster-ips { 10.96.0.11 }
            delete element ip svcnet no-endpoint-reject { 10.96.0.10 . tcp . 80 }
            delete element ip svcnet no-endpoint-reject { 10.96.0.11 . tcp . 443 }
        "#]],
    );
    assert!(fake.elements("cluster-ips").is_empty());
    assert!(!fake.chain_names().iter().any(|c| c.contains("default/")));
}

/// `web`'s slice with `n` endpoints (10.244.1.2, 10.244.2.2, …).
fn web_endpoints(state: &mut ProxyState, n: usize) {
    state.update_slice(&slice("default", "web-1", "web", |s| {
        s.port("http", "TCP", 8080);
        for i in 1..=n {
            s.endpoint(&format!("10.244.{i}.2"), &format!("n{i}"), |_| {});
        }
    }));
}

#[test]
fn endpoint_counts_within_the_standing_groups_change_elements_only() {
    let mut state = web_state();
    state.take_changes();
    let (mut r, mut fake, _) = full(&state, None);
    let rewrites = |tx: &svcnet_nft::Transaction| {
        let text = tx.to_string();
        text.contains("flush chain ip svcnet services")
            || text.contains(" rule ")
            || text.contains(" chain ")
    };
    // 2 → 3 … STANDING_LEN: the count's group is in the table already.
    for n in 3..=STANDING_LEN {
        web_endpoints(&mut state, n);
        let tx = common::partial(&mut state, &mut r, &mut fake, None);
        assert!(!rewrites(&tx), "{n} endpoints: not data-only:\n{tx}");
        common::assert_converged(&state, &mut r, &mut fake);
    }
    // One more: a group no port used comes into use, and the dispatch chain is rewritten.
    web_endpoints(&mut state, STANDING_LEN + 1);
    let tx = common::partial(&mut state, &mut r, &mut fake, None);
    assert!(rewrites(&tx), "a new group must be dispatched:\n{tx}");
    common::assert_converged(&state, &mut r, &mut fake);
    // Back within the standing groups: the unused group goes, the standing ones stay.
    web_endpoints(&mut state, 2);
    let tx = common::partial(&mut state, &mut r, &mut fake, None);
    let gone = format!("delete set ip svcnet svc-n{}", STANDING_LEN + 1);
    assert!(tx.to_string().contains(&gone), "{gone} expected:\n{tx}");
    common::assert_converged(&state, &mut r, &mut fake);
    assert!(
        fake.rules("services")
            .unwrap()
            .iter()
            .any(|r| r.contains("@svc-n3 "))
    );
}

#[test]
fn reassert_repairs_drift_and_keeps_affinity_entries() {
    let mut state = web_state();
    state
        .update_service(&service("default", "web", |s| {
            s.cluster_ip(&["10.96.0.10"])
                .port("http", "TCP", 80)
                .affinity(Some(60));
        }))
        .unwrap();
    let map = svcnet_nft::names::affinity_object(
        "cluster",
        &svcnet_proxy::ServicePortName {
            service: svcnet_proxy::NamespacedName::new("default", "web"),
            port: "http".into(),
            protocol: svcnet_proxy::Protocol::Tcp,
        },
    );
    let (mut r, mut fake, _) = full(&state, None);
    // Drift: someone deletes a backends slot; a client is pinned by affinity.
    let mut tx = svcnet_nft::Transaction::new(Family::Ip, "svcnet");
    tx.push(svcnet_nft::Op::DeleteElement {
        set: "backends-tcp".into(),
        key: "10.96.0.10 . tcp . 80 . 1".into(),
    });
    tx.push(svcnet_nft::Op::AddElement {
        set: map.clone(),
        key: "10.244.9.9".into(),
        value: Some("10.244.1.2 . 8080".into()),
    });
    fake.apply(&tx).unwrap();
    state
        .update_service(&service("default", "other", |s| {
            s.cluster_ip(&["10.96.0.12"]).port("", "TCP", 80);
        }))
        .unwrap();
    let plan = r.plan_full(&state.desired(IpFamily::V4), FullMode::Reassert);
    fake.apply(&plan.tx).unwrap();
    r.commit(plan);
    let (_, fresh, _) = full(&state, None);
    assert_eq!(
        fake.elements("backends-tcp"),
        fresh.elements("backends-tcp")
    );
    assert_eq!(fake.elements(&map), ["10.244.9.9 : 10.244.1.2 . 8080"]);
    // Apart from the affinity entry, a reassert gives what a fresh full sync gives.
    let mut tx = svcnet_nft::Transaction::new(Family::Ip, "svcnet");
    tx.push(svcnet_nft::Op::DeleteElement {
        set: map,
        key: "10.244.9.9".into(),
    });
    fake.apply(&tx).unwrap();
    assert_eq!(fake.dump(), fresh.dump());
}

#[test]
fn fake_rejects_dangling_references_atomically() {
    let (_, mut fake, _) = full(&web_state(), None);
    let before = fake.dump();
    let mut tx = svcnet_nft::Transaction::new(Family::Ip, "svcnet");
    tx.push(svcnet_nft::Op::AddChain {
        name: "x".into(),
        base: None,
    });
    tx.push(svcnet_nft::Op::AddRule {
        chain: "x".into(),
        rule: "goto nowhere".into(),
    });
    let err = fake.apply(&tx).unwrap_err();
    assert_eq!(
        err.to_string(),
        "op 1 (add chain ip svcnet x { goto nowhere ; }): dangling reference to chain nowhere"
    );
    assert_eq!(
        fake.dump(),
        before,
        "a failed transaction must change nothing"
    );
    let mut tx = svcnet_nft::Transaction::new(Family::Ip, "svcnet");
    tx.push(svcnet_nft::Op::DeleteChain("masquerading".into()));
    assert!(fake.apply(&tx).unwrap_err().message.contains("not empty"));
    let mut tx = svcnet_nft::Transaction::new(Family::Ip, "svcnet");
    tx.push(svcnet_nft::Op::DeleteSet {
        name: "backends-tcp".into(),
        kind: svcnet_nft::tx::SetKind::Map,
    });
    assert!(
        fake.apply(&tx)
            .unwrap_err()
            .message
            .contains("still referenced")
    );
}

#[test]
fn ipv6_renders_in_its_own_table() {
    let mut s = ProxyState::new(config());
    s.update_service(&service("default", "v6", |s| {
        s.cluster_ip(&["fd00:10:96::10"]).port("", "TCP", 80);
    }))
    .unwrap();
    s.update_slice(&slice("default", "v6-1", "v6", |s| {
        s.ipv6()
            .port("", "TCP", 8080)
            .endpoint("fd00:244:1::2", "n1", |_| {});
    }));
    let r = Renderer::new(Family::Ip6);
    let plan = r.plan_full(&s.desired(IpFamily::V6), FullMode::Recreate);
    let mut fake = FakeNft::new();
    fake.apply(&plan.tx).unwrap();
    let text = plan.tx.to_string();
    let marker = "add chain ip6 svcnet nat-postrouting { jump masquerading ; ct status dnat ip6 saddr . ip6 daddr @hairpin masquerade fully-random ; }\n";
    expect![[r#"
        add map ip6 svcnet backends-tcp { typeof ip6 daddr . meta l4proto . th dport . numgen random mod 1 : ip6 daddr . tcp dport ; elements = { fd00:10:96::10 . tcp . 80 . 0 : fd00:244:1::2 . 8080 } ; }
        add set ip6 svcnet cluster-ips { type ipv6_addr ; elements = { fd00:10:96::10 } ; }
        add set ip6 svcnet hairpin { typeof ip6 saddr . ip6 daddr ; elements = { fd00:244:1::2 . fd00:244:1::2 } ; }
        add set ip6 svcnet svc-n1 { typeof ip6 daddr . meta l4proto . th dport ; elements = { fd00:10:96::10 . tcp . 80 comment "cluster IP of default/v6/tcp/" } ; }
    "#]].assert_eq(text.split_once(marker).unwrap().1);
}

//! Snapshot tests of the rendered ruleset and of each partial sync's transaction, each applied
//! to `FakeNft` (which rejects dangling references), plus the property that partial syncs
//! converge to exactly what a fresh full sync produces.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use common::{config, full};
use expect_test::{Expect, expect};
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
        add set ip svcnet cluster-ips { type ipv4_addr ; comment "active cluster IPs" ; }
        add map ip svcnet service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "service IP . proto . port to service chain" ; }
        add map ip svcnet service-nodeports { type inet_proto . inet_service : verdict ; comment "proto . node port to external chain" ; }
        add map ip svcnet no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; comment "service IP . proto . port without endpoints" ; }
        add map ip svcnet no-endpoint-nodeports { type inet_proto . inet_service : verdict ; comment "proto . node port without endpoints" ; }
        add map ip svcnet firewall-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "load-balancer IPs with source ranges" ; }
        add chain ip svcnet mark-for-masquerade { meta mark set meta mark | 0x4000 ; }
        add chain ip svcnet masquerading { meta mark & 0x4000 == 0 return ; meta mark set meta mark ^ 0x4000 ; masquerade fully-random ; }
        add chain ip svcnet reject-chain { reject ; }
        add chain ip svcnet services { ip daddr . meta l4proto . th dport vmap @service-ips ; fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports ; }
        add chain ip svcnet firewall-check { ip daddr . meta l4proto . th dport vmap @firewall-ips ; }
        add chain ip svcnet service-endpoints-check { ip daddr . meta l4proto . th dport vmap @no-endpoint-services ; }
        add chain ip svcnet nodeport-endpoints-check { fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @no-endpoint-nodeports ; }
        add chain ip svcnet cluster-ips-check { ip daddr @cluster-ips reject ; ip daddr { 10.96.0.0/12 } drop ; }
        add chain ip svcnet filter-prerouting { type filter hook prerouting priority -110 ; }
        add chain ip svcnet filter-prerouting { ct state new jump firewall-check ; }
        add chain ip svcnet filter-input { type filter hook input priority -110 ; }
        add chain ip svcnet filter-input { ct state new jump nodeport-endpoints-check ; ct state new jump service-endpoints-check ; }
        add chain ip svcnet filter-forward { type filter hook forward priority -110 ; }
        add chain ip svcnet filter-forward { ct state invalid drop ; ct state new jump service-endpoints-check ; ct state new jump cluster-ips-check ; }
        add chain ip svcnet filter-output { type filter hook output priority -110 ; }
        add chain ip svcnet filter-output { ct state new jump service-endpoints-check ; ct state new jump firewall-check ; }
        add chain ip svcnet filter-output-post-dnat { type filter hook output priority -90 ; }
        add chain ip svcnet filter-output-post-dnat { ct state new jump cluster-ips-check ; }
        add chain ip svcnet nat-prerouting { type nat hook prerouting priority -100 ; }
        add chain ip svcnet nat-prerouting { jump services ; }
        add chain ip svcnet nat-output { type nat hook output priority -100 ; }
        add chain ip svcnet nat-output { jump services ; }
        add chain ip svcnet nat-postrouting { type nat hook postrouting priority 100 ; }
        add chain ip svcnet nat-postrouting { jump masquerading ; }
        add chain ip svcnet endpoint-AAOQDDFY-default/web/tcp/http__10.244.2.2/8080
        add chain ip svcnet endpoint-SVLGPL42-default/web/tcp/http__10.244.1.2/8080
        add chain ip svcnet service-SUSTUHLJ-default/web/tcp/http
        add chain ip svcnet endpoint-AAOQDDFY-default/web/tcp/http__10.244.2.2/8080 { ip saddr 10.244.2.2 jump mark-for-masquerade ; meta l4proto tcp dnat to 10.244.2.2:8080 ; }
        add chain ip svcnet endpoint-SVLGPL42-default/web/tcp/http__10.244.1.2/8080 { ip saddr 10.244.1.2 jump mark-for-masquerade ; meta l4proto tcp dnat to 10.244.1.2:8080 ; }
        add chain ip svcnet service-SUSTUHLJ-default/web/tcp/http { ip daddr 10.96.0.10 tcp dport 80 ip saddr != { 10.244.0.0/16 } jump mark-for-masquerade ; numgen random mod 2 == 0 goto endpoint-SVLGPL42-default/web/tcp/http__10.244.1.2/8080 ; goto endpoint-AAOQDDFY-default/web/tcp/http__10.244.2.2/8080 ; }
        add set ip svcnet cluster-ips { type ipv4_addr ; comment "active cluster IPs" ; elements = { 10.96.0.10 } ; }
        add map ip svcnet service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "service IP . proto . port to service chain" ; elements = { 10.96.0.10 . tcp . 80 : goto service-SUSTUHLJ-default/web/tcp/http } ; }
    "#]]
    .assert_eq(&text);
    assert!(fake.chain_names().len() > 10);
}

/// The transaction text after the base objects (the per-service part).
fn services_part(text: &str) -> String {
    let marker = "add chain ip svcnet nat-postrouting { jump masquerading ; }\n";
    text.split_once(marker)
        .map(|(_, rest)| rest.to_string())
        .unwrap_or_default()
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
        add set ip svcnet affinity-TCMDY6CB-kube-system/dns/udp/dns__10.244.1.3/5353 { type ipv4_addr ; flags dynamic,timeout ; timeout 60s ; }
        add chain ip svcnet endpoint-TCMDY6CB-kube-system/dns/udp/dns__10.244.1.3/5353
        add chain ip svcnet service-2YY5BS5C-kube-system/dns/udp/dns
        add chain ip svcnet endpoint-TCMDY6CB-kube-system/dns/udp/dns__10.244.1.3/5353 { ip saddr 10.244.1.3 jump mark-for-masquerade ; update @affinity-TCMDY6CB-kube-system/dns/udp/dns__10.244.1.3/5353 { ip saddr } ; meta l4proto udp dnat to 10.244.1.3:5353 ; }
        add chain ip svcnet service-2YY5BS5C-kube-system/dns/udp/dns { ip daddr 10.96.0.10 udp dport 53 ip saddr != { 10.244.0.0/16 } jump mark-for-masquerade ; ip saddr @affinity-TCMDY6CB-kube-system/dns/udp/dns__10.244.1.3/5353 goto endpoint-TCMDY6CB-kube-system/dns/udp/dns__10.244.1.3/5353 ; goto endpoint-TCMDY6CB-kube-system/dns/udp/dns__10.244.1.3/5353 ; }
        add chain ip svcnet endpoint-SE55U6IJ-shop/lb/tcp/https__10.244.1.5/8443
        add chain ip svcnet endpoint-XIJUXMDY-shop/lb/tcp/https__10.244.2.5/8443
        add chain ip svcnet external-2ECW3NZX-shop/lb/tcp/https
        add chain ip svcnet firewall-2ECW3NZX-shop/lb/tcp/https
        add chain ip svcnet local-2ECW3NZX-shop/lb/tcp/https
        add chain ip svcnet service-2ECW3NZX-shop/lb/tcp/https
        add chain ip svcnet endpoint-SE55U6IJ-shop/lb/tcp/https__10.244.1.5/8443 { ip saddr 10.244.1.5 jump mark-for-masquerade ; meta l4proto tcp dnat to 10.244.1.5:8443 ; }
        add chain ip svcnet endpoint-XIJUXMDY-shop/lb/tcp/https__10.244.2.5/8443 { ip saddr 10.244.2.5 jump mark-for-masquerade ; meta l4proto tcp dnat to 10.244.2.5:8443 ; }
        add chain ip svcnet external-2ECW3NZX-shop/lb/tcp/https { ip saddr { 10.244.0.0/16 } goto service-2ECW3NZX-shop/lb/tcp/https ; fib saddr type local jump mark-for-masquerade ; fib saddr type local goto service-2ECW3NZX-shop/lb/tcp/https ; goto local-2ECW3NZX-shop/lb/tcp/https ; }
        add chain ip svcnet firewall-2ECW3NZX-shop/lb/tcp/https { ip saddr != { 192.168.50.0/24 } drop ; }
        add chain ip svcnet local-2ECW3NZX-shop/lb/tcp/https { goto endpoint-SE55U6IJ-shop/lb/tcp/https__10.244.1.5/8443 ; }
        add chain ip svcnet service-2ECW3NZX-shop/lb/tcp/https { ip daddr 10.96.0.20 tcp dport 443 ip saddr != { 10.244.0.0/16 } jump mark-for-masquerade ; numgen random mod 2 == 0 goto endpoint-SE55U6IJ-shop/lb/tcp/https__10.244.1.5/8443 ; goto endpoint-XIJUXMDY-shop/lb/tcp/https__10.244.2.5/8443 ; }
        add set ip svcnet cluster-ips { type ipv4_addr ; comment "active cluster IPs" ; elements = { 10.96.0.30, 10.96.0.40, 10.96.0.10, 10.96.0.20 } ; }
        add map ip svcnet firewall-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "load-balancer IPs with source ranges" ; elements = { 203.0.113.7 . tcp . 443 : goto firewall-2ECW3NZX-shop/lb/tcp/https } ; }
        add map ip svcnet no-endpoint-nodeports { type inet_proto . inet_service : verdict ; comment "proto . node port without endpoints" ; elements = { tcp . 30080 : goto reject-chain } ; }
        add map ip svcnet no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; comment "service IP . proto . port without endpoints" ; elements = { 10.96.0.30 . tcp . 80 : goto reject-chain, 10.96.0.40 . tcp . 80 : drop } ; }
        add map ip svcnet service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment "service IP . proto . port to service chain" ; elements = { 10.96.0.10 . udp . 53 : goto service-2YY5BS5C-kube-system/dns/udp/dns, 10.96.0.20 . tcp . 443 : goto service-2ECW3NZX-shop/lb/tcp/https, 198.51.100.9 . tcp . 443 : goto external-2ECW3NZX-shop/lb/tcp/https, 203.0.113.7 . tcp . 443 : goto external-2ECW3NZX-shop/lb/tcp/https } ; }
        add map ip svcnet service-nodeports { type inet_proto . inet_service : verdict ; comment "proto . node port to external chain" ; elements = { tcp . 30443 : goto external-2ECW3NZX-shop/lb/tcp/https } ; }
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
            add chain ip svcnet endpoint-VCVRTEPX-default/web/tcp/http__10.244.3.2/8080
            flush chain ip svcnet service-SUSTUHLJ-default/web/tcp/http
            add chain ip svcnet endpoint-VCVRTEPX-default/web/tcp/http__10.244.3.2/8080 { ip saddr 10.244.3.2 jump mark-for-masquerade ; meta l4proto tcp dnat to 10.244.3.2:8080 ; }
            add chain ip svcnet service-SUSTUHLJ-default/web/tcp/http { ip daddr 10.96.0.10 tcp dport 80 ip saddr != { 10.244.0.0/16 } jump mark-for-masquerade ; numgen random mod 3 == 0 goto endpoint-SVLGPL42-default/web/tcp/http__10.244.1.2/8080 ; numgen random mod 2 == 0 goto endpoint-AAOQDDFY-default/web/tcp/http__10.244.2.2/8080 ; goto endpoint-VCVRTEPX-default/web/tcp/http__10.244.3.2/8080 ; }
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
            add set ip svcnet cluster-ips { type ipv4_addr ; comment "active cluster IPs" ; }
            add map ip svcnet no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; comment "service IP . proto . port without endpoints" ; }
            add set ip svcnet cluster-ips { type ipv4_addr ; comment "active cluster IPs" ; elements = { 10.96.0.11 } ; }
            add map ip svcnet no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; comment "service IP . proto . port without endpoints" ; elements = { 10.96.0.11 . tcp . 443 : goto reject-chain } ; }
        "#]],
    );

    // All endpoints of web go away: its chains are removed, it now rejects.
    state.delete_slice("default", "web-1");
    partial(
        &mut state,
        &mut r,
        &mut fake,
        expect![[r#"
            delete element ip svcnet service-ips { 10.96.0.10 . tcp . 80 }
            flush chain ip svcnet endpoint-AAOQDDFY-default/web/tcp/http__10.244.2.2/8080
            flush chain ip svcnet endpoint-SVLGPL42-default/web/tcp/http__10.244.1.2/8080
            flush chain ip svcnet endpoint-VCVRTEPX-default/web/tcp/http__10.244.3.2/8080
            flush chain ip svcnet service-SUSTUHLJ-default/web/tcp/http
            add map ip svcnet no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; comment "service IP . proto . port without endpoints" ; }
            add map ip svcnet no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; comment "service IP . proto . port without endpoints" ; elements = { 10.96.0.10 . tcp . 80 : goto reject-chain } ; }
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
        delete element ip svcnet cluster-ips { 10.96.0.11 }
        delete element ip svcnet no-endpoint-services { 10.96.0.11 . tcp . 443 }
        delete element ip svcnet cluster-ips { 10.96.0.10 }
        delete element ip svcnet no-endpoint-services { 10.96.0.10 . tcp . 80 }
    "#]],
    );
    assert!(fake.elements("cluster-ips").is_empty());
    assert!(!fake.chain_names().iter().any(|c| c.contains("default/")));
}

#[test]
fn reassert_repairs_drift_and_removes_stale_chains() {
    let mut state = web_state();
    let (mut r, mut fake, _) = full(&state, None);
    let svc_chain = fake
        .chain_names()
        .into_iter()
        .find(|c| c.starts_with("service-"))
        .unwrap();
    fake.tamper_delete_chain(&svc_chain);
    state.delete_service(&svcnet_proxy::NamespacedName::new("default", "web"));
    state
        .update_service(&service("default", "other", |s| {
            s.cluster_ip(&["10.96.0.12"]).port("", "TCP", 80);
        }))
        .unwrap();
    // The tampered chain is gone; re-asserting must still work and remove web's stale chains.
    let plan = r.plan_full(&state.desired(IpFamily::V4), FullMode::Reassert);
    // web's service chain no longer exists in the fake, so deleting it would fail like the
    // kernel does: the caller then falls back to Recreate.
    let err = fake.apply(&plan.tx).unwrap_err();
    assert!(err.message.contains("no such chain"), "{err}");
    let plan = r.plan_full(&state.desired(IpFamily::V4), FullMode::Recreate);
    fake.apply(&plan.tx).unwrap();
    r.commit(plan);
    let (_, fresh, _) = full(&state, None);
    assert_eq!(fake.dump(), fresh.dump());

    // Without tampering, a reassert is a clean no-op in effect.
    let plan = r.plan_full(&state.desired(IpFamily::V4), FullMode::Reassert);
    fake.apply(&plan.tx).unwrap();
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
    tx.push(svcnet_nft::Op::DeleteChain("reject-chain".into()));
    assert!(fake.apply(&tx).unwrap_err().message.contains("not empty"));
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
    let marker = "add chain ip6 svcnet nat-postrouting { jump masquerading ; }\n";
    expect![[r#"
        add chain ip6 svcnet endpoint-77OXVDJC-default/v6/tcp/__fd00.244.1..2/8080
        add chain ip6 svcnet service-KYX2TYW5-default/v6/tcp/
        add chain ip6 svcnet endpoint-77OXVDJC-default/v6/tcp/__fd00.244.1..2/8080 { ip6 saddr fd00:244:1::2 jump mark-for-masquerade ; meta l4proto tcp dnat to [fd00:244:1::2]:8080 ; }
        add chain ip6 svcnet service-KYX2TYW5-default/v6/tcp/ { goto endpoint-77OXVDJC-default/v6/tcp/__fd00.244.1..2/8080 ; }
        add set ip6 svcnet cluster-ips { type ipv6_addr ; comment "active cluster IPs" ; elements = { fd00:10:96::10 } ; }
        add map ip6 svcnet service-ips { type ipv6_addr . inet_proto . inet_service : verdict ; comment "service IP . proto . port to service chain" ; elements = { fd00:10:96::10 . tcp . 80 : goto service-KYX2TYW5-default/v6/tcp/ } ; }
    "#]].assert_eq(text.split_once(marker).unwrap().1);
}

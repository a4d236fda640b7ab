//! Snapshot tests of the rendered restore payloads (full and partial) and of the hooks, each
//! applied to `FakeIptables` (which rejects dangling references). `UPDATE_EXPECT=1` refreshes.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use expect_test::{Expect, expect};
use svcnet_iptables::{FakeIptables, Family, KernelChains, Payload, Renderer, Table};
use svcnet_proxy::fixtures::*;
use svcnet_proxy::{IpFamily, NamespacedName, ProxyState};

fn full(state: &ProxyState) -> (Renderer, FakeIptables, Payload) {
    let mut r = Renderer::new(Family::V4);
    let mut fake = FakeIptables::new();
    let plan = r.plan_full(&state.desired(IpFamily::V4), Some(&KernelChains::new()));
    fake.apply(&plan.payload).unwrap();
    for h in &plan.hooks {
        fake.ensure_hook(h).unwrap();
    }
    let payload = plan.payload.clone();
    r.commit(plan);
    (r, fake, payload)
}

/// The lines of one service: those carrying its comment, and every line declaring, deleting
/// or filling a per-service chain those lines mention. Prefixed with the table.
fn service_lines(payload: &Payload, needle: &str) -> String {
    let text = payload.to_string();
    let quoted = format!("\"{needle}");
    let mine = |l: &str| l.contains(&quoted) || l.contains(&format!(" {needle} "));
    let chains: std::collections::BTreeSet<&str> = text
        .lines()
        .filter(|l| mine(l))
        .flat_map(|l| l.split_whitespace())
        .filter(|w| svcnet_iptables::names::is_service_chain(w))
        .collect();
    let owns = |l: &str| {
        let w: Vec<&str> = l.split_whitespace().collect();
        match w.as_slice() {
            [decl, ..] if decl.starts_with(':') => chains.contains(&decl[1..]),
            ["-X", c, ..] | ["-A", c, ..] => chains.contains(c),
            _ => false,
        }
    };
    let mut out = String::new();
    let mut table = "";
    for l in text.lines() {
        if let Some(t) = l.strip_prefix('*') {
            table = if t == "nat" { "nat" } else { "filter" };
        } else if mine(l) || owns(l) {
            out.push_str(&format!("{table:6} {l}\n"));
        }
    }
    out
}

fn check(state: &ProxyState, needle: &str, expect: Expect) {
    let (_, _, payload) = full(state);
    expect.assert_eq(&service_lines(&payload, needle));
}

fn web_only() -> ProxyState {
    let mut s = ProxyState::new(config());
    s.update_service(&service("default", "web", |b| {
        b.cluster_ip(&["10.96.0.10"]).port("http", "TCP", 80);
    }))
    .unwrap();
    s.update_slice(&slice("default", "web-1", "web", |b| {
        b.port("http", "TCP", 8080)
            .endpoint("10.244.1.2", NODE, |_| {})
            .endpoint("10.244.2.2", "n2", |_| {})
            .endpoint("10.244.3.2", "n2", |_| {});
    }));
    s
}

#[test]
fn full_payload_cluster_ip_with_three_endpoints() {
    let (_, fake, payload) = full(&web_only());
    expect![[r#"
        *mangle
        :SVCNET-PROXY-CANARY - [0:0]
        COMMIT
        *filter
        :SVCNET-PROXY-CANARY - [0:0]
        :SVCNET-SERVICES - [0:0]
        :SVCNET-EXTERNAL-SERVICES - [0:0]
        :SVCNET-CLUSTER-IPS - [0:0]
        :SVCNET-NODEPORTS - [0:0]
        :SVCNET-FORWARD - [0:0]
        :SVCNET-PROXY-FIREWALL - [0:0]
        -A SVCNET-SERVICES -m comment --comment "svcnet unknown port or unallocated service IP; NOTE: this must be the last rule in this chain" -d 10.96.0.0/12 -j SVCNET-CLUSTER-IPS
        -A SVCNET-CLUSTER-IPS -m comment --comment "default/web:http cluster IP, other ports" -d 10.96.0.10 -j REJECT
        -A SVCNET-CLUSTER-IPS -m comment --comment "svcnet unallocated service IP" -d 10.96.0.0/12 -j DROP
        -A SVCNET-FORWARD -m conntrack --ctstate INVALID -j DROP
        -A SVCNET-FORWARD -m comment --comment "svcnet forwarding rules" -m mark --mark 0x00004000/0x00004000 -j ACCEPT
        -A SVCNET-FORWARD -m comment --comment "svcnet forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
        COMMIT
        *nat
        :SVCNET-PROXY-CANARY - [0:0]
        :SVCNET-SERVICES - [0:0]
        :SVCNET-NODEPORTS - [0:0]
        :SVCNET-POSTROUTING - [0:0]
        :SVCNET-MARK-MASQ - [0:0]
        :SVCNET-MASQ-OFF-CLUSTER - [0:0]
        :SVCNET-SEP-4EX2N4PG4ASNZOBF - [0:0]
        :SVCNET-SEP-UIQK3OSOSTRHRPBX - [0:0]
        :SVCNET-SEP-UTFLDO4GY7FI2SFB - [0:0]
        :SVCNET-SVC-CDGGSHYLG3RE2FKL - [0:0]
        -A SVCNET-SERVICES -m comment --comment "default/web:http cluster IP" -m tcp -p tcp -d 10.96.0.10 --dport 80 -j SVCNET-SVC-CDGGSHYLG3RE2FKL
        -A SVCNET-SERVICES -m comment --comment "svcnet service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL ! -d 127.0.0.0/8 -j SVCNET-NODEPORTS
        -A SVCNET-POSTROUTING -m mark ! --mark 0x00004000/0x00004000 -j RETURN
        -A SVCNET-POSTROUTING -j MARK --xor-mark 0x00004000
        -A SVCNET-POSTROUTING -m comment --comment "svcnet service traffic requiring SNAT" -j MASQUERADE --random-fully
        -A SVCNET-MARK-MASQ -j MARK --or-mark 0x00004000
        -A SVCNET-SEP-4EX2N4PG4ASNZOBF -m comment --comment "default/web:http" -s 10.244.2.2 -j SVCNET-MARK-MASQ
        -A SVCNET-SEP-4EX2N4PG4ASNZOBF -m comment --comment "default/web:http" -m tcp -p tcp -j DNAT --to-destination 10.244.2.2:8080
        -A SVCNET-SEP-UIQK3OSOSTRHRPBX -m comment --comment "default/web:http" -s 10.244.1.2 -j SVCNET-MARK-MASQ
        -A SVCNET-SEP-UIQK3OSOSTRHRPBX -m comment --comment "default/web:http" -m tcp -p tcp -j DNAT --to-destination 10.244.1.2:8080
        -A SVCNET-SEP-UTFLDO4GY7FI2SFB -m comment --comment "default/web:http" -s 10.244.3.2 -j SVCNET-MARK-MASQ
        -A SVCNET-SEP-UTFLDO4GY7FI2SFB -m comment --comment "default/web:http" -m tcp -p tcp -j DNAT --to-destination 10.244.3.2:8080
        -A SVCNET-SVC-CDGGSHYLG3RE2FKL -m comment --comment "default/web:http cluster IP" -m tcp -p tcp -d 10.96.0.10 --dport 80 ! -s 10.244.0.0/16 -j SVCNET-MARK-MASQ
        -A SVCNET-SVC-CDGGSHYLG3RE2FKL -m comment --comment "default/web:http -> 10.244.1.2:8080" -m statistic --mode random --probability 0.3333333333 -j SVCNET-SEP-UIQK3OSOSTRHRPBX
        -A SVCNET-SVC-CDGGSHYLG3RE2FKL -m comment --comment "default/web:http -> 10.244.2.2:8080" -m statistic --mode random --probability 0.5000000000 -j SVCNET-SEP-4EX2N4PG4ASNZOBF
        -A SVCNET-SVC-CDGGSHYLG3RE2FKL -m comment --comment "default/web:http -> 10.244.3.2:8080" -j SVCNET-SEP-UTFLDO4GY7FI2SFB
        COMMIT
    "#]]
    .assert_eq(&payload.to_string());
    assert_eq!(payload.rule_count(Table::Nat), 16);
    // The hooks, in the order they end up in the built-in chains.
    let hooks: String = svcnet_iptables::render::hooks()
        .iter()
        .map(|h| format!("{h}\n"))
        .collect();
    expect![[r#"
        -t filter -I INPUT 1 -m conntrack --ctstate NEW -m comment --comment "svcnet load balancer firewall" -j SVCNET-PROXY-FIREWALL
        -t filter -I INPUT 1 -m comment --comment "svcnet health check service ports" -j SVCNET-NODEPORTS
        -t filter -I INPUT 1 -m conntrack --ctstate NEW -m comment --comment "svcnet externally-visible service portals" -j SVCNET-EXTERNAL-SERVICES
        -t filter -I FORWARD 1 -m conntrack --ctstate NEW -m comment --comment "svcnet load balancer firewall" -j SVCNET-PROXY-FIREWALL
        -t filter -I FORWARD 1 -m comment --comment "svcnet forwarding rules" -j SVCNET-FORWARD
        -t filter -I FORWARD 1 -m conntrack --ctstate NEW -m comment --comment "svcnet service portals" -j SVCNET-SERVICES
        -t filter -I FORWARD 1 -m conntrack --ctstate NEW -m comment --comment "svcnet externally-visible service portals" -j SVCNET-EXTERNAL-SERVICES
        -t filter -I OUTPUT 1 -m conntrack --ctstate NEW -m comment --comment "svcnet load balancer firewall" -j SVCNET-PROXY-FIREWALL
        -t filter -I OUTPUT 1 -m conntrack --ctstate NEW -m comment --comment "svcnet service portals" -j SVCNET-SERVICES
        -t nat -I PREROUTING 1 -m comment --comment "svcnet service portals" -j SVCNET-SERVICES
        -t nat -I OUTPUT 1 -m comment --comment "svcnet service portals" -j SVCNET-SERVICES
        -t nat -I POSTROUTING 1 -m comment --comment "svcnet postrouting rules" -j SVCNET-POSTROUTING
    "#]]
    .assert_eq(&hooks);
    assert!(fake.dump().contains(
        "-A PREROUTING -m comment --comment \"svcnet service portals\" -j SVCNET-SERVICES"
    ));
}

#[test]
fn world_services() {
    let s = world();
    check(
        &s,
        "default/sh",
        expect![[r#"
            filter -A SVCNET-CLUSTER-IPS -m comment --comment "default/sh cluster IP, other ports" -d 10.96.0.22 -j REJECT
            nat    :SVCNET-SEP-TV5CXBMVQJOFUJUE - [0:0]
            nat    :SVCNET-SEP-W2W6WNLYZL5WEB25 - [0:0]
            nat    :SVCNET-SEP-ZFUBQGP7O47ZQ2NL - [0:0]
            nat    :SVCNET-SVC-VMDFZ7EK35ALBIBY - [0:0]
            nat    -A SVCNET-SERVICES -m comment --comment "default/sh cluster IP" -m tcp -p tcp -d 10.96.0.22 --dport 80 -j SVCNET-SVC-VMDFZ7EK35ALBIBY
            nat    -A SVCNET-SEP-TV5CXBMVQJOFUJUE -m comment --comment "default/sh" -s 10.244.3.2 -j SVCNET-MARK-MASQ
            nat    -A SVCNET-SEP-TV5CXBMVQJOFUJUE -m comment --comment "default/sh" -m tcp -p tcp -j DNAT --to-destination 10.244.3.2:8080
            nat    -A SVCNET-SEP-W2W6WNLYZL5WEB25 -m comment --comment "default/sh" -s 10.244.1.2 -j SVCNET-MARK-MASQ
            nat    -A SVCNET-SEP-W2W6WNLYZL5WEB25 -m comment --comment "default/sh" -m tcp -p tcp -j DNAT --to-destination 10.244.1.2:8080
            nat    -A SVCNET-SEP-ZFUBQGP7O47ZQ2NL -m comment --comment "default/sh" -s 10.244.2.2 -j SVCNET-MARK-MASQ
            nat    -A SVCNET-SEP-ZFUBQGP7O47ZQ2NL -m comment --comment "default/sh" -m tcp -p tcp -j DNAT --to-destination 10.244.2.2:8080
            nat    -A SVCNET-SVC-VMDFZ7EK35ALBIBY -m comment --comment "default/sh cluster IP" -m tcp -p tcp -d 10.96.0.22 --dport 80 ! -s 10.244.0.0/16 -j SVCNET-MARK-MASQ
            nat    -A SVCNET-SVC-VMDFZ7EK35ALBIBY -m comment --comment "default/sh -> 10.244.1.2:8080" -m cluster --cluster-total-nodes 3 --cluster-local-nodemask 0x1 --cluster-hash-seed 0x53564e01 -j SVCNET-SEP-W2W6WNLYZL5WEB25
            nat    -A SVCNET-SVC-VMDFZ7EK35ALBIBY -m comment --comment "default/sh -> 10.244.2.2:8080" -m cluster --cluster-total-nodes 3 --cluster-local-nodemask 0x2 --cluster-hash-seed 0x53564e01 -j SVCNET-SEP-ZFUBQGP7O47ZQ2NL
            nat    -A SVCNET-SVC-VMDFZ7EK35ALBIBY -m comment --comment "default/sh -> 10.244.3.2:8080" -j SVCNET-SEP-TV5CXBMVQJOFUJUE
        "#]],
    );
    check(
        &s,
        "default/wrr",
        expect![[r#"
            filter -A SVCNET-CLUSTER-IPS -m comment --comment "default/wrr cluster IP, other ports" -d 10.96.0.23 -j REJECT
            nat    :SVCNET-SEP-RBN6CX4YK74QM46G - [0:0]
            nat    :SVCNET-SEP-WYI566BCMZRK7LME - [0:0]
            nat    :SVCNET-SEP-X3L56TU36VIILIIN - [0:0]
            nat    :SVCNET-SVC-DRUUMA4DP7SUVL2N - [0:0]
            nat    -A SVCNET-SERVICES -m comment --comment "default/wrr cluster IP" -m tcp -p tcp -d 10.96.0.23 --dport 80 -j SVCNET-SVC-DRUUMA4DP7SUVL2N
            nat    -A SVCNET-SEP-RBN6CX4YK74QM46G -m comment --comment "default/wrr" -s 10.244.2.2 -j SVCNET-MARK-MASQ
            nat    -A SVCNET-SEP-RBN6CX4YK74QM46G -m comment --comment "default/wrr" -m tcp -p tcp -j DNAT --to-destination 10.244.2.2:8080
            nat    -A SVCNET-SEP-WYI566BCMZRK7LME -m comment --comment "default/wrr" -s 10.244.1.2 -j SVCNET-MARK-MASQ
            nat    -A SVCNET-SEP-WYI566BCMZRK7LME -m comment --comment "default/wrr" -m tcp -p tcp -j DNAT --to-destination 10.244.1.2:8080
            nat    -A SVCNET-SEP-X3L56TU36VIILIIN -m comment --comment "default/wrr" -s 10.244.3.2 -j SVCNET-MARK-MASQ
            nat    -A SVCNET-SEP-X3L56TU36VIILIIN -m comment --comment "default/wrr" -m tcp -p tcp -j DNAT --to-destination 10.244.3.2:8080
            nat    -A SVCNET-SVC-DRUUMA4DP7SUVL2N -m comment --comment "default/wrr cluster IP" -m tcp -p tcp -d 10.96.0.23 --dport 80 ! -s 10.244.0.0/16 -j SVCNET-MARK-MASQ
            nat    -A SVCNET-SVC-DRUUMA4DP7SUVL2N -m comment --comment "default/wrr -> 10.244.1.2:8080" -m statistic --mode nth --every 3 --packet 0 -j SVCNET-SEP-WYI566BCMZRK7LME
            nat    -A SVCNET-SVC-DRUUMA4DP7SUVL2N -m comment --comment "default/wrr -> 10.244.2.2:8080" -m statistic --mode nth --every 2 --packet 0 -j SVCNET-SEP-RBN6CX4YK74QM46G
            nat    -A SVCNET-SVC-DRUUMA4DP7SUVL2N -m comment --comment "default/wrr -> 10.244.3.2:8080" -j SVCNET-SEP-X3L56TU36VIILIIN
        "#]],
    );
    check(
        &s,
        "default/rr",
        expect![[r#"
            filter -A SVCNET-CLUSTER-IPS -m comment --comment "default/rr cluster IP, other ports" -d 10.96.0.21 -j REJECT
            nat    :SVCNET-SEP-CIR4PJWIC5KX46HY - [0:0]
            nat    :SVCNET-SEP-EUQ4ZMT66AHUTDCY - [0:0]
            nat    :SVCNET-SEP-I3G4LVD2QB6X32CC - [0:0]
            nat    :SVCNET-SVC-Y2JJW5KOTIA4SWU2 - [0:0]
            nat    -A SVCNET-SERVICES -m comment --comment "default/rr cluster IP" -m tcp -p tcp -d 10.96.0.21 --dport 80 -j SVCNET-SVC-Y2JJW5KOTIA4SWU2
            nat    -A SVCNET-SEP-CIR4PJWIC5KX46HY -m comment --comment "default/rr" -s 10.244.3.2 -j SVCNET-MARK-MASQ
            nat    -A SVCNET-SEP-CIR4PJWIC5KX46HY -m comment --comment "default/rr" -m tcp -p tcp -j DNAT --to-destination 10.244.3.2:8080
            nat    -A SVCNET-SEP-EUQ4ZMT66AHUTDCY -m comment --comment "default/rr" -s 10.244.2.2 -j SVCNET-MARK-MASQ
            nat    -A SVCNET-SEP-EUQ4ZMT66AHUTDCY -m comment --comment "default/rr" -m tcp -p tcp -j DNAT --to-destination 10.244.2.2:8080
            nat    -A SVCNET-SEP-I3G4LVD2QB6X32CC -m comment --comment "default/rr" -s 10.244.1.2 -j SVCNET-MARK-MASQ
            nat    -A SVCNET-SEP-I3G4LVD2QB6X32CC -m comment --comment "default/rr" -m tcp -p tcp -j DNAT --to-destination 10.244.1.2:8080
            nat    -A SVCNET-SVC-Y2JJW5KOTIA4SWU2 -m comment --comment "default/rr cluster IP" -m tcp -p tcp -d 10.96.0.21 --dport 80 ! -s 10.244.0.0/16 -j SVCNET-MARK-MASQ
            nat    -A SVCNET-SVC-Y2JJW5KOTIA4SWU2 -m comment --comment "default/rr -> 10.244.1.2:8080" -m statistic --mode nth --every 3 --packet 0 -j SVCNET-SEP-I3G4LVD2QB6X32CC
            nat    -A SVCNET-SVC-Y2JJW5KOTIA4SWU2 -m comment --comment "default/rr -> 10.244.2.2:8080" -m statistic --mode nth --every 2 --packet 0 -j SVCNET-SEP-EUQ4ZMT66AHUTDCY
            nat    -A SVCNET-SVC-Y2JJW5KOTIA4SWU2 -m comment --comment "default/rr -> 10.244.3.2:8080" -j SVCNET-SEP-CIR4PJWIC5KX46HY
        "#]],
    );
    check(
        &s,
        "default/sticky",
        expect![[r#"
            filter -A SVCNET-CLUSTER-IPS -m comment --comment "default/sticky cluster IP, other ports" -d 10.96.0.11 -j REJECT
            nat    :SVCNET-SEP-6VSJZUSQZX2522B5 - [0:0]
            nat    :SVCNET-SEP-RENCVIZFL3OZ7QBA - [0:0]
            nat    :SVCNET-SVC-BJWR5DPVIKTHVKZU - [0:0]
            nat    -A SVCNET-SERVICES -m comment --comment "default/sticky cluster IP" -m tcp -p tcp -d 10.96.0.11 --dport 80 -j SVCNET-SVC-BJWR5DPVIKTHVKZU
            nat    -A SVCNET-SEP-6VSJZUSQZX2522B5 -m comment --comment "default/sticky" -s 10.244.2.2 -j SVCNET-MARK-MASQ
            nat    -A SVCNET-SEP-6VSJZUSQZX2522B5 -m comment --comment "default/sticky" -m recent --name SVCNET-SEP-6VSJZUSQZX2522B5 --set -m tcp -p tcp -j DNAT --to-destination 10.244.2.2:8080
            nat    -A SVCNET-SEP-RENCVIZFL3OZ7QBA -m comment --comment "default/sticky" -s 10.244.1.2 -j SVCNET-MARK-MASQ
            nat    -A SVCNET-SEP-RENCVIZFL3OZ7QBA -m comment --comment "default/sticky" -m recent --name SVCNET-SEP-RENCVIZFL3OZ7QBA --set -m tcp -p tcp -j DNAT --to-destination 10.244.1.2:8080
            nat    -A SVCNET-SVC-BJWR5DPVIKTHVKZU -m comment --comment "default/sticky cluster IP" -m tcp -p tcp -d 10.96.0.11 --dport 80 ! -s 10.244.0.0/16 -j SVCNET-MARK-MASQ
            nat    -A SVCNET-SVC-BJWR5DPVIKTHVKZU -m comment --comment "default/sticky -> 10.244.1.2:8080" -m recent --name SVCNET-SEP-RENCVIZFL3OZ7QBA --rcheck --seconds 10800 --reap -j SVCNET-SEP-RENCVIZFL3OZ7QBA
            nat    -A SVCNET-SVC-BJWR5DPVIKTHVKZU -m comment --comment "default/sticky -> 10.244.2.2:8080" -m recent --name SVCNET-SEP-6VSJZUSQZX2522B5 --rcheck --seconds 10800 --reap -j SVCNET-SEP-6VSJZUSQZX2522B5
            nat    -A SVCNET-SVC-BJWR5DPVIKTHVKZU -m comment --comment "default/sticky -> 10.244.1.2:8080" -m statistic --mode random --probability 0.5000000000 -j SVCNET-SEP-RENCVIZFL3OZ7QBA
            nat    -A SVCNET-SVC-BJWR5DPVIKTHVKZU -m comment --comment "default/sticky -> 10.244.2.2:8080" -j SVCNET-SEP-6VSJZUSQZX2522B5
        "#]],
    );
    check(
        &s,
        "default/np",
        expect![[r#"
            filter -A SVCNET-CLUSTER-IPS -m comment --comment "default/np cluster IP, other ports" -d 10.96.0.12 -j REJECT
            nat    :SVCNET-EXT-LDATH6LIB7VCFHLW - [0:0]
            nat    :SVCNET-SEP-452MO6KHCX4VOXDH - [0:0]
            nat    :SVCNET-SEP-CZKVABC4VEAJWKI3 - [0:0]
            nat    :SVCNET-SVC-LDATH6LIB7VCFHLW - [0:0]
            nat    -A SVCNET-SERVICES -m comment --comment "default/np cluster IP" -m tcp -p tcp -d 10.96.0.12 --dport 80 -j SVCNET-SVC-LDATH6LIB7VCFHLW
            nat    -A SVCNET-NODEPORTS -m comment --comment "default/np" -m tcp -p tcp --dport 30080 -j SVCNET-EXT-LDATH6LIB7VCFHLW
            nat    -A SVCNET-EXT-LDATH6LIB7VCFHLW -m comment --comment "masquerade traffic for default/np external destinations" -j SVCNET-MARK-MASQ
            nat    -A SVCNET-EXT-LDATH6LIB7VCFHLW -j SVCNET-SVC-LDATH6LIB7VCFHLW
            nat    -A SVCNET-SEP-452MO6KHCX4VOXDH -m comment --comment "default/np" -s 10.244.1.2 -j SVCNET-MARK-MASQ
            nat    -A SVCNET-SEP-452MO6KHCX4VOXDH -m comment --comment "default/np" -m tcp -p tcp -j DNAT --to-destination 10.244.1.2:8080
            nat    -A SVCNET-SEP-CZKVABC4VEAJWKI3 -m comment --comment "default/np" -s 10.244.2.2 -j SVCNET-MARK-MASQ
            nat    -A SVCNET-SEP-CZKVABC4VEAJWKI3 -m comment --comment "default/np" -m tcp -p tcp -j DNAT --to-destination 10.244.2.2:8080
            nat    -A SVCNET-SVC-LDATH6LIB7VCFHLW -m comment --comment "default/np cluster IP" -m tcp -p tcp -d 10.96.0.12 --dport 80 ! -s 10.244.0.0/16 -j SVCNET-MARK-MASQ
            nat    -A SVCNET-SVC-LDATH6LIB7VCFHLW -m comment --comment "default/np -> 10.244.1.2:8080" -m statistic --mode random --probability 0.5000000000 -j SVCNET-SEP-452MO6KHCX4VOXDH
            nat    -A SVCNET-SVC-LDATH6LIB7VCFHLW -m comment --comment "default/np -> 10.244.2.2:8080" -j SVCNET-SEP-CZKVABC4VEAJWKI3
        "#]],
    );
    check(
        &s,
        "default/lb-allow",
        expect![[r#"
            filter -A SVCNET-CLUSTER-IPS -m comment --comment "default/lb-allow cluster IP, other ports" -d 10.96.0.13 -j REJECT
            filter -A SVCNET-PROXY-FIREWALL -m comment --comment "default/lb-allow traffic not accepted by SVCNET-FW-GC7Y7IJYPANGCVQV" -m tcp -p tcp -d 203.0.113.7 --dport 80 -j DROP
            nat    :SVCNET-EXT-GC7Y7IJYPANGCVQV - [0:0]
            nat    :SVCNET-FW-GC7Y7IJYPANGCVQV - [0:0]
            nat    :SVCNET-SEP-5GLPCCP253PEMW55 - [0:0]
            nat    :SVCNET-SEP-RXBCLR5JDJNX6VHO - [0:0]
            nat    :SVCNET-SVC-GC7Y7IJYPANGCVQV - [0:0]
            nat    -A SVCNET-SERVICES -m comment --comment "default/lb-allow cluster IP" -m tcp -p tcp -d 10.96.0.13 --dport 80 -j SVCNET-SVC-GC7Y7IJYPANGCVQV
            nat    -A SVCNET-SERVICES -m comment --comment "default/lb-allow loadbalancer IP" -m tcp -p tcp -d 203.0.113.7 --dport 80 -j SVCNET-FW-GC7Y7IJYPANGCVQV
            nat    -A SVCNET-NODEPORTS -m comment --comment "default/lb-allow" -m tcp -p tcp --dport 30084 -j SVCNET-EXT-GC7Y7IJYPANGCVQV
            nat    -A SVCNET-EXT-GC7Y7IJYPANGCVQV -m comment --comment "masquerade traffic for default/lb-allow external destinations" -j SVCNET-MARK-MASQ
            nat    -A SVCNET-EXT-GC7Y7IJYPANGCVQV -j SVCNET-SVC-GC7Y7IJYPANGCVQV
            nat    -A SVCNET-FW-GC7Y7IJYPANGCVQV -m comment --comment "default/lb-allow loadbalancer IP" -s 192.168.50.0/24 -j SVCNET-EXT-GC7Y7IJYPANGCVQV
            nat    -A SVCNET-FW-GC7Y7IJYPANGCVQV -m comment --comment "other traffic to default/lb-allow will be dropped by SVCNET-PROXY-FIREWALL"
            nat    -A SVCNET-SEP-5GLPCCP253PEMW55 -m comment --comment "default/lb-allow" -s 10.244.2.2 -j SVCNET-MARK-MASQ
            nat    -A SVCNET-SEP-5GLPCCP253PEMW55 -m comment --comment "default/lb-allow" -m tcp -p tcp -j DNAT --to-destination 10.244.2.2:8080
            nat    -A SVCNET-SEP-RXBCLR5JDJNX6VHO -m comment --comment "default/lb-allow" -s 10.244.1.2 -j SVCNET-MARK-MASQ
            nat    -A SVCNET-SEP-RXBCLR5JDJNX6VHO -m comment --comment "default/lb-allow" -m tcp -p tcp -j DNAT --to-destination 10.244.1.2:8080
            nat    -A SVCNET-SVC-GC7Y7IJYPANGCVQV -m comment --comment "default/lb-allow cluster IP" -m tcp -p tcp -d 10.96.0.13 --dport 80 ! -s 10.244.0.0/16 -j SVCNET-MARK-MASQ
            nat    -A SVCNET-SVC-GC7Y7IJYPANGCVQV -m comment --comment "default/lb-allow -> 10.244.1.2:8080" -m statistic --mode random --probability 0.5000000000 -j SVCNET-SEP-RXBCLR5JDJNX6VHO
            nat    -A SVCNET-SVC-GC7Y7IJYPANGCVQV -m comment --comment "default/lb-allow -> 10.244.2.2:8080" -j SVCNET-SEP-5GLPCCP253PEMW55
        "#]],
    );
    check(
        &s,
        "default/local",
        expect![[r#"
            filter -A SVCNET-CLUSTER-IPS -m comment --comment "default/local cluster IP, other ports" -d 10.96.0.14 -j REJECT
            nat    :SVCNET-EXT-NEXWZWH5PGMW4KIO - [0:0]
            nat    :SVCNET-SEP-5IKIAQ5HWSI6JIXU - [0:0]
            nat    :SVCNET-SEP-RRIP2IYJ55HSUSLQ - [0:0]
            nat    :SVCNET-SVC-NEXWZWH5PGMW4KIO - [0:0]
            nat    :SVCNET-SVL-NEXWZWH5PGMW4KIO - [0:0]
            nat    -A SVCNET-SERVICES -m comment --comment "default/local cluster IP" -m tcp -p tcp -d 10.96.0.14 --dport 80 -j SVCNET-SVC-NEXWZWH5PGMW4KIO
            nat    -A SVCNET-SERVICES -m comment --comment "default/local external IP" -m tcp -p tcp -d 198.51.100.9 --dport 80 -j SVCNET-EXT-NEXWZWH5PGMW4KIO
            nat    -A SVCNET-NODEPORTS -m comment --comment "default/local" -m tcp -p tcp --dport 30081 -j SVCNET-EXT-NEXWZWH5PGMW4KIO
            nat    -A SVCNET-EXT-NEXWZWH5PGMW4KIO -m comment --comment "pod traffic for default/local external destinations" -s 10.244.0.0/16 -j SVCNET-SVC-NEXWZWH5PGMW4KIO
            nat    -A SVCNET-EXT-NEXWZWH5PGMW4KIO -m comment --comment "masquerade LOCAL traffic for default/local external destinations" -m addrtype --src-type LOCAL -j SVCNET-MARK-MASQ
            nat    -A SVCNET-EXT-NEXWZWH5PGMW4KIO -m comment --comment "route LOCAL traffic for default/local external destinations" -m addrtype --src-type LOCAL -j SVCNET-SVC-NEXWZWH5PGMW4KIO
            nat    -A SVCNET-EXT-NEXWZWH5PGMW4KIO -j SVCNET-SVL-NEXWZWH5PGMW4KIO
            nat    -A SVCNET-SEP-5IKIAQ5HWSI6JIXU -m comment --comment "default/local" -s 10.244.2.2 -j SVCNET-MARK-MASQ
            nat    -A SVCNET-SEP-5IKIAQ5HWSI6JIXU -m comment --comment "default/local" -m tcp -p tcp -j DNAT --to-destination 10.244.2.2:8080
            nat    -A SVCNET-SEP-RRIP2IYJ55HSUSLQ -m comment --comment "default/local" -s 10.244.1.2 -j SVCNET-MARK-MASQ
            nat    -A SVCNET-SEP-RRIP2IYJ55HSUSLQ -m comment --comment "default/local" -m tcp -p tcp -j DNAT --to-destination 10.244.1.2:8080
            nat    -A SVCNET-SVC-NEXWZWH5PGMW4KIO -m comment --comment "default/local cluster IP" -m tcp -p tcp -d 10.96.0.14 --dport 80 ! -s 10.244.0.0/16 -j SVCNET-MARK-MASQ
            nat    -A SVCNET-SVC-NEXWZWH5PGMW4KIO -m comment --comment "default/local -> 10.244.1.2:8080" -m statistic --mode random --probability 0.5000000000 -j SVCNET-SEP-RRIP2IYJ55HSUSLQ
            nat    -A SVCNET-SVC-NEXWZWH5PGMW4KIO -m comment --comment "default/local -> 10.244.2.2:8080" -j SVCNET-SEP-5IKIAQ5HWSI6JIXU
            nat    -A SVCNET-SVL-NEXWZWH5PGMW4KIO -m comment --comment "default/local -> 10.244.1.2:8080" -j SVCNET-SEP-RRIP2IYJ55HSUSLQ
        "#]],
    );
    check(
        &s,
        "default/remote",
        expect![[r#"
            filter -A SVCNET-EXTERNAL-SERVICES -m comment --comment "default/remote has no local endpoints" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 30082 -j DROP
            filter -A SVCNET-CLUSTER-IPS -m comment --comment "default/remote cluster IP, other ports" -d 10.96.0.15 -j REJECT
            nat    :SVCNET-EXT-WTUWVVJNNKPUFNHY - [0:0]
            nat    :SVCNET-SEP-XC5LF7DMX7V2ATM7 - [0:0]
            nat    :SVCNET-SVC-WTUWVVJNNKPUFNHY - [0:0]
            nat    -A SVCNET-SERVICES -m comment --comment "default/remote cluster IP" -m tcp -p tcp -d 10.96.0.15 --dport 80 -j SVCNET-SVC-WTUWVVJNNKPUFNHY
            nat    -A SVCNET-NODEPORTS -m comment --comment "default/remote" -m tcp -p tcp --dport 30082 -j SVCNET-EXT-WTUWVVJNNKPUFNHY
            nat    -A SVCNET-EXT-WTUWVVJNNKPUFNHY -m comment --comment "pod traffic for default/remote external destinations" -s 10.244.0.0/16 -j SVCNET-SVC-WTUWVVJNNKPUFNHY
            nat    -A SVCNET-EXT-WTUWVVJNNKPUFNHY -m comment --comment "masquerade LOCAL traffic for default/remote external destinations" -m addrtype --src-type LOCAL -j SVCNET-MARK-MASQ
            nat    -A SVCNET-EXT-WTUWVVJNNKPUFNHY -m comment --comment "route LOCAL traffic for default/remote external destinations" -m addrtype --src-type LOCAL -j SVCNET-SVC-WTUWVVJNNKPUFNHY
            nat    -A SVCNET-SEP-XC5LF7DMX7V2ATM7 -m comment --comment "default/remote" -s 10.244.2.2 -j SVCNET-MARK-MASQ
            nat    -A SVCNET-SEP-XC5LF7DMX7V2ATM7 -m comment --comment "default/remote" -m tcp -p tcp -j DNAT --to-destination 10.244.2.2:8080
            nat    -A SVCNET-SVC-WTUWVVJNNKPUFNHY -m comment --comment "default/remote cluster IP" -m tcp -p tcp -d 10.96.0.15 --dport 80 ! -s 10.244.0.0/16 -j SVCNET-MARK-MASQ
            nat    -A SVCNET-SVC-WTUWVVJNNKPUFNHY -m comment --comment "default/remote -> 10.244.2.2:8080" -j SVCNET-SEP-XC5LF7DMX7V2ATM7
        "#]],
    );
    check(
        &s,
        "default/empty",
        expect![[r#"
            filter -A SVCNET-SERVICES -m comment --comment "default/empty has no endpoints" -m tcp -p tcp -d 10.96.0.16 --dport 80 -j REJECT
            filter -A SVCNET-EXTERNAL-SERVICES -m comment --comment "default/empty has no endpoints" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 30083 -j REJECT
            filter -A SVCNET-CLUSTER-IPS -m comment --comment "default/empty cluster IP, other ports" -d 10.96.0.16 -j REJECT
        "#]],
    );
    check(
        &s,
        "default/itl",
        expect![[r#"
            filter -A SVCNET-SERVICES -m comment --comment "default/itl has no local endpoints" -m tcp -p tcp -d 10.96.0.17 --dport 80 -j DROP
            filter -A SVCNET-CLUSTER-IPS -m comment --comment "default/itl cluster IP, other ports" -d 10.96.0.17 -j REJECT
        "#]],
    );
    // Headless services get no rule at all.
    let (_, _, payload) = full(&s);
    assert!(!payload.to_string().contains("headless"));
}

#[test]
fn partial_sync_touches_only_changed_services() {
    let mut s = world();
    s.take_changes();
    let (mut r, mut fake, _) = full(&s);
    // web scales from 3 to 2 endpoints.
    s.update_slice(&slice("default", "web-1", "web", |b| {
        b.port("http", "TCP", 8080)
            .endpoint("10.244.1.2", NODE, |_| {})
            .endpoint("10.244.2.2", "n2", |_| {});
    }));
    let changes = s.take_changes();
    let desired = s.desired_for(IpFamily::V4, changes.services.keys());
    let plan = r
        .plan_partial(&s.node_state(IpFamily::V4), &desired)
        .unwrap();
    fake.apply(&plan.payload).unwrap();
    let text = plan.payload.to_string();
    // Only web's changed chain is declared (flushed), plus the removed endpoint's chain,
    // which is deleted; the shared chains are not touched (web's frontend rule is unchanged).
    let declared: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with(':') || l.starts_with('*') || l.starts_with("-X"))
        .collect();
    expect![[r#"
        *nat
        :SVCNET-SVC-CDGGSHYLG3RE2FKL - [0:0]
        :SVCNET-SEP-UTFLDO4GY7FI2SFB - [0:0]
        -X SVCNET-SEP-UTFLDO4GY7FI2SFB"#]]
    .assert_eq(&declared.join("\n"));
    expect![[r#"
        nat    :SVCNET-SVC-CDGGSHYLG3RE2FKL - [0:0]
        nat    -A SVCNET-SVC-CDGGSHYLG3RE2FKL -m comment --comment "default/web:http cluster IP" -m tcp -p tcp -d 10.96.0.10 --dport 80 ! -s 10.244.0.0/16 -j SVCNET-MARK-MASQ
        nat    -A SVCNET-SVC-CDGGSHYLG3RE2FKL -m comment --comment "default/web:http -> 10.244.1.2:8080" -m statistic --mode random --probability 0.5000000000 -j SVCNET-SEP-UIQK3OSOSTRHRPBX
        nat    -A SVCNET-SVC-CDGGSHYLG3RE2FKL -m comment --comment "default/web:http -> 10.244.2.2:8080" -j SVCNET-SEP-4EX2N4PG4ASNZOBF
    "#]]
    .assert_eq(&service_lines(&plan.payload, "default/web:http"));
    r.commit(plan);
    let (_, fresh, _) = full(&s);
    assert_eq!(normalized(&fake.dump()), normalized(&fresh.dump()));
    // Deleting a service deletes all its chains.
    s.delete_service(&NamespacedName::new("default", "web"));
    let changes = s.take_changes();
    let desired = s.desired_for(IpFamily::V4, changes.services.keys());
    let plan = r
        .plan_partial(&s.node_state(IpFamily::V4), &desired)
        .unwrap();
    fake.apply(&plan.payload).unwrap();
    // Its frontend rule is deleted from the shared chain by specification (`-D`), in the
    // commit that flushes and deletes its chains.
    expect![[r#"
        *filter
        -D SVCNET-CLUSTER-IPS -m comment --comment "default/web:http cluster IP, other ports" -d 10.96.0.10 -j REJECT
        COMMIT
        *nat
        :SVCNET-SEP-4EX2N4PG4ASNZOBF - [0:0]
        :SVCNET-SEP-UIQK3OSOSTRHRPBX - [0:0]
        :SVCNET-SVC-CDGGSHYLG3RE2FKL - [0:0]
        -D SVCNET-SERVICES -m comment --comment "default/web:http cluster IP" -m tcp -p tcp -d 10.96.0.10 --dport 80 -j SVCNET-SVC-CDGGSHYLG3RE2FKL
        -X SVCNET-SEP-4EX2N4PG4ASNZOBF
        -X SVCNET-SEP-UIQK3OSOSTRHRPBX
        -X SVCNET-SVC-CDGGSHYLG3RE2FKL
        COMMIT
    "#]]
    .assert_eq(&plan.payload.to_string());
    let deleted: Vec<&str> = plan
        .payload
        .get(Table::Nat)
        .unwrap()
        .deletes
        .iter()
        .map(String::as_str)
        .collect();
    assert_eq!(deleted.len(), 3, "{deleted:?}");
    assert!(!fake.dump().contains("default/web"));
}

#[test]
fn ipv6_payload() {
    let mut s = ProxyState::new(config());
    s.update_service(&service("default", "v6", |b| {
        b.cluster_ip(&["fd00:10:96::10"])
            .node_port("", "TCP", 80, 30090);
    }))
    .unwrap();
    s.update_slice(&slice("default", "v6-1", "v6", |b| {
        b.ipv6()
            .port("", "TCP", 8080)
            .endpoint("fd00:244:1::2", NODE, |_| {});
    }));
    let r = Renderer::new(Family::V6);
    let plan = r.plan_full(&s.desired(IpFamily::V6), None);
    FakeIptables::new().apply(&plan.payload).unwrap();
    expect![[r#"
        filter -A SVCNET-CLUSTER-IPS -m comment --comment "default/v6 cluster IP, other ports" -d fd00:10:96::10 -j REJECT
        nat    :SVCNET-EXT-VF4TOXHNK44YGQLE - [0:0]
        nat    :SVCNET-SEP-2LUABZMGJ5OEE4ZN - [0:0]
        nat    :SVCNET-SVC-VF4TOXHNK44YGQLE - [0:0]
        nat    -A SVCNET-SERVICES -m comment --comment "default/v6 cluster IP" -m tcp -p tcp -d fd00:10:96::10 --dport 80 -j SVCNET-SVC-VF4TOXHNK44YGQLE
        nat    -A SVCNET-NODEPORTS -m comment --comment "default/v6" -m tcp -p tcp --dport 30090 -j SVCNET-EXT-VF4TOXHNK44YGQLE
        nat    -A SVCNET-EXT-VF4TOXHNK44YGQLE -m comment --comment "masquerade traffic for default/v6 external destinations" -j SVCNET-MARK-MASQ
        nat    -A SVCNET-EXT-VF4TOXHNK44YGQLE -j SVCNET-SVC-VF4TOXHNK44YGQLE
        nat    -A SVCNET-SEP-2LUABZMGJ5OEE4ZN -m comment --comment "default/v6" -s fd00:244:1::2 -j SVCNET-MARK-MASQ
        nat    -A SVCNET-SEP-2LUABZMGJ5OEE4ZN -m comment --comment "default/v6" -m tcp -p tcp -j DNAT --to-destination [fd00:244:1::2]:8080
        nat    -A SVCNET-SVC-VF4TOXHNK44YGQLE -m comment --comment "default/v6 -> [fd00:244:1::2]:8080" -j SVCNET-SEP-2LUABZMGJ5OEE4ZN
    "#]]
    .assert_eq(&service_lines(&plan.payload, "default/v6"));
    assert!(
        plan.payload
            .to_string()
            .contains("! -d ::1/128 -j SVCNET-NODEPORTS")
    );
}

/// Staged payloads (several nat commits: a prelude, whole services' chains, then the shared
/// chains) converge to exactly the same tables as one commit, for full and partial syncs, and
/// a kernel that rejects dangling references accepts every stage in order.
#[test]
fn staged_payloads_converge_to_the_single_commit() {
    let mut s = world();
    s.take_changes();
    let mut staged = Renderer::new(Family::V4);
    staged.set_staging(Some(4));
    let plan = staged.plan_full(&s.desired(IpFamily::V4), Some(&KernelChains::new()));
    let sections = plan.payload.sections(Table::Nat).count();
    assert!(sections > 3, "expected several nat commits, got {sections}");
    // The prelude writes only the masquerade chains; the last commit all shared chains.
    let first = plan.payload.sections(Table::Nat).next().unwrap();
    assert_eq!(
        first.chains,
        ["SVCNET-MARK-MASQ", "SVCNET-MASQ-OFF-CLUSTER"]
    );
    let last = plan.payload.get(Table::Nat).unwrap();
    assert!(last.chains.iter().any(|c| c == "SVCNET-SERVICES"));
    assert!(!last.chains.iter().any(|c| c.starts_with("SVCNET-SEP-")));
    let mut fake = FakeIptables::new();
    fake.apply(&plan.payload).unwrap();
    for h in &plan.hooks {
        fake.ensure_hook(h).unwrap();
    }
    staged.commit(plan);
    let (mut single, mut single_fake, _) = full(&s);
    assert_eq!(fake.dump(), single_fake.dump());
    // A partial sync touching two services, staged with one service per commit.
    staged.set_staging(Some(1));
    for (ns, name) in [("default", "np-1"), ("default", "web-1")] {
        s.delete_slice(ns, name);
    }
    let changes = s.take_changes();
    let desired = s.desired_for(IpFamily::V4, changes.services.keys());
    let node = s.node_state(IpFamily::V4);
    let a = staged.plan_partial(&node, &desired).unwrap();
    let b = single.plan_partial(&node, &desired).unwrap();
    fake.apply(&a.payload).unwrap();
    single_fake.apply(&b.payload).unwrap();
    assert_eq!(normalized(&fake.dump()), normalized(&single_fake.dump()));
    staged.commit(a);
    single.commit(b);
}

/// A plan reports the ports whose algorithm its rules cannot express (random instead): lc,
/// dh and maglev, and sh over more hash slots than `-m cluster` has; a partial plan only the
/// ports it re-rendered. (Moved from proxyd, which used to recompute this after each sync.)
#[test]
fn plans_report_what_their_rules_cannot_express() {
    use svcnet_lb::{Algorithm, Dataplane};
    let mut state = ProxyState::new(config());
    let algorithms = ["", "random", "rr", "wrr", "sh", "lc", "dh", "maglev", "sh"];
    for (i, a) in algorithms.iter().enumerate() {
        let name = format!("s{i}");
        let mut svc = service("default", &name, |b| {
            b.cluster_ip(&[&format!("10.96.1.{}", i + 1)])
                .port("", "TCP", 80);
        });
        if !a.is_empty() {
            svc.metadata.annotations = Some(
                [(svcnet_lb::ANNOTATION.to_string(), a.to_string())]
                    .into_iter()
                    .collect(),
            );
        }
        state.update_service(&svc).unwrap();
        // The last `sh` service has 33 endpoints: more than `-m cluster` has slots.
        let endpoints = if i + 1 == algorithms.len() { 33 } else { 3 };
        state.update_slice(&slice("default", &format!("{name}-1"), &name, |b| {
            b.port("", "TCP", 8080);
            for e in 0..endpoints {
                b.endpoint(&format!("10.244.1.{}", e + 2), "n1", |_| {});
            }
        }));
    }
    let mut r = Renderer::new(Family::V4);
    let plan = r.plan_full(&state.desired(IpFamily::V4), None);
    let fallback = |i: usize| {
        plan.fallbacks
            .iter()
            .find(|(spn, _)| spn.service.name == format!("s{i}"))
            .map(|(_, f)| f.clone())
    };
    for (i, a) in algorithms.iter().enumerate().take(5) {
        assert_eq!(fallback(i), None, "{a}");
    }
    for i in 5..9 {
        let f = fallback(i).unwrap();
        assert_eq!(
            (f.used, f.dataplane),
            (Algorithm::Random, Dataplane::Iptables)
        );
    }
    assert_eq!(plan.fallbacks.len(), 4);
    let dh = fallback(6).unwrap().to_string();
    assert!(dh.contains("hashes the destination"), "{dh}");
    let big = fallback(8).unwrap().to_string();
    assert!(big.contains("at most 32 slots"), "{big}");
    r.commit(plan);
    // A partial plan of one changed service lists only that one.
    state.take_changes();
    state.update_slice(&slice("default", "s5-1", "s5", |b| {
        b.port("", "TCP", 8080).endpoint("10.244.1.2", "n1", |_| {});
    }));
    let changes = state.take_changes();
    let partial = r
        .plan_partial(
            &state.node_state(IpFamily::V4),
            &state.desired_for(IpFamily::V4, changes.services.keys()),
        )
        .unwrap();
    let names: Vec<String> = partial
        .fallbacks
        .iter()
        .map(|(spn, _)| spn.service.name.clone())
        .collect();
    assert_eq!(names, ["s5"]);
}

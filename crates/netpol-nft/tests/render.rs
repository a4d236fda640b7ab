//! The rendered table and each change's transaction, as snapshots (`UPDATE_EXPECT=1` to
//! refresh): what the kernel is given is reviewed as text. Incremental changes are checked to
//! touch only what they are about.
#![allow(clippy::unwrap_used)]

mod common;

use common::{fixed, labels, model, policy};
use expect_test::expect;
use serde_json::json;
use svcnet_libnft::Op;
use svcnet_netpol::{Cluster, IpBlock};
use svcnet_netpol_nft::render::ranges;
use svcnet_netpol_nft::{Options, plan, plan_full, render};

fn cluster() -> Cluster {
    let mut c = model(fixed);
    // z lives on another node: its pods are in selector sets, never in this node's
    // isolation sets.
    for p in c.pods.iter_mut().filter(|p| p.namespace == "z") {
        p.node = Some("node2".into());
    }
    c.policies = vec![
        policy(
            "x",
            "allow-y-b",
            json!({
                "podSelector": {"matchLabels": {"pod": "a"}},
                "ingress": [{
                    "from": [
                        {"namespaceSelector": {"matchLabels": {"ns": "y"}},
                         "podSelector": {"matchLabels": {"pod": "b"}}},
                        {"ipBlock": {"cidr": "10.244.0.0/16", "except": ["10.244.1.0/24"]}},
                    ],
                    "ports": [{"port": 80, "endPort": 81}, {"protocol": "UDP", "port": "serve-80-udp"}],
                }],
            }),
        ),
        policy(
            "y",
            "deny-egress",
            json!({"podSelector": {}, "policyTypes": ["Egress"]}),
        ),
    ];
    c
}

#[test]
fn the_table_of_a_node() {
    let r = render(&cluster(), "node1", &Options::default());
    expect![[r#"
        set block-0cac71f0acbb { type ipv4_addr ; flags interval ; # 10.244.0.0/16 except 10.244.1.0/24
          { 10.244.0.0-10.244.0.255, 10.244.2.0-10.244.255.255 }
        }
        set egress-isolated { type ipv4_addr : verdict ; # this node's pods isolated for egress
          { 10.244.1.10 : jump out-ns-af63f44c8602, 10.244.1.11 : jump out-ns-af63f44c8602, 10.244.1.12 : jump out-ns-af63f44c8602 }
        }
        set ingress-isolated { type ipv4_addr : verdict ; # this node's pods isolated for ingress
          { 10.244.0.10 : jump in-ns-af63f54c8602 }
        }
        set pods-0096132d46ea { type ipv4_addr ; # namespace x, pods pod=a
          { 10.244.0.10 }
        }
        set pods-486b6c67b6ae { type ipv4_addr ; # namespaces ns=y, pods pod=b
          { 10.244.1.11 }
        }
        set pods-adce33ceda67 { type ipv4_addr ; # namespace y, pods {}
          { 10.244.1.10, 10.244.1.11, 10.244.1.12 }
        }
        set port-88d35c05f8ac { type ipv4_addr . inet_proto . inet_service ; # port serve-80-udp
          { 10.244.0.10 . udp . 80, 10.244.0.11 . udp . 80, 10.244.0.12 . udp . 80, 10.244.1.10 . udp . 80, 10.244.1.11 . udp . 80, 10.244.1.12 . udp . 80, 10.244.2.10 . udp . 80, 10.244.2.11 . udp . 80, 10.244.2.12 . udp . 80 }
        }
        chain egress-forward { type filter hook forward priority 0 ;
          ct state established,related accept
          ip saddr vmap @egress-isolated
        }
        chain egress-input { type filter hook input priority 110 ;
          ct state established,related accept
          ip saddr vmap @egress-isolated
        }
        chain egress-output { type filter hook output priority 0 ;
          ct state established,related accept
          ip saddr vmap @egress-isolated
        }
        chain in-3688f9951893 {
          ip saddr @pods-486b6c67b6ae meta l4proto . th dport { tcp . 80-81 } accept
          ip saddr @pods-486b6c67b6ae meta l4proto udp ip daddr . meta l4proto . th dport @port-88d35c05f8ac accept
          ip saddr @block-0cac71f0acbb meta l4proto . th dport { tcp . 80-81 } accept
          ip saddr @block-0cac71f0acbb meta l4proto udp ip daddr . meta l4proto . th dport @port-88d35c05f8ac accept
        }
        chain in-ns-af63f54c8602 {
          ip daddr @pods-0096132d46ea jump in-3688f9951893 comment "x/allow-y-b"
          reject with icmp type admin-prohibited
        }
        chain ingress-forward { type filter hook forward priority 1 ;
          ct state established,related accept
          ip daddr vmap @ingress-isolated
        }
        chain ingress-output { type filter hook output priority 1 ;
          ct state established,related accept
          fib saddr type local accept
          ip daddr vmap @ingress-isolated
        }
        chain out-043841dc574e {
        }
        chain out-ns-af63f44c8602 {
          ip saddr @pods-adce33ceda67 jump out-043841dc574e comment "y/deny-egress"
          reject with icmp type admin-prohibited
        }
    "#]]
    .assert_eq(&r.to_string());
}

/// Under the userspace proxy, which relays Service connections from its own sockets and
/// judges each itself: connections redirected to it pass `egress-input`, and new connections
/// from the nodes' proxy addresses pass `ingress-forward` (of the family they belong to);
/// nothing else changes.
#[test]
fn under_the_userspace_proxy_its_two_legs_are_left_to_it() {
    let plain = render(&cluster(), "node1", &Options::default());
    let opts = Options {
        proxy_sources: vec!["10.244.1.1".parse().unwrap(), "10.244.2.1".parse().unwrap()],
        ..Options::default()
    };
    let relayed = render(&cluster(), "node1", &opts);
    let chain = |r: &svcnet_netpol_nft::Ruleset, name: &str| r.chains[name].rules.join("\n");
    expect![[r#"
        ct state established,related accept
        ct status dnat accept comment "to the proxy, which judges it"
        ip saddr vmap @egress-isolated"#]]
    .assert_eq(&chain(&relayed, "egress-input"));
    expect![[r#"
        ct state established,related accept
        ip saddr { 10.244.1.1, 10.244.2.1 } accept comment "from a node proxy, which judged it"
        ip daddr vmap @ingress-isolated"#]]
    .assert_eq(&chain(&relayed, "ingress-forward"));
    for name in ["egress-forward", "egress-output", "ingress-output"] {
        assert_eq!(relayed.chains[name], plain.chains[name], "{name}");
    }
    assert_eq!(relayed.sets, plain.sets);
    // The IPv6 table has no IPv4 proxy address to trust; it still leaves redirects alone.
    let v6 = render(
        &cluster(),
        "node1",
        &Options {
            family: svcnet_libnft::Family::Ip6,
            ..opts
        },
    );
    assert!(!chain(&v6, "ingress-forward").contains("saddr {"));
    assert!(chain(&v6, "egress-input").contains("ct status dnat accept"));
}

#[test]
fn the_first_sync_recreates_the_table_in_one_batch() {
    let mut c = cluster();
    c.policies.truncate(1);
    let tx = plan_full(&render(&c, "node1", &Options::default()));
    expect![[r#"
        add table ip svcnet-netpol { comment "svcnet NetworkPolicy enforcement" ; }
        delete table ip svcnet-netpol
        add table ip svcnet-netpol { comment "svcnet NetworkPolicy enforcement" ; }
        add chain ip svcnet-netpol egress-forward { type filter hook forward priority 0 ; }
        add chain ip svcnet-netpol egress-input { type filter hook input priority 110 ; }
        add chain ip svcnet-netpol egress-output { type filter hook output priority 0 ; }
        add chain ip svcnet-netpol in-3688f9951893
        add chain ip svcnet-netpol in-ns-af63f54c8602
        add chain ip svcnet-netpol ingress-forward { type filter hook forward priority 1 ; }
        add chain ip svcnet-netpol ingress-output { type filter hook output priority 1 ; }
        add set ip svcnet-netpol block-0cac71f0acbb { type ipv4_addr ; flags interval ; comment "10.244.0.0/16 except 10.244.1.0/24" ; }
        add set ip svcnet-netpol block-0cac71f0acbb { type ipv4_addr ; flags interval ; comment "10.244.0.0/16 except 10.244.1.0/24" ; elements = { 10.244.0.0-10.244.0.255, 10.244.2.0-10.244.255.255 } ; }
        add map ip svcnet-netpol egress-isolated { type ipv4_addr : verdict ; comment "this node's pods isolated for egress" ; }
        add map ip svcnet-netpol ingress-isolated { type ipv4_addr : verdict ; comment "this node's pods isolated for ingress" ; }
        add map ip svcnet-netpol ingress-isolated { type ipv4_addr : verdict ; comment "this node's pods isolated for ingress" ; elements = { 10.244.0.10 : jump in-ns-af63f54c8602 } ; }
        add set ip svcnet-netpol pods-0096132d46ea { type ipv4_addr ; comment "namespace x, pods pod=a" ; }
        add set ip svcnet-netpol pods-0096132d46ea { type ipv4_addr ; comment "namespace x, pods pod=a" ; elements = { 10.244.0.10 } ; }
        add set ip svcnet-netpol pods-486b6c67b6ae { type ipv4_addr ; comment "namespaces ns=y, pods pod=b" ; }
        add set ip svcnet-netpol pods-486b6c67b6ae { type ipv4_addr ; comment "namespaces ns=y, pods pod=b" ; elements = { 10.244.1.11 } ; }
        add set ip svcnet-netpol port-88d35c05f8ac { type ipv4_addr . inet_proto . inet_service ; comment "port serve-80-udp" ; }
        add set ip svcnet-netpol port-88d35c05f8ac { type ipv4_addr . inet_proto . inet_service ; comment "port serve-80-udp" ; elements = { 10.244.0.10 . udp . 80, 10.244.0.11 . udp . 80, 10.244.0.12 . udp . 80, 10.244.1.10 . udp . 80, 10.244.1.11 . udp . 80, 10.244.1.12 . udp . 80, 10.244.2.10 . udp . 80, 10.244.2.11 . udp . 80, 10.244.2.12 . udp . 80 } ; }
        add chain ip svcnet-netpol egress-forward { ct state established,related accept ; ip saddr vmap @egress-isolated ; }
        add chain ip svcnet-netpol egress-input { ct state established,related accept ; ip saddr vmap @egress-isolated ; }
        add chain ip svcnet-netpol egress-output { ct state established,related accept ; ip saddr vmap @egress-isolated ; }
        add chain ip svcnet-netpol in-3688f9951893 { ip saddr @pods-486b6c67b6ae meta l4proto . th dport { tcp . 80-81 } accept ; ip saddr @pods-486b6c67b6ae meta l4proto udp ip daddr . meta l4proto . th dport @port-88d35c05f8ac accept ; ip saddr @block-0cac71f0acbb meta l4proto . th dport { tcp . 80-81 } accept ; ip saddr @block-0cac71f0acbb meta l4proto udp ip daddr . meta l4proto . th dport @port-88d35c05f8ac accept ; }
        add chain ip svcnet-netpol in-ns-af63f54c8602 { ip daddr @pods-0096132d46ea jump in-3688f9951893 comment "x/allow-y-b" ; reject with icmp type admin-prohibited ; }
        add chain ip svcnet-netpol ingress-forward { ct state established,related accept ; ip daddr vmap @ingress-isolated ; }
        add chain ip svcnet-netpol ingress-output { ct state established,related accept ; fib saddr type local accept ; ip daddr vmap @ingress-isolated ; }
    "#]]
    .assert_eq(&tx.to_string());
}

#[test]
fn a_pod_joining_a_selector_is_an_element_change_only() {
    let before = cluster();
    let mut after = before.clone();
    // y/c gets pod=b: it joins the peer set and the block still excludes namespace y.
    let yc = after
        .pods
        .iter_mut()
        .find(|p| p.namespace == "y" && p.name == "c")
        .unwrap();
    yc.labels = labels(&[("pod", "b")]);
    let opts = Options::default();
    let tx = plan(
        Some(&render(&before, "node1", &opts)),
        &render(&after, "node1", &opts),
    );
    // Elements, and the set's (idempotent) declaration they are written in; no rule moves.
    assert!(
        tx.ops.iter().all(|op| matches!(
            op,
            Op::AddElement { .. } | Op::DeleteElement { .. } | Op::AddSet(_)
        )),
        "{tx}"
    );
    expect![[r#"
        add set ip svcnet-netpol pods-486b6c67b6ae { type ipv4_addr ; comment "namespaces ns=y, pods pod=b" ; }
        add set ip svcnet-netpol pods-486b6c67b6ae { type ipv4_addr ; comment "namespaces ns=y, pods pod=b" ; elements = { 10.244.1.12 } ; }
    "#]]
    .assert_eq(&tx.to_string());
}

#[test]
fn a_new_pod_under_a_policy_is_isolated_by_an_element() {
    let before = cluster();
    let mut after = before.clone();
    let mut pod = after.pods[0].clone();
    pod.name = "d".into();
    pod.ips = vec!["10.244.0.13".parse().unwrap()];
    after.pods.push(pod);
    let opts = Options::default();
    let tx = plan(
        Some(&render(&before, "node1", &opts)),
        &render(&after, "node1", &opts),
    );
    expect![[r#"
        add map ip svcnet-netpol ingress-isolated { type ipv4_addr : verdict ; comment "this node's pods isolated for ingress" ; }
        add map ip svcnet-netpol ingress-isolated { type ipv4_addr : verdict ; comment "this node's pods isolated for ingress" ; elements = { 10.244.0.13 : jump in-ns-af63f54c8602 } ; }
        add set ip svcnet-netpol pods-0096132d46ea { type ipv4_addr ; comment "namespace x, pods pod=a" ; }
        add set ip svcnet-netpol pods-0096132d46ea { type ipv4_addr ; comment "namespace x, pods pod=a" ; elements = { 10.244.0.13 } ; }
        add set ip svcnet-netpol port-88d35c05f8ac { type ipv4_addr . inet_proto . inet_service ; comment "port serve-80-udp" ; }
        add set ip svcnet-netpol port-88d35c05f8ac { type ipv4_addr . inet_proto . inet_service ; comment "port serve-80-udp" ; elements = { 10.244.0.13 . udp . 80 } ; }
    "#]]
    .assert_eq(&tx.to_string());
}

#[test]
fn adding_and_deleting_a_policy_touch_its_own_objects() {
    let before = cluster();
    let mut after = before.clone();
    after.policies.push(policy(
        "z",
        "allow-from-x",
        json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "x"}}}]}]}),
    ));
    let opts = Options::default();
    let (a, b) = (
        render(&before, "node1", &opts),
        render(&after, "node1", &opts),
    );
    // z's pods are on node2: nothing is isolated here, but the policy is rendered.
    expect![[r#"
        add chain ip svcnet-netpol in-a6fea09e42be
        add chain ip svcnet-netpol in-ns-af63f74c8602
        add set ip svcnet-netpol pods-0ef830bf6a42 { type ipv4_addr ; comment "namespaces ns=x, all pods" ; }
        add set ip svcnet-netpol pods-0ef830bf6a42 { type ipv4_addr ; comment "namespaces ns=x, all pods" ; elements = { 10.244.0.10, 10.244.0.11, 10.244.0.12 } ; }
        add set ip svcnet-netpol pods-efb39b116110 { type ipv4_addr ; comment "namespace z, pods {}" ; }
        add set ip svcnet-netpol pods-efb39b116110 { type ipv4_addr ; comment "namespace z, pods {}" ; elements = { 10.244.2.10, 10.244.2.11, 10.244.2.12 } ; }
        add chain ip svcnet-netpol in-a6fea09e42be { ip saddr @pods-0ef830bf6a42 accept ; }
        add chain ip svcnet-netpol in-ns-af63f74c8602 { ip daddr @pods-efb39b116110 jump in-a6fea09e42be comment "z/allow-from-x" ; reject with icmp type admin-prohibited ; }
    "#]]
    .assert_eq(&plan(Some(&a), &b).to_string());
    expect![[r#"
        flush chain ip svcnet-netpol in-a6fea09e42be
        flush chain ip svcnet-netpol in-ns-af63f74c8602
        delete chain ip svcnet-netpol in-a6fea09e42be
        delete chain ip svcnet-netpol in-ns-af63f74c8602
        delete set ip svcnet-netpol pods-0ef830bf6a42
        delete set ip svcnet-netpol pods-efb39b116110
    "#]]
    .assert_eq(&plan(Some(&b), &a).to_string());
    assert!(plan(Some(&a), &a).is_empty());
}

#[test]
fn ip_block_ranges_leave_out_every_except() {
    let block = |cidr: &str, except: &[&str]| IpBlock {
        cidr: cidr.parse().unwrap(),
        except: except.iter().map(|e| e.parse().unwrap()).collect(),
    };
    let show = |b: &IpBlock| {
        ranges(b)
            .iter()
            .map(|(a, b)| format!("{a}-{b}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(show(&block("10.0.0.0/8", &[])), "10.0.0.0-10.255.255.255");
    assert_eq!(
        show(&block(
            "10.0.0.0/8",
            &["10.1.0.0/16", "10.0.0.0/24", "10.1.2.0/24"]
        )),
        "10.0.1.0-10.0.255.255 10.2.0.0-10.255.255.255"
    );
    assert_eq!(show(&block("10.0.0.7/32", &["10.0.0.7/32"])), "");
    assert_eq!(
        show(&block("0.0.0.0/0", &["255.255.255.255/32"])),
        "0.0.0.0-255.255.255.254"
    );
    assert_eq!(show(&block("fd00::/8", &[])), "");
}

#[test]
fn overlapping_port_ranges_are_merged_per_protocol() {
    let mut c = model(fixed);
    c.policies = vec![policy(
        "x",
        "ports",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"ports": [
            {"port": 80, "endPort": 81}, {"port": 81}, {"port": 79}, {"protocol": "UDP"}, {"protocol": "UDP", "port": 53},
        ]}]}),
    )];
    let r = render(&c, "node1", &Options::default());
    let rules: Vec<&String> = r
        .chains
        .iter()
        .filter(|(n, _)| n.starts_with("in-") && !n.starts_with("in-ns-"))
        .flat_map(|(_, c)| &c.rules)
        .collect();
    expect![[r#"
        [
            "meta l4proto . th dport { tcp . 79-81, udp . 0-65535 } accept",
        ]
    "#]]
    .assert_debug_eq(&rules);
}

/// The incremental renderer gives what a full render gives, over a seeded sequence of pod
/// additions, deletions, label, address, port and node changes, namespace label changes and
/// policy creations, deletions and changes; and its recorded changes are complete: planning
/// only them gives the transaction a comparison of the whole tables gives.
#[test]
fn incremental_renders_equal_full_ones() {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use svcnet_netpol::{NamedPort, PortMatch, Protocol};
    use svcnet_netpol_nft::{Renderer, plan_changes};
    let mut rng = StdRng::seed_from_u64(12);
    let mut c = cluster();
    let opts = Options::default();
    let mut renderer = Renderer::new("node1", opts.clone());
    renderer.update(&c);
    renderer.take_changes();
    assert_eq!(renderer.ruleset(), &render(&c, "node1", &opts));
    let spare = [
        policy(
            "y",
            "from-x",
            json!({
                "podSelector": {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["a", "b"]}]},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "x"}}}],
                             "ports": [{"port": "serve-81-tcp"}]}],
                "egress": [{"to": [{"podSelector": {"matchLabels": {"pod": "c"}}},
                                   {"ipBlock": {"cidr": "10.244.0.0/24"}}]}],
            }),
        ),
        policy(
            "z",
            "all-in-ns",
            json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}),
        ),
    ];
    for step in 0..600 {
        let before = renderer.ruleset().clone();
        let n = rng.random_range(0..c.pods.len());
        match rng.random_range(0..12) {
            0 => {
                let v = ["a", "b", "c", "d"][rng.random_range(0..4)];
                c.pods[n].labels.insert("pod".into(), v.into());
            }
            1 => {
                let mut p = c.pods[n].clone();
                p.name = format!("new-{step}");
                // Addresses repeat: a pod may share one with another for a while.
                p.ips = vec![format!("10.244.9.{}", step % 50).parse().unwrap()];
                p.node = Some(["node1", "node2"][rng.random_range(0..2)].into());
                c.pods.push(p);
            }
            2 if c.pods.len() > 3 => {
                c.pods.remove(n);
            }
            3 => c.pods[n].ips = vec![format!("10.244.8.{}", step % 50).parse().unwrap()],
            4 => {
                let ns = &mut c.namespaces[rng.random_range(0..3)];
                let v = ["x", "y", "z"][rng.random_range(0..3)];
                ns.labels.insert("ns".into(), v.into());
            }
            5 => c.policies.reverse(),
            6 => {
                let v = ["a", "b"][rng.random_range(0..2)];
                if let Some(p) = c.policies.first_mut() {
                    p.pod_selector = svcnet_netpol::Selector::labels([("pod", v)]);
                }
            }
            7 => {
                let p = &spare[rng.random_range(0..spare.len())];
                match c.policies.iter().position(|q| q.name == p.name) {
                    Some(i) => {
                        c.policies.remove(i);
                    }
                    None => c.policies.push(p.clone()),
                }
            }
            8 => {
                let i = rng.random_range(0..c.policies.len());
                let p = &mut c.policies[i];
                p.isolates_egress = !p.isolates_egress;
            }
            9 => {
                let i = rng.random_range(0..c.policies.len());
                let hi = rng.random_range(80..83);
                if let Some(rule) = c.policies[i].ingress.first_mut() {
                    rule.ports = vec![svcnet_netpol::Port {
                        protocol: Protocol::Tcp,
                        port: PortMatch::Range(80, hi),
                    }];
                }
            }
            10 => {
                let port = rng.random_range(80..82);
                c.pods[n].ports = vec![NamedPort {
                    name: "serve-81-tcp".into(),
                    port,
                    protocol: Protocol::Tcp,
                }];
            }
            _ => {
                c.pods[n].node = Some(["node1", "node2"][rng.random_range(0..2)].into());
            }
        }
        renderer.update(&c);
        let changes = renderer.take_changes();
        let next = renderer.ruleset();
        assert_eq!(next, &render(&c, "node1", &opts), "step {step}");
        assert_eq!(
            plan_changes(&before, next, &changes),
            plan(Some(&before), next),
            "step {step}: the recorded changes {changes:?} miss something"
        );
    }
    assert_eq!(renderer.render(&c), render(&c, "node1", &opts));
}

//! Shared by the snapshot, tracer and real-kernel tests: the "world" of services (addresses
//! chosen to match `svcnet_netns::test_support::Lab`: pod `i` is `10.244.i.2`, the node IP on
//! the external link `192.168.50.1`, the external client `192.168.50.2`) and the packet-flow
//! case table that states Service behaviour once. svcnet-nft has no shared case table yet, so
//! this one mirrors issue 3's list (cluster IP spread, off-cluster masquerade, hairpin,
//! affinity, node ports, LB source ranges, Local policies, reject/drop without endpoints).
#![allow(dead_code, clippy::unwrap_used)]

pub mod tracer;

use std::net::{IpAddr, Ipv4Addr};

use svcnet_proxy::fixtures::*;
use svcnet_proxy::{CoreConfig, ProxyState};

pub const NODE: &str = "n1";
pub const EXTERNAL_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 2);
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 1);
/// Pods 1..=3 are backends (pod 1 on this node, pods 2 and 3 on node n2); pod 4 is a client.
pub const BACKENDS: usize = 3;
pub const CLIENT_POD: usize = 4;
pub const TCP_PORT: u16 = 8080;
pub const UDP_PORT: u16 = 5353;

pub fn pod_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 244, i as u8, 2)
}

/// The node's address on pod `i`'s link (the masquerade source towards that pod).
pub fn node_ip_towards(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 244, i as u8, 1)
}

pub fn config() -> CoreConfig {
    CoreConfig {
        node_name: NODE.into(),
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        ..Default::default()
    }
}

fn backends(s: &mut ProxyState, ns: &str, svc: &str, port: &str, proto: &str, pods: &[usize]) {
    let target = if proto == "UDP" { UDP_PORT } else { TCP_PORT };
    s.update_slice(&slice(ns, &format!("{svc}-1"), svc, |b| {
        b.port(port, proto, target as i32);
        for &i in pods {
            let node = if i == 1 { NODE } else { "n2" };
            b.endpoint(&pod_ip(i).to_string(), node, |_| {});
        }
    }));
}

/// Every kind of service the dataplane must handle.
pub fn world() -> ProxyState {
    let mut s = ProxyState::new(config());
    let mut add = |svc: k8s_openapi::api::core::v1::Service| s.update_service(&svc).unwrap();
    add(service("default", "web", |b| {
        b.cluster_ip(&["10.96.0.10"]).port("http", "TCP", 80);
    }));
    add(service("default", "sticky", |b| {
        b.cluster_ip(&["10.96.0.11"])
            .port("", "TCP", 80)
            .affinity(Some(10800));
    }));
    add(service("default", "np", |b| {
        b.cluster_ip(&["10.96.0.12"])
            .node_port("", "TCP", 80, 30080);
    }));
    add(service("default", "lb-allow", |b| {
        b.cluster_ip(&["10.96.0.13"])
            .lb_ingress(&["203.0.113.7"])
            .node_port("", "TCP", 80, 30084)
            .source_ranges(&["192.168.50.0/24"]);
    }));
    add(service("default", "lb-deny", |b| {
        b.cluster_ip(&["10.96.0.18"])
            .lb_ingress(&["203.0.113.8"])
            .node_port("", "TCP", 80, 30085)
            .source_ranges(&["172.16.0.0/12"]);
    }));
    add(service("default", "local", |b| {
        b.cluster_ip(&["10.96.0.14"])
            .node_port("", "TCP", 80, 30081)
            .external_ips(&["198.51.100.9"])
            .external_local()
            .health_check_node_port(32000);
    }));
    add(service("default", "remote", |b| {
        b.cluster_ip(&["10.96.0.15"])
            .node_port("", "TCP", 80, 30082)
            .external_local();
    }));
    add(service("default", "empty", |b| {
        b.cluster_ip(&["10.96.0.16"])
            .node_port("", "TCP", 80, 30083);
    }));
    add(service("default", "itl", |b| {
        b.cluster_ip(&["10.96.0.17"])
            .port("", "TCP", 80)
            .internal_local();
    }));
    add(service("default", "headless", |b| {
        b.cluster_ip(&["None"]).port("", "TCP", 80);
    }));
    // Algorithms by annotation: round robin and weighted round robin (`-m statistic --mode
    // nth` instead of `--mode random`), source hashing (`-m cluster`).
    for (name, ip) in [
        ("rr", "10.96.0.21"),
        ("sh", "10.96.0.22"),
        ("wrr", "10.96.0.23"),
    ] {
        let mut svc = service("default", name, |b| {
            b.cluster_ip(&[ip]).port("", "TCP", 80);
        });
        svc.metadata.annotations = Some(
            [(
                svcnet_proxy::algorithm::ANNOTATION.to_string(),
                name.to_string(),
            )]
            .into_iter()
            .collect(),
        );
        add(svc);
    }
    add(service("kube-system", "dns", |b| {
        b.cluster_ip(&["10.96.0.20"]).port("dns", "UDP", 53);
    }));
    backends(&mut s, "default", "web", "http", "TCP", &[1, 2, 3]);
    backends(&mut s, "default", "sticky", "", "TCP", &[1, 2]);
    backends(&mut s, "default", "np", "", "TCP", &[1, 2]);
    backends(&mut s, "default", "lb-allow", "", "TCP", &[1, 2]);
    backends(&mut s, "default", "lb-deny", "", "TCP", &[1, 2]);
    backends(&mut s, "default", "local", "", "TCP", &[1, 2]);
    backends(&mut s, "default", "remote", "", "TCP", &[2]);
    backends(&mut s, "default", "itl", "", "TCP", &[2]);
    backends(&mut s, "default", "headless", "", "TCP", &[1, 2]);
    backends(&mut s, "default", "rr", "", "TCP", &[1, 2, 3]);
    backends(&mut s, "default", "sh", "", "TCP", &[1, 2, 3]);
    backends(&mut s, "default", "wrr", "", "TCP", &[1, 2, 3]);
    backends(&mut s, "kube-system", "dns", "dns", "UDP", &[1, 2]);
    s
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Client {
    /// Pod `i` (1-based).
    Pod(usize),
    /// The external namespace, outside every cluster CIDR.
    External,
}

impl Client {
    pub fn ip(self) -> IpAddr {
        match self {
            Client::Pod(i) => pod_ip(i).into(),
            Client::External => EXTERNAL_IP.into(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    Udp,
}

/// Whether the backend sees the client's own address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Masq {
    No,
    Yes,
    /// Only when the chosen endpoint is the client itself (hairpin).
    Hairpin,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Each listed backend pod gets an equal share; masquerade as given.
    Spread(&'static [usize], Masq),
    /// ClientIP affinity: the first connection is spread like `Spread`; every later one from
    /// the same client goes to the endpoint the first one reached.
    Sticky(&'static [usize], Masq),
    /// Refused at once (TCP RST / ICMP unreachable).
    Reject,
    /// Silently dropped.
    Drop,
}

#[derive(Clone, Debug)]
pub struct Case {
    pub name: &'static str,
    pub from: Client,
    pub to: (Ipv4Addr, u16),
    pub proto: Proto,
    pub expect: Expect,
}

fn case(name: &'static str, from: Client, to: &str, expect: Expect) -> Case {
    let (ip, port) = to.split_once(':').unwrap();
    Case {
        name,
        from,
        to: (ip.parse().unwrap(), port.parse().unwrap()),
        proto: Proto::Tcp,
        expect,
    }
}

/// The packet-flow table.
pub fn cases() -> Vec<Case> {
    use Client::*;
    use Expect::*;
    let mut udp = case(
        "UDP cluster IP",
        Pod(CLIENT_POD),
        "10.96.0.20:53",
        Spread(&[1, 2], Masq::No),
    );
    udp.proto = Proto::Udp;
    vec![
        case(
            "cluster IP spreads over 3 endpoints",
            Pod(CLIENT_POD),
            "10.96.0.10:80",
            Spread(&[1, 2, 3], Masq::No),
        ),
        case(
            "cluster IP from off-cluster is masqueraded",
            External,
            "10.96.0.10:80",
            Spread(&[1, 2, 3], Masq::Yes),
        ),
        case(
            "hairpin is masqueraded",
            Pod(1),
            "10.96.0.10:80",
            Spread(&[1, 2, 3], Masq::Hairpin),
        ),
        case(
            "affinity service sticks after its first pick",
            Pod(CLIENT_POD),
            "10.96.0.11:80",
            Sticky(&[1, 2], Masq::No),
        ),
        case(
            "node port from outside",
            External,
            "192.168.50.1:30080",
            Spread(&[1, 2], Masq::Yes),
        ),
        case(
            "node port from a pod",
            Pod(CLIENT_POD),
            "192.168.50.1:30080",
            Spread(&[1, 2], Masq::Yes),
        ),
        case(
            "LB IP inside source ranges",
            External,
            "203.0.113.7:80",
            Spread(&[1, 2], Masq::Yes),
        ),
        case(
            "LB IP outside source ranges is dropped",
            External,
            "203.0.113.8:80",
            Drop,
        ),
        case(
            "LB node port ignores source ranges",
            External,
            "192.168.50.1:30085",
            Spread(&[1, 2], Masq::Yes),
        ),
        case(
            "eTP=Local node port keeps the client IP",
            External,
            "192.168.50.1:30081",
            Spread(&[1], Masq::No),
        ),
        case(
            "eTP=Local external IP keeps the client IP",
            External,
            "198.51.100.9:80",
            Spread(&[1], Masq::No),
        ),
        case(
            "eTP=Local external IP from a pod short-circuits",
            Pod(CLIENT_POD),
            "198.51.100.9:80",
            Spread(&[1, 2], Masq::No),
        ),
        case(
            "eTP=Local cluster IP uses every endpoint",
            Pod(CLIENT_POD),
            "10.96.0.14:80",
            Spread(&[1, 2], Masq::No),
        ),
        case(
            "eTP=Local without local endpoints drops",
            External,
            "192.168.50.1:30082",
            Drop,
        ),
        case(
            "no endpoints: cluster IP rejects",
            Pod(CLIENT_POD),
            "10.96.0.16:80",
            Reject,
        ),
        case(
            "no endpoints: node port rejects",
            External,
            "192.168.50.1:30083",
            Reject,
        ),
        case(
            "iTP=Local without local endpoints drops",
            Pod(CLIENT_POD),
            "10.96.0.17:80",
            Drop,
        ),
        case(
            "unallocated service IP rejects",
            Pod(CLIENT_POD),
            "10.96.0.99:80",
            Reject,
        ),
        case(
            "unknown port on a cluster IP rejects",
            Pod(CLIENT_POD),
            "10.96.0.10:81",
            Reject,
        ),
        udp,
    ]
}

/// A fake's dump with the rules of the shared chains sorted (partial syncs insert and delete
/// their rules in place, so only their set — and the rule that must stay last — matters).
/// Panics when a "must be last" rule is not last.
pub fn normalized(dump: &str) -> String {
    const SHARED: [&str; 5] = [
        "SVCNET-SERVICES",
        "SVCNET-NODEPORTS",
        "SVCNET-EXTERNAL-SERVICES",
        "SVCNET-PROXY-FIREWALL",
        "SVCNET-NODEPORTS",
    ];
    let tail =
        |l: &str| l.contains("must be the last rule") || l.contains("unallocated service IP");
    let mut out: Vec<String> = Vec::new();
    let mut group: Vec<String> = Vec::new();
    let mut group_chain = String::new();
    let flush = |out: &mut Vec<String>, group: &mut Vec<String>, chain: &str| {
        if SHARED.contains(&chain) {
            let tails: Vec<&String> = group.iter().filter(|l| tail(l)).collect();
            if let Some(first_tail) = group.iter().position(|l| tail(l)) {
                assert_eq!(
                    first_tail,
                    group.len() - tails.len(),
                    "{chain}: a last rule is not last: {group:?}"
                );
            }
            let n = group.len() - tails.len();
            group[..n].sort();
        }
        out.append(group);
    };
    for line in dump.lines() {
        let chain = line
            .strip_prefix("-A ")
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or("")
            .to_string();
        if chain != group_chain {
            flush(&mut out, &mut group, &group_chain);
            group_chain = chain;
        }
        group.push(line.to_string());
    }
    flush(&mut out, &mut group, &group_chain);
    out.join("\n")
}

/// Linux's `jhash_1word` (include/linux/jhash.h), with which `-m cluster` hashes an IPv4
/// source address.
pub fn jhash_1word(a: u32, seed: u32) -> u32 {
    let init = seed.wrapping_add(0xdead_beef).wrapping_add(1 << 2);
    let (mut a, mut b, mut c) = (a.wrapping_add(init), init, init);
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(14));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(11));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(25));
    c ^= b;
    c = c.wrapping_sub(b.rotate_left(16));
    a ^= c;
    a = a.wrapping_sub(c.rotate_left(4));
    b ^= a;
    b = b.wrapping_sub(a.rotate_left(14));
    c ^= b;
    c.wrapping_sub(b.rotate_left(24))
}

/// The slot `-m cluster --cluster-total-nodes total --cluster-hash-seed seed` hashes an IPv4
/// source into (`reciprocal_scale` of the hash of the address as it lies in memory).
pub fn cluster_slot(src: Ipv4Addr, seed: u32, total: u32) -> u32 {
    let h = jhash_1word(u32::from_ne_bytes(src.octets()), seed);
    ((u64::from(h) * u64::from(total)) >> 32) as u32
}

//! The packet-flow test kit: one table of cases that states Service behaviour once, and the
//! [`Tracer`] trait each dataplane implements over its rendered rules (nftables over
//! `FakeNft`, iptables over `FakeIptables`, userspace over its route table), so that every
//! dataplane is checked against the same expected verdict, endpoint distribution and
//! masquerade. The kernel-tier tests run the same [`cases`] with real traffic.
//!
//! A dev-only crate (no dataplane depends on it outside its tests), so that production crates
//! carry no test code and the workspace needs no per-member feature. The table and the trait
//! are pure; [`kernel`] (root only) runs the same cases with real traffic inside a fresh
//! `svcnet_netns::test_support::Lab`.
//!
//! The world ([`world`]): addresses match `svcnet_netns::test_support::Lab`: pod `i` is
//! `10.244.i.2`, the node's address on pod `i`'s link `10.244.i.1`, the node IP on the
//! external link `192.168.50.1`, the external client `192.168.50.2`.

pub mod kernel;

use std::collections::BTreeMap;
use std::fmt::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

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

/// The node's own addresses (`fib … type local`, `addrtype LOCAL`).
pub fn node_addrs() -> Vec<IpAddr> {
    let mut local: Vec<IpAddr> = (1..=CLIENT_POD)
        .map(|i| node_ip_towards(i).into())
        .collect();
    local.push(NODE_IP.into());
    local.push(Ipv4Addr::LOCALHOST.into());
    local
}

pub fn config() -> CoreConfig {
    CoreConfig {
        node_name: NODE.into(),
        cluster_cidrs: vec![ipnet::IpNet::V4(ipnet::Ipv4Net::new_assert(
            Ipv4Addr::new(10, 244, 0, 0),
            16,
        ))],
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

/// Every kind of service the dataplanes must handle.
///
/// # Panics
/// When a fixture is invalid (a bug in this kit).
pub fn world() -> ProxyState {
    let mut s = ProxyState::new(config());
    let mut add = |svc: k8s_openapi::api::core::v1::Service| {
        if let Err(e) = s.update_service(&svc) {
            panic!("fixture: {e}");
        }
    };
    add(service("default", "web", |b| {
        b.cluster_ip(&["10.96.0.10"]).port("http", "TCP", 80);
    }));
    add(service("default", "sticky", |b| {
        b.cluster_ip(&["10.96.0.11"])
            .port("", "TCP", 80)
            .affinity(Some(10800));
    }));
    add(service("default", "pinned", |b| {
        b.cluster_ip(&["10.96.0.19"])
            .node_port("", "TCP", 80, 30086)
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
    // Algorithms by annotation: round robin, source hashing, weighted round robin.
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
    backends(&mut s, "default", "pinned", "", "TCP", &[1, 2]);
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

/// Where a packet comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Client {
    /// Pod `i` (1-based), inside the cluster CIDR, forwarded through the node.
    Pod(usize),
    /// A process on the node itself (its source is [`NODE_IP`], a local address).
    Node,
    /// The external namespace, outside every cluster CIDR.
    External,
}

impl Client {
    pub fn ip(self) -> IpAddr {
        match self {
            Client::Pod(i) => pod_ip(i).into(),
            Client::Node => NODE_IP.into(),
            Client::External => EXTERNAL_IP.into(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
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
    /// ClientIP affinity across frontends: an earlier connection of the same client to
    /// `first` (another frontend of the same service port) reached one of `pods`; this case's
    /// connection, within the timeout, reaches that same endpoint, whichever it was.
    Pinned {
        first: (Ipv4Addr, u16),
        pods: &'static [usize],
        masq: Masq,
    },
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

impl Case {
    /// The first packet of the case's connection.
    pub fn packet(&self) -> Packet {
        Packet {
            src: self.from.ip(),
            dst: self.to.0.into(),
            dport: self.to.1,
            proto: self.proto,
            from: self.from,
        }
    }

    /// The first packet of the earlier connection of a [`Expect::Pinned`] case.
    pub fn first_packet(&self) -> Option<Packet> {
        let Expect::Pinned { first, .. } = self.expect else {
            return None;
        };
        Some(Packet {
            dst: first.0.into(),
            dport: first.1,
            ..self.packet()
        })
    }

    /// The port the backends listen on for this case's protocol.
    pub fn target_port(&self) -> u16 {
        match self.proto {
            Proto::Tcp => TCP_PORT,
            Proto::Udp => UDP_PORT,
        }
    }
}

fn case(name: &'static str, from: Client, to: (Ipv4Addr, u16), expect: Expect) -> Case {
    Case {
        name,
        from,
        to,
        proto: Proto::Tcp,
        expect,
    }
}

fn at(a: u8, b: u8, c: u8, d: u8, port: u16) -> (Ipv4Addr, u16) {
    (Ipv4Addr::new(a, b, c, d), port)
}

/// The packet-flow table.
pub fn cases() -> Vec<Case> {
    use Client::*;
    use Expect::*;
    let mut udp = case(
        "UDP cluster IP",
        Pod(CLIENT_POD),
        at(10, 96, 0, 20, 53),
        Spread(&[1, 2], Masq::No),
    );
    udp.proto = Proto::Udp;
    let node_port = |port| at(192, 168, 50, 1, port);
    let local_external_ip = at(198, 51, 100, 9, 80);
    vec![
        case(
            "cluster IP spreads over 3 endpoints",
            Pod(CLIENT_POD),
            at(10, 96, 0, 10, 80),
            Spread(&[1, 2, 3], Masq::No),
        ),
        case(
            "cluster IP from off-cluster is masqueraded",
            External,
            at(10, 96, 0, 10, 80),
            Spread(&[1, 2, 3], Masq::Yes),
        ),
        case(
            "hairpin is masqueraded",
            Pod(1),
            at(10, 96, 0, 10, 80),
            Spread(&[1, 2, 3], Masq::Hairpin),
        ),
        case(
            "affinity service sticks after its first pick",
            Pod(CLIENT_POD),
            at(10, 96, 0, 11, 80),
            Sticky(&[1, 2], Masq::No),
        ),
        case(
            "affinity is per service port: pinned via the cluster IP, same endpoint via the node port",
            Pod(CLIENT_POD),
            node_port(30086),
            Pinned {
                first: at(10, 96, 0, 19, 80),
                pods: &[1, 2],
                masq: Masq::Yes,
            },
        ),
        case(
            "affinity is per service port: pinned via the node port, same endpoint via the cluster IP",
            Pod(CLIENT_POD),
            at(10, 96, 0, 19, 80),
            Pinned {
                first: node_port(30086),
                pods: &[1, 2],
                masq: Masq::No,
            },
        ),
        case(
            "node port from outside",
            External,
            node_port(30080),
            Spread(&[1, 2], Masq::Yes),
        ),
        case(
            "node port from a pod",
            Pod(CLIENT_POD),
            node_port(30080),
            Spread(&[1, 2], Masq::Yes),
        ),
        case(
            "LB IP inside source ranges",
            External,
            at(203, 0, 113, 7, 80),
            Spread(&[1, 2], Masq::Yes),
        ),
        case(
            "LB IP outside source ranges is dropped",
            External,
            at(203, 0, 113, 8, 80),
            Drop,
        ),
        case(
            "LB node port ignores source ranges",
            External,
            node_port(30085),
            Spread(&[1, 2], Masq::Yes),
        ),
        case(
            "eTP=Local node port keeps the client IP",
            External,
            node_port(30081),
            Spread(&[1], Masq::No),
        ),
        case(
            "eTP=Local external IP from off-cluster: local pool, client IP kept",
            External,
            local_external_ip,
            Spread(&[1], Masq::No),
        ),
        case(
            "eTP=Local external IP from a pod short-circuits to the cluster pool",
            Pod(CLIENT_POD),
            local_external_ip,
            Spread(&[1, 2], Masq::No),
        ),
        case(
            "eTP=Local external IP from the node short-circuits, masqueraded",
            Node,
            local_external_ip,
            Spread(&[1, 2], Masq::Yes),
        ),
        case(
            "eTP=Local hairpin through the external IP is masqueraded",
            Pod(1),
            local_external_ip,
            Spread(&[1, 2], Masq::Hairpin),
        ),
        case(
            "eTP=Local node port from a pod without local endpoints short-circuits",
            Pod(CLIENT_POD),
            node_port(30082),
            Spread(&[2], Masq::No),
        ),
        case(
            "eTP=Local cluster IP uses every endpoint",
            Pod(CLIENT_POD),
            at(10, 96, 0, 14, 80),
            Spread(&[1, 2], Masq::No),
        ),
        case(
            "eTP=Local without local endpoints drops",
            External,
            node_port(30082),
            Drop,
        ),
        case(
            "no endpoints: cluster IP rejects",
            Pod(CLIENT_POD),
            at(10, 96, 0, 16, 80),
            Reject,
        ),
        case(
            "no endpoints: node port rejects",
            External,
            node_port(30083),
            Reject,
        ),
        case(
            "iTP=Local without local endpoints drops",
            Pod(CLIENT_POD),
            at(10, 96, 0, 17, 80),
            Drop,
        ),
        case(
            "unallocated service IP is dropped",
            Pod(CLIENT_POD),
            at(10, 96, 0, 99, 80),
            Drop,
        ),
        case(
            "unallocated service IP from the node is dropped",
            Node,
            at(10, 96, 0, 99, 80),
            Drop,
        ),
        case(
            "unknown port on a cluster IP rejects",
            Pod(CLIENT_POD),
            at(10, 96, 0, 10, 81),
            Reject,
        ),
        case(
            "unknown port on a cluster IP from off-cluster rejects",
            External,
            at(10, 96, 0, 12, 81),
            Reject,
        ),
        udp,
    ]
}

/// The first packet of a connection, as a tracer sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub dport: u16,
    pub proto: Proto,
    pub from: Client,
}

impl Packet {
    /// The packet as the proxy core's tracers take it (`svcnet trace`'s).
    pub fn to_trace(&self) -> svcnet_proxy::trace::Packet {
        svcnet_proxy::trace::Packet {
            src: self.src,
            dst: self.dst,
            dport: self.dport,
            proto: Some(match self.proto {
                Proto::Tcp => svcnet_proxy::Protocol::Tcp,
                Proto::Udp => svcnet_proxy::Protocol::Udp,
            }),
            local_origin: self.from == Client::Node,
        }
    }
}

/// Where a traced packet ends.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// Sent to an endpoint (DNAT, or a proxy's connection); `masquerade`: the endpoint sees
    /// the node's address, not the client's.
    Endpoint { to: SocketAddr, masquerade: bool },
    /// Refused at once.
    Reject,
    /// Silently dropped.
    Drop,
    /// Not a service: passed on unchanged.
    Pass,
}

/// Outcomes with their probabilities (summing to 1).
pub type Distribution = BTreeMap<Outcome, f64>;

/// A dataplane's packet tracer: the distribution of outcomes of a packet through what the
/// dataplane rendered.
pub trait Tracer {
    /// The dataplane's name, for failure messages.
    fn name(&self) -> &'static str;

    /// Whether an endpoint can see the client's own address. The userspace proxy connects to
    /// endpoints itself, so they always see the node's: for it, every delivered packet is
    /// expected masqueraded.
    fn preserves_client_address(&self) -> bool {
        true
    }

    fn trace(&self, packet: &Packet) -> Distribution;

    /// Traces `packet` after an earlier connection of the same client, `first`, reached
    /// `endpoint`: with whatever ClientIP affinity state that connection left (a map entry,
    /// a `recent` list, the proxy's pin).
    fn trace_after(&self, first: &Packet, endpoint: SocketAddr, packet: &Packet) -> Distribution;
}

/// Checks one case against a tracer; the error says what differs.
pub fn check(tracer: &dyn Tracer, c: &Case) -> Result<(), String> {
    let got = tracer.trace(&c.packet());
    let fail = |why: String| {
        Err(format!(
            "{}: {}: {why}; traced {got:?}",
            tracer.name(),
            c.name
        ))
    };
    let total: f64 = got.values().sum();
    if (total - 1.0).abs() > 1e-9 {
        return fail(format!("probabilities sum to {total}"));
    }
    if let (Expect::Pinned { pods, masq, .. }, Some(first)) = (&c.expect, c.first_packet()) {
        return check_pinned(tracer, c, &first, pods, *masq);
    }
    match &c.expect {
        Expect::Pinned { .. } => unreachable!("handled above"),
        Expect::Reject | Expect::Drop => {
            let want = if c.expect == Expect::Reject {
                Outcome::Reject
            } else {
                Outcome::Drop
            };
            if got.keys().ne([&want]) {
                return fail(format!("want only {want:?}"));
            }
        }
        Expect::Spread(pods, masq) | Expect::Sticky(pods, masq) => {
            let mut shares: BTreeMap<usize, f64> = BTreeMap::new();
            for (o, p) in &got {
                let Outcome::Endpoint { to, masquerade } = o else {
                    return fail(format!("unexpected {o:?}"));
                };
                let Some(pod) = pods
                    .iter()
                    .copied()
                    .find(|i| *to == SocketAddr::new(pod_ip(*i).into(), c.target_port()))
                else {
                    return fail(format!("unexpected endpoint {to}"));
                };
                let want = !tracer.preserves_client_address()
                    || match masq {
                        Masq::No => false,
                        Masq::Yes => true,
                        Masq::Hairpin => Client::Pod(pod) == c.from,
                    };
                if *masquerade != want {
                    return fail(format!(
                        "masquerade towards {to} is {masquerade}, want {want}"
                    ));
                }
                *shares.entry(pod).or_default() += p;
            }
            let want = 1.0 / pods.len() as f64;
            for pod in pods.iter() {
                let share = shares.get(pod).copied().unwrap_or(0.0);
                if (share - want).abs() > 1e-9 {
                    return fail(format!("pod {pod} gets {share}, not {want}"));
                }
            }
        }
    }
    Ok(())
}

/// An [`Expect::Pinned`] case: the first connection may reach each of `pods`; after each,
/// the case's connection reaches only that pod.
fn check_pinned(
    tracer: &dyn Tracer,
    c: &Case,
    first: &Packet,
    pods: &[usize],
    masq: Masq,
) -> Result<(), String> {
    let firsts = tracer.trace(first);
    for &pod in pods {
        let to = SocketAddr::new(pod_ip(pod).into(), c.target_port());
        if !firsts
            .keys()
            .any(|o| matches!(o, Outcome::Endpoint { to: t, .. } if *t == to))
        {
            return Err(format!(
                "{}: {}: the first connection never reaches pod {pod}; traced {firsts:?}",
                tracer.name(),
                c.name
            ));
        }
        let got = tracer.trace_after(first, to, &c.packet());
        let masquerade = !tracer.preserves_client_address()
            || match masq {
                Masq::No => false,
                Masq::Yes => true,
                Masq::Hairpin => Client::Pod(pod) == c.from,
            };
        let want = Outcome::Endpoint { to, masquerade };
        let total: f64 = got.values().sum();
        if got.keys().ne([&want]) || (total - 1.0).abs() > 1e-9 {
            return Err(format!(
                "{}: {}: pinned to pod {pod}, want only {want:?}; traced {got:?}",
                tracer.name(),
                c.name
            ));
        }
    }
    Ok(())
}

/// Runs every case of `table` against `tracer` and panics listing every failure.
pub fn run_table(tracer: &dyn Tracer, table: &[Case]) {
    let mut failures = String::new();
    for c in table {
        if let Err(e) = check(tracer, c) {
            writeln!(failures, "  {e}").ok();
        }
    }
    assert!(
        failures.is_empty(),
        "{} of the packet-flow table failed:\n{failures}",
        tracer.name()
    );
}

/// What `svcnet trace` says of a case, the same on every kernel dataplane: the frontend kind
/// (the words before ` of `), why its masqueraded branches are masqueraded, and the verdict
/// of its branches that reach no endpoint (reasons as in `svcnet_proxy::trace::why`).
#[derive(Clone, Debug)]
pub struct Explained {
    /// The start of the case's name.
    pub case: &'static str,
    pub frontend: Option<&'static str>,
    pub masquerade: Option<&'static str>,
    pub verdict: Option<&'static str>,
}

/// The explanations every kernel dataplane's tracer must give.
pub fn explanations() -> Vec<Explained> {
    use svcnet_proxy::trace::why;
    let e = |case, frontend, masquerade, verdict| Explained {
        case,
        frontend,
        masquerade,
        verdict,
    };
    vec![
        e("cluster IP spreads", Some("cluster IP"), None, None),
        e(
            "cluster IP from off-cluster",
            Some("cluster IP"),
            Some(why::OFF_CLUSTER),
            None,
        ),
        e(
            "hairpin is masqueraded",
            Some("cluster IP"),
            Some(why::HAIRPIN),
            None,
        ),
        e(
            "node port from outside",
            Some("node port"),
            Some(why::EXTERNAL_CLUSTER),
            None,
        ),
        e(
            "eTP=Local external IP from the node",
            None,
            Some(why::LOCAL_SHORT_CIRCUIT),
            None,
        ),
        e(
            "eTP=Local without local endpoints drops",
            None,
            None,
            Some(why::NO_LOCAL_ENDPOINTS),
        ),
        e(
            "LB IP outside source ranges",
            None,
            None,
            Some(why::SOURCE_RANGES),
        ),
        e(
            "no endpoints: cluster IP rejects",
            None,
            None,
            Some(why::NO_ENDPOINTS),
        ),
        e(
            "no endpoints: node port rejects",
            None,
            None,
            Some(why::NO_ENDPOINTS),
        ),
        e(
            "unallocated service IP is dropped",
            None,
            None,
            Some(why::UNALLOCATED),
        ),
        e(
            "unknown port on a cluster IP rejects",
            None,
            None,
            Some(why::UNKNOWN_PORT),
        ),
    ]
}

/// A dataplane's trace with each branch's explanation.
pub type Explain<'a> = &'a dyn Fn(
    &Packet,
) -> Vec<(
    svcnet_proxy::trace::Branch,
    svcnet_proxy::trace::Explanation,
)>;

/// Checks [`explanations`] against a dataplane's tracer and explainer.
///
/// # Panics
/// On the first explanation that differs, naming the case.
pub fn check_explanations(explain: Explain<'_>) {
    use svcnet_proxy::trace::Outcome as O;
    let all = cases();
    for x in explanations() {
        let Some(c) = all.iter().find(|c| c.name.starts_with(x.case)) else {
            panic!("no case {}", x.case);
        };
        let got = explain(&c.packet());
        assert!(!got.is_empty(), "{}: no branches", c.name);
        for (b, e) in &got {
            if let Some(kind) = x.frontend {
                let f = e.frontend.clone().unwrap_or_default();
                assert!(
                    f.starts_with(&format!("{kind} of ")),
                    "{}: frontend {f:?}",
                    c.name
                );
            }
            let masq = matches!(
                b.outcome,
                O::Endpoint {
                    masquerade: true,
                    ..
                }
            );
            match x.masquerade {
                Some(why) if masq => {
                    assert_eq!(e.masquerade.as_deref(), Some(why), "{}: {b:?}", c.name)
                }
                _ => assert_eq!(masq, e.masquerade.is_some(), "{}: {b:?} {e:?}", c.name),
            }
            if let (Some(v), false) = (x.verdict, matches!(b.outcome, O::Endpoint { .. })) {
                assert_eq!(e.verdict, v, "{}: {b:?}", c.name);
            }
        }
        if x.masquerade.is_some() {
            assert!(
                got.iter().any(|(b, _)| matches!(
                    b.outcome,
                    O::Endpoint {
                        masquerade: true,
                        ..
                    }
                )),
                "{}: nothing masqueraded",
                c.name
            );
        }
    }
}

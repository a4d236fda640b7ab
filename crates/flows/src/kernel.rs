//! The kernel tier of the table: the same [`cases`](crate::cases) with real connections,
//! inside a fresh `svcnet_netns::test_support::Lab` (a node namespace, pods 1..=4 on their own
//! links, an external client). Each dataplane programs the lab's node and calls
//! [`KernelLab::run_table`]. Needs root; traffic goes only into the lab's own namespaces, and
//! the lab removes them on drop, also on failure.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use svcnet_netns::NetNs;
use svcnet_netns::test_support::{Lab, Server, serve_udp, tcp_ask, udp_ask};

use crate::{
    BACKENDS, CLIENT_POD, Case, Client, EXTERNAL_IP, Expect, Masq, Proto, TCP_PORT, UDP_PORT,
    node_ip_towards,
};

/// The lab of the table: pod `i` (1-based) is `lab.pod(i - 1)`; pods 1..=3 serve TCP (and
/// 1..=2 UDP) and answer with `p<i>` and the client address they saw.
pub struct KernelLab {
    pub lab: Lab,
    pub ext: NetNs,
    _udp: Vec<Server>,
}

fn must<T, E: std::fmt::Display>(r: Result<T, E>, what: &str) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// The pod that answered `r` (one of `pods`), after checking the client address it saw.
fn answered(
    c: &Case,
    r: std::io::Result<svcnet_netns::test_support::Reply>,
    pods: &[usize],
    masq: Masq,
    preserves_client_address: bool,
) -> usize {
    let r = r.unwrap_or_else(|e| panic!("{}: {e}", c.name));
    let pod: usize = r
        .identity
        .trim_start_matches('p')
        .parse()
        .unwrap_or_else(|_| panic!("{}: reply {r:?}", c.name));
    assert!(
        pods.contains(&pod),
        "{}: answered by unexpected p{pod}",
        c.name
    );
    let masqueraded = !preserves_client_address
        || match masq {
            Masq::No => false,
            Masq::Yes => true,
            Masq::Hairpin => Client::Pod(pod) == c.from,
        };
    let want: IpAddr = if masqueraded {
        node_ip_towards(pod).into()
    } else {
        c.from.ip()
    };
    assert_eq!(r.client, want, "{}: client address seen by p{pod}", c.name);
    pod
}

impl KernelLab {
    /// Creates the lab's namespaces, links, routes and servers.
    ///
    /// # Panics
    /// When the namespaces cannot be created (not root).
    pub fn start() -> Self {
        let mut lab = must(Lab::new(), "creating the lab needs root");
        for _ in 0..CLIENT_POD {
            must(lab.add_pod(), "adding a pod");
        }
        must(lab.external(), "adding the external client");
        let mut udp = Vec::new();
        for i in 0..BACKENDS {
            must(
                lab.serve_tcp(i, TCP_PORT, &format!("p{}", i + 1)),
                "starting a TCP server",
            );
            if i < 2 {
                udp.push(must(
                    serve_udp(&lab.pod(i).ns, UDP_PORT, &format!("p{}", i + 1)),
                    "starting a UDP server",
                ));
            }
        }
        // Frontend ranges are routed onward (towards the external namespace, which does not
        // forward), so packets no rule takes reach the forward hook as on a real node.
        for net in ["10.96.0.0/12", "203.0.113.0/24", "198.51.100.0/24"] {
            must(
                lab.node
                    .exec(&["ip", "route", "add", net, "via", &EXTERNAL_IP.to_string()]),
                "routing a frontend range",
            );
        }
        let ext = must(
            NetNs::open(&format!("{}x", lab.prefix())),
            "opening the external namespace",
        );
        Self {
            lab,
            ext,
            _udp: udp,
        }
    }

    /// The node namespace the dataplane programs.
    pub fn node(&self) -> &NetNs {
        &self.lab.node
    }

    pub fn client_ns(&self, c: Client) -> &NetNs {
        match c {
            Client::Pod(i) => &self.lab.pod(i - 1).ns,
            Client::Node => &self.lab.node,
            Client::External => &self.ext,
        }
    }

    /// The identities of the backends answering `n` connections from `client` to `addr`.
    pub fn asks(&self, client: Client, addr: SocketAddr, n: usize) -> Vec<String> {
        must(
            self.client_ns(client).run(|| {
                (0..n)
                    .map(|_| must(tcp_ask(addr, Duration::from_secs(2)), "ask").identity)
                    .collect()
            }),
            "running in the client namespace",
        )
    }

    /// Runs one case with real connections and checks it (panics naming the case).
    /// `preserves_client_address`: see [`crate::Tracer::preserves_client_address`].
    pub fn run_case(&self, c: &Case, preserves_client_address: bool) {
        let addr = SocketAddr::new(IpAddr::V4(c.to.0), c.to.1);
        let ns = self.client_ns(c.from);
        match &c.expect {
            Expect::Spread(pods, masq) | Expect::Sticky(pods, masq) => {
                let trials = 24 * pods.len();
                let replies = must(
                    ns.run(|| {
                        (0..trials)
                            .map(|_| match c.proto {
                                Proto::Tcp => tcp_ask(addr, Duration::from_secs(2)),
                                Proto::Udp => udp_ask(addr, Duration::from_secs(2)),
                            })
                            .collect::<Vec<_>>()
                    }),
                    "running in the client namespace",
                );
                let mut counts: BTreeMap<usize, usize> = BTreeMap::new();
                for r in replies {
                    let pod = answered(c, r, pods, *masq, preserves_client_address);
                    *counts.entry(pod).or_default() += 1;
                }
                if let Expect::Sticky(..) = c.expect {
                    assert_eq!(counts.len(), 1, "{}: affinity broken: {counts:?}", c.name);
                    return;
                }
                // Each endpoint's share is 1/n: with 24 trials per endpoint, fewer than 6
                // hits has a probability below 1e-5 for a fair split.
                for pod in pods.iter() {
                    let n = counts.get(pod).copied().unwrap_or(0);
                    assert!(n >= 6, "{}: p{pod} got {n} of {trials}: {counts:?}", c.name);
                }
            }
            Expect::Pinned { first, pods, masq } => {
                // The first connection pins the client (to whichever pod it reaches); every
                // later one through this case's frontend reaches that pod.
                let first = SocketAddr::new(IpAddr::V4(first.0), first.1);
                let (pin, later) = must(
                    ns.run(|| {
                        let pin = tcp_ask(first, Duration::from_secs(2));
                        let later: Vec<_> = (0..12)
                            .map(|_| tcp_ask(addr, Duration::from_secs(2)))
                            .collect();
                        (pin, later)
                    }),
                    "running in the client namespace",
                );
                let pin = must(pin, "the pinning connection");
                let pinned: usize = pin
                    .identity
                    .trim_start_matches('p')
                    .parse()
                    .unwrap_or_else(|_| panic!("{}: reply {pin:?}", c.name));
                for r in later {
                    let pod = answered(c, r, pods, *masq, preserves_client_address);
                    assert_eq!(
                        pod, pinned,
                        "{}: pinned to p{pinned}, reached p{pod}",
                        c.name
                    );
                }
            }
            Expect::Reject => {
                let (res, took) = must(
                    ns.run(|| {
                        let t = Instant::now();
                        (
                            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3)),
                            t.elapsed(),
                        )
                    }),
                    "running in the client namespace",
                );
                let e = res.err().unwrap_or_else(|| panic!("{}: connected", c.name));
                assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{}: {e}", c.name);
                assert!(
                    took < Duration::from_millis(500),
                    "{}: refused after {took:?}",
                    c.name
                );
            }
            Expect::Drop => {
                let res = must(
                    ns.run(|| {
                        std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(400))
                    }),
                    "running in the client namespace",
                );
                let e = res.err().unwrap_or_else(|| panic!("{}: connected", c.name));
                assert_eq!(e.kind(), ErrorKind::TimedOut, "{}: {e}", c.name);
            }
        }
    }

    /// Runs every case, in order.
    pub fn run_table(&self, cases: &[Case], preserves_client_address: bool) {
        for c in cases {
            self.run_case(c, preserves_client_address);
        }
    }
}

//! Privileged mode in real network namespaces (root): a client pod → service IP, redirected by
//! the dataplane's nftables rules in the node namespace into the proxy, which runs its
//! sockets inside that namespace and relays to backend pod namespaces.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use common::{NODE, annotate, desired};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use svcnet_netns::NetNs;
use svcnet_netns::test_support::{Lab, NODE_IP, Session, tcp_ask};
use svcnet_proxy::fixtures::*;
use svcnet_userspace::{Config, Mode, UserspaceProxy};

const T: Duration = Duration::from_secs(3);

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A lab with a client pod (0) and `backends` backend pods (1..), each serving TCP 8080.
fn lab(backends: usize, serving: &[usize]) -> Lab {
    let mut lab = Lab::new().unwrap();
    for _ in 0..=backends {
        lab.add_pod().unwrap();
    }
    for &i in serving {
        lab.serve_tcp(i, 8080, &format!("b{i}")).unwrap();
    }
    lab
}

fn web(lab: &Lab, pods: &[usize], f: impl FnOnce(&mut ServiceBuilder)) -> (Service, EndpointSlice) {
    let svc = service("default", "web", |s| {
        s.type_("NodePort")
            .cluster_ip(&["10.96.0.10"])
            .node_port("http", "TCP", 80, 30080);
        f(s);
    });
    let sl = slice("default", "web-1", "web", |s| {
        s.port("http", "TCP", 8080);
        for &i in pods {
            s.endpoint(&lab.pod(i).ipv4.to_string(), NODE, |_| {});
        }
    });
    (svc, sl)
}

fn proxy(lab: &Lab) -> UserspaceProxy {
    let mut c = Config::new(Mode::Privileged);
    c.netns = Some(lab.node.name().to_string());
    c.connect_timeout = Duration::from_millis(500);
    c.drain_timeout = Duration::from_secs(30);
    UserspaceProxy::new(c).unwrap()
}

/// Runs blocking client code inside a namespace without stalling the proxy's runtime.
fn run_in<R: Send>(ns: &NetNs, f: impl FnOnce() -> R + Send) -> R {
    tokio::task::block_in_place(|| ns.run(f).unwrap())
}

fn tally(ns: &NetNs, addr: SocketAddr, n: usize) -> BTreeMap<String, usize> {
    run_in(ns, || {
        let mut m = BTreeMap::new();
        for _ in 0..n {
            let r = tcp_ask(addr, T).unwrap();
            *m.entry(r.identity).or_default() += 1;
        }
        m
    })
}

fn svc_addr() -> SocketAddr {
    "10.96.0.10:80".parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_ip_and_node_port_reach_every_endpoint_in_turn() {
    if !is_root() {
        return eprintln!("skipped: needs root");
    }
    let mut lab = lab(3, &[1, 2, 3]);
    let (svc, sl) = web(&lab, &[1, 2, 3], |_| {});
    let p = proxy(&lab);
    p.sync(&desired(&[svc], &[sl])).await.unwrap();
    let t = tally(&lab.pod(0).ns, svc_addr(), 30);
    assert_eq!(
        t,
        BTreeMap::from([("b1".into(), 10), ("b2".into(), 10), ("b3".into(), 10)])
    );
    // The endpoint sees the proxy (the node's address on its link), as userspace mode does.
    let r = run_in(&lab.pod(0).ns, || tcp_ask(svc_addr(), T).unwrap());
    assert!(r.client.to_string().starts_with("10.244."), "{r:?}");
    // Node port from outside the cluster.
    let ext = lab.external().unwrap();
    let t = tally(ext, SocketAddr::new(NODE_IP.into(), 30080), 3);
    assert_eq!(t.values().sum::<usize>(), 3);
    assert_eq!(t.len(), 3, "{t:?}");
    p.shutdown().await.unwrap();
    let rules = lab.node.exec(&["nft", "list", "ruleset"]).unwrap();
    assert!(!rules.contains("svcnet-userspace"), "{rules}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_endpoint_times_out_and_is_retried() {
    if !is_root() {
        return eprintln!("skipped: needs root");
    }
    // Pod 3 drops SYNs: its connect can only end by the proxy's timeout (500 ms here).
    let lab = lab(3, &[1, 2, 3]);
    lab.pod(3)
        .ns
        .exec(&[
            "nft",
            "add table inet silent { chain in { type filter hook input priority 0; tcp dport 8080 drop; }; }",
        ])
        .unwrap();
    let (svc, sl) = web(&lab, &[1, 2, 3], |_| {});
    let p = proxy(&lab);
    p.sync(&desired(&[svc], &[sl])).await.unwrap();
    let started = Instant::now();
    let t = tally(&lab.pod(0).ns, svc_addr(), 12);
    let took = started.elapsed();
    assert_eq!(t.values().sum::<usize>(), 12, "{t:?}");
    assert!(!t.contains_key("b3"), "{t:?}");
    assert!(
        took >= Duration::from_millis(450),
        "no connect waited for its timeout: {took:?}"
    );
    let m = &p.metrics()[0];
    let silent = m
        .endpoints
        .iter()
        .find(|e| e.addr.ip() == IpAddr::from(lab.pod(3).ipv4))
        .unwrap();
    assert_eq!(
        silent.connect_failures, 1,
        "timed out once, then backed off"
    );
    assert!(silent.down);
    assert_eq!(silent.active, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_endpoint_is_retried_transparently() {
    if !is_root() {
        return eprintln!("skipped: needs root");
    }
    // Pod 3 has no listener: its kernel answers the SYN with a RST.
    let lab = lab(3, &[1, 2]);
    let (svc, sl) = web(&lab, &[1, 2, 3], |_| {});
    let p = proxy(&lab);
    p.sync(&desired(&[svc], &[sl])).await.unwrap();
    let t = tally(&lab.pod(0).ns, svc_addr(), 12);
    assert_eq!(t.values().sum::<usize>(), 12, "{t:?}");
    assert!(!t.contains_key("b3"));
    let m = &p.metrics()[0];
    let dead = m
        .endpoints
        .iter()
        .find(|e| e.addr.ip() == IpAddr::from(lab.pod(3).ipv4))
        .unwrap();
    assert_eq!(dead.connect_failures, 1, "tried once, then backed off");
    assert!(dead.down);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_endpoints_is_refused_at_once() {
    if !is_root() {
        return eprintln!("skipped: needs root");
    }
    let mut lab = lab(1, &[1]);
    // Like a real node, the node namespace has a default route (towards the external
    // namespace), so its own connections reach the output hook instead of failing routing.
    lab.external().unwrap();
    let (svc, sl) = web(&lab, &[], |_| {});
    let p = proxy(&lab);
    p.sync(&desired(&[svc], &[sl])).await.unwrap();
    for ns in [&lab.pod(0).ns, &lab.node] {
        let (err, took) = run_in(ns, || {
            let start = Instant::now();
            (tcp_ask(svc_addr(), T).unwrap_err(), start.elapsed())
        });
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
        assert!(took < Duration::from_millis(300), "{took:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn affinity_sticks_to_one_endpoint() {
    if !is_root() {
        return eprintln!("skipped: needs root");
    }
    let lab = lab(3, &[1, 2, 3]);
    let (svc, sl) = web(&lab, &[1, 2, 3], |s| {
        s.affinity(Some(30));
    });
    let p = proxy(&lab);
    p.sync(&desired(&[svc], &[sl])).await.unwrap();
    let t = tally(&lab.pod(0).ns, svc_addr(), 10);
    assert_eq!(t.len(), 1, "{t:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drained_endpoint_keeps_its_established_connection() {
    if !is_root() {
        return eprintln!("skipped: needs root");
    }
    let lab = lab(2, &[1, 2]);
    let (svc, sl) = web(&lab, &[1, 2], |_| {});
    let p = proxy(&lab);
    p.sync(&desired(std::slice::from_ref(&svc), &[sl]))
        .await
        .unwrap();
    let (mut held, first) = run_in(&lab.pod(0).ns, || {
        let mut s = Session::connect(svc_addr(), T).unwrap();
        let r = s.ask().unwrap();
        (s, r.identity)
    });
    let keep = if first == "b1" { 2 } else { 1 };
    let (_, sl) = web(&lab, &[keep], |_| {});
    p.sync(&desired(&[svc], &[sl])).await.unwrap();
    let t = tally(&lab.pod(0).ns, svc_addr(), 6);
    assert_eq!(t, BTreeMap::from([(format!("b{keep}"), 6)]));
    let again = tokio::task::block_in_place(|| held.ask().unwrap());
    assert_eq!(again.identity, first);
    // The six short connections finish closing (both directions) shortly; the drained one
    // stays counted.
    let deadline = Instant::now() + Duration::from_secs(3);
    while p.metrics()[0].active != 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        p.metrics()[0].active,
        1,
        "the drained connection is still counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_replies_come_from_the_service_address() {
    if !is_root() {
        return eprintln!("skipped: needs root");
    }
    let mut lab = lab(2, &[]);
    let _u1 = lab.serve_udp(1, 5353, "u1").unwrap();
    let _u2 = lab.serve_udp(2, 5353, "u2").unwrap();
    let svc = service("default", "dns", |s| {
        s.cluster_ip(&["10.96.0.11"]).port("dns", "UDP", 53);
    });
    let sl = slice("default", "dns-1", "dns", |s| {
        s.port("dns", "UDP", 5353);
        for i in [1, 2] {
            s.endpoint(&lab.pod(i).ipv4.to_string(), NODE, |_| {});
        }
    });
    let p = proxy(&lab);
    p.sync(&desired(&[svc], &[sl])).await.unwrap();
    let dns: SocketAddr = "10.96.0.11:53".parse().unwrap();
    let seen = run_in(&lab.pod(0).ns, || {
        let mut seen = BTreeMap::new();
        for _ in 0..4 {
            let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
            sock.set_read_timeout(Some(T)).unwrap();
            for _ in 0..2 {
                sock.send_to(b"?", dns).unwrap();
                let mut buf = [0u8; 128];
                let (n, from) = sock.recv_from(&mut buf).unwrap();
                assert_eq!(from, dns, "reply source");
                let id = String::from_utf8_lossy(&buf[..n]);
                let id = id.split_whitespace().next().unwrap().to_string();
                *seen.entry(id).or_insert(0) += 1;
            }
        }
        seen
    });
    assert_eq!(seen, BTreeMap::from([("u1".into(), 4), ("u2".into(), 4)]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_cluster_ip_and_maglev_annotation() {
    if !is_root() {
        return eprintln!("skipped: needs root");
    }
    let lab = lab(2, &[1, 2]);
    let svc = annotate(
        service("default", "web6", |s| {
            s.cluster_ip(&["fd00:10:96::10"]).port("http", "TCP", 80);
        }),
        "maglev",
    );
    let sl = slice("default", "web6-1", "web6", |s| {
        s.ipv6().port("http", "TCP", 8080);
        for i in [1, 2] {
            s.endpoint(&lab.pod(i).ipv6.to_string(), NODE, |_| {});
        }
    });
    let p = proxy(&lab);
    p.sync(&desired(&[svc], &[sl])).await.unwrap();
    let addr: SocketAddr = "[fd00:10:96::10]:80".parse().unwrap();
    let t = tally(&lab.pod(0).ns, addr, 40);
    // Maglev over client address and port: both endpoints get a share of 40 flows.
    assert_eq!(t.values().sum::<usize>(), 40);
    assert_eq!(t.len(), 2, "{t:?}");
    assert_eq!(p.metrics()[0].algorithm, svcnet_lb::Algorithm::Maglev);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_ips_source_ranges_and_local_policy() {
    if !is_root() {
        return eprintln!("skipped: needs root");
    }
    let mut lab = lab(2, &[1, 2]);
    lab.external().unwrap();
    // External IPs outside the external link's subnet, so the client routes them via the node.
    let lb = service("default", "lb", |s| {
        s.type_("LoadBalancer")
            .cluster_ip(&["10.96.0.20"])
            .node_port("http", "TCP", 80, 30081)
            .external_ips(&["203.0.113.10"])
            .lb_ingress(&["203.0.113.20"])
            .source_ranges(&["10.244.0.0/16"]);
    });
    let lb_slice = slice("default", "lb-1", "lb", |s| {
        s.port("http", "TCP", 8080)
            .endpoint(&lab.pod(1).ipv4.to_string(), NODE, |_| {});
    });
    // externalTrafficPolicy: Local with its only endpoint on another node: external traffic
    // is dropped here, cluster IP traffic still works.
    let local = service("default", "local", |s| {
        s.type_("NodePort")
            .cluster_ip(&["10.96.0.21"])
            .node_port("http", "TCP", 80, 30082)
            .external_local();
    });
    let local_slice = slice("default", "local-1", "local", |s| {
        s.port("http", "TCP", 8080)
            .endpoint(&lab.pod(2).ipv4.to_string(), "n2", |_| {});
    });
    let p = proxy(&lab);
    p.sync(&desired(&[lb, local], &[lb_slice, local_slice]))
        .await
        .unwrap();
    let ext = lab.external().unwrap();
    let quick = Duration::from_millis(400);
    let a = |s: &str| s.parse::<SocketAddr>().unwrap();
    let (ext_ip, lb_from_outside, np_local, np_lb) = run_in(ext, move || {
        (
            tcp_ask(a("203.0.113.10:80"), T).map(|r| r.identity),
            tcp_ask(a("203.0.113.20:80"), quick).map(|r| r.identity),
            tcp_ask(a("192.168.50.1:30082"), quick).map(|r| r.identity),
            tcp_ask(a("192.168.50.1:30081"), T).map(|r| r.identity),
        )
    });
    assert_eq!(ext_ip.unwrap(), "b1");
    assert_eq!(np_lb.unwrap(), "b1");
    let e = lb_from_outside.unwrap_err();
    assert!(
        matches!(
            e.kind(),
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
        ),
        "outside the source ranges must be dropped: {e}"
    );
    let e = np_local.unwrap_err();
    assert!(
        matches!(
            e.kind(),
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
        ),
        "Local policy without local endpoints must drop: {e}"
    );
    let (lb_from_pod, local_cluster_ip) = run_in(&lab.pod(0).ns, move || {
        (
            tcp_ask(a("203.0.113.20:80"), T).map(|r| r.identity),
            tcp_ask(a("10.96.0.21:80"), T).map(|r| r.identity),
        )
    });
    assert_eq!(lb_from_pod.unwrap(), "b1");
    assert_eq!(local_cluster_ip.unwrap(), "b2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destination_hashing_uses_the_original_destination() {
    if !is_root() {
        return eprintln!("skipped: needs root");
    }
    // dh hashes the frontend the client asked for, which only SO_ORIGINAL_DST reveals after
    // the redirect. Two services over the same endpoints: each must land where the balancer
    // predicts for its own cluster IP.
    let lab = lab(3, &[1, 2, 3]);
    let mut services = Vec::new();
    let mut slices = Vec::new();
    for (name, ip) in [("dh-a", "10.96.0.40"), ("dh-b", "10.96.0.41")] {
        services.push(annotate(
            service("default", name, |s| {
                s.cluster_ip(&[ip]).port("http", "TCP", 80);
            }),
            "dh",
        ));
        slices.push(slice("default", &format!("{name}-1"), name, |s| {
            s.port("http", "TCP", 8080);
            for i in 1..=3 {
                s.endpoint(&lab.pod(i).ipv4.to_string(), NODE, |_| {});
            }
        }));
    }
    let p = proxy(&lab);
    p.sync(&desired(&services, &slices)).await.unwrap();
    let backends: Vec<svcnet_lb::Backend> = (1..=3)
        .map(|i| svcnet_lb::Backend {
            addr: SocketAddr::new(lab.pod(i).ipv4.into(), 8080),
            weight: 1,
        })
        .collect();
    let balancer =
        svcnet_lb::Balancer::new(svcnet_lb::Algorithm::DestinationHash, backends).unwrap();
    for ip in ["10.96.0.40", "10.96.0.41"] {
        let dst = SocketAddr::new(ip.parse().unwrap(), 80);
        let flow = svcnet_lb::Flow {
            client: "10.244.1.2:40000".parse().unwrap(),
            destination: dst,
        };
        let mut rng = rand::rng();
        let i = balancer
            .pick(&flow, 0, &svcnet_lb::NoLoad, &mut rng)
            .unwrap();
        let want_ip = balancer.backends()[i].addr.ip();
        let pod = (1..=3)
            .find(|k| IpAddr::from(lab.pod(*k).ipv4) == want_ip)
            .unwrap();
        let t = tally(&lab.pod(0).ns, dst, 5);
        assert_eq!(t, BTreeMap::from([(format!("b{pod}"), 5)]), "{ip}");
    }
}

/// Issue 13's bug, on the real kernel: a LoadBalancer service with `externalTrafficPolicy:
/// Local` whose only endpoint is on another node. A pod and the node itself reach its LB IP
/// (the core's short-circuit to the cluster pool, as nft and iptables do); off-cluster
/// traffic is dropped (no local endpoint). The node-wide verdicts hold too: an unknown port of
/// a cluster IP is refused at once, an unallocated service IP dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_policy_short_circuit_and_node_wide_verdicts() {
    if !is_root() {
        return eprintln!("skipped: needs root");
    }
    let mut lab = lab(2, &[1, 2]);
    lab.external().unwrap();
    let svc = service("default", "remote", |s| {
        s.type_("LoadBalancer")
            .cluster_ip(&["10.96.0.30"])
            .node_port("http", "TCP", 80, 30090)
            .lb_ingress(&["203.0.113.30"])
            .external_local();
    });
    let sl = slice("default", "remote-1", "remote", |s| {
        s.port("http", "TCP", 8080)
            .endpoint(&lab.pod(2).ipv4.to_string(), "n2", |_| {});
    });
    let p = proxy(&lab);
    p.sync(&desired(&[svc], &[sl])).await.unwrap();
    let quick = Duration::from_millis(400);
    let a = |s: &str| s.parse::<SocketAddr>().unwrap();
    let from_pod = run_in(&lab.pod(0).ns, move || {
        tcp_ask(a("203.0.113.30:80"), T).map(|r| r.identity)
    });
    assert_eq!(
        from_pod.unwrap(),
        "b2",
        "a pod short-circuits to the cluster pool"
    );
    let from_node = run_in(&lab.node, move || {
        tcp_ask(a("203.0.113.30:80"), T).map(|r| r.identity)
    });
    assert_eq!(
        from_node.unwrap(),
        "b2",
        "the node short-circuits to the cluster pool"
    );
    let from_outside = run_in(lab.external().unwrap(), move || {
        tcp_ask(a("203.0.113.30:80"), quick).map(|r| r.identity)
    });
    let e = from_outside.unwrap_err();
    assert!(
        matches!(
            e.kind(),
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
        ),
        "off-cluster traffic has no local endpoint and is dropped: {e}"
    );
    let (unknown_port, unallocated) = run_in(&lab.pod(0).ns, move || {
        let t = Instant::now();
        let refused = std::net::TcpStream::connect_timeout(&a("10.96.0.30:81"), T);
        let took = t.elapsed();
        let dropped = std::net::TcpStream::connect_timeout(&a("10.96.0.99:80"), quick);
        ((refused.map(|_| ()), took), dropped.map(|_| ()))
    });
    let ((refused, took), dropped) = (unknown_port, unallocated);
    assert_eq!(
        refused.unwrap_err().kind(),
        std::io::ErrorKind::ConnectionRefused,
        "unknown port of a cluster IP"
    );
    assert!(took < Duration::from_millis(500), "refused after {took:?}");
    assert_eq!(
        dropped.unwrap_err().kind(),
        std::io::ErrorKind::TimedOut,
        "unallocated service IP"
    );
    p.shutdown().await.unwrap();
}

/// The shared packet-flow table (svcnet-flows) on the real kernel, as nft and iptables run it:
/// the userspace proxy in privileged mode programs a fresh lab's node; the endpoints always see
/// the proxy's address (the node's on their link), which the kit expects for every delivered
/// case.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_flow_table_on_the_kernel() {
    if !is_root() {
        return eprintln!("skipped: needs root");
    }
    let kl = svcnet_flows::kernel::KernelLab::start();
    let state = svcnet_flows::world();
    let families: Vec<_> = svcnet_proxy::IpFamily::ALL
        .into_iter()
        .map(|f| state.desired(f))
        .collect();
    let p = proxy(&kl.lab);
    p.sync(&families).await.unwrap();
    // `svcnet trace`'s reading of the proxy's redirect table as the kernel lists it: every
    // case that reaches endpoints goes to a listener, the rest are rejected or dropped, as
    // the real traffic below finds.
    let listing = kl
        .node()
        .exec(&["nft", "list", "table", "ip", svcnet_userspace::rules::TABLE])
        .unwrap();
    let rules = svcnet_nft::trace::Ruleset::parse_listing(&listing).unwrap();
    let tracer = svcnet_nft::trace::Tracer::new(&rules, svcnet_flows::node_addrs());
    for c in svcnet_flows::cases() {
        let pkt = svcnet_nft::trace::Packet {
            src: c.from.ip(),
            dst: c.to.0.into(),
            dport: c.to.1,
            proto: Some(match c.proto {
                svcnet_flows::Proto::Tcp => svcnet_proxy::Protocol::Tcp,
                svcnet_flows::Proto::Udp => svcnet_proxy::Protocol::Udp,
            }),
            local_origin: c.from == svcnet_flows::Client::Node,
        };
        let branches = tracer.trace(&pkt).unwrap();
        let total: f64 = branches.iter().map(|b| b.share).sum();
        assert!((total - 1.0).abs() < 1e-9, "{}: {branches:?}", c.name);
        for b in &branches {
            use svcnet_nft::trace::Outcome;
            let ok = match c.expect {
                svcnet_flows::Expect::Spread(..)
                | svcnet_flows::Expect::Sticky(..)
                | svcnet_flows::Expect::Pinned { .. } => {
                    matches!(b.outcome, Outcome::Listener { .. })
                }
                svcnet_flows::Expect::Reject => b.outcome == Outcome::Reject,
                svcnet_flows::Expect::Drop => b.outcome == Outcome::Drop,
            };
            assert!(ok, "{}: traced {:?}\n{listing}", c.name, b.outcome);
        }
    }
    tokio::task::block_in_place(|| kl.run_table(&svcnet_flows::cases(), false));
    p.shutdown().await.unwrap();
}

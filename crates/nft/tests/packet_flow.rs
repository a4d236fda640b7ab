//! The packet-flow table against the REAL kernel: fresh network namespaces per test (a node
//! running svcnet's nft rules, a client pod, backend pods with echo servers, an external
//! client), real TCP/UDP traffic, and the answers say which backend replied and which client
//! address it saw. Needs root (CI runs as root); every namespace is removed on drop.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use svcnet_netns::test_support::{
    EXTERNAL_IP, Lab, NODE_IP, Reply, Session, tcp_ask, udp_ask_with,
};
use svcnet_nft::{FullMode, NftExecutor, Renderer};
use svcnet_proxy::fixtures::*;
use svcnet_proxy::{CoreConfig, IpFamily, NamespacedName, ProxyState};

const FAST: Duration = Duration::from_millis(1500);
const DROP_WAIT: Duration = Duration::from_millis(400);

/// A lab plus the proxy pipeline programming its node.
struct Env {
    lab: Lab,
    state: ProxyState,
    renderers: BTreeMap<IpFamily, Renderer>,
    exec: NftExecutor,
}

/// Pod 0 is the client; pods 1..=3 are backends "b1".."b3" serving TCP and UDP on 8080.
fn env() -> Env {
    let mut lab = Lab::new().expect("creating namespaces needs root");
    for _ in 0..4 {
        lab.add_pod().unwrap();
    }
    lab.external().unwrap();
    for i in 1..=3 {
        lab.serve_tcp(i, 8080, &format!("b{i}")).unwrap();
    }
    let config = CoreConfig {
        node_name: "n1".into(),
        cluster_cidrs: vec![
            "10.244.0.0/16".parse().unwrap(),
            "fd00:244::/32".parse().unwrap(),
        ],
        ..Default::default()
    };
    let exec = NftExecutor::new(Some(lab.node.name().to_string()));
    let renderers = IpFamily::ALL
        .into_iter()
        .map(|f| (f, Renderer::new(svcnet_nft::family_of(f))))
        .collect();
    Env {
        lab,
        state: ProxyState::new(config),
        renderers,
        exec,
    }
}

impl Env {
    fn backend_ip(&self, i: usize) -> String {
        self.lab.pod(i).ipv4.to_string()
    }

    fn apply(&mut self, services: &[Service], slices: &[EndpointSlice]) {
        for s in services {
            self.state.update_service(s).unwrap();
        }
        for s in slices {
            self.state.update_slice(s);
        }
        self.sync();
    }

    /// A partial sync when possible, else a full one; plus UDP conntrack cleanup.
    fn sync(&mut self) {
        let changes = self.state.take_changes();
        for (family, r) in self.renderers.iter_mut() {
            let plan = if r.has_applied() {
                let desired = self.state.desired_for(*family, changes.services.keys());
                r.plan_partial(&self.state.node_state(*family), &desired)
                    .unwrap_or_else(|| {
                        r.plan_full(&self.state.desired(*family), FullMode::Recreate)
                    })
            } else {
                r.plan_full(&self.state.desired(*family), FullMode::Recreate)
            };
            if let Err(e) = self.exec.apply(&plan.tx) {
                panic!("nft rejected:\n{}\n{e}", plan.tx);
            }
            r.commit(plan);
        }
        let stale = self.state.stale_conntrack(&changes);
        svcnet_conntrack::clear_stale(Some(self.lab.node.name()), &stale).unwrap();
    }

    fn tcp_from(
        &self,
        ns: &svcnet_netns::NetNs,
        addr: SocketAddr,
        n: usize,
    ) -> Vec<std::io::Result<Reply>> {
        ns.run(move || (0..n).map(|_| tcp_ask(addr, FAST)).collect())
            .unwrap()
    }

    fn client(&self) -> &svcnet_netns::NetNs {
        &self.lab.pod(0).ns
    }
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn counts(replies: &[std::io::Result<Reply>]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for r in replies {
        let r = r.as_ref().expect("connection failed");
        *m.entry(r.identity.clone()).or_default() += 1;
    }
    m
}

fn assert_refused_fast(result: std::io::Result<Reply>, started: Instant) {
    let err = result.expect_err("expected the connection to be refused");
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{err}");
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "refusal took {:?}",
        started.elapsed()
    );
}

fn assert_dropped(result: std::io::Result<Reply>) {
    let err = result.expect_err("expected the traffic to be dropped");
    assert!(
        matches!(err.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock),
        "expected a timeout, got {err}"
    );
}

fn web(f: impl FnOnce(&mut ServiceBuilder)) -> Service {
    service("default", "web", |s| {
        s.cluster_ip(&["10.96.0.10"]).port("http", "TCP", 80);
        f(s);
    })
}

fn web_slice(env: &Env, eps: &[(usize, &str, EndpointFn)]) -> EndpointSlice {
    slice("default", "web-1", "web", |s| {
        s.port("http", "TCP", 8080);
        for (i, node, f) in eps {
            s.endpoint(&env.backend_ip(*i), node, f);
        }
    })
}

/// Customises one endpoint of a fixture slice.
type EndpointFn = fn(&mut k8s_openapi::api::discovery::v1::Endpoint);

fn ready(_: &mut k8s_openapi::api::discovery::v1::Endpoint) {}

#[test]
fn cluster_ip_balances_over_ready_endpoints_only() {
    let mut env = env();
    let slice = web_slice(
        &env,
        &[(1, "n1", ready), (2, "n2", ready), (3, "n2", ready)],
    );
    env.apply(&[web(|_| {})], &[slice]);
    let replies = env.tcp_from(env.client(), addr("10.96.0.10:80"), 300);
    let c = counts(&replies);
    assert_eq!(c.len(), 3, "{c:?}");
    for (id, n) in &c {
        // Mean 100, sd ≈ 8.2: [60, 140] is ~5 sd, a false failure is practically impossible.
        assert!((60..=140).contains(n), "{id} got {n} of 300: {c:?}");
    }
    // Pod-to-service traffic keeps the pod's address (no masquerade inside the cluster CIDR).
    let client_ip = IpAddr::V4(env.lab.pod(0).ipv4);
    assert!(
        replies
            .iter()
            .all(|r| r.as_ref().unwrap().client == client_ip)
    );

    // b3 becomes unready: it never gets new connections.
    let slice = web_slice(
        &env,
        &[(1, "n1", ready), (2, "n2", ready), (3, "n2", not_ready)],
    );
    env.apply(&[], &[slice]);
    let c = counts(&env.tcp_from(env.client(), addr("10.96.0.10:80"), 60));
    assert_eq!(c.keys().cloned().collect::<Vec<_>>(), ["b1", "b2"], "{c:?}");

    // Unknown port on a cluster IP: refused; unallocated IP in the service CIDR: dropped.
    let started = Instant::now();
    assert_refused_fast(
        env.client()
            .run(|| tcp_ask(addr("10.96.0.10:81"), FAST))
            .unwrap(),
        started,
    );
    assert_dropped(
        env.client()
            .run(|| tcp_ask(addr("10.96.0.99:80"), DROP_WAIT))
            .unwrap(),
    );
}

#[test]
fn no_endpoints_rejects_fast_and_terminating_fallback() {
    let mut env = env();
    env.apply(
        &[web(|s| {
            s.node_port("np", "TCP", 81, 30081);
        })],
        &[],
    );
    let started = Instant::now();
    assert_refused_fast(
        env.client()
            .run(|| tcp_ask(addr("10.96.0.10:80"), FAST))
            .unwrap(),
        started,
    );
    let ext = env.lab.external().unwrap();
    let started = Instant::now();
    let r = ext
        .run(|| tcp_ask(SocketAddr::new(NODE_IP.into(), 30081), FAST))
        .unwrap();
    assert_refused_fast(r, started);

    // Only terminating (still serving) endpoints: they are used rather than refusing.
    let slice = web_slice(&env, &[(1, "n1", terminating), (2, "n2", not_ready)]);
    env.apply(&[], &[slice]);
    let c = counts(&env.tcp_from(env.client(), addr("10.96.0.10:80"), 10));
    assert_eq!(c.keys().cloned().collect::<Vec<_>>(), ["b1"], "{c:?}");
}

#[test]
fn node_port_external_ip_and_load_balancer_source_ranges() {
    let mut env = env();
    let svc = web(|s| {
        s.lb_ingress(&["203.0.113.20"])
            .external_ips(&["203.0.113.10"])
            .source_ranges(&["10.0.0.0/8"]);
        s.0.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].node_port = Some(30080);
    });
    let open = service("default", "open", |s| {
        s.cluster_ip(&["10.96.0.11"])
            .port("http", "TCP", 80)
            .lb_ingress(&["203.0.113.21"])
            .source_ranges(&["192.168.50.0/24"]);
    });
    let open_slice = slice("default", "open-1", "open", |s| {
        s.port("http", "TCP", 8080)
            .endpoint(&env.backend_ip(3), "n1", |_| {});
    });
    let slice = web_slice(&env, &[(1, "n1", ready), (2, "n2", ready)]);
    env.apply(&[svc, open], &[slice, open_slice]);
    let ext = env.lab.external().unwrap();
    let probe = |a: SocketAddr, n: usize| {
        ext.run(move || (0..n).map(|_| tcp_ask(a, FAST)).collect::<Vec<_>>())
            .unwrap()
    };

    // NodePort and external IP from outside reach the endpoints, masqueraded
    // (externalTrafficPolicy: Cluster): the backend sees the node, not 192.168.50.2.
    for target in [
        SocketAddr::new(NODE_IP.into(), 30080),
        addr("203.0.113.10:80"),
    ] {
        let replies = probe(target, 40);
        assert_eq!(counts(&replies).len(), 2, "{target}");
        for r in &replies {
            let r = r.as_ref().unwrap();
            assert_ne!(
                r.client,
                IpAddr::V4(EXTERNAL_IP),
                "{target}: external traffic must be masqueraded"
            );
            assert!(
                r.client.to_string().starts_with("10.244."),
                "{target}: saw {}",
                r.client
            );
        }
    }
    // LB IP whose source ranges exclude the client: dropped before DNAT.
    assert_dropped(
        ext.run(|| tcp_ask(addr("203.0.113.20:80"), DROP_WAIT))
            .unwrap(),
    );
    // LB IP whose source ranges include it: reachable.
    let r = ext
        .run(|| tcp_ask(addr("203.0.113.21:80"), FAST))
        .unwrap()
        .unwrap();
    assert_eq!(r.identity, "b3");
}

#[test]
fn external_traffic_policy_local_preserves_client_ip_and_drops_without_local_endpoints() {
    let mut env = env();
    let svc = web(|s| {
        s.node_port("np", "TCP", 81, 30080).external_local();
    });
    let both = slice("default", "web-1", "web", |s| {
        s.port("np", "TCP", 8080)
            .endpoint(&env.backend_ip(1), "n1", |_| {})
            .endpoint(&env.backend_ip(2), "n2", |_| {});
    });
    env.apply(&[svc], &[both]);
    let ext = env.lab.external().unwrap();
    let replies = ext
        .run(|| {
            (0..30)
                .map(|_| tcp_ask(SocketAddr::new(NODE_IP.into(), 30080), FAST))
                .collect::<Vec<_>>()
        })
        .unwrap();
    for r in &replies {
        let r = r.as_ref().unwrap();
        assert_eq!(
            r.identity, "b1",
            "only the local endpoint serves external traffic"
        );
        assert_eq!(
            r.client,
            IpAddr::V4(EXTERNAL_IP),
            "client IP must be preserved"
        );
    }
    // Pods still reach every endpoint through the cluster IP.
    assert_eq!(
        counts(&env.tcp_from(env.client(), addr("10.96.0.10:81"), 40)).len(),
        2
    );

    // No local endpoint left: external traffic is dropped (not refused).
    let remote = slice("default", "web-1", "web", |s| {
        s.port("np", "TCP", 8080)
            .endpoint(&env.backend_ip(2), "n2", |_| {});
    });
    env.apply(&[], &[remote]);
    let ext = env.lab.external().unwrap();
    assert_dropped(
        ext.run(|| tcp_ask(SocketAddr::new(NODE_IP.into(), 30080), DROP_WAIT))
            .unwrap(),
    );
}

#[test]
fn internal_traffic_policy_local_drops_without_local_endpoints() {
    let mut env = env();
    let slice = web_slice(&env, &[(1, "n2", ready)]);
    env.apply(
        &[web(|s| {
            s.internal_local();
        })],
        &[slice],
    );
    assert_dropped(
        env.client()
            .run(|| tcp_ask(addr("10.96.0.10:80"), DROP_WAIT))
            .unwrap(),
    );
    let slice = web_slice(&env, &[(1, "n2", ready), (2, "n1", ready)]);
    env.apply(&[], &[slice]);
    let c = counts(&env.tcp_from(env.client(), addr("10.96.0.10:80"), 20));
    assert_eq!(c.keys().cloned().collect::<Vec<_>>(), ["b2"], "{c:?}");
}

#[test]
fn session_affinity_sticks_then_expires() {
    let mut env = env();
    let slice = web_slice(
        &env,
        &[(1, "n1", ready), (2, "n1", ready), (3, "n1", ready)],
    );
    env.apply(
        &[web(|s| {
            s.affinity(Some(1));
        })],
        &[slice],
    );
    let c = counts(&env.tcp_from(env.client(), addr("10.96.0.10:80"), 30));
    assert_eq!(
        c.len(),
        1,
        "all connections of one client must stick to one endpoint: {c:?}"
    );
    // The port's map of its cluster pool (every frontend of the port records there).
    let spn = svcnet_proxy::ServicePortName {
        service: svcnet_proxy::NamespacedName::new("default", "web"),
        port: "http".into(),
        protocol: svcnet_proxy::Protocol::Tcp,
    };
    let map = svcnet_nft::names::affinity_object("cluster", &spn);
    let sets = env
        .lab
        .node
        .exec(&["nft", "list", "map", "ip", "svcnet", &map])
        .unwrap();
    assert!(
        sets.contains(&env.lab.pod(0).ipv4.to_string()),
        "client recorded in the affinity map:\n{sets}"
    );
    // The 1 s timeout expires: the kernel forgets the client.
    std::thread::sleep(Duration::from_millis(2200));
    let sets = env
        .lab
        .node
        .exec(&["nft", "list", "map", "ip", "svcnet", &map])
        .unwrap();
    assert!(
        !sets.contains(&env.lab.pod(0).ipv4.to_string()),
        "affinity did not expire:\n{sets}"
    );
}

#[test]
fn hairpin_pod_reaches_itself_through_its_service() {
    let mut env = env();
    let slice = web_slice(&env, &[(1, "n1", ready)]);
    env.apply(&[web(|_| {})], &[slice]);
    let r = env
        .lab
        .pod(1)
        .ns
        .run(|| tcp_ask(addr("10.96.0.10:80"), FAST))
        .unwrap()
        .unwrap();
    assert_eq!(r.identity, "b1");
    // Masqueraded to the node's address on b1's link, or the reply would never come back.
    assert_eq!(r.client.to_string(), "10.244.2.1");
}

#[test]
fn endpoint_removal_keeps_established_connections() {
    let mut env = env();
    let slice = web_slice(&env, &[(1, "n1", ready), (2, "n1", ready)]);
    env.apply(&[web(|_| {})], &[slice]);
    let mut session = env
        .client()
        .run(|| Session::connect(addr("10.96.0.10:80"), FAST))
        .unwrap()
        .unwrap();
    let first = session.ask().unwrap().identity;
    let keep = if first == "b1" { 2 } else { 1 };
    let slice = web_slice(&env, &[(keep, "n1", ready)]);
    env.apply(&[], &[slice]);
    // The established connection still talks to the removed endpoint …
    assert_eq!(session.ask().unwrap().identity, first);
    // … while new connections only reach the remaining one.
    let c = counts(&env.tcp_from(env.client(), addr("10.96.0.10:80"), 20));
    assert_eq!(c.keys().cloned().collect::<Vec<_>>(), [format!("b{keep}")]);
}

#[test]
fn udp_service_survives_endpoint_replacement() {
    let mut env = env();
    let _u1 = env.lab.serve_udp(1, 5353, "u1").unwrap();
    let _u2 = env.lab.serve_udp(2, 5353, "u2").unwrap();
    let svc = service("kube-system", "dns", |s| {
        s.cluster_ip(&["10.96.0.53"]).port("dns", "UDP", 53);
    });
    let one = |i: usize, env: &Env| {
        slice("kube-system", "dns-1", "dns", |s| {
            s.port("dns", "UDP", 5353)
                .endpoint(&env.backend_ip(i), "n1", |_| {});
        })
    };
    let s1 = one(1, &env);
    env.apply(&[svc], &[s1]);
    let sock = env
        .client()
        .run(|| std::net::UdpSocket::bind("0.0.0.0:0"))
        .unwrap()
        .unwrap();
    let target = addr("10.96.0.53:53");
    assert_eq!(udp_ask_with(&sock, target, FAST).unwrap().identity, "u1");
    // Replace the endpoint; the same client socket (same 5-tuple) must reach the new one,
    // which needs the stale conntrack entry deleted.
    let s2 = one(2, &env);
    env.apply(&[], &[s2]);
    assert_eq!(udp_ask_with(&sock, target, FAST).unwrap().identity, "u2");
}

#[test]
fn ipv6_cluster_ip() {
    let mut env = env();
    let svc = service("default", "v6", |s| {
        s.cluster_ip(&["fd00:10:96::10"]).port("http", "TCP", 80);
    });
    let (ip1, ip2) = (
        env.lab.pod(1).ipv6.to_string(),
        env.lab.pod(2).ipv6.to_string(),
    );
    let slice = slice("default", "v6-1", "v6", |s| {
        s.ipv6()
            .port("http", "TCP", 8080)
            .endpoint(&ip1, "n1", |_| {})
            .endpoint(&ip2, "n1", |_| {});
    });
    env.apply(&[svc], &[slice]);
    let replies = env.tcp_from(env.client(), addr("[fd00:10:96::10]:80"), 40);
    assert_eq!(counts(&replies).len(), 2);
    assert!(
        replies
            .iter()
            .all(|r| r.as_ref().unwrap().client == IpAddr::V6(env.lab.pod(0).ipv6))
    );
    // Deleting the service removes its rules: now an unallocated IP in the service CIDR.
    env.state
        .delete_service(&NamespacedName::new("default", "v6"));
    env.sync();
    assert_dropped(
        env.client()
            .run(|| tcp_ask(addr("[fd00:10:96::10]:80"), DROP_WAIT))
            .unwrap(),
    );
}

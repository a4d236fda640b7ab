//! The IPVS kernel tier (inside user-mode Linux through `scripts/uml/cargo-runner`; skipped on
//! the host, whose kernel has no IPVS): the generic-netlink client against IPVS itself, in
//! network namespaces this test creates.
#![allow(clippy::unwrap_used)]

use svcnet_ipvs::types::{F_HASHED, F_SCHED1, F_SCHED2};
use svcnet_ipvs::{
    Dest, DestKey, FakeIpvs, Forward, Ipvs, IpvsError, IpvsSocket, Op, Protocol, Service,
    ServiceKey,
};
use svcnet_netns::NetNs;
use svcnet_netns::test_support::uml_guest;

fn key(proto: Protocol, addr: &str, port: u16) -> ServiceKey {
    ServiceKey::new(proto, addr.parse().unwrap(), port)
}

fn errno(r: Result<(), IpvsError>) -> Option<i32> {
    match r {
        Ok(()) => None,
        Err(IpvsError::Rejected(r)) => Some(r.errno),
        Err(e) => panic!("{e}"),
    }
}

/// The operations of the agreement test: accepted ones and every rejection the fake models.
fn script() -> Vec<Op> {
    let v4 = key(Protocol::Tcp, "10.96.0.10", 80);
    let v6 = key(Protocol::Udp, "fd00:96::a", 53);
    let d1 = Dest::masq("10.244.1.2".parse().unwrap(), 8080, 1);
    let d2 = Dest::masq("10.244.2.2".parse().unwrap(), 8080, 1);
    let d6 = Dest::masq("fd00:244:1::2".parse().unwrap(), 53, 1);
    let mut mh = Service::new(key(Protocol::Tcp, "10.96.0.11", 80), "mh");
    mh.flags = F_SCHED1 | F_SCHED2;
    let mut bad_mask = Service::new(v6, "rr");
    bad_mask.netmask = 129;
    let mut heavy = d2.clone();
    heavy.weight = u32::MAX;
    let mut thresholds = d2.clone();
    (thresholds.upper_threshold, thresholds.lower_threshold) = (5, 10);
    vec![
        Op::AddService(Service::new(v4, "rr")),
        Op::AddService(Service::new(v4, "rr")), // EEXIST
        Op::AddService(Service::new(key(Protocol::Tcp, "10.96.0.12", 80), "nosuch")), // ENOENT
        Op::AddService(Service::new(
            key(Protocol::Tcp, "10.96.0.12", 80),
            "averyveryverylongname",
        )),
        Op::AddService(bad_mask), // EINVAL
        Op::AddService(Service::new(v6, "sh").persistent(10800)),
        Op::AddService(mh),
        Op::AddDest(v4, d1.clone()),
        Op::AddDest(v4, d1.clone()), // EEXIST
        Op::AddDest(key(Protocol::Tcp, "10.96.0.99", 80), d1.clone()), // ESRCH
        Op::AddDest(v4, d6.clone()), // EINVAL: other family under NAT
        Op::AddDest(v4, heavy),      // ERANGE
        Op::AddDest(v4, thresholds), // ERANGE
        Op::AddDest(v4, d2.clone()),
        Op::AddDest(v6, d6.clone()),
        Op::EditDest(v4, Dest::masq(d2.addr, 8080, 0)),
        Op::EditDest(v4, Dest::masq("10.244.9.9".parse().unwrap(), 1, 1)), // ENOENT
        Op::DelDest(v4, d1.key()),
        Op::DelDest(v4, d1.key()), // ENOENT
        Op::EditService(Service::new(v4, "wlc")),
        Op::EditService(Service::new(key(Protocol::Tcp, "10.96.0.99", 80), "rr")), // ESRCH
        Op::DelService(key(Protocol::Udp, "10.96.0.10", 80)),                      // ESRCH
        Op::AddService(Service::new(ServiceKey::fwmark(false, 0x5300_0001), "rr").persistent(60)),
        Op::AddDest(ServiceKey::fwmark(false, 0x5300_0001), d1.clone()),
        Op::AddService(Service::new(key(Protocol::Sctp, "10.96.0.13", 9), "lblcr")),
        Op::DelService(key(Protocol::Sctp, "10.96.0.13", 9)),
    ]
}

fn state(t: &mut dyn Ipvs) -> Vec<(Service, Vec<Dest>)> {
    let mut out = Vec::new();
    let mut services = t.services().unwrap();
    services.sort_by_key(|s| s.key);
    for s in services {
        let mut dests = t.dests(&s.key).unwrap();
        dests.sort_by_key(Dest::key);
        out.push((s, dests));
    }
    out
}

/// Every operation gets the same answer from the kernel and the fake, and both end in the same
/// table; dumps carry the kernel's F_HASHED, and IPv6, persistence and mh flags round-trip.
#[test]
fn the_fake_rejects_what_the_kernel_rejects() {
    if !uml_guest() {
        return;
    }
    let ns = NetNs::create(&svcnet_netns::unique_name("ipa")).unwrap();
    ns.run(|| {
        let mut kernel = IpvsSocket::open().unwrap();
        let mut fake = FakeIpvs::new();
        for op in script() {
            let k = errno(kernel.apply(std::slice::from_ref(&op)));
            let f = errno(fake.apply(std::slice::from_ref(&op)));
            assert_eq!(k, f, "{op}: kernel {k:?}, fake {f:?}");
        }
        let (k, f) = (state(&mut kernel), state(&mut fake));
        assert_eq!(k, f);
        assert_eq!(k.len(), 4);
        assert!(k.iter().all(|(s, _)| s.flags & F_HASHED != 0));
        let (v6, dests) = &k[3];
        assert_eq!(
            (v6.scheduler.as_str(), v6.timeout, v6.netmask),
            ("sh", 10800, 128)
        );
        assert_eq!(dests[0].forward, Forward::Masq);
        kernel.apply(&[Op::Flush]).unwrap();
        assert!(kernel.services().unwrap().is_empty());
    })
    .unwrap();
}

/// A thousand services with two real servers each go in one batched call (a few datagrams),
/// a dump reads them back, and a batch with a rejection in the middle still applies the rest
/// and names the rejected operation.
#[test]
fn bulk_batches_and_partial_rejections() {
    if !uml_guest() {
        return;
    }
    let ns = NetNs::create(&svcnet_netns::unique_name("ipb")).unwrap();
    ns.run(|| {
        let mut kernel = IpvsSocket::open().unwrap();
        let mut ops = Vec::new();
        for i in 0..1000u32 {
            let k = key(
                Protocol::Tcp,
                &format!("10.96.{}.{}", i / 250, i % 250 + 1),
                80,
            );
            ops.push(Op::AddService(Service::new(k, "rr")));
            for pod in 1..=2 {
                ops.push(Op::AddDest(
                    k,
                    Dest::masq(format!("10.244.{pod}.2").parse().unwrap(), 8080, 1),
                ));
            }
        }
        let t = std::time::Instant::now();
        kernel.apply(&ops).unwrap();
        eprintln!("3000 ops in {:?} (UML)", t.elapsed());
        assert_eq!(kernel.services().unwrap().len(), 1000);
        let first = key(Protocol::Tcp, "10.96.0.1", 80);
        assert_eq!(kernel.dests(&first).unwrap().len(), 2);
        let extra = key(Protocol::Tcp, "10.97.0.1", 80);
        let err = kernel
            .apply(&[
                Op::DelDest(
                    first,
                    DestKey {
                        addr: "10.244.1.2".parse().unwrap(),
                        port: 8080,
                    },
                ),
                Op::AddService(Service::new(first, "rr")),
                Op::AddService(Service::new(extra, "rr")),
            ])
            .unwrap_err();
        assert!(err.to_string().contains("-A -t 10.96.0.1:80"), "{err}");
        assert!(err.to_string().contains("already exists"), "{err}");
        assert_eq!(kernel.dests(&first).unwrap().len(), 1);
        assert_eq!(kernel.services().unwrap().len(), 1001);
        kernel.apply(&[Op::Flush]).unwrap();
    })
    .unwrap();
}

/// The flows lab and an IPVS dataplane for its node namespace.
fn lab(
    families: &[svcnet_proxy::IpFamily],
) -> (svcnet_flows::kernel::KernelLab, svcnet_ipvs::IpvsDataplane) {
    let kl = svcnet_flows::kernel::KernelLab::start();
    let dp = svcnet_ipvs::IpvsDataplane::new(Some(kl.node().name().to_string()), families).unwrap();
    (kl, dp)
}

/// One full sync of the flows world, as the syncer makes the first one.
fn full_sync(dp: &mut svcnet_ipvs::IpvsDataplane, state: &svcnet_proxy::ProxyState) {
    use svcnet_proxy::{Dataplane, FullReason};
    for f in dp.families() {
        let plan = dp
            .plan_full(f, &state.desired(f), FullReason::Unknown)
            .unwrap();
        dp.apply(f, &plan).unwrap_or_else(|e| panic!("{e}\n{plan}"));
        dp.commit(f, plan);
    }
}

/// The shared packet-flow table with real connections between the lab's namespaces, through
/// IPVS in the node namespace: every case, with the expectations every dataplane meets; and
/// host ports do not answer on service IPs.
#[test]
fn flow_table_with_real_traffic() {
    if !uml_guest() {
        return;
    }
    let (kl, mut dp) = lab(&[svcnet_proxy::IpFamily::V4]);
    let state = svcnet_flows::world();
    full_sync(&mut dp, &state);
    // What `svcnet trace` reads back from the node (IPVS, ipsets, iptables-save, the dummy's
    // addresses) is what the dataplane applied, whole, before traffic moves the counters.
    let v4 = svcnet_proxy::IpFamily::V4;
    let back = svcnet_ipvs::readback::read(Some(kl.node().name()), v4)
        .unwrap()
        .expect("the IPVS dataplane's state");
    let applied = dp.applied(v4).unwrap();
    assert_eq!(back.members, applied.members);
    assert_eq!(back.marks, applied.marks);
    assert_eq!(back.port_dnats, applied.port_dnats);
    assert_eq!(back.addresses, applied.addresses);
    assert_eq!(back.servers, applied.servers);
    assert_eq!(&back, applied);
    kl.run_table(&svcnet_flows::cases(), true);
    // A port the node itself listens on does not answer on service IPs, which are local
    // addresses on the dummy (k/k#72236): the listener answers on the node IP, a service IP
    // refuses.
    let _host = svcnet_netns::test_support::serve_tcp(kl.node(), 2222, "host").unwrap();
    let pod = svcnet_flows::Client::Pod(svcnet_flows::CLIENT_POD);
    let ids = kl.asks(pod, "192.168.50.1:2222".parse().unwrap(), 1);
    assert_eq!(ids, ["host"]);
    let refused = kl
        .client_ns(pod)
        .run(|| {
            std::net::TcpStream::connect_timeout(
                &"10.96.0.10:2222".parse().unwrap(),
                std::time::Duration::from_secs(2),
            )
        })
        .unwrap();
    assert_eq!(
        refused.unwrap_err().kind(),
        std::io::ErrorKind::ConnectionRefused
    );
}

/// One IPv4 sync as the syncer makes it after the first: a partial plan of the changes, or a
/// full one for `full`. Returns the plan's IPVS operations as text.
fn sync(
    dp: &mut svcnet_ipvs::IpvsDataplane,
    state: &mut svcnet_proxy::ProxyState,
    full: Option<svcnet_proxy::FullReason>,
) -> Vec<String> {
    use svcnet_proxy::{Dataplane, IpFamily};
    let changes = state.take_changes();
    let f = IpFamily::V4;
    let plan = match full {
        Some(why) => dp.plan_full(f, &state.desired(f), why).unwrap(),
        None => dp
            .plan_partial(
                f,
                &state.node_state(f),
                &state.desired_for(f, changes.services.keys()),
            )
            .unwrap(),
    };
    let ops = plan.ops.iter().map(ToString::to_string).collect();
    dp.apply(f, &plan).unwrap_or_else(|e| panic!("{e}\n{plan}"));
    dp.commit(f, plan);
    ops
}

/// Partial syncs touch only the changed service; a removed TCP endpoint drains at weight 0
/// (its established connection keeps working, new ones go elsewhere) and is deleted once the
/// drain bound passes; a removed UDP endpoint goes at once and the next datagram from the same
/// client port reaches the remaining one (no black hole); a virtual server deleted by hand
/// comes back with the periodic full sync.
#[test]
fn partial_syncs_graceful_termination_and_drift_repair() {
    use std::net::SocketAddr;
    use std::time::Duration;
    use svcnet_flows::{NODE, TCP_PORT, UDP_PORT, pod_ip};
    use svcnet_netns::test_support::{Session, udp_ask_with};
    use svcnet_proxy::fixtures::slice;
    if !uml_guest() {
        return;
    }
    let (kl, mut dp) = lab(&[svcnet_proxy::IpFamily::V4]);
    dp.set_drain_bound(Duration::from_secs(2));
    let mut state = svcnet_flows::world();
    state.take_changes();
    full_sync(&mut dp, &state);
    let client = kl.client_ns(svcnet_flows::Client::Pod(svcnet_flows::CLIENT_POD));
    // A held connection to web (rr over p1..p3).
    let web: SocketAddr = "10.96.0.10:80".parse().unwrap();
    let (mut held, first) = client
        .run(|| {
            let mut s = Session::connect(web, Duration::from_secs(2)).unwrap();
            let r = s.ask().unwrap();
            (s, r.identity)
        })
        .unwrap();
    let gone: usize = first.trim_start_matches('p').parse().unwrap();
    let keep: Vec<usize> = (1..=3).filter(|i| *i != gone).collect();
    state.update_slice(&slice("default", "web-1", "web", |b| {
        b.port("http", "TCP", TCP_PORT as i32);
        for i in &keep {
            b.endpoint(
                &pod_ip(*i).to_string(),
                if *i == 1 { NODE } else { "n2" },
                |_| {},
            );
        }
    }));
    let ops = sync(&mut dp, &mut state, None);
    assert_eq!(
        ops,
        [format!(
            "-e -t 10.96.0.10:80 -r {}:{TCP_PORT} -m -w 0",
            pod_ip(gone)
        )],
        "only web's draining endpoint changes"
    );
    assert_eq!(dp.draining().len(), 1);
    // The held connection still answers from the draining endpoint; new ones avoid it.
    let again = client.run(|| held.ask().unwrap().identity).unwrap();
    assert_eq!(again, first);
    let news = kl.asks(svcnet_flows::Client::Pod(svcnet_flows::CLIENT_POD), web, 6);
    assert!(
        news.iter().all(|id| *id != first),
        "{news:?} after draining {first}"
    );
    drop(held);
    // After the bound, the next sync deletes it (its connection sits in TIME_WAIT, which
    // IPVS counts as inactive for two minutes).
    std::thread::sleep(Duration::from_millis(2100));
    let ops = sync(&mut dp, &mut state, None);
    assert!(ops.is_empty(), "{ops:?}");
    assert!(dp.draining().is_empty());
    let key = svcnet_ipvs::ServiceKey::new(Protocol::Tcp, "10.96.0.10".parse().unwrap(), 80);
    let dests = dp.socket().dests(&key).unwrap();
    assert_eq!(dests.len(), 2, "{dests:?}");

    // UDP: the DNS service loses the endpoint a client port is talking to.
    let dns: SocketAddr = "10.96.0.20:53".parse().unwrap();
    let sock = client
        .run(|| std::net::UdpSocket::bind("0.0.0.0:0").unwrap())
        .unwrap();
    let t = Duration::from_secs(2);
    let before = udp_ask_with(&sock, dns, t).unwrap().identity;
    let left: usize = if before == "p1" { 2 } else { 1 };
    state.update_slice(&slice("kube-system", "dns-1", "dns", |b| {
        b.port("dns", "UDP", UDP_PORT as i32).endpoint(
            &pod_ip(left).to_string(),
            if left == 1 { NODE } else { "n2" },
            |_| {},
        );
    }));
    let ops = sync(&mut dp, &mut state, None);
    assert_eq!(ops.len(), 1, "{ops:?}");
    assert!(ops[0].starts_with("-d -u 10.96.0.20:53"), "{ops:?}");
    let after = udp_ask_with(&sock, dns, t).unwrap().identity;
    assert_eq!(after, format!("p{left}"), "same client port, no black hole");

    // Drift: a virtual server deleted by hand is back after the periodic full sync.
    let np = svcnet_ipvs::ServiceKey::new(Protocol::Tcp, "10.96.0.12".parse().unwrap(), 80);
    dp.socket().apply(&[Op::DelService(np)]).unwrap();
    let ops = sync(
        &mut dp,
        &mut state,
        Some(svcnet_proxy::FullReason::Periodic),
    );
    assert!(
        ops.iter().any(|o| o == "-A -t 10.96.0.12:80 -s rr"),
        "{ops:?}"
    );
    assert_eq!(
        ops.len(),
        3,
        "the server and its two real servers only: {ops:?}"
    );
    let ids = kl.asks(
        svcnet_flows::Client::Pod(svcnet_flows::CLIENT_POD),
        "10.96.0.12:80".parse().unwrap(),
        4,
    );
    assert_eq!(ids.len(), 4);
}

/// The schedulers as traffic sees them, and IPv6 virtual servers: rr hands out endpoints in
/// a fixed rotation; sh keeps each client on one endpoint; lc sends new connections away from
/// endpoints holding connections; an IPv6 cluster IP spreads over IPv6 endpoints with the
/// client address kept.
#[test]
fn schedulers_and_ipv6_with_real_traffic() {
    use std::collections::{BTreeMap, BTreeSet};
    use std::net::SocketAddr;
    use std::time::Duration;
    use svcnet_flows::{CLIENT_POD, Client, NODE, TCP_PORT, pod_ip};
    use svcnet_netns::test_support::{Session, tcp_ask};
    use svcnet_proxy::IpFamily;
    use svcnet_proxy::fixtures::{service, slice};
    if !uml_guest() {
        return;
    }
    let (kl, mut dp) = lab(&IpFamily::ALL);
    let mut state = svcnet_flows::world();
    let mut lc = service("default", "lc", |b| {
        b.cluster_ip(&["10.96.0.24"]).port("", "TCP", 80);
    });
    lc.metadata.annotations = Some(
        [(
            svcnet_proxy::algorithm::ANNOTATION.to_string(),
            "lc".to_string(),
        )]
        .into_iter()
        .collect(),
    );
    state.update_service(&lc).unwrap();
    state
        .update_service(&service("default", "v6", |b| {
            b.cluster_ip(&["10.96.0.40", "fd00:10:96::40"])
                .port("", "TCP", 80);
        }))
        .unwrap();
    state.update_slice(&slice("default", "lc-1", "lc", |b| {
        b.port("", "TCP", TCP_PORT as i32);
        for i in 1..=3 {
            b.endpoint(
                &pod_ip(i).to_string(),
                if i == 1 { NODE } else { "n2" },
                |_| {},
            );
        }
    }));
    let v6 = |i: usize| format!("fd00:244:{i}::2");
    state.update_slice(&slice("default", "v6-1", "v6", |b| {
        b.ipv6()
            .port("", "TCP", TCP_PORT as i32)
            .endpoint(&v6(1), NODE, |_| {})
            .endpoint(&v6(2), "n2", |_| {});
    }));
    full_sync(&mut dp, &state);
    let pod = Client::Pod(CLIENT_POD);

    // rr: every turn of three hands out all three endpoints, in the same order.
    let ids = kl.asks(pod, "10.96.0.21:80".parse().unwrap(), 12);
    for turn in ids.chunks(3) {
        assert_eq!(turn.iter().collect::<BTreeSet<_>>().len(), 3, "{ids:?}");
    }
    assert_eq!(ids[3..], ids[..9], "{ids:?}");

    // sh: one endpoint per client address.
    for client in [pod, Client::External] {
        let ids = kl.asks(client, "10.96.0.22:80".parse().unwrap(), 8);
        assert!(ids.iter().all(|i| *i == ids[0]), "{client:?}: {ids:?}");
    }

    // lc: two held connections land on two endpoints; new ones go to the third.
    let addr: SocketAddr = "10.96.0.24:80".parse().unwrap();
    let client = kl.client_ns(pod);
    let (held, busy) = client
        .run(|| {
            let mut held = Vec::new();
            let mut busy = BTreeSet::new();
            for _ in 0..2 {
                let mut s = Session::connect(addr, Duration::from_secs(2)).unwrap();
                busy.insert(s.ask().unwrap().identity);
                held.push(s);
            }
            (held, busy)
        })
        .unwrap();
    assert_eq!(busy.len(), 2, "{busy:?}");
    let fresh = kl.asks(pod, addr, 3);
    assert!(
        fresh.iter().all(|i| !busy.contains(i)),
        "busy {busy:?}, new {fresh:?}"
    );
    drop(held);

    // IPv6: the IPv6 cluster IP spreads over both IPv6 endpoints, client address kept.
    let addr6: SocketAddr = "[fd00:10:96::40]:80".parse().unwrap();
    let replies: Vec<_> = client
        .run(|| {
            (0..12)
                .map(|_| tcp_ask(addr6, Duration::from_secs(2)).unwrap())
                .collect()
        })
        .unwrap();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for r in replies {
        assert_eq!(r.client.to_string(), v6(CLIENT_POD));
        *seen.entry(r.identity).or_default() += 1;
    }
    assert_eq!(
        seen.values().copied().collect::<Vec<_>>(),
        [6, 6],
        "rr: {seen:?}"
    );
}

/// kube-proxy's node-wide IPVS options, then two behaviours that need short UDP timeouts to be
/// observed: the timeouts are set through netlink when the dataplane opens and read back, strict
/// ARP sets `arp_ignore`/`arp_announce` in the node namespace; ClientIP affinity is
/// persistence that ends with its timeout (a client stays on one endpoint, and once the
/// persistence template has expired the next flow is scheduled afresh, by rr to the other
/// endpoint); maglev (`mh` with the source port) keeps most flows on their endpoint when a real
/// server is added, where a fresh scheduling would move most of them.
#[test]
fn options_persistence_timeout_and_maglev_stability() {
    use std::collections::BTreeMap;
    use std::net::{SocketAddr, UdpSocket};
    use std::time::Duration;
    use svcnet_flows::{CLIENT_POD, Client, NODE, UDP_PORT, pod_ip};
    use svcnet_netns::test_support::{serve_udp, udp_ask, udp_ask_with};
    use svcnet_proxy::IpFamily;
    use svcnet_proxy::fixtures::{service, slice};
    if !uml_guest() {
        return;
    }
    let kl = svcnet_flows::kernel::KernelLab::start();
    let options = svcnet_ipvs::NodeOptions {
        timeouts: svcnet_ipvs::Timeouts {
            tcp: 900,
            tcp_fin: 30,
            udp: 1,
        },
        strict_arp: true,
    };
    let mut dp =
        svcnet_ipvs::IpvsDataplane::new(Some(kl.node().name().to_string()), &[IpFamily::V4])
            .unwrap()
            .with_options(options)
            .unwrap();
    assert_eq!(
        dp.socket().timeouts().unwrap(),
        svcnet_ipvs::Timeouts {
            tcp: 900,
            tcp_fin: 30,
            udp: 1
        }
    );
    let mut state = svcnet_flows::world();
    state
        .update_service(&service("default", "sticky-udp", |b| {
            b.cluster_ip(&["10.96.0.30"])
                .port("", "UDP", 53)
                .affinity(Some(2));
        }))
        .unwrap();
    let mut mh = service("default", "mh-udp", |b| {
        b.cluster_ip(&["10.96.0.31"]).port("", "UDP", 53);
    });
    mh.metadata.annotations = Some(
        [(
            svcnet_proxy::algorithm::ANNOTATION.to_string(),
            "maglev".to_string(),
        )]
        .into_iter()
        .collect(),
    );
    state.update_service(&mh).unwrap();
    let backends = |name: &str, svc: &str, pods: &[usize]| {
        slice("default", name, svc, |b| {
            b.port("", "UDP", UDP_PORT as i32);
            for i in pods {
                b.endpoint(
                    &pod_ip(*i).to_string(),
                    if *i == 1 { NODE } else { "n2" },
                    |_| {},
                );
            }
        })
    };
    state.update_slice(&backends("sticky-udp-1", "sticky-udp", &[1, 2]));
    state.update_slice(&backends("mh-udp-1", "mh-udp", &[1, 2]));
    state.take_changes();
    full_sync(&mut dp, &state);
    let sysctl = |name: &str| {
        kl.node()
            .run(|| std::fs::read_to_string(format!("/proc/sys/net/ipv4/conf/all/{name}")))
            .unwrap()
            .unwrap()
    };
    assert_eq!(
        (sysctl("arp_ignore").trim(), sysctl("arp_announce").trim()),
        ("1", "2")
    );

    let client = kl.client_ns(Client::Pod(CLIENT_POD));
    let wait = Duration::from_secs(2);
    // Persistence: every flow (a fresh source port each) of this client goes to one endpoint.
    let sticky: SocketAddr = "10.96.0.30:53".parse().unwrap();
    let ask = |n: usize| -> Vec<String> {
        client
            .run(|| {
                (0..n)
                    .map(|_| udp_ask(sticky, wait).unwrap().identity)
                    .collect()
            })
            .unwrap()
    };
    let first = ask(6);
    assert!(first.iter().all(|i| *i == first[0]), "{first:?}");
    // The flows expire after the 1 s UDP timeout, the template 2 s after its last use: then
    // the client is scheduled afresh, and rr hands out the other endpoint.
    std::thread::sleep(Duration::from_secs(6));
    let after = ask(4);
    assert!(after.iter().all(|i| *i == after[0]), "{after:?}");
    assert_ne!(after[0], first[0], "the persistence did not end");

    // Maglev: 30 flows, each from its own fixed source port, before and after a third real
    // server is added.
    let _p3 = serve_udp(kl.client_ns(Client::Pod(3)), UDP_PORT, "p3").unwrap();
    let mh_addr: SocketAddr = "10.96.0.31:53".parse().unwrap();
    let flows = |round: &str| -> BTreeMap<u16, String> {
        client
            .run(|| {
                (41000..41030)
                    .map(|port| {
                        let sock = UdpSocket::bind(("0.0.0.0", port)).unwrap();
                        let r = udp_ask_with(&sock, mh_addr, wait)
                            .unwrap_or_else(|e| panic!("{round}: flow from port {port}: {e}"));
                        (port, r.identity)
                    })
                    .collect()
            })
            .unwrap()
    };
    let before = flows("two real servers");
    state.update_slice(&backends("mh-udp-1", "mh-udp", &[1, 2, 3]));
    let ops = sync(&mut dp, &mut state, None);
    let add = format!("-a -u 10.96.0.31:53 -r {}:{UDP_PORT} -m -w 1", pod_ip(3));
    assert!(ops.contains(&add), "{ops:?}");
    // Let the flows' IPVS entries expire (1 s) and forget their conntrack entries, so every
    // flow is scheduled again through the new table.
    std::thread::sleep(Duration::from_secs(3));
    let _ = kl
        .node()
        .exec(&["conntrack", "-D", "-p", "udp", "--orig-dst", "10.96.0.31"]);
    let after = flows("three real servers");
    let stayed = before.iter().filter(|(p, id)| after[*p] == **id).count();
    let to_new = after.values().filter(|id| *id == "p3").count();
    let between_old = before
        .iter()
        .filter(|(p, id)| after[*p] != **id && after[*p] != "p3")
        .count();
    assert!(
        stayed >= 14 && to_new >= 1 && between_old <= 3,
        "maglev moved too much: {stayed} of 30 stayed, {to_new} went to the new server, \
         {between_old} moved between the old ones\nbefore {before:?}\nafter {after:?}"
    );
}

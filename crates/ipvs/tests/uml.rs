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
/// IPVS in the node namespace: every case, with the expectations every dataplane meets.
#[test]
fn flow_table_with_real_traffic() {
    if !uml_guest() {
        return;
    }
    let kl = svcnet_flows::kernel::KernelLab::start();
    let mut dp = svcnet_ipvs::IpvsDataplane::new(
        Some(kl.node().name().to_string()),
        &[svcnet_proxy::IpFamily::V4],
    )
    .unwrap();
    let state = svcnet_flows::world();
    full_sync(&mut dp, &state);
    kl.run_table(&svcnet_flows::cases(), true);
}

//! The packet-flow table against the REAL kernel, on both iptables back ends: a node namespace
//! running svcnet's rules (applied with `ip netns exec <node> iptables-restore --noflush`),
//! backend pod namespaces with echo servers that report who answered and which client address
//! they saw, a client pod and an external client. Only namespaces this test creates are
//! touched; everything is removed on drop. Needs root (skipped otherwise). The flow table is
//! also traced by the production tracer over the kernel's own `iptables-save`.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use common::tracer;
use common::*;
use svcnet_flows::kernel::KernelLab;
use svcnet_iptables::{Backend, Family, IptablesDataplane, IptablesExecutor};
use svcnet_netns::NetNs;
use svcnet_netns::test_support::tcp_ask;
use svcnet_proxy::fixtures::*;
use svcnet_proxy::{Dataplane, FullReason, IpFamily, NamespacedName, ProxyState};

fn root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

struct World {
    kl: KernelLab,
    dp: IptablesDataplane,
}

impl std::ops::Deref for World {
    type Target = KernelLab;
    fn deref(&self) -> &KernelLab {
        &self.kl
    }
}

fn setup(backend: Backend, state: &ProxyState) -> World {
    setup_staged(backend, state, None)
}

fn setup_staged(backend: Backend, state: &ProxyState, staging: Option<usize>) -> World {
    let kl = KernelLab::start();
    let exec = IptablesExecutor::new(Some(kl.node().name().to_string()), backend);
    let mut dp = IptablesDataplane::new(exec);
    if staging.is_some() {
        dp.set_staging(staging);
    }
    full_sync(&mut dp, state, FullReason::Unknown);
    World { kl, dp }
}

/// A full sync of every family, as the syncer (svcnet-proxyd's) makes the first one.
fn full_sync(dp: &mut IptablesDataplane, state: &ProxyState, why: FullReason) {
    for f in dp.families() {
        let plan = dp.plan_full(f, &state.desired(f), why).unwrap();
        assert!(plan.is_full());
        dp.apply(f, &plan).unwrap();
        dp.commit(f, plan);
    }
}

/// The identities of the backends answering `n` connections from `client` to `addr`, in order.
fn asks(w: &World, client: Client, addr: SocketAddr, n: usize) -> Vec<String> {
    w.kl.asks(client, addr, n)
}

/// Runs one case of the shared table with real connections and checks it.
fn run_case(w: &World, c: &Case) {
    w.kl.run_case(c, true);
}

fn flow_table(backend: Backend) {
    if !root() {
        eprintln!("skipped: needs root");
        return;
    }
    let w = setup(backend, &world());
    // The production tracer over the tables as the kernel lists them (what `svcnet trace`
    // reads) gives the same answers as the real traffic below.
    let save = w
        .lab
        .node
        .exec(&[&backend.program(Family::V4, "-save")])
        .unwrap();
    let env = tracer::Env {
        local_addrs: node_addrs(),
        recent: Default::default(),
    };
    svcnet_flows::run_table(&tracer::IptablesTracer::over_save(&save, env), &cases());
    for c in cases() {
        run_case(&w, &c);
    }
    // svcnet wrote only through the chosen back end.
    let other = match backend {
        Backend::Nft => Backend::Legacy,
        Backend::Legacy => Backend::Nft,
    };
    let save = w
        .lab
        .node
        .exec(&[&other.program(Family::V4, "-save")])
        .unwrap();
    assert!(!save.contains("SVCNET-"), "{save}");
}

#[test]
fn flow_table_iptables_nft() {
    flow_table(Backend::Nft);
}

/// The same table when the payload is staged into many small nat commits (as the nft back end
/// does for large rulesets): a first sync and then a full resync over the existing rules.
#[test]
fn flow_table_iptables_nft_staged() {
    if !root() {
        return;
    }
    let state = world();
    let mut w = setup_staged(Backend::Nft, &state, Some(3));
    for c in cases() {
        run_case(&w, &c);
    }
    full_sync(&mut w.dp, &state, FullReason::Periodic);
    for c in cases() {
        run_case(&w, &c);
    }
}

#[test]
fn flow_table_iptables_legacy() {
    flow_table(Backend::Legacy);
}

/// Affinity sticks to one endpoint per client.
#[test]
fn affinity_sticks() {
    if !root() {
        return;
    }
    let w = setup(Backend::Nft, &world());
    let addr: SocketAddr = "10.96.0.11:80".parse().unwrap();
    for c in [Client::Pod(CLIENT_POD), Client::External] {
        let ids: Vec<String> = asks(&w, c, addr, 20);
        assert!(ids.iter().all(|i| *i == ids[0]), "{c:?}: {ids:?}");
    }
}

/// `svcnet.io/lb-algorithm: rr`: the nth cascade hands new connections to the endpoints in
/// turn, exactly (random would give three in a row to one endpoint about once in nine).
#[test]
fn round_robin_rotates_exactly() {
    if !root() {
        return;
    }
    let w = setup(Backend::Nft, &world());
    let addr: SocketAddr = "10.96.0.21:80".parse().unwrap();
    let ids: Vec<String> = asks(&w, Client::Pod(CLIENT_POD), addr, 30);
    for turn in ids.chunks(3) {
        let distinct: std::collections::BTreeSet<&String> = turn.iter().collect();
        assert_eq!(distinct.len(), 3, "{ids:?}");
    }
    assert_eq!(ids[3..], ids[..27], "the same order every turn: {ids:?}");
}

/// `wrr` with equal weights is round robin: the nth cascade over the cycle, exactly.
#[test]
fn weighted_round_robin_follows_its_cycle() {
    if !root() {
        return;
    }
    let w = setup(Backend::Legacy, &world());
    let addr: SocketAddr = "10.96.0.23:80".parse().unwrap();
    let ids: Vec<String> = asks(&w, Client::Pod(CLIENT_POD), addr, 12);
    assert_eq!(ids[..3], ["p1", "p2", "p3"], "{ids:?}");
    assert_eq!(ids[3..], ids[..9], "{ids:?}");
}

/// `sh` by `-m cluster`: every connection from one client reaches one endpoint, the one the
/// kernel's hash of the client address picks (computed here independently), on both back ends.
#[test]
fn source_hashing_pins_each_client_to_its_hashed_endpoint() {
    if !root() {
        return;
    }
    let state = world();
    let desired = state.desired(svcnet_proxy::IpFamily::V4);
    let d = desired
        .services
        .values()
        .find(|d| d.name.service.name == "sh")
        .unwrap();
    let seed = svcnet_lb::hash::SEED_SOURCE;
    let graph = svcnet_proxy::lower(
        d,
        &desired.node,
        &svcnet_iptables::render::IptablesCapability,
    );
    let eps = graph.pool(svcnet_proxy::Pool::Cluster).unwrap();
    let expected = |src: std::net::Ipv4Addr| -> String {
        let slot = cluster_slot(src, seed, eps.len() as u32) as usize;
        match eps[slot].ip {
            IpAddr::V4(ip) => format!("p{}", ip.octets()[2]),
            IpAddr::V6(_) => unreachable!(),
        }
    };
    for backend in [Backend::Legacy, Backend::Nft] {
        let w = setup(backend, &state);
        let addr: SocketAddr = "10.96.0.22:80".parse().unwrap();
        for client in [Client::Pod(CLIENT_POD), Client::External] {
            let ids: Vec<String> = asks(&w, client, addr, 9);
            let IpAddr::V4(src) = client.ip() else {
                unreachable!()
            };
            let want = expected(src);
            assert!(
                ids.iter().all(|i| *i == want),
                "{backend:?} {client:?}: {ids:?}, hashed to {want}"
            );
        }
    }
}

/// Partial syncs in the kernel: scale, empty, delete, add; then someone flushes the tables and
/// the canary makes the next sync full, which restores service.
#[test]
fn partial_syncs_and_canary_iptables_nft() {
    partial_syncs_and_canary(Backend::Nft);
}

#[test]
fn partial_syncs_and_canary_iptables_legacy() {
    partial_syncs_and_canary(Backend::Legacy);
}

fn partial_syncs_and_canary(backend: Backend) {
    if !root() {
        return;
    }
    let mut state = world();
    state.take_changes();
    let mut w = setup(backend, &state);
    // One IPv4 sync after the first, as the syncer makes it (its decision is tested in
    // svcnet-proxyd): full when the dataplane says so (the canary), else a partial plan of the
    // changes. Returns the full sync's reason.
    let sync = |w: &mut World, state: &mut ProxyState| -> Option<FullReason> {
        let changes = state.take_changes();
        let f = IpFamily::V4;
        let why = w.dp.needs_full(f).unwrap();
        let plan = match why {
            Some(why) => w.dp.plan_full(f, &state.desired(f), why).unwrap(),
            None => {
                w.dp.plan_partial(
                    f,
                    &state.node_state(f),
                    &state.desired_for(f, changes.services.keys()),
                )
                .unwrap()
            }
        };
        assert_eq!(plan.is_full(), why.is_some());
        w.dp.apply(f, &plan).unwrap();
        w.dp.commit(f, plan);
        why
    };
    let web = cases().into_iter().next().unwrap();
    // web loses p3.
    state.update_slice(&slice("default", "web-1", "web", |b| {
        b.port("http", "TCP", TCP_PORT as i32)
            .endpoint(&pod_ip(1).to_string(), NODE, |_| {})
            .endpoint(&pod_ip(2).to_string(), "n2", |_| {});
    }));
    assert_eq!(sync(&mut w, &mut state), None);
    run_case(
        &w,
        &Case {
            expect: Expect::Spread(&[1, 2], Masq::No),
            ..web.clone()
        },
    );
    // A new service appears.
    state
        .update_service(&service("default", "new", |b| {
            b.cluster_ip(&["10.96.0.30"]).port("", "TCP", 80);
        }))
        .unwrap();
    state.update_slice(&slice("default", "new-1", "new", |b| {
        b.port("", "TCP", TCP_PORT as i32)
            .endpoint(&pod_ip(3).to_string(), "n2", |_| {});
    }));
    assert_eq!(sync(&mut w, &mut state), None);
    let new = Case {
        name: "new service",
        to: ("10.96.0.30".parse().unwrap(), 80),
        expect: Expect::Spread(&[3], Masq::No),
        ..web.clone()
    };
    run_case(&w, &new);
    // web is deleted: its cluster IP is unallocated now, so dropped (the core's node-wide
    // verdict).
    state.delete_service(&NamespacedName::new("default", "web"));
    assert_eq!(sync(&mut w, &mut state), None);
    run_case(
        &w,
        &Case {
            expect: Expect::Drop,
            ..web.clone()
        },
    );
    // Someone flushes and deletes every chain of every table.
    for t in ["mangle", "nat", "filter"] {
        let prog = backend.program(Family::V4, "");
        w.lab.node.exec(&[&prog, "-t", t, "-F"]).unwrap();
        w.lab.node.exec(&[&prog, "-t", t, "-X"]).unwrap();
    }
    assert_eq!(
        sync(&mut w, &mut state),
        Some(FullReason::Damaged("canary chain missing"))
    );
    run_case(&w, &new);
    run_case(
        &w,
        &Case {
            expect: Expect::Drop,
            ..web
        },
    );
    // Cleanup removes every svcnet chain and hook, in both families and back ends.
    let cleaned = svcnet_iptables::cleanup_all(Some(w.lab.node.name())).unwrap();
    assert!(cleaned.contains(&(backend, Family::V4)), "{cleaned:?}");
    for family in Family::ALL {
        let save = w
            .lab
            .node
            .exec(&[&backend.program(family, "-save")])
            .unwrap();
        assert!(!save.contains("SVCNET"), "{save}");
    }
    assert!(
        svcnet_iptables::cleanup_all(Some(w.lab.node.name()))
            .unwrap()
            .is_empty()
    );
}

/// The back end is detected as kube-proxy's wrapper does: a fresh namespace uses nft; one
/// whose rules live in the legacy back end uses legacy.
#[test]
fn backend_detection() {
    if !root() {
        return;
    }
    let ns = NetNs::create(&svcnet_netns::unique_name("sbd")).unwrap();
    let exec = IptablesExecutor::detect(Some(ns.name().to_string())).unwrap();
    assert_eq!(exec.backend(), Backend::Nft);
    assert!(
        exec.why().unwrap().contains("has nf_tables"),
        "{:?}",
        exec.why()
    );
    for i in 0..3 {
        ns.exec(&[
            "iptables-legacy",
            "-A",
            "INPUT",
            "-s",
            &format!("10.9.9.{i}"),
            "-j",
            "ACCEPT",
        ])
        .unwrap();
    }
    let exec = IptablesExecutor::detect(Some(ns.name().to_string())).unwrap();
    assert_eq!(exec.backend(), Backend::Legacy);
    assert!(exec.why().unwrap().contains("legacy"), "{:?}", exec.why());
}

/// Hooks are installed once: a second ensure finds them all (no duplicates), in both families.
#[test]
fn hooks_are_idempotent() {
    if !root() {
        return;
    }
    for backend in Backend::ALL {
        let w = setup(backend, &world());
        let hooks = svcnet_iptables::render::hooks();
        for family in Family::ALL {
            assert_eq!(
                w.dp.executor().ensure_hooks(family, &hooks).unwrap(),
                0,
                "{backend:?} {family}"
            );
            let prog = backend.program(family, "");
            let pre = w
                .lab
                .node
                .exec(&[&prog, "-t", "nat", "-S", "PREROUTING"])
                .unwrap();
            assert_eq!(pre.matches("SVCNET-SERVICES").count(), 1, "{pre}");
            let fwd = w
                .lab
                .node
                .exec(&[&prog, "-t", "filter", "-S", "FORWARD"])
                .unwrap();
            let order: Vec<&str> = fwd
                .lines()
                .filter_map(|l| l.split_whitespace().last())
                .filter(|t| t.starts_with("SVCNET-"))
                .collect();
            assert_eq!(
                order,
                [
                    "SVCNET-PROXY-FIREWALL",
                    "SVCNET-FORWARD",
                    "SVCNET-SERVICES",
                    "SVCNET-EXTERNAL-SERVICES"
                ]
            );
        }
    }
}

/// IPv6 through ip6tables-restore: a dual-stack service reaches both backends over IPv6 and
/// the backend sees the client's own address.
#[test]
fn ipv6_cluster_ip() {
    if !root() {
        return;
    }
    let mut state = ProxyState::new(config());
    state
        .update_service(&service("default", "v6", |b| {
            b.cluster_ip(&["10.96.0.40", "fd00:10:96::40"])
                .port("", "TCP", 80);
        }))
        .unwrap();
    let v6 = |i: usize| format!("fd00:244:{i}::2");
    state.update_slice(&slice("default", "v6-1", "v6", |b| {
        b.ipv6()
            .port("", "TCP", TCP_PORT as i32)
            .endpoint(&v6(1), NODE, |_| {})
            .endpoint(&v6(2), "n2", |_| {});
    }));
    let w = setup(Backend::Nft, &state);
    let addr: SocketAddr = "[fd00:10:96::40]:80".parse().unwrap();
    let client: IpAddr = v6(CLIENT_POD).parse().unwrap();
    let replies: Vec<_> = w
        .lab
        .pod(CLIENT_POD - 1)
        .ns
        .run(|| {
            (0..40)
                .map(|_| tcp_ask(addr, Duration::from_secs(2)).unwrap())
                .collect()
        })
        .unwrap();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for r in replies {
        assert_eq!(r.client, client);
        *seen.entry(r.identity).or_default() += 1;
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen.values().all(|n| *n >= 6), "{seen:?}");
    // No IPv4 endpoints: the IPv4 cluster IP is refused at once.
    let res = w
        .lab
        .pod(CLIENT_POD - 1)
        .ns
        .run(|| {
            std::net::TcpStream::connect_timeout(
                &"10.96.0.40:80".parse().unwrap(),
                Duration::from_secs(2),
            )
        })
        .unwrap();
    assert_eq!(res.unwrap_err().kind(), ErrorKind::ConnectionRefused);
}

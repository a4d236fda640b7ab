//! Calico's BGP backend against the real kernel and real BIRD 2 (root, `bird2` installed):
//! three node namespaces on the topology's own underlay bridge, a BIRD in each configured by
//! svcnet's confd-equivalent, and the pod routes coming from BGP alone (`proto bird`, svcnet
//! programs none). Pods on different nodes reach each other over TCP and UDP with their source
//! addresses kept, 10 MB arrive byte-exact; a node joining or leaving the mesh through a config
//! reload (`birdc configure`) gains or loses its routes; a speaker stopped withdraws its block
//! from the others at once, restarted re-announces it; a speaker killed (no Cease) keeps its
//! block at the peers only for the graceful-restart time; `cleanup_speakers` (`svcnet down`)
//! stops leftovers by pid file and removes the routes a killed BIRD left behind.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use svcnet_agent::NodeTopology;
use svcnet_agent::ip;
use svcnet_agent::podnet::bgp::{BgpSettings, Speaker, cleanup_speakers, mesh_configs};
use svcnet_agent::routes::PodNetwork;
use svcnet_agent::test_support::{PodPair, Slot, links_with_prefix, transfer_byte};
use svcnet_agent::topology::Topology;
use svcnet_netns::NetNs;
use svcnet_netns::test_support::{serve_tcp, serve_udp};

fn bird_routes(netns: &str) -> String {
    ip::ip(Some(netns), &["route", "show", "proto", "bird"]).unwrap()
}

/// The route BIRD installs on a node for `peer`'s block.
fn route_to(peer: &NodeTopology) -> String {
    format!("{} via {} dev eth0", peer.pod_cidr, peer.internal_ip)
}

fn wait(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn has_route(node: &NodeTopology, peer: &NodeTopology) -> bool {
    bird_routes(&node.netns).contains(&route_to(peer))
}

fn bird_available() -> bool {
    std::process::Command::new("bird")
        .arg("--version")
        .output()
        .is_ok()
}

/// Sends `bytes` from `from` to `to` and checks every byte on arrival; returns the count.
fn transfer_checked(from: &NetNs, listener: TcpListener, bytes: usize) -> usize {
    let to = listener.local_addr().unwrap();
    let sink = std::thread::spawn(move || -> std::io::Result<usize> {
        let (mut conn, _) = listener.accept()?;
        conn.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut buf = vec![0u8; 1 << 16];
        let mut total = 0;
        loop {
            let n = conn.read(&mut buf)?;
            if n == 0 {
                return Ok(total);
            }
            for (i, b) in buf[..n].iter().enumerate() {
                assert_eq!(*b, transfer_byte(total + i), "byte {} differs", total + i);
            }
            total += n;
        }
    });
    from.run(move || {
        let mut conn = TcpStream::connect_timeout(&to, Duration::from_secs(2)).unwrap();
        let chunk: Vec<u8> = (0..1 << 16).map(transfer_byte).collect();
        let mut sent = 0;
        while sent < bytes {
            let n = chunk.len().min(bytes - sent);
            conn.write_all(&chunk[..n]).unwrap();
            sent += n;
        }
        conn.shutdown(std::net::Shutdown::Write).unwrap();
    })
    .unwrap();
    sink.join().unwrap().unwrap()
}

#[test]
fn pods_reach_each_other_over_routes_learnt_from_bird() {
    if !bird_available() {
        // CI installs bird2 (scripts/test.sh); without it the backend cannot run at all.
        assert!(
            std::env::var_os("CI").is_none(),
            "bird is not installed: apt-get install -y bird2"
        );
        eprintln!("skipped: bird (Debian's bird2) is not installed");
        return;
    }
    let slot = Slot::acquire().unwrap();
    let data = tempfile::tempdir().unwrap();
    let mut config = slot.config(3, data.path().to_path_buf());
    config.pod_network = PodNetwork::Bgp;
    let prefix = config.prefix.clone();
    let settings = BgpSettings {
        graceful_restart_secs: 3,
        ..BgpSettings::calico(config.pod_cidr)
    };
    // Dropped last on every path out (also a failed assertion): namespaces, links, routes.
    let topo = Topology::create(config).unwrap();
    let nodes = topo.nodes().to_vec();
    let (n1, n2, n3) = (&nodes[0], &nodes[1], &nodes[2]);
    // svcnet programs no pod routes between nodes with bgp.
    for n in &nodes {
        let routes = ip::ip(Some(&n.netns), &["route", "show"]).unwrap();
        assert!(!routes.contains("via"), "{}: {routes}", n.name);
    }

    // Nodes 1 and 2 form the mesh first (node 3 is not a Node yet).
    let two = mesh_configs(&settings, &nodes[..2]);
    let start = |n: &NodeTopology, conf: &str| {
        Speaker::start(data.path(), &n.name, &n.netns, conf).unwrap()
    };
    let s1 = start(n1, &two[&n1.name]);
    let mut s2 = Some(start(n2, &two[&n2.name]));
    wait(
        "node 1 and 2 exchanging blocks",
        Duration::from_secs(20),
        || has_route(n1, n2) && has_route(n2, n1),
    );
    assert!(!has_route(n1, n3));

    // Node 3 joins: the others' configs are rewritten and reloaded, its speaker starts.
    let three = mesh_configs(&settings, &nodes);
    s1.configure(&three[&n1.name]).unwrap();
    s2.as_ref().unwrap().configure(&three[&n2.name]).unwrap();
    let s3 = start(n3, &three[&n3.name]);
    wait("the full mesh", Duration::from_secs(20), || {
        nodes
            .iter()
            .all(|a| nodes.iter().all(|b| a == b || has_route(a, b)))
    });
    let sessions = s1.birdc(&["show", "protocols"]).unwrap();
    assert_eq!(
        sessions.matches("Established").count(),
        2,
        "node 1's sessions:\n{sessions}"
    );
    // Only the peers' blocks: not the node's own, nothing outside the pool.
    let learnt = bird_routes(&n1.netns);
    assert_eq!(learnt.lines().count(), 2, "{learnt}");
    assert!(!learnt.contains(&n1.pod_cidr.to_string()), "{learnt}");

    // Pods on nodes 1 and 2.
    let pods = PodPair::attach(&prefix, (n1, n2), data.path(), PodNetwork::Bgp.pod_mtu()).unwrap();
    let (p1, p2) = (&pods.p1, &pods.p2);
    let _tcp = serve_tcp(p2, 9000, "two").unwrap();
    let _udp = serve_udp(p2, 9001, "two").unwrap();
    let direct = pods.direct_reply("two");
    assert_eq!(
        pods.ask_tcp(9000).unwrap(),
        direct,
        "TCP across nodes, no NAT"
    );
    assert_eq!(
        pods.ask_udp(9001).unwrap(),
        direct,
        "UDP across nodes, no NAT"
    );
    let listener = pods.listen_on_pod2(9100).unwrap();
    assert_eq!(transfer_checked(p1, listener, 10_000_000), 10_000_000);

    // Node 2's speaker stops (SIGTERM: a Cease): the others withdraw its block at once, and its
    // own learnt routes go with it; node 2's pods are unreachable.
    let stopped_at = Instant::now();
    s2.take().unwrap().stop();
    wait("node 2's block withdrawn", Duration::from_secs(3), || {
        !has_route(n1, n2) && !has_route(n3, n2)
    });
    eprintln!("withdrawn after {:?}", stopped_at.elapsed());
    assert_eq!(
        bird_routes(&n2.netns),
        "",
        "a stopped speaker leaves no routes"
    );
    assert!(
        pods.ask_tcp(9000).is_err(),
        "node 2 unreachable without its route"
    );

    // Restarted, it re-announces.
    let s2 = start(n2, &three[&n2.name]);
    wait(
        "node 2's block re-announced",
        Duration::from_secs(20),
        || has_route(n1, n2) && has_route(n3, n2) && has_route(n2, n1),
    );
    assert_eq!(pods.ask_tcp(9000).unwrap().identity, "two");

    // Node 3 leaves the mesh by reload: the others drop their session and its block.
    s1.configure(&two[&n1.name]).unwrap();
    s2.configure(&two[&n2.name]).unwrap();
    wait(
        "node 3's block gone after the reload",
        Duration::from_secs(10),
        || !has_route(n1, n3) && !has_route(n2, n3),
    );
    s1.configure(&three[&n1.name]).unwrap();
    s2.configure(&three[&n2.name]).unwrap();
    wait("node 3 back in the mesh", Duration::from_secs(20), || {
        has_route(n1, n3) && has_route(n3, n1)
    });

    // Node 3's speaker is killed (no Cease): the peers keep its block, stale, for the
    // graceful-restart time (3 s), then withdraw it; node 3 keeps what the dead BIRD installed.
    let s3_pid = s3.pid();
    s3.kill();
    let killed_at = Instant::now();
    std::thread::sleep(Duration::from_millis(300));
    assert!(has_route(n1, n3), "kept through graceful restart");
    wait(
        "node 3's stale block expired",
        Duration::from_secs(15),
        || !has_route(n1, n3) && !has_route(n2, n3),
    );
    let held = killed_at.elapsed();
    assert!(held >= Duration::from_secs(2), "held only {held:?}");
    assert!(has_route(n3, n1), "a killed BIRD leaves its routes");

    // `svcnet down`'s part: stops the live speakers by pid file and removes node 3's leftovers.
    let (pid1, pid2) = (s1.pid(), s2.pid());
    let report = cleanup_speakers(data.path()).unwrap();
    let mut killed = report.killed.clone();
    killed.sort();
    let mut expected = vec![pid1, pid2];
    expected.sort();
    assert_eq!(killed, expected, "{report:?}");
    assert!(!killed.contains(&s3_pid));
    assert!(
        report
            .routes
            .iter()
            .any(|r| r.starts_with(&n3.name) && r.contains(&n1.pod_cidr.to_string())),
        "{report:?}"
    );
    for n in &nodes {
        assert_eq!(bird_routes(&n.netns), "", "{}", n.name);
    }
    assert!(!data.path().join("bird").exists());
    for pid in [pid1, pid2, s3_pid] {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.trim() != "bird"),
            "bird {pid} still running"
        );
    }
    drop((s1, s2));

    drop((_tcp, _udp, pods));
    topo.destroy().unwrap();
    let left = links_with_prefix(&prefix);
    assert!(left.is_empty(), "{left:?}");
}

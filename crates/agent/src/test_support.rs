//! Helpers for tests that build real topologies: a unique name prefix per test, and a
//! machine-wide *slot* that gives each concurrently running test its own CIDRs (host routes are
//! global, so two tests, or a test and a running `svcnet up`, must never use the same ones).

use std::fs::File;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use ipnet::Ipv4Net;

use crate::topology::TopologyConfig;

/// A prefix unique to this process and call, ≤ 11 characters: `t<pid hex>k<n>`.
pub fn unique_prefix() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "t{:x}k{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A slot held through an exclusive lock on a file (released when dropped or the process dies).
#[derive(Debug)]
pub struct Slot {
    pub index: u8,
    _lock: File,
}

impl Slot {
    /// Takes a free slot out of 32, waiting if all are taken.
    pub fn acquire() -> std::io::Result<Slot> {
        let dir = PathBuf::from("/tmp/svcnet-agent-test-slots");
        std::fs::create_dir_all(&dir)?;
        loop {
            for index in 0..32u8 {
                let file = File::options()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(dir.join(index.to_string()))?;
                if file.try_lock().is_ok() {
                    return Ok(Slot { index, _lock: file });
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// A topology config in this slot: underlay 198.18.<slot>.0/24 (RFC 2544 benchmarking
    /// space), pod CIDR 10.<160+slot>.0.0/16, service CIDR 10.<224+slot>.0.0/16, LB pool
    /// 198.19.<slot>.0/28. None of these is svcnet up's default.
    pub fn config(&self, nodes: usize, data_dir: PathBuf) -> TopologyConfig {
        let i = self.index;
        let net = |a, b, c, len| Ipv4Net::new(Ipv4Addr::new(a, b, c, 0), len).unwrap_or_default();
        TopologyConfig {
            prefix: unique_prefix(),
            nodes,
            underlay: net(198, 18, i, 24),
            pod_cidr: net(10, 160 + i, 0, 16),
            service_cidrs: vec![net(10, 224 + i, 0, 16)],
            lb_pool: Some(net(198, 19, i, 28)),
            data_dir,
            pod_network: crate::routes::PodNetwork::HostGw,
        }
    }
}

/// The CNI config of `node`'s pods at `mtu`, with IPAM in `data_dir` (what the agent hands the
/// plugin).
pub fn pod_netconf(
    node: &crate::NodeTopology,
    data_dir: &std::path::Path,
    mtu: u32,
) -> crate::cni::NetConf {
    crate::cni::NetConf {
        cni_version: "1.0.0".into(),
        name: "svcnet".into(),
        plugin_type: "svcnet-bridge".into(),
        bridge: crate::topology::POD_BRIDGE.into(),
        node_netns: Some(node.netns.clone()),
        data_dir: data_dir.to_path_buf(),
        mtu: Some(mtu),
        ipam: crate::cni::IpamConf {
            ipam_type: "svcnet-host-local".into(),
            subnet: node.pod_cidr,
            gateway: node.gateway,
            range_start: None,
            range_end: None,
        },
        prev_result: None,
    }
}

/// `node`'s Node object as `svcnet up` registers it: name, `spec.podCIDR` and `network`'s
/// flannel annotations.
pub fn node_object(
    node: &crate::NodeTopology,
    network: crate::routes::PodNetwork,
) -> k8s_openapi::api::core::v1::Node {
    let annotations: std::collections::BTreeMap<String, String> =
        network.node_annotations(node).into_iter().collect();
    k8s_openapi::api::core::v1::Node {
        metadata: kube::api::ObjectMeta {
            name: Some(node.name.clone()),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::core::v1::NodeSpec {
            pod_cidr: Some(node.pod_cidr.to_string()),
            ..Default::default()
        }),
        status: None,
    }
}

/// The byte [`tcp_transfer`] sends at `offset`.
pub fn transfer_byte(offset: usize) -> u8 {
    ((offset % (1 << 16)) % 251) as u8
}

/// Sends `bytes` over one TCP connection from namespace `from` to `listener` (bound in the
/// destination namespace) and returns the first 4 MiB the receiver got, how many bytes it got,
/// and the time from the first write to the receiver seeing the end. Fails (`InvalidData`) if
/// any received byte differs from what was sent.
pub fn tcp_transfer(
    from: &svcnet_netns::NetNs,
    listener: std::net::TcpListener,
    bytes: usize,
) -> std::io::Result<(Vec<u8>, usize, std::time::Duration)> {
    use std::io::{Read, Write};
    let to = listener.local_addr()?;
    let sink = std::thread::spawn(move || -> std::io::Result<(Vec<u8>, usize)> {
        let (mut conn, _) = listener.accept()?;
        conn.set_read_timeout(Some(std::time::Duration::from_secs(60)))?;
        // Keeps the first 4 MiB for the caller; checks every byte against the pattern (which
        // repeats every 64 KiB, so one comparison per read).
        let pattern: Vec<u8> = (0..2 << 16).map(transfer_byte).collect();
        let mut kept = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        let mut total = 0;
        loop {
            let n = conn.read(&mut buf)?;
            if n == 0 {
                return Ok((kept, total));
            }
            let at = total % (1 << 16);
            if buf[..n] != pattern[at..at + n] {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("transfer: the {n} bytes at offset {total} differ from what was sent"),
                ));
            }
            let room = (4usize << 20).saturating_sub(kept.len()).min(n);
            kept.extend_from_slice(&buf[..room]);
            total += n;
        }
    });
    let start = from
        .run(move || -> std::io::Result<std::time::Instant> {
            let mut conn =
                std::net::TcpStream::connect_timeout(&to, std::time::Duration::from_secs(2))?;
            conn.set_write_timeout(Some(std::time::Duration::from_secs(60)))?;
            let chunk: Vec<u8> = (0..1 << 16).map(transfer_byte).collect();
            let start = std::time::Instant::now();
            let mut sent = 0;
            while sent < bytes {
                let n = chunk.len().min(bytes - sent);
                conn.write_all(&chunk[..n])?;
                sent += n;
            }
            conn.shutdown(std::net::Shutdown::Write)?;
            Ok(start)
        })
        .map_err(std::io::Error::other)??;
    let (kept, total) = sink
        .join()
        .map_err(|_| std::io::Error::other("receiver panicked"))??;
    Ok((kept, total, start.elapsed()))
}

/// Programs every node's VXLAN peers from the others' Node objects, as the Node watch in
/// [`crate::podnet::run_vxlan`] does (for tests and benches without an API server).
pub fn program_vxlan_peers(nodes: &[crate::NodeTopology]) -> Result<(), crate::TopologyError> {
    let network = crate::routes::PodNetwork::Vxlan;
    let objects = node_objects(nodes, network);
    for node in nodes {
        for peer in crate::podnet::desired_peers(&node.name, &objects).values() {
            peer.add_steps(&node.netns)
                .iter()
                .try_for_each(crate::topology::Step::run)?;
        }
    }
    Ok(())
}

/// One pod on each of two nodes, `<prefix>-pod-1` and `<prefix>-pod-2`, attached by the CNI
/// plugin at `mtu` with IPAM in `data_dir`; detached (CNI DEL) and removed when dropped.
pub struct PodPair {
    pub p1: svcnet_netns::NetNs,
    pub p2: svcnet_netns::NetNs,
    pub ip1: std::net::Ipv4Addr,
    pub ip2: std::net::Ipv4Addr,
    attached: [(crate::cni::NetConf, &'static str); 2],
}

impl PodPair {
    pub fn attach(
        prefix: &str,
        nodes: (&crate::NodeTopology, &crate::NodeTopology),
        data_dir: &std::path::Path,
        mtu: u32,
    ) -> Result<Self, String> {
        use crate::cni::{self, Invocation};
        let ns = |i| {
            svcnet_netns::NetNs::create(&format!("{prefix}-pod-{i}")).map_err(|e| e.to_string())
        };
        let (p1, p2) = (ns(1)?, ns(2)?);
        let (c1, c2) = (
            pod_netconf(nodes.0, data_dir, mtu),
            pod_netconf(nodes.1, data_dir, mtu),
        );
        let add = |conf: &crate::cni::NetConf, id: &str, pod: &svcnet_netns::NetNs| {
            cni::add(conf, &Invocation::new(id, pod.name()))
                .map_err(|e| e.to_string())?
                .pod_ip()
                .ok_or_else(|| format!("no IPv4 address for {id}"))
        };
        let ip1 = add(&c1, "one", &p1)?;
        let ip2 = add(&c2, "two", &p2)?;
        Ok(Self {
            p1,
            p2,
            ip1,
            ip2,
            attached: [(c1, "one"), (c2, "two")],
        })
    }
}

/// Starts the UDP backend's loop on each of `nodes` with the peer table their Node objects give
/// (as [`crate::podnet::udp::run_udp`] does, for tests and benches without an API server).
pub fn start_udp_backends(
    nodes: &[crate::NodeTopology],
    cluster_cidr: ipnet::Ipv4Net,
) -> Result<Vec<crate::udpencap::UdpEncap>, crate::TopologyError> {
    let cfg = crate::udpencap::UdpEncapConfig::new(cluster_cidr);
    let objects = node_objects(nodes, crate::routes::PodNetwork::Udp);
    nodes
        .iter()
        .map(|node| {
            let encap = crate::udpencap::UdpEncap::start(node, &cfg)?;
            encap.set_peers(udp_table(node, &objects));
            Ok(encap)
        })
        .collect()
}

/// The Node objects of `nodes` for `network`.
pub fn node_objects(
    nodes: &[crate::NodeTopology],
    network: crate::routes::PodNetwork,
) -> Vec<k8s_openapi::api::core::v1::Node> {
    nodes.iter().map(|n| node_object(n, network)).collect()
}

/// `node`'s UDP peer table among `objects` (its own Node excluded).
pub fn udp_table(
    node: &crate::NodeTopology,
    objects: &[k8s_openapi::api::core::v1::Node],
) -> crate::udpencap::PeerTable {
    crate::podnet::udp::desired_table(&node.name, objects, crate::udpencap::UDP_PORT)
}

/// A pod namespace attached to `node`'s `cni0` by the CNI plugin, for kernel tests and benches;
/// detached (CNI DEL) and its namespace removed on drop.
#[derive(Debug)]
pub struct TestPod {
    pub ns: svcnet_netns::NetNs,
    pub conf: crate::cni::NetConf,
    pub ip: std::net::Ipv4Addr,
    id: String,
}

impl TestPod {
    /// The pod `<prefix>-pod-<id>` on `node` at `mtu`, with IPAM in `data_dir`.
    pub fn add(
        node: &crate::NodeTopology,
        data_dir: &std::path::Path,
        mtu: u32,
        prefix: &str,
        id: &str,
    ) -> Result<Self, String> {
        let ns = svcnet_netns::NetNs::create(&format!("{prefix}-pod-{id}"))
            .map_err(|e| e.to_string())?;
        let conf = pod_netconf(node, data_dir, mtu);
        let ip = crate::cni::add(&conf, &crate::cni::Invocation::new(id, ns.name()))
            .map_err(|e| e.to_string())?
            .pod_ip()
            .ok_or("CNI ADD returned no address")?;
        Ok(Self {
            ns,
            conf,
            ip,
            id: id.to_string(),
        })
    }
}

impl PodPair {
    /// Asks pod 2's TCP echo server on `port` from pod 1.
    pub fn ask_tcp(&self, port: u16) -> std::io::Result<svcnet_netns::test_support::Reply> {
        self.ask(port, svcnet_netns::test_support::tcp_ask)
    }

    /// Asks pod 2's UDP echo server on `port` from pod 1.
    pub fn ask_udp(&self, port: u16) -> std::io::Result<svcnet_netns::test_support::Reply> {
        self.ask(port, svcnet_netns::test_support::udp_ask)
    }

    fn ask(
        &self,
        port: u16,
        ask: fn(
            std::net::SocketAddr,
            std::time::Duration,
        ) -> std::io::Result<svcnet_netns::test_support::Reply>,
    ) -> std::io::Result<svcnet_netns::test_support::Reply> {
        let to = std::net::SocketAddr::new(self.ip2.into(), port);
        self.p1
            .run(move || ask(to, std::time::Duration::from_secs(5)))
            .map_err(std::io::Error::other)?
    }

    /// A TCP listener on pod 2's address (for [`tcp_transfer`] from pod 1).
    pub fn listen_on_pod2(&self, port: u16) -> std::io::Result<std::net::TcpListener> {
        let ip2 = self.ip2;
        self.p2
            .run(move || std::net::TcpListener::bind((ip2, port)))
            .map_err(std::io::Error::other)?
    }

    /// The reply of pod 2's server `identity` when it saw pod 1's own address (no NAT).
    pub fn direct_reply(&self, identity: &str) -> svcnet_netns::test_support::Reply {
        svcnet_netns::test_support::Reply {
            identity: identity.to_string(),
            client: self.ip1.into(),
        }
    }
}

/// Host links whose names start with `prefix` (what a test must leave none of).
pub fn links_with_prefix(prefix: &str) -> Vec<String> {
    crate::ip::link_names(None)
        .unwrap_or_default()
        .into_iter()
        .filter(|l| l.starts_with(prefix))
        .collect()
}

impl Drop for PodPair {
    fn drop(&mut self) {
        for ((conf, id), pod) in self.attached.iter().zip([&self.p1, &self.p2]) {
            if let Err(e) = crate::cni::del(conf, &crate::cni::Invocation::new(id, pod.name())) {
                tracing::warn!("cni del {id}: {e}");
            }
        }
    }
}

impl Drop for TestPod {
    fn drop(&mut self) {
        let inv = crate::cni::Invocation::new(&self.id, self.ns.name());
        if let Err(e) = crate::cni::del(&self.conf, &inv) {
            tracing::warn!(pod = %self.id, "test pod CNI DEL: {e}");
        }
    }
}

/// `ip -s -d link show dev DEV` in `netns`, as JSON.
pub fn link_json(netns: &str, dev: &str) -> Result<serde_json::Value, String> {
    crate::ip::ip_json(Some(netns), &["-s", "-d", "link", "show", "dev", dev])
        .map_err(|e| e.to_string())?
        .into_iter()
        .next()
        .ok_or_else(|| format!("no link {dev} in {netns}"))
}

/// The packets `dev` in `netns` sent (`dir` = `tx`) or received (`rx`).
pub fn link_packets(netns: &str, dev: &str, dir: &str) -> Result<u64, String> {
    let link = link_json(netns, dev)?;
    link["stats64"][dir]["packets"]
        .as_u64()
        .ok_or_else(|| format!("no {dir} packet count in {link}"))
}

/// One question to the test server at `to` over TCP from inside `from` (2 s timeout).
pub fn ask_tcp(
    from: &svcnet_netns::NetNs,
    to: std::net::SocketAddr,
) -> std::io::Result<svcnet_netns::test_support::Reply> {
    from.run(move || svcnet_netns::test_support::tcp_ask(to, std::time::Duration::from_secs(2)))
        .map_err(std::io::Error::other)?
}

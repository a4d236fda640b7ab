#![allow(clippy::unwrap_used)]
use svcnet_agent::cni::{self, Invocation};
use svcnet_agent::routes::PodNetwork;
use svcnet_agent::test_support::{Slot, pod_netconf, start_udp_backends};
use svcnet_agent::topology::Topology;
use svcnet_netns::NetNs;

#[test]
#[ignore]
fn scratch() {
    let slot = Slot::acquire().unwrap();
    let data = tempfile::tempdir().unwrap();
    let mut config = slot.config(2, data.path().to_path_buf());
    let net: PodNetwork = std::env::var("NET").unwrap_or("udp".into()).parse().unwrap();
    config.pod_network = net;
    let (prefix, cluster) = (config.prefix.clone(), config.pod_cidr);
    let topo = Topology::create(config).unwrap();
    let nodes = topo.nodes().to_vec();
    let _e = if net == PodNetwork::Udp { start_udp_backends(&nodes, cluster).unwrap() } else { svcnet_agent::test_support::program_vxlan_peers(&nodes).unwrap(); vec![] };
    let mtu = net.pod_mtu();
    let pods: Vec<NetNs> = (1..=2).map(|i| NetNs::create(&format!("{prefix}-pod-{i}")).unwrap()).collect();
    for (i, (p, n)) in pods.iter().zip(&nodes).enumerate() {
        let ip = cni::add(&pod_netconf(n, data.path(), mtu), &Invocation::new(&format!("p{i}"), p.name())).unwrap().pod_ip().unwrap();
        eprintln!("POD {} {} node {}", p.name(), ip, n.netns);
    }
    std::fs::write("/tmp/udp-scratch-ready", prefix).unwrap();
    let secs: u64 = std::env::var("SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(120);
    std::thread::sleep(std::time::Duration::from_secs(secs));
}

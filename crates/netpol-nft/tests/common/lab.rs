//! The 3×3 model for real: node namespaces of the agent's topology (each with its `cni0` bridge),
//! nine pods attached by the agent's CNI plugin, each serving TCP and UDP on 80 and 81, a
//! "Service" per pod (a DNAT rule of the test's own, in the node's prerouting, as a proxy
//! would), the enforcer programming the node, and probes of every ordered pair compared
//! with the evaluator. Everything is removed on drop, also when a test fails.

use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde_json::json;
use svcnet_agent::cni::{self, Invocation, NetConf};
use svcnet_agent::routes::PodNetwork;
use svcnet_agent::test_support::Slot;
use svcnet_agent::topology::{NodeTopology, Topology};
use svcnet_libnft::NftExecutor;
use svcnet_netns::NetNs;
use svcnet_netns::test_support::{Server, serve_tcp, serve_udp, tcp_ask};
use svcnet_netpol::{Cluster, Connection, Endpoint, Protocol};
use svcnet_netpol_nft::{Enforcer, Options, Renderer, conntrack, render};

use super::{NAMESPACES, PODS, PROBES, all_pods, model};

/// How long a probe waits. Denied connections are rejected (reset, ICMP), so only a
/// dataplane fault waits this long. In the QEMU tier, whose emulated CPUs run the nine
/// probing pods' threads several times slower, an allowed probe has been seen to take longer
/// than the host's 2 s.
pub fn probe_timeout() -> Duration {
    if std::env::var_os("VM_GUEST").is_some() {
        Duration::from_secs(15)
    } else {
        Duration::from_secs(2)
    }
}

/// One pod of the lab.
pub struct LabPod {
    pub id: String,
    pub netns: NetNs,
    pub ip: Ipv4Addr,
    /// Its "Service" address, DNATed to `ip` in the node.
    pub service_ip: Ipv4Addr,
}

/// The "proxy" of every node, DNATing each pod's Service IP to the pod (ports unchanged).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proxy {
    /// A DNAT rule in the node's prerouting, as svcnet's nftables and iptables proxies: the
    /// connection then goes through the forward hook (or input, to the node).
    Nft,
    /// IPVS, as its proxy mode: the Service IPs on a dummy device, a virtual server per IP,
    /// protocol and port with the pod as its one real server (masquerading forwarding, i.e.
    /// DNAT), `net.ipv4.vs.conntrack=1`. IPVS takes the connection at input and sends it on
    /// from output: no forward hook. Needs `ip_vs` (the QEMU tier).
    Ipvs,
    /// svcnet's userspace proxy in privileged mode, as `svcnet up --proxy-mode userspace`
    /// runs it: its table redirects each Service IP and port to a listener on the node, and
    /// it relays each connection from the node's `cni0` address once its judge
    /// ([`Cluster::check_relayed`] over the model of the lab's last sync) allows the client
    /// to reach the endpoint; each node's policy table leaves the two legs to it
    /// ([`Options::proxy_sources`]: the nodes' `cni0` addresses).
    Userspace,
}

/// The userspace proxy's judge in the lab.
#[derive(Debug)]
struct LabJudge {
    node: String,
    own: Vec<IpAddr>,
    model: Arc<RwLock<Cluster>>,
}

impl svcnet_userspace::Admission for LabJudge {
    fn admits(
        &self,
        client: IpAddr,
        endpoint: SocketAddr,
        protocol: svcnet_proxy::Protocol,
    ) -> bool {
        let protocol = match protocol {
            svcnet_proxy::Protocol::Tcp => Protocol::Tcp,
            svcnet_proxy::Protocol::Udp => Protocol::Udp,
            svcnet_proxy::Protocol::Sctp => Protocol::Sctp,
        };
        let own = |ip: IpAddr| ip.is_loopback() || self.own.contains(&ip);
        self.model
            .read()
            .unwrap()
            .check_relayed(&self.node, own, client, endpoint, protocol)
            .allowed()
    }
}

/// The nodes' userspace proxies and the runtime their syncs run on; stopped on drop.
struct Proxies {
    runtime: tokio::runtime::Runtime,
    proxies: Vec<svcnet_userspace::UserspaceProxy>,
    /// What the judges read: the model as of the last sync.
    model: Arc<RwLock<Cluster>>,
}

impl Drop for Proxies {
    fn drop(&mut self) {
        for p in &self.proxies {
            let _ = self.runtime.block_on(p.shutdown());
        }
    }
}

/// A userspace proxy in `node` serving one Service per pod (its Service IP, TCP and UDP 80
/// and 81, the pod as its endpoint), as the proxy core computes it for that node.
fn userspace_proxy(
    runtime: &tokio::runtime::Runtime,
    node: &NodeTopology,
    config: &svcnet_agent::topology::TopologyConfig,
    pods: &[LabPod],
    placed: &[(String, Ipv4Addr, String)],
    model: &Arc<RwLock<Cluster>>,
) -> svcnet_userspace::UserspaceProxy {
    use svcnet_proxy::fixtures::{service, slice};
    let mut state = svcnet_proxy::ProxyState::new(svcnet_proxy::CoreConfig {
        node_name: node.name.clone(),
        cluster_cidrs: vec![config.pod_cidr.into()],
        service_cidrs: config.service_cidrs.iter().map(|&c| c.into()).collect(),
        ..Default::default()
    });
    for p in pods {
        let (ns, name) = p.id.split_once('/').unwrap();
        let (_, ip, on) = placed.iter().find(|(id, _, _)| *id == p.id).unwrap();
        let ports = [
            ("t80", "TCP", 80),
            ("t81", "TCP", 81),
            ("u80", "UDP", 80),
            ("u81", "UDP", 81),
        ];
        let svc = service(ns, name, |b| {
            b.cluster_ip(&[&p.service_ip.to_string()]);
            for (port, proto, n) in ports {
                b.port(port, proto, n);
            }
        });
        let sl = slice(ns, &format!("{name}-1"), name, |b| {
            for (port, proto, n) in ports {
                b.port(port, proto, n);
            }
            b.endpoint(&ip.to_string(), on, |_| {});
        });
        state.update_service(&svc).unwrap();
        state.update_slice(&sl);
    }
    let mut cfg = svcnet_userspace::Config::new(svcnet_userspace::Mode::Privileged);
    cfg.netns = Some(node.netns.clone());
    cfg.admission = Some(Arc::new(LabJudge {
        node: node.name.clone(),
        own: vec![node.internal_ip.into(), node.gateway.into()],
        model: model.clone(),
    }));
    // The lab empties the nodes' conntrack tables after each sync, so that a probe reusing
    // an earlier probe's source port is new; the proxy's UDP flows are its own conntrack:
    // they end 200 ms after their last datagram, long before the next case's probes.
    cfg.udp_idle_timeout = Duration::from_millis(200);
    cfg.upstream_source = Some(svcnet_userspace::UpstreamSource {
        to: config.pod_cidr.into(),
        from: node.gateway.into(),
    });
    let proxy = svcnet_userspace::UserspaceProxy::new(cfg).unwrap();
    let report = runtime
        .block_on(proxy.sync(&[state.desired(svcnet_proxy::IpFamily::V4)]))
        .unwrap();
    assert!(report.bind_errors.is_empty(), "{:?}", report.bind_errors);
    proxy
}

/// Which address a probe targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    PodIp,
    ServiceIp,
}

/// The lab. Fields drop in order: the userspace proxies, servers, pods, then the topology
/// (node namespace, bridge).
pub struct Lab {
    userspace: Option<Proxies>,
    servers: Vec<Server>,
    pub pods: Vec<LabPod>,
    /// The first node and its enforcer.
    pub enforcer: Enforcer,
    pub node: NodeTopology,
    /// The other nodes.
    pub more: Vec<(NodeTopology, Enforcer)>,
    /// One incremental renderer per node (first node first).
    renderers: Vec<Renderer>,
    pub model: Cluster,
    /// After each sync: `Some(true)` cuts the existing flows the change denies (the
    /// enforcer's option), `Some(false)` none; `None` (the default) empties the node's
    /// conntrack table, so that a probe reusing the source port of an earlier, allowed probe
    /// is a new connection, as upstream's probes are (one `conntrack -F`, where cutting
    /// hundreds of probes' flows one by one takes seconds).
    pub cut_denied: Option<bool>,
    pub proxy: Proxy,
    /// The nodes' table options (the userspace proxy's sources).
    opts: Options,
    /// How pods cross nodes.
    pub network: PodNetwork,
    _topology: Topology,
    _data: tempfile::TempDir,
    _slot: Slot,
}

impl Lab {
    pub fn new() -> Lab {
        Lab::with_nodes(1)
    }

    /// The model on `n` nodes, pods placed round robin in upstream's order (with two nodes
    /// x/a, x/c, y/b, z/a, z/c on the first): same-node and cross-node pairs.
    pub fn with_nodes(n: usize) -> Lab {
        Lab::with(n, Proxy::Nft, PodNetwork::HostGw)
    }

    /// The model on `n` nodes with `proxy` as every node's proxy and pods crossing nodes over
    /// `network`, programmed by the agent's topology as `svcnet up` does (Calico's IPIP needs
    /// the `ipip` module: the QEMU tier).
    pub fn with(n: usize, proxy: Proxy, network: PodNetwork) -> Lab {
        if network == PodNetwork::Ipip {
            // Loaded before the namespaces exist, so that each gets its fallback `tunl0`.
            svcnet_agent::podnet::ipip::kernel_support().unwrap();
        }
        let slot = Slot::acquire().unwrap();
        let data = tempfile::tempdir().unwrap();
        let mut config = slot.config(n, data.path().to_path_buf());
        config.pod_network = network;
        let prefix = config.prefix.clone();
        let service_net = config.service_cidrs[0];
        let topology = Topology::create(config.clone()).unwrap();
        let nodes = topology.nodes().to_vec();
        let confs: Vec<NetConf> = nodes
            .iter()
            .map(|node| {
                serde_json::from_value(json!({
                    "cniVersion": "1.0.0",
                    "name": "svcnet",
                    "type": "svcnet-bridge",
                    "bridge": "cni0",
                    "nodeNetns": node.netns,
                    "dataDir": PathBuf::from(data.path()).join(&node.name),
                    "ipam": {"type": "svcnet-host-local", "subnet": node.pod_cidr, "gateway": node.gateway},
                }))
                .unwrap()
            })
            .collect();
        let mut pods = Vec::new();
        let mut servers = Vec::new();
        let mut placed = Vec::new();
        for (i, (ns, pod)) in all_pods().into_iter().enumerate() {
            let id = format!("{ns}/{pod}");
            let netns = NetNs::create(&format!("{prefix}-pod-{ns}{pod}")).unwrap();
            let result = cni::add(
                &confs[i % n],
                &Invocation::new(&format!("ctr-{ns}{pod}"), netns.name()),
            )
            .unwrap();
            let ip: Ipv4Addr = result.ips[0]
                .address
                .split('/')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            for port in [80, 81] {
                servers.push(serve_tcp(&netns, port, &id).unwrap());
                servers.push(serve_udp(&netns, port, &id).unwrap());
            }
            let service_ip = Ipv4Addr::from(u32::from(service_net.network()) + 10 + i as u32);
            placed.push((id.clone(), ip, nodes[i % n].name.clone()));
            pods.push(LabPod {
                id,
                netns,
                ip,
                service_ip,
            });
        }
        // The "proxy", on every node: each Service IP DNATed to its pod, ports unchanged.
        let map: Vec<String> = pods
            .iter()
            .map(|p| format!("{} : {}", p.service_ip, p.ip))
            .collect();
        let svc = format!(
            "add table ip netpol-test-svc\n\
             add chain ip netpol-test-svc pre {{ type nat hook prerouting priority -100 ; }}\n\
             add rule ip netpol-test-svc pre dnat to ip daddr map {{ {} }}\n",
            map.join(", ")
        );
        let mut enforcers = Vec::new();
        for node in &nodes {
            let node_ns = NetNs::open(&node.netns).unwrap();
            let exec = NftExecutor::new(Some(node.netns.clone()));
            match proxy {
                Proxy::Nft => drop(exec.command(&svc).unwrap()),
                Proxy::Ipvs => ipvs_proxy(&node_ns, &pods, data.path()),
                Proxy::Userspace => {}
            }
            // Pods on one bridge talk without the node's routing: only br_netfilter shows
            // their packets to the forward hook (and un-NATs a Service reply on the bridge).
            svcnet_netpol_nft::bridge_netfilter(Some(&node.netns)).unwrap();
            let sysctl = node_ns
                .exec(&["sysctl", "-n", "net.bridge.bridge-nf-call-iptables"])
                .unwrap();
            assert_eq!(
                sysctl.trim(),
                "1",
                "br_netfilter is off in the node namespace"
            );
            // A rejected probe learns of it from an ICMP error; the node's default ICMP
            // rate limits (per client, and 1000/s with a burst of 50 per namespace) would
            // turn many into timeouts.
            node_ns
                .exec(&[
                    "sysctl",
                    "-qw",
                    "net.ipv4.icmp_ratelimit=0",
                    "net.ipv4.icmp_msgs_per_sec=1000000",
                    "net.ipv4.icmp_msgs_burst=1000000",
                ])
                .unwrap();
            enforcers.push(Enforcer::new(exec));
        }
        let model = model(|ns, pod| {
            let id = format!("{ns}/{pod}");
            let (_, ip, node) = placed.iter().find(|(i, _, _)| *i == id).unwrap();
            (IpAddr::V4(*ip), node.clone())
        });
        let mut enforcers = enforcers.into_iter();
        let enforcer = enforcers.next().unwrap();
        let more = nodes[1..].iter().cloned().zip(enforcers).collect();
        let opts = Options {
            proxy_sources: match proxy {
                Proxy::Userspace => nodes.iter().map(|n| n.gateway.into()).collect(),
                Proxy::Nft | Proxy::Ipvs => Vec::new(),
            },
            ..Options::default()
        };
        let renderers = nodes
            .iter()
            .map(|n| Renderer::new(&n.name, opts.clone()))
            .collect();
        let userspace = (proxy == Proxy::Userspace).then(|| {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            let model = Arc::new(RwLock::new(model.clone()));
            let proxies = nodes
                .iter()
                .map(|n| userspace_proxy(&runtime, n, &config, &pods, &placed, &model))
                .collect();
            Proxies {
                runtime,
                proxies,
                model,
            }
        });
        Lab {
            userspace,
            opts,
            servers,
            pods,
            renderers,
            enforcer,
            node: nodes[0].clone(),
            more,
            model,
            cut_denied: None,
            proxy,
            network,
            _topology: topology,
            _data: data,
            _slot: slot,
        }
    }

    /// Renders the model for every node and applies it (incrementally after the first time);
    /// the report is the first node's.
    pub fn sync(&mut self) -> svcnet_netpol_nft::SyncReport {
        let model = &self.model;
        let opts = &self.opts;
        let cut = self.cut_denied;
        let mut renderers = self.renderers.iter_mut();
        let mut sync = |node: &NodeTopology, enforcer: &mut Enforcer| {
            // The node loop's incremental renderer, checked against a full render.
            let renderer = renderers.next().unwrap();
            renderer.update(model);
            let changes = renderer.take_changes();
            assert_eq!(renderer.ruleset(), &render(model, &node.name, opts));
            let report = enforcer.sync_changes(renderer.ruleset(), &changes).unwrap();
            let netns = Some(node.netns.as_str());
            match cut {
                Some(true) => {
                    let flows = conntrack::list(netns).unwrap();
                    let denied = conntrack::denied(model, &node.name, &[], &[], &flows);
                    conntrack::delete(netns, &denied).unwrap();
                }
                Some(false) => {}
                None => {
                    NetNs::open(&node.netns)
                        .unwrap()
                        .exec(&["conntrack", "-F"])
                        .unwrap();
                }
            }
            report
        };
        let first = sync(&self.node, &mut self.enforcer);
        for (node, enforcer) in &mut self.more {
            sync(node, enforcer);
        }
        if let Some(u) = &self.userspace {
            *u.model.write().unwrap() = self.model.clone();
        }
        first
    }

    pub fn pod(&self, id: &str) -> &LabPod {
        self.pods.iter().find(|p| p.id == id).unwrap()
    }

    /// Probes every ordered pair on every (protocol, port) of [`PROBES`].
    pub fn probe_all(&self, via: Via) -> Matrix {
        // The userspace proxy cannot reject a UDP flow it denies (no ICMP from a socket): the
        // client hears nothing. Allowed flows through it answer within milliseconds; 1 s
        // leaves room for a loaded machine.
        let udp_wait = match self.proxy {
            Proxy::Userspace => Duration::from_secs(1),
            Proxy::Nft | Proxy::Ipvs => probe_timeout(),
        };
        let mut cells = Vec::new();
        std::thread::scope(|s| {
            let handles: Vec<_> = self
                .pods
                .iter()
                .map(|src| {
                    let targets: Vec<(String, SocketAddr, Protocol, u16)> = self
                        .pods
                        .iter()
                        // A pod reaching itself through its Service needs hairpin
                        // masquerading, which this test's DNAT does not do; upstream leaves
                        // loopback out of the comparison anyway.
                        .filter(|dst| via == Via::PodIp || dst.id != src.id)
                        .flat_map(|dst| {
                            PROBES.iter().map(move |(proto, port)| {
                                let ip = match via {
                                    Via::PodIp => dst.ip,
                                    Via::ServiceIp => dst.service_ip,
                                };
                                (
                                    dst.id.clone(),
                                    SocketAddr::new(IpAddr::V4(ip), *port),
                                    *proto,
                                    *port,
                                )
                            })
                        })
                        .collect();
                    s.spawn(move || {
                        src.netns
                            .run(move || {
                                targets
                                    .into_iter()
                                    .map(|(dst, addr, proto, port)| {
                                        let ok = probe(addr, proto, &dst, udp_wait);
                                        ((src.id.clone(), dst, proto, port), ok)
                                    })
                                    .collect::<Vec<_>>()
                            })
                            .unwrap()
                    })
                })
                .collect();
            for h in handles {
                cells.extend(h.join().unwrap());
            }
        });
        Matrix {
            cells: cells.into_iter().collect(),
        }
    }

    /// The evaluator's answer for every cell.
    pub fn expected(&self) -> Matrix {
        let mut cells = std::collections::BTreeMap::new();
        for src in &self.pods {
            for dst in &self.pods {
                for (proto, port) in PROBES {
                    let (sns, sname) = src.id.split_once('/').unwrap();
                    let (dns, dname) = dst.id.split_once('/').unwrap();
                    let conn = Connection {
                        src: Endpoint::pod(sns, sname),
                        dst: Endpoint::pod(dns, dname),
                        protocol: proto,
                        port,
                    };
                    cells.insert(
                        (src.id.clone(), dst.id.clone(), proto, port),
                        self.model.allowed(&conn),
                    );
                }
            }
        }
        Matrix { cells }
    }

    /// Probes the whole matrix and asserts it equals the evaluator's, printing upstream's
    /// truth tables (expected, observed, and `.`/`X` for agree/disagree) when not.
    pub fn check(&self, case: &str, via: Via) {
        let expected = self.expected();
        let observed = self.probe_all(via);
        let report = expected.compare(&observed);
        assert!(
            report.is_none(),
            "case {case:?} via {via:?}: the kernel disagrees with the evaluator\n{}\npolicies: {:#?}\nruleset:\n{}",
            report.unwrap_or_default(),
            self.model.policies,
            self.enforcer
                .applied()
                .map(ToString::to_string)
                .unwrap_or_default()
        );
    }
}

/// IPVS in `node`: every pod's Service IP on a dummy device (so it is local and IPVS takes
/// it at input), one virtual server per IP, protocol and port 80/81 with the pod as its real
/// server, NAT forwarding; conntrack kept for IPVS's connections, as kube-proxy sets it.
fn ipvs_proxy(node: &NetNs, pods: &[LabPod], dir: &std::path::Path) {
    node.exec(&["modprobe", "ip_vs"]).unwrap();
    node.exec(&["sysctl", "-qw", "net.ipv4.vs.conntrack=1"])
        .unwrap();
    node.exec(&["ip", "link", "add", "netpol-ipvs0", "type", "dummy"])
        .unwrap();
    let (mut rules, mut addrs) = (String::new(), String::new());
    for p in pods {
        addrs.push_str(&format!("addr add {}/32 dev netpol-ipvs0\n", p.service_ip));
        for (flag, port) in [("-t", 80), ("-t", 81), ("-u", 80), ("-u", 81)] {
            rules.push_str(&format!(
                "-A {flag} {vip}:{port} -s rr\n-a {flag} {vip}:{port} -r {ip}:{port} -m\n",
                vip = p.service_ip,
                ip = p.ip
            ));
        }
    }
    let file = dir.join(format!("ipvs-{}", node.name()));
    std::fs::write(&file, rules).unwrap();
    node.exec(&["sh", "-c", &format!("ipvsadm -R < {}", file.display())])
        .unwrap();
    let file = dir.join(format!("addrs-{}", node.name()));
    std::fs::write(&file, addrs).unwrap();
    node.exec(&["ip", "-batch", &file.to_string_lossy()])
        .unwrap();
}

/// One probe: connected (and answered by the expected pod) or not.
fn probe(addr: SocketAddr, proto: Protocol, expect: &str, udp_wait: Duration) -> bool {
    let identity = match proto {
        Protocol::Tcp => tcp_ask(addr, probe_timeout()).map(|r| r.identity),
        Protocol::Udp | Protocol::Sctp => udp_probe(addr, udp_wait),
    };
    match identity {
        Ok(id) => {
            assert_eq!(id, expect, "{addr} {proto:?} answered by the wrong pod");
            true
        }
        Err(e) if e.kind() == ErrorKind::InvalidData => panic!("{addr}: {e}"),
        Err(_) => false,
    }
}

/// A UDP request from a connected socket, so that an ICMP reject ends it at once.
fn udp_probe(addr: SocketAddr, wait: Duration) -> std::io::Result<String> {
    let sock = UdpSocket::bind("0.0.0.0:0")?;
    sock.connect(addr)?;
    sock.set_read_timeout(Some(wait))?;
    sock.send(b"?")?;
    let mut buf = [0u8; 512];
    let n = sock.recv(&mut buf)?;
    let text = String::from_utf8_lossy(&buf[..n]);
    Ok(text
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string())
}

/// Connectivity per (source, destination, protocol, port).
#[derive(Clone, PartialEq, Eq)]
pub struct Matrix {
    pub cells: std::collections::BTreeMap<(String, String, Protocol, u16), bool>,
}

impl Matrix {
    /// `None` when equal (loopback left out, as upstream); else the truth tables of every
    /// (protocol, port) that differs.
    pub fn compare(&self, observed: &Matrix) -> Option<String> {
        let mut out = String::new();
        for (proto, port) in PROBES {
            let differs = self.cells.iter().any(|((s, d, p, n), v)| {
                *p == proto
                    && *n == port
                    && s != d
                    && observed.cells.get(&(s.clone(), d.clone(), *p, *n)) != Some(v)
            });
            if differs {
                out.push_str(&format!("{proto:?}/{port}: expected\n"));
                out.push_str(&self.table(proto, port, |v, _| v));
                out.push_str("observed\n");
                out.push_str(&observed.table(proto, port, |v, _| v));
                out.push_str("comparison (X: disagree)\n");
                out.push_str(&self.table(proto, port, |v, key| {
                    key.0 == key.1 || observed.cells.get(key) == Some(&v)
                }));
            }
        }
        (!out.is_empty()).then_some(out)
    }

    fn table(
        &self,
        proto: Protocol,
        port: u16,
        cell: impl Fn(bool, &(String, String, Protocol, u16)) -> bool,
    ) -> String {
        let names: Vec<String> = NAMESPACES
            .iter()
            .flat_map(|ns| PODS.iter().map(move |p| format!("{ns}/{p}")))
            .collect();
        let mut out = format!("-  {}\n", names.join(" "));
        for from in &names {
            out.push_str(from);
            for to in &names {
                let key = (from.clone(), to.clone(), proto, port);
                let v = self.cells.get(&key).copied().unwrap_or(false);
                out.push_str(if cell(v, &key) { "  . " } else { "  X " });
            }
            out.push('\n');
        }
        out
    }
}

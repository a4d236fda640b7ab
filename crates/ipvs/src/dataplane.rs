//! The IPVS dataplane behind the dataplane contract ([`svcnet_proxy::Dataplane`]): per family
//! a [`Renderer`] and the model of what was applied; one IPVS socket in the node's namespace
//! (programmed over generic netlink, no `ipvsadm`), the dummy interface's addresses through
//! one `ip -batch`, the ipsets through one `ipset restore`, the companion rules through
//! `svcnet_iptables`' executor. Full syncs read the kernel (IPVS dumps, the node's addresses)
//! and repair drift; partial syncs diff against the applied model, so only changed services
//! are touched. Real servers drain at weight 0 (see [`crate::plan`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use svcnet_iptables::{Family, IptablesExecutor};
use svcnet_lb::Fallback;
use svcnet_netns::NetNs;
use svcnet_proxy::{
    Capability, Changes, Dataplane, DesiredFamily, DesiredNode, FullReason, IpFamily,
    ServicePortName,
};

use crate::plan::{Plan, diff_servers, ipset_text};
use crate::render::{
    DUMMY, FWMARK_BASE, FWMARK_MASK, IpvsCapability, Rendered, Renderer, VirtualServer,
};
use crate::rules;
use crate::types::{DestKey, Op, ServiceKey};
use crate::{Ipvs, IpvsError, IpvsSocket};

/// How long a removed TCP real server may drain at weight 0 before it is deleted anyway.
pub const DRAIN_BOUND: Duration = Duration::from_secs(300);

/// A failed sync step.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error(transparent)]
    Ipvs(#[from] IpvsError),
    #[error(transparent)]
    Iptables(#[from] svcnet_iptables::ApplyError),
    #[error("{program} failed: {stderr}")]
    Tool { program: String, stderr: String },
    #[error("{program} not found; install it (Debian/Ubuntu: `apt-get install {package}`)")]
    NotInstalled {
        program: String,
        package: &'static str,
    },
    #[error("network namespace: {0}")]
    Netns(String),
}

impl SyncError {
    pub fn is_retryable(&self) -> bool {
        !matches!(
            self,
            Self::NotInstalled { .. } | Self::Ipvs(IpvsError::NotAvailable)
        )
    }
}

/// The IPVS dataplane of one node (or one named network namespace).
pub struct IpvsDataplane {
    netns: Option<String>,
    sock: IpvsSocket,
    iptables: IptablesExecutor,
    renderers: BTreeMap<IpFamily, Renderer>,
    applied: BTreeMap<IpFamily, Rendered>,
    /// Real servers at weight 0, with when they started draining.
    draining: BTreeMap<(ServiceKey, DestKey), Instant>,
    /// Deleted by the last apply's drain check, for commit.
    drained: Vec<(ServiceKey, DestKey)>,
    drain_bound: Duration,
    /// The node settings each family was last fully synced with.
    nodes: BTreeMap<IpFamily, DesiredNode>,
    /// Whether loading br_netfilter was tried already.
    br_netfilter_tried: bool,
    options: NodeOptions,
}

/// kube-proxy's node-wide IPVS settings (`--ipvs-tcp-timeout`, `--ipvs-tcpfin-timeout`,
/// `--ipvs-udp-timeout`, `--ipvs-strict-arp`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeOptions {
    /// Connection timeouts, set once when the dataplane opens (as kube-proxy); zeros leave the
    /// kernel's (15 min, 2 min, 5 min).
    pub timeouts: crate::Timeouts,
    /// `arp_ignore=1`, `arp_announce=2` for every interface of the node, so the node does not
    /// answer ARP for the service addresses on its dummy interface (MetalLB's L2 mode needs it).
    pub strict_arp: bool,
}

impl std::fmt::Debug for IpvsDataplane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpvsDataplane")
            .field("netns", &self.netns)
            .finish()
    }
}

pub(crate) fn run_tool(
    netns: Option<&str>,
    program: &str,
    args: &[&str],
    stdin: Option<&str>,
    package: &'static str,
) -> Result<String, SyncError> {
    let mut cmd = svcnet_netns::command(netns, program);
    cmd.args(args);
    let out = svcnet_netns::output_with_input(&mut cmd, stdin).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => SyncError::NotInstalled {
            program: program.to_string(),
            package,
        },
        _ => SyncError::Tool {
            program: program.to_string(),
            stderr: e.to_string(),
        },
    })?;
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if !out.status.success() {
        if stderr.contains(&format!("exec of \"{program}\" failed")) {
            return Err(SyncError::NotInstalled {
                program: program.to_string(),
                package,
            });
        }
        return Err(SyncError::Tool {
            program: program.to_string(),
            stderr,
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Addresses per interface from `ip -o addr show`.
pub fn parse_addresses(text: &str) -> Vec<(String, IpAddr)> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let _index = w.next()?;
            let dev = w
                .next()?
                .trim_end_matches(':')
                .split('@')
                .next()?
                .to_string();
            let _kind = w.next()?;
            let addr = w.next()?.split('/').next()?.parse().ok()?;
            Some((dev, addr))
        })
        .collect()
}

/// An IPVS socket in the current or the named network namespace (a generic-netlink socket
/// stays in the namespace it was made in).
pub(crate) fn open_socket(netns: Option<&str>) -> Result<IpvsSocket, SyncError> {
    match netns {
        Some(name) => Ok(NetNs::open(name)
            .map_err(|e| SyncError::Netns(e.to_string()))?
            .run(IpvsSocket::open)
            .map_err(|e| SyncError::Netns(e.to_string()))??),
        None => Ok(IpvsSocket::open()?),
    }
}

impl IpvsDataplane {
    /// Opens the dataplane in the current or the named network namespace: resolves IPVS (which
    /// loads `ip_vs`; [`IpvsError::NotAvailable`] names the module when the kernel has none),
    /// picks the iptables back end and checks for `ipset`.
    pub fn new(netns: Option<String>, families: &[IpFamily]) -> Result<Self, SyncError> {
        let sock = open_socket(netns.as_deref())?;
        run_tool(netns.as_deref(), "ipset", &["version"], None, "ipset")?;
        let iptables = IptablesExecutor::detect(netns.clone())?;
        tracing::info!(
            backend = iptables.backend().as_str(),
            why = iptables.why().unwrap_or_default(),
            "ipvs companion rules: iptables back end"
        );
        Ok(Self {
            netns,
            sock,
            iptables,
            renderers: families.iter().map(|f| (*f, Renderer::new(*f))).collect(),
            applied: BTreeMap::new(),
            draining: BTreeMap::new(),
            drained: Vec::new(),
            drain_bound: DRAIN_BOUND,
            nodes: BTreeMap::new(),
            br_netfilter_tried: false,
            options: NodeOptions::default(),
        })
    }

    /// Applies kube-proxy's node-wide IPVS settings: the timeouts now (a value the kernel
    /// refuses fails here, at start), strict ARP with every node preparation (each full sync).
    pub fn with_options(mut self, options: NodeOptions) -> Result<Self, SyncError> {
        if options.timeouts != crate::Timeouts::default() {
            self.sock.set_timeouts(options.timeouts)?;
        }
        self.options = options;
        Ok(self)
    }

    /// Overrides how long a removed TCP real server may drain ([`DRAIN_BOUND`]).
    pub fn set_drain_bound(&mut self, bound: Duration) {
        self.drain_bound = bound;
    }

    pub fn executor(&self) -> &IptablesExecutor {
        &self.iptables
    }

    /// The IPVS socket (tests read the table through it).
    pub fn socket(&mut self) -> &mut IpvsSocket {
        &mut self.sock
    }

    /// The state last applied for `family` (`None` before the first sync).
    pub fn applied(&self, family: IpFamily) -> Option<&Rendered> {
        self.applied.get(&family)
    }

    /// Real servers currently draining.
    pub fn draining(&self) -> Vec<(ServiceKey, DestKey)> {
        self.draining.keys().copied().collect()
    }

    fn tool(
        &self,
        program: &str,
        args: &[&str],
        stdin: Option<&str>,
        package: &'static str,
    ) -> Result<String, SyncError> {
        run_tool(self.netns.as_deref(), program, args, stdin, package)
    }

    /// The node's addresses: (on the dummy, elsewhere except loopback and link-local).
    fn addresses(&self, family: IpFamily) -> Result<(BTreeSet<IpAddr>, Vec<IpAddr>), SyncError> {
        let flag = match family {
            IpFamily::V4 => "-4",
            IpFamily::V6 => "-6",
        };
        let text = self.tool("ip", &[flag, "-o", "addr", "show"], None, "iproute2")?;
        let mut dummy = BTreeSet::new();
        let mut node = Vec::new();
        for (dev, addr) in parse_addresses(&text) {
            if dev == DUMMY {
                dummy.insert(addr);
            } else if !addr.is_loopback()
                && !matches!(addr, IpAddr::V6(a) if a.segments()[0] & 0xffc0 == 0xfe80)
            {
                node.push(addr);
            }
        }
        Ok((dummy, node))
    }

    /// The upstream sysctls in the node's namespace and the dummy interface. A pod reaching a
    /// pod on its own node's bridge through a service needs the bridge to pass its frames
    /// through iptables (br_netfilter), or the reply is bridged straight back and IPVS never
    /// undoes its NAT: the module is loaded when missing (best effort, with a warning).
    fn prepare_node(&mut self) -> Result<(), SyncError> {
        // Once per dataplane: a host that cannot load it warns once, not every resync.
        let first = !std::mem::replace(&mut self.br_netfilter_tried, true);
        if first
            && !std::path::Path::new("/proc/sys/net/bridge").exists()
            && let Err(e) = run_tool(None, "modprobe", &["br_netfilter"], None, "kmod")
        {
            tracing::warn!(
                "br_netfilter is not loaded and could not be ({e}): a pod reaching a pod on its \
                 own node's bridge through a service will not get replies"
            );
        }
        let strict_arp: &[(&str, &str)] = if self.options.strict_arp {
            &[
                ("/proc/sys/net/ipv4/conf/all/arp_ignore", "1"),
                ("/proc/sys/net/ipv4/conf/all/arp_announce", "2"),
            ]
        } else {
            &[]
        };
        let settings = [
            ("/proc/sys/net/ipv4/vs/conntrack", "1"),
            ("/proc/sys/net/ipv4/vs/expire_nodest_conn", "1"),
            ("/proc/sys/net/ipv4/vs/expire_quiescent_template", "1"),
            ("/proc/sys/net/ipv4/ip_forward", "1"),
            // Only where br_netfilter is loaded: pod → VIP → pod on one bridge needs it.
            ("/proc/sys/net/bridge/bridge-nf-call-iptables", "1"),
            ("/proc/sys/net/bridge/bridge-nf-call-ip6tables", "1"),
        ];
        let write = || -> Result<(), String> {
            for &(path, value) in settings.iter().chain(strict_arp) {
                let p = std::path::Path::new(path);
                if path.contains("/bridge/") && !p.exists() {
                    continue;
                }
                std::fs::write(p, value).map_err(|e| format!("{path}: {e}"))?;
            }
            Ok(())
        };
        match &self.netns {
            Some(name) => NetNs::open(name)
                .and_then(|ns| ns.run(write))
                .map_err(|e| SyncError::Netns(e.to_string()))?
                .map_err(SyncError::Netns)?,
            None => write().map_err(SyncError::Netns)?,
        }
        let exists = self.tool(
            "ip",
            &["-o", "link", "show", "dev", DUMMY],
            None,
            "iproute2",
        );
        if exists.is_err() {
            self.tool(
                "ip",
                &["link", "add", DUMMY, "type", "dummy"],
                None,
                "iproute2",
            )?;
        }
        Ok(())
    }

    /// The kernel's virtual servers of `family` that are svcnet's: firewall marks in its range
    /// and addresses on the dummy or the node.
    fn observe(
        &mut self,
        family: IpFamily,
        ours: &BTreeSet<IpAddr>,
    ) -> Result<BTreeMap<ServiceKey, VirtualServer>, SyncError> {
        let mut out = BTreeMap::new();
        for s in self.sock.services()? {
            if s.key.addr.is_ipv6() != (family == IpFamily::V6) {
                continue;
            }
            let mine = if s.key.fwmark != 0 {
                s.key.fwmark & FWMARK_MASK == FWMARK_BASE
            } else {
                ours.contains(&s.key.addr)
            };
            if !mine {
                continue;
            }
            let dests = self
                .sock
                .dests(&s.key)?
                .into_iter()
                .map(|d| (d.key(), d))
                .collect();
            out.insert(
                s.key,
                VirtualServer {
                    protocol: s.key.protocol,
                    service: s,
                    dests,
                },
            );
        }
        Ok(out)
    }

    fn renderer(&mut self, family: IpFamily) -> &mut Renderer {
        self.renderers
            .entry(family)
            .or_insert_with(|| Renderer::new(family))
    }

    /// Deletes the conntrack entries of UDP real servers the plan deleted (their flows would
    /// otherwise keep the old reply tuple: IPVS drops the next datagram of such a flow instead
    /// of rescheduling it). Best effort: `conntrack` missing or finding nothing is fine.
    fn clear_udp_conntrack(&self, plan: &Plan) {
        for op in &plan.ops {
            let Op::DelDest(k, d) = op else { continue };
            let udp = plan
                .rendered
                .servers
                .get(k)
                .is_some_and(|vs| vs.protocol == crate::Protocol::Udp);
            if !udp {
                continue;
            }
            let mut args = vec!["-D", "-p", "udp"];
            if d.addr.is_ipv6() {
                args.extend(["-f", "ipv6"]);
            }
            let (ip, port) = (d.addr.to_string(), d.port.to_string());
            args.extend(["--reply-src", &ip, "--reply-port-src", &port]);
            let _ = self.tool("conntrack", &args, None, "conntrack");
        }
    }

    /// Deletes draining real servers whose connections are gone or whose bound passed.
    fn check_drains(&mut self, family: IpFamily) -> Result<(), SyncError> {
        let v6 = family == IpFamily::V6;
        let mut by_vs: BTreeMap<ServiceKey, Vec<(DestKey, Instant)>> = BTreeMap::new();
        for ((k, d), since) in &self.draining {
            if k.addr.is_ipv6() == v6 {
                by_vs.entry(*k).or_default().push((*d, *since));
            }
        }
        let mut ops = Vec::new();
        for (k, dests) in by_vs {
            let now = self.sock.dests(&k)?;
            for (d, since) in dests {
                let done = match now.iter().find(|x| x.key() == d) {
                    // Gone already (its virtual server was deleted, or by hand).
                    None => {
                        self.drained.push((k, d));
                        continue;
                    }
                    Some(x) if x.weight != 0 => continue,
                    Some(x) => {
                        x.active_conns + x.inactive_conns == 0
                            || since.elapsed() >= self.drain_bound
                    }
                };
                if done {
                    ops.push(Op::DelDest(k, d));
                    self.drained.push((k, d));
                }
            }
        }
        if !ops.is_empty() {
            tracing::debug!(n = ops.len(), "drained real servers deleted");
            // A real server or virtual server gone meanwhile is fine.
            match self.sock.apply(&ops) {
                Err(IpvsError::Rejected(r)) if [libc::ENOENT, libc::ESRCH].contains(&r.errno) => {}
                other => other?,
            }
        }
        Ok(())
    }
}

/// The plan taking `observed` (the kernel, or the applied model) to `rendered`.
#[allow(clippy::too_many_arguments)]
fn make_plan(
    family: IpFamily,
    full: bool,
    observed: &BTreeMap<ServiceKey, VirtualServer>,
    old: Option<&Rendered>,
    rendered: Rendered,
    fallbacks: Vec<(ServicePortName, Fallback)>,
    dummy_now: &BTreeSet<IpAddr>,
    renderer: Option<Renderer>,
) -> Plan {
    let (ops, servers, drains) = diff_servers(observed, &rendered.servers);
    let node_ips: BTreeSet<IpAddr> = rendered.node_ips.iter().copied().collect();
    let want: BTreeSet<IpAddr> = rendered.addresses.difference(&node_ips).copied().collect();
    let addr_add = want.difference(dummy_now).copied().collect();
    let addr_del = dummy_now.difference(&want).copied().collect();
    let ipset = ipset_text(family, old, &rendered);
    let iptables = if full {
        Some(rules::payload(&rendered, family))
    } else if old.is_some_and(|o| o.marks != rendered.marks || o.port_dnats != rendered.port_dnats)
    {
        Some(rules::marks_payload(&rendered, family))
    } else {
        None
    };
    let mut after = rendered;
    after.servers = servers;
    Plan {
        family,
        full,
        ops,
        addr_add,
        addr_del,
        ipset,
        iptables,
        rendered: after,
        drains,
        fallbacks,
        renderer,
    }
}

impl Dataplane for IpvsDataplane {
    type Plan = Plan;
    type Error = SyncError;

    fn name(&self) -> &'static str {
        svcnet_lb::Dataplane::Ipvs.as_str()
    }

    fn families(&self) -> Vec<IpFamily> {
        self.renderers.keys().copied().collect()
    }

    fn capability(&self) -> &dyn Capability {
        &IpvsCapability
    }

    fn plan_full(
        &mut self,
        family: IpFamily,
        desired: &DesiredFamily,
        _why: FullReason,
    ) -> Result<Plan, SyncError> {
        let (dummy, node_ips) = self.addresses(family)?;
        let renderer = self.renderer(family);
        renderer.set_node_ips(node_ips.clone());
        let rendered = renderer.render_all(desired);
        let fallbacks = renderer.fallbacks(None);
        let mut ours: BTreeSet<IpAddr> = dummy.clone();
        ours.extend(node_ips.iter().copied());
        ours.extend(rendered.addresses.iter().copied());
        let observed = self.observe(family, &ours)?;
        self.nodes.insert(family, desired.node.clone());
        Ok(make_plan(
            family, true, &observed, None, rendered, fallbacks, &dummy, None,
        ))
    }

    fn plan_partial(
        &self,
        family: IpFamily,
        node: &DesiredNode,
        changes: &Changes,
    ) -> Option<Plan> {
        if self.nodes.get(&family) != Some(node) {
            return None;
        }
        let applied = self.applied.get(&family)?;
        let mut renderer = self.renderers.get(&family)?.clone();
        let rendered = renderer.render_changes(node, changes);
        let fallbacks = renderer.fallbacks(Some(changes));
        let node_ips: BTreeSet<IpAddr> = applied.node_ips.iter().copied().collect();
        let dummy = applied.addresses.difference(&node_ips).copied().collect();
        // plan_partial is pure: the renderer's new memory travels in the plan to commit.
        Some(make_plan(
            family,
            false,
            &applied.servers,
            Some(applied),
            rendered,
            fallbacks,
            &dummy,
            Some(renderer),
        ))
    }

    fn is_full(plan: &Plan) -> bool {
        plan.full
    }

    fn apply(&mut self, family: IpFamily, plan: &Plan) -> Result<(), SyncError> {
        if plan.full {
            self.prepare_node()?;
        }
        if !plan.ipset.is_empty() {
            self.tool("ipset", &["restore"], Some(&plan.ipset), "ipset")?;
        }
        let mut batch = String::new();
        let (host, extra) = match family {
            IpFamily::V4 => ("/32", ""),
            IpFamily::V6 => ("/128", " nodad"),
        };
        for a in &plan.addr_add {
            batch.push_str(&format!("address add {a}{host} dev {DUMMY}{extra}\n"));
        }
        for a in &plan.addr_del {
            batch.push_str(&format!("address del {a}{host} dev {DUMMY}\n"));
        }
        // Addresses come before the virtual servers use them, the rules before the
        // virtual servers take traffic.
        if !batch.is_empty() {
            self.tool("ip", &["-force", "-batch", "-"], Some(&batch), "iproute2")?;
        }
        if let Some(p) = &plan.iptables {
            if plan.full {
                let missing = self
                    .iptables
                    .missing_hooks(Family::from(family), &rules::hooks())?;
                let mut p = p.clone();
                svcnet_iptables::apply::with_hooks(&mut p, &missing);
                self.iptables.restore(&p)?;
            } else {
                self.iptables.restore(p)?;
            }
        }
        self.sock.apply(&plan.ops)?;
        self.clear_udp_conntrack(plan);
        self.drained.clear();
        self.check_drains(family)?;
        Ok(())
    }

    fn commit(&mut self, family: IpFamily, plan: Plan) -> Vec<(ServicePortName, Fallback)> {
        let mut rendered = plan.rendered;
        for (k, d) in std::mem::take(&mut self.drained) {
            self.draining.remove(&(k, d));
            if let Some(vs) = rendered.servers.get_mut(&k) {
                vs.dests.remove(&d);
            }
        }
        let now = Instant::now();
        for (k, d) in plan.drains {
            self.draining.entry((k, d)).or_insert(now);
        }
        // Real servers of this family that are back (weight > 0) or gone stop draining.
        let v6 = family == IpFamily::V6;
        self.draining.retain(|(k, d), _| {
            k.addr.is_ipv6() != v6
                || rendered
                    .servers
                    .get(k)
                    .and_then(|vs| vs.dests.get(d))
                    .is_some_and(|x| x.weight == 0)
        });
        // A partial plan carries the renderer's new memory; plan_full updated it in place.
        if let Some(r) = plan.renderer {
            self.renderers.insert(family, r);
        }
        self.applied.insert(family, rendered);
        plan.fallbacks
    }

    fn invalidate(&mut self, family: IpFamily) {
        self.applied.remove(&family);
        self.nodes.remove(&family);
    }

    fn service_ports(&self, family: IpFamily) -> usize {
        self.renderers
            .get(&family)
            .map_or(0, Renderer::service_ports)
    }

    fn cleanup(&mut self) -> Result<(), SyncError> {
        cleanup(self.netns.as_deref(), Some(&mut self.sock))?;
        self.applied.clear();
        self.nodes.clear();
        Ok(())
    }

    fn is_retryable(error: &SyncError) -> bool {
        error.is_retryable()
    }
}

/// Removes everything the IPVS dataplane installs, in the current or the named namespace (as
/// `--cleanup` and a switch to another mode do): when its dummy interface exists (the IPVS
/// mode ran here), its virtual servers (on the dummy's or the node's addresses, or its
/// firewall marks; other software's stay) and the dummy; always the companion chains of both iptables back ends and families and
/// the ipsets. Missing pieces are skipped; IPVS is never loaded just to clean up.
pub fn cleanup(netns: Option<&str>, sock: Option<&mut IpvsSocket>) -> Result<(), SyncError> {
    let dummy = run_tool(
        netns,
        "ip",
        &["-o", "link", "show", "dev", DUMMY],
        None,
        "iproute2",
    )
    .is_ok();
    if dummy {
        let mut opened = match sock {
            Some(_) => None,
            None => {
                let open = match netns {
                    Some(name) => NetNs::open(name)
                        .map_err(|e| SyncError::Netns(e.to_string()))?
                        .run(IpvsSocket::open)
                        .map_err(|e| SyncError::Netns(e.to_string()))?,
                    None => IpvsSocket::open(),
                };
                match open {
                    Ok(s) => Some(s),
                    Err(IpvsError::NotAvailable) => None,
                    Err(e) => return Err(e.into()),
                }
            }
        };
        if let Some(sock) = sock.or(opened.as_mut()) {
            // Its own virtual servers only: on the dummy's or the node's addresses (node
            // ports), or firewall marks in its range.
            let text = run_tool(netns, "ip", &["-o", "addr", "show"], None, "iproute2")?;
            let ours: BTreeSet<IpAddr> =
                parse_addresses(&text).into_iter().map(|(_, a)| a).collect();
            let dels: Vec<Op> = sock
                .services()?
                .into_iter()
                .filter(|s| {
                    if s.key.fwmark != 0 {
                        s.key.fwmark & FWMARK_MASK == FWMARK_BASE
                    } else {
                        ours.contains(&s.key.addr)
                    }
                })
                .map(|s| Op::DelService(s.key))
                .collect();
            sock.apply(&dels)?;
        }
    }
    for backend in svcnet_iptables::Backend::ALL {
        let exec = IptablesExecutor::new(netns.map(str::to_string), backend);
        for family in Family::ALL {
            let Ok(save) = exec.save(family) else {
                continue;
            };
            if let Some(text) = rules::cleanup_text(&save) {
                run_tool(
                    netns,
                    &backend.program(family, "-restore"),
                    &["-w", "5", "--noflush"],
                    Some(&text),
                    "iptables",
                )?;
            }
        }
    }
    // No ipset, or a kernel without ip_set: no sets of ours either.
    if let Ok(names) = run_tool(netns, "ipset", &["list", "-n"], None, "ipset") {
        let destroy: String = names
            .lines()
            .map(str::trim)
            .filter(|n| rules::is_ours(n))
            .map(|n| format!("destroy {n}\n"))
            .collect();
        if !destroy.is_empty() {
            run_tool(netns, "ipset", &["restore"], Some(&destroy), "ipset")?;
        }
    }
    if dummy {
        run_tool(netns, "ip", &["link", "del", DUMMY], None, "iproute2")?;
    }
    Ok(())
}

//! The shared packet-flow table against the IPVS dataplane's tracer (pure, on any host): the
//! world of `svcnet-flows` rendered into virtual servers, ipsets and marks, each case traced
//! through them with the same expected distributions, masquerade and verdicts as every other
//! dataplane. The plan is also applied to the fake IPVS table, which must accept it.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;

use svcnet_flows::{Client, Distribution, Outcome, Packet, Proto, Tracer, cases, world};
use svcnet_ipvs::render::{Rendered, Renderer};
use svcnet_ipvs::trace::{self, Verdict};
use svcnet_ipvs::{FakeIpvs, Ipvs, Op, Protocol};
use svcnet_proxy::IpFamily;

pub struct IpvsTracer {
    pub rendered: Rendered,
}

fn packet(p: &Packet) -> trace::Packet {
    trace::Packet {
        src: p.src,
        dst: p.dst,
        dport: p.dport,
        protocol: match p.proto {
            Proto::Tcp => Protocol::Tcp,
            Proto::Udp => Protocol::Udp,
        },
        local_source: p.from == Client::Node,
    }
}

fn distribution(v: Vec<(Verdict, f64)>) -> Distribution {
    let mut d = Distribution::new();
    for (v, p) in v {
        let o = match v {
            Verdict::Endpoint { to, masquerade, .. } => Outcome::Endpoint { to, masquerade },
            Verdict::Reject => Outcome::Reject,
            Verdict::Drop => Outcome::Drop,
            Verdict::Pass => Outcome::Pass,
        };
        *d.entry(o).or_default() += p;
    }
    d
}

impl Tracer for IpvsTracer {
    fn name(&self) -> &'static str {
        "ipvs"
    }

    fn trace(&self, p: &Packet) -> Distribution {
        distribution(trace::trace(&self.rendered, &packet(p), None))
    }

    fn trace_after(&self, first: &Packet, endpoint: SocketAddr, p: &Packet) -> Distribution {
        // The pin is the persistence template of the virtual server the first connection
        // went through: it holds for this one only if it goes through the same server.
        let same = trace::server_of(&self.rendered, &packet(first))
            == trace::server_of(&self.rendered, &packet(p));
        let pinned = same.then_some(endpoint);
        distribution(trace::trace(&self.rendered, &packet(p), pinned))
    }
}

fn rendered() -> (Renderer, Rendered) {
    let state = world();
    let mut r = common::renderer();
    let rendered = r.render_all(&state.desired(IpFamily::V4));
    (r, rendered)
}

#[test]
fn flow_table_on_the_ipvs_tracer() {
    let (_, rendered) = rendered();
    svcnet_flows::run_table(&IpvsTracer { rendered }, &cases());
}

/// Everything rendered is a table the kernel accepts (the fake answers as IPVS does).
#[test]
fn rendered_servers_apply_to_the_fake() {
    let (_, rendered) = rendered();
    let (ops, _, _) = svcnet_ipvs::plan::diff_servers(&Default::default(), &rendered.servers);
    let mut fake = FakeIpvs::new();
    fake.apply(&ops).unwrap();
    let dump = fake.dump();
    // One virtual server per cluster IP, per node address × node port, a firewall-mark one
    // for the port whose affinity spans frontends and for each short-circuit pool.
    assert!(dump.contains("-A -t 10.96.0.10:80 -s rr\n"), "{dump}");
    assert!(dump.contains("-A -t 192.168.50.1:30080 -s rr\n"), "{dump}");
    assert!(
        dump.contains("-A -t 10.96.0.11:80 -s rr -p 10800\n"),
        "{dump}"
    );
    assert!(dump.contains("-s sh -b sh-fallback"), "{dump}");
    let fwmarks = dump.lines().filter(|l| l.starts_with("-A -f ")).count();
    assert_eq!(
        fwmarks, 3,
        "pinned, local's and remote's short-circuits: {dump}"
    );
    assert!(ops.iter().all(|o| !matches!(o, Op::DelService(_))));
}

/// `svcnet trace`'s words for the shared cases (frontend, masquerade reason, verdict), the
/// same as the nftables and iptables tracers give; each branch's outcome and share are
/// [`trace::trace`]'s.
#[test]
fn explanations_match_the_shared_table() {
    let (_, rendered) = rendered();
    svcnet_flows::check_explanations(&|p| {
        let branches = trace::branches(&rendered, &p.to_trace());
        let shares: Vec<f64> = branches.iter().map(|b| b.share).collect();
        let traced: Vec<f64> = trace::trace(&rendered, &packet(p), None)
            .into_iter()
            .map(|(_, s)| s)
            .collect();
        assert_eq!(shares, traced, "{p:?}");
        branches
            .into_iter()
            .map(|b| {
                let e = trace::explain(&b);
                (b, e)
            })
            .collect()
    });
}

/// The hops of a traced branch are in the order the kernel's hooks meet the packet: nat's
/// masquerade decision in prerouting before IPVS at LOCAL_IN, the hairpin masquerade in
/// postrouting after it.
#[test]
fn traced_hops_follow_the_hooks() {
    let (_, rendered) = rendered();
    let chains = |case: &str, masquerade: bool| -> Vec<String> {
        let c = cases()
            .into_iter()
            .find(|c| c.name.starts_with(case))
            .unwrap();
        let b = trace::branches(&rendered, &c.packet().to_trace())
            .into_iter()
            .find(|b| {
                matches!(b.outcome, svcnet_proxy::trace::Outcome::Endpoint { masquerade: m, .. } if m == masquerade)
            })
            .unwrap();
        b.path.iter().map(|h| h.chain.clone()).collect()
    };
    assert_eq!(
        chains("cluster IP from off-cluster", true),
        ["SVCIPVS-SERVICES", "SVCIPVS-FILTER", "IPVS"]
    );
    assert_eq!(
        chains("hairpin is masqueraded", true),
        ["SVCIPVS-FILTER", "IPVS", "SVCIPVS-POSTROUTING"]
    );
    assert_eq!(
        chains("cluster IP spreads", false),
        ["SVCIPVS-FILTER", "IPVS"]
    );
}

/// The state read back from the texts the node's tools print (here the render's own restore
/// texts, which the parsers must read as iptables-save and ipset save print them) and the
/// servers IPVS lists is the rendered state, whole.
#[test]
fn the_state_reads_back_as_rendered() {
    let (_, rendered) = rendered();
    let family = IpFamily::V4;
    let payload = svcnet_ipvs::rules::payload(&rendered, family);
    let iptables = payload.to_string();
    let ipsets = svcnet_ipvs::plan::ipset_text(family, Some(&Rendered::default()), &rendered);
    let addresses: String = rendered
        .addresses
        .iter()
        .map(|ip| format!("9: svcnet-ipvs0    inet {ip}/32 scope global svcnet-ipvs0\n"))
        .collect();
    let mut back = svcnet_ipvs::readback::parse(family, &iptables, &ipsets, &addresses).unwrap();
    let servers = rendered
        .servers
        .values()
        .map(|vs| (vs.service.clone(), vs.dests.values().cloned().collect()))
        .collect();
    svcnet_ipvs::readback::add_servers(&mut back, family, servers);
    assert_eq!(back.members, rendered.members);
    assert_eq!(back.marks, rendered.marks);
    assert_eq!(back.port_dnats, rendered.port_dnats);
    assert_eq!(back.servers, rendered.servers);
    assert_eq!(back, rendered);
    // As iptables-save prints the mark rules: host addresses with /32, `--set-xmark`.
    let saved = iptables
        .lines()
        .map(|l| {
            if l.starts_with("-A SVCIPVS-MARK ") {
                let l = l.replace("--set-mark", "--set-xmark");
                let mut words: Vec<String> = l.split(' ').map(String::from).collect();
                for i in 0..words.len() {
                    if words[i] == "-d" {
                        words[i + 1] = format!("{}/32", words[i + 1]);
                    }
                    if words[i] == "--set-xmark" {
                        words[i + 1] = format!("{}/0xffffffff", words[i + 1]);
                    }
                }
                words.join(" ")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let marks = svcnet_ipvs::readback::parse_marks(&saved, family).unwrap();
    assert_eq!(marks, rendered.marks);
    assert!(!marks.is_empty());
    // Nothing of svcnet's: nothing read; a rule it cannot read is an error naming it.
    let err =
        svcnet_ipvs::readback::parse_marks("-A SVCIPVS-MARK -j MARK --set-xmark 0x1\n", family)
            .unwrap_err();
    assert!(err.to_string().contains("without a destination"), "{err}");
}

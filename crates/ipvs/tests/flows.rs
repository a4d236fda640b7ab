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

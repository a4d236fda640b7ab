//! A test-only tracer over the userspace dataplane's route table (privileged mode): the
//! `svcnet-userspace` table's rules as `rules::render` writes them, walked in the same order
//! with the same matches, then the proxy's own endpoint choice (svcnet-lb's balancer, the one
//! the data path calls) over the redirected route's endpoints. The real-kernel tier
//! (`tests/privileged.rs`) checks the rendered rules themselves.
//!
//! Order modelled: `filter prerouting/output -110` (`no-endpoints`: source-range drops and
//! refusals of routes without a listener), `nat … -100` (`frontends`: the first matching
//! redirect), then, for what no frontend took, `filter forward -110` / `output -90`
//! (`cluster-ips-check`: the core's node-wide verdicts).

use std::net::{IpAddr, SocketAddr};

use svcnet_flows::{Distribution, Outcome, Packet, Tracer};
use svcnet_lb::{Algorithm, Backend, Balancer, Flow, NoLoad};
use svcnet_proxy::{NoEndpointsVerdict, Protocol, ServicePortName};
use svcnet_userspace::rules::NodeChecks;
use svcnet_userspace::table::{Class, Frontend, RouteSpec, Sources};

pub struct UserspaceTracer {
    pub routes: Vec<RouteSpec>,
    pub checks: NodeChecks,
    pub local_addrs: Vec<IpAddr>,
}

impl UserspaceTracer {
    fn frontend_matches(&self, p: &Packet, r: &RouteSpec, fe: &Frontend) -> bool {
        let proto = match r.protocol {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        };
        if proto != p.proto.as_str() {
            return false;
        }
        match fe {
            Frontend::Addr(ip, port) | Frontend::LoadBalancer(ip, port, _) => {
                *ip == p.dst && *port == p.dport
            }
            Frontend::NodePort(port) => self.local_addrs.contains(&p.dst) && *port == p.dport,
        }
    }

    fn sources_match(&self, p: &Packet, r: &RouteSpec) -> bool {
        let from_node = self.local_addrs.contains(&p.src);
        let pod = |pods: &[ipnet::IpNet]| pods.iter().any(|n| n.contains(&p.src));
        match &r.sources {
            Sources::Any => true,
            Sources::PodsAndNode(pods) => pod(pods) || from_node,
            Sources::NotPodsOrNode(pods) => !pod(pods) && !from_node,
        }
    }

    /// The proxy's choice over a route's endpoints: exact shares over one rr/wrr cycle, or
    /// by weight for random.
    fn choose(&self, p: &Packet, r: &RouteSpec) -> Distribution {
        let backends: Vec<Backend> = r
            .endpoints
            .iter()
            .map(|e| Backend {
                addr: SocketAddr::new(e.ip, e.port),
                weight: e.weight,
            })
            .collect();
        let mut out = Distribution::new();
        let mut add = |addr: SocketAddr, share: f64| {
            // The proxy connects from the node: the endpoint never sees the client.
            *out.entry(Outcome::Endpoint {
                to: addr,
                masquerade: true,
            })
            .or_default() += share;
        };
        match r.algorithm {
            Algorithm::RoundRobin | Algorithm::WeightedRoundRobin => {
                let b = Balancer::new(r.algorithm, backends.clone())
                    .unwrap_or_else(|e| panic!("{}: {e}", r.key.service));
                let flow = Flow {
                    client: SocketAddr::new(p.src, 40_000),
                    destination: SocketAddr::new(p.dst, p.dport),
                };
                let len = b.slots().len();
                let mut rng = rand::rng();
                for ticket in 0..len as u64 {
                    let i = b
                        .pick(&flow, ticket, &NoLoad, &mut rng)
                        .unwrap_or_else(|| panic!("{}: no pick", r.key.service));
                    add(b.backends()[i].addr, 1.0 / len as f64);
                }
            }
            Algorithm::Random => {
                let total: u32 = backends.iter().map(|b| b.weight).sum();
                for b in &backends {
                    add(b.addr, f64::from(b.weight) / f64::from(total));
                }
            }
            other => panic!("the tracer models rr, wrr and random, not {other}"),
        }
        out
    }
}

impl Tracer for UserspaceTracer {
    fn name(&self) -> &'static str {
        "userspace"
    }

    fn preserves_client_address(&self) -> bool {
        false
    }

    fn trace(&self, p: &Packet) -> Distribution {
        self.trace_pinned(p, None)
    }

    /// The proxy pins the client (under the route's affinity key) to the endpoint the first
    /// connection reached; a later connection whose route has the same key follows the pin
    /// when that endpoint is one of the route's own (`tcp::choose`).
    fn trace_after(&self, first: &Packet, endpoint: SocketAddr, p: &Packet) -> Distribution {
        let key = self
            .redirect(first)
            .and_then(|r| r.affinity.as_ref())
            .map(|(_, key)| key);
        self.trace_pinned(p, key.map(|k| (k, endpoint)))
    }
}

impl UserspaceTracer {
    /// The route whose redirect takes `p` (the first in the nat chain's order).
    fn redirect(&self, p: &Packet) -> Option<&RouteSpec> {
        self.routes.iter().find(|r| {
            !r.listeners.is_empty()
                && r.frontends.iter().any(|fe| self.frontend_matches(p, r, fe))
                && self.sources_match(p, r)
        })
    }

    fn trace_pinned(
        &self,
        p: &Packet,
        pin: Option<(&ServicePortName, SocketAddr)>,
    ) -> Distribution {
        let mut out = Distribution::new();
        let mut only = |o: Outcome| {
            out.insert(o, 1.0);
            out.clone()
        };
        // filter -110: source ranges, then refusals of routes without a listener.
        for r in &self.routes {
            for fe in r
                .frontends
                .iter()
                .filter(|fe| self.frontend_matches(p, r, fe))
            {
                if let Frontend::LoadBalancer(_, _, ranges) = fe
                    && !ranges.is_empty()
                    && r.key.class != Class::ShortCircuit
                    && !ranges.iter().any(|n| n.contains(&p.src))
                {
                    return only(Outcome::Drop);
                }
                if r.listeners.is_empty() && self.sources_match(p, r) {
                    match r.no_endpoints {
                        Some(NoEndpointsVerdict::Reject) => return only(Outcome::Reject),
                        Some(NoEndpointsVerdict::Drop) => return only(Outcome::Drop),
                        None => {}
                    }
                }
            }
        }
        // nat -100: the first redirect.
        if let Some(r) = self.redirect(p) {
            if let (Some((key, endpoint)), Some((_, k))) = (pin, &r.affinity)
                && k == key
                && r.endpoints
                    .iter()
                    .any(|e| SocketAddr::new(e.ip, e.port) == endpoint)
            {
                return only(Outcome::Endpoint {
                    to: endpoint,
                    masquerade: true,
                });
            }
            return self.choose(p, r);
        }
        // What no frontend took: the node-wide verdicts.
        if self.checks.cluster_ips.contains(&p.dst) {
            return only(Outcome::Reject);
        }
        if self.checks.service_cidrs.iter().any(|n| n.contains(&p.dst)) {
            return only(Outcome::Drop);
        }
        only(Outcome::Pass)
    }
}

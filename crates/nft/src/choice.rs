//! Choosing an endpoint in a service port's policy chain: the masquerade check for
//! cluster-IP traffic, affinity lookups, then the port's load-balancing algorithm as nftables
//! can express it (a `numgen random` cascade or verdict map by default; `numgen inc` or
//! `jhash` slot maps from [`kernel_plan`]). Pure.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::net::SocketAddr;

use svcnet_lb::{Algorithm, Backend, Dataplane, Fallback, KernelPlan, kernel_plan};
use svcnet_proxy::{ClusterIpMasquerade, DesiredEndpoint, DesiredNode, DesiredServicePort};

use crate::names::*;
use crate::render::{CASCADE_MAX, Element, Fragment, ip_kw, ip_literal, nets};
use crate::tx::{Family, SetDef, SetKind};

/// The chain choosing among `eps`: masquerade check for cluster-IP traffic (when this chain
/// serves internal traffic), affinity lookups, then a uniform random pick.
pub(crate) fn policy_chain(
    family: Family,
    d: &DesiredServicePort,
    node: &DesiredNode,
    eps: &[DesiredEndpoint],
    internal: bool,
    chain: &str,
    f: &mut Fragment,
) -> (Vec<String>, Option<Fallback>) {
    let ip = ip_kw(family);
    let mut rules = Vec::new();
    if internal {
        let m = format!(
            "{ip} daddr {} {} dport {}",
            ip_literal(d.cluster_ip),
            d.protocol,
            d.port
        );
        match d.cluster_ip_masquerade {
            ClusterIpMasquerade::All => rules.push(format!("{m} jump {MARK_FOR_MASQUERADE}")),
            ClusterIpMasquerade::OffCluster => rules.push(format!(
                "{m} {ip} saddr != {} jump {MARK_FOR_MASQUERADE}",
                nets(&node.cluster_cidrs)
            )),
            ClusterIpMasquerade::Never => {}
        }
    }
    if d.affinity_timeout.is_some() {
        for ep in eps {
            rules.push(format!(
                "{ip} saddr @{} goto {}",
                affinity_set(&d.name, ep),
                endpoint_chain(&d.name, ep)
            ));
        }
    }
    let (choice, fallback) = endpoint_choice(family, d, eps, chain, f);
    rules.extend(choice);
    (rules, fallback)
}

/// Compiles the port's algorithm for nftables ([`kernel_plan`]); `Err` carries the fallback
/// when the plan could not even be built (an impossible Maglev table).
fn algorithm_plan(d: &DesiredServicePort, eps: &[DesiredEndpoint]) -> Result<KernelPlan, Fallback> {
    let backends = eps
        .iter()
        .map(|e| Backend {
            addr: SocketAddr::new(e.ip, e.port),
            weight: e.weight.max(1),
        })
        .collect();
    kernel_plan(
        d.lb_algorithm,
        Dataplane::Nftables,
        backends,
        d.affinity_timeout.is_some(),
    )
    .map_err(|_| Fallback {
        requested: d.lb_algorithm.unwrap_or(Algorithm::Random),
        used: Algorithm::Random,
        dataplane: Dataplane::Nftables,
        why: "its lookup table could not be built for these endpoints",
    })
}

/// The rules picking one of `eps` for a new flow, and the fallback to report if the port's
/// algorithm could not be expressed. Random (the default, and every fallback) is a cascade or
/// a `numgen random` verdict map; rr/wrr, sh, dh and maglev are the [`kernel_plan`]'s slot
/// expression (`numgen inc` or `jhash`) looked up in a verdict map of its slots. A random
/// vmap is the named map [`endpoints_map`] of `chain`, which this adds to `f`.
fn endpoint_choice(
    family: Family,
    d: &DesiredServicePort,
    eps: &[DesiredEndpoint],
    chain: &str,
    f: &mut Fragment,
) -> (Vec<String>, Option<Fallback>) {
    // The default needs no plan (and most services have it: keep their rendering cheap).
    let default = matches!(d.lb_algorithm, None | Some(Algorithm::Random));
    let (plan, fallback) = match (!default).then(|| algorithm_plan(d, eps)) {
        None => (None, None),
        Some(Ok(p)) => {
            let f = p.fallback.clone();
            (Some(p), f)
        }
        Some(Err(f)) => (None, Some(f)),
    };
    if let Some(plan) = plan.filter(|p| p.algorithm != Algorithm::Random)
        && let Some(expr) = plan.expression(family == Family::Ip6)
    {
        let by_addr: BTreeMap<SocketAddr, &DesiredEndpoint> = eps
            .iter()
            .map(|e| (SocketAddr::new(e.ip, e.port), e))
            .collect();
        let chains: Vec<Option<String>> = plan
            .backends()
            .iter()
            .map(|b| by_addr.get(&b.addr).map(|e| endpoint_chain(&d.name, e)))
            .collect();
        let entries: Vec<String> = plan
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, b)| {
                chains
                    .get(*b)
                    .and_then(Option::as_ref)
                    .map(|c| format!("{i} : goto {c}"))
            })
            .collect();
        return (
            vec![format!("{expr} vmap {{ {} }}", entries.join(", "))],
            fallback,
        );
    }
    let mut rules = Vec::new();
    let mut slots = Vec::new();
    for ep in eps {
        for _ in 0..ep.weight.max(1) {
            slots.push(endpoint_chain(&d.name, ep));
        }
    }
    if slots.len() <= CASCADE_MAX {
        // A cascade: rule i is taken with probability 1/(n-i), so each endpoint gets 1/n.
        // It avoids one anonymous verdict map per service: the kernel allocates anonymous set
        // names by scanning the table's sets, which makes loading N such maps O(N²).
        let n = slots.len();
        for (i, c) in slots.iter().enumerate() {
            if i + 1 == n {
                rules.push(format!("goto {c}"));
            } else {
                rules.push(format!("numgen random mod {} == 0 goto {c}", n - i));
            }
        }
    } else {
        // A named map: anonymous ones are what makes loading many services quadratic.
        let map = endpoints_map(chain);
        f.sets.insert(
            map.clone(),
            SetDef {
                name: map.clone(),
                kind: SetKind::Map,
                // `numgen` has no named type; the modulus in `typeof` is only a label, kept
                // constant so the declaration does not change with the endpoint count.
                type_: "typeof numgen random mod 1 : verdict".into(),
                flags: vec![],
                timeout_seconds: None,
                comment: None,
            },
        );
        for (i, c) in slots.iter().enumerate() {
            f.elements.insert(Element {
                set: Cow::Owned(map.clone()),
                key: i.to_string(),
                value: Some(format!("goto {c}")),
            });
        }
        rules.push(format!("numgen random mod {} vmap @{map}", slots.len()));
    }
    (rules, fallback)
}

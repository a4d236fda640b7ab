//! Choosing an endpoint in a service port's policy chain: the masquerade check for
//! cluster-IP traffic, affinity lookups, then the port's load-balancing algorithm as nftables
//! can express it (a `numgen random` cascade or verdict map by default; `numgen inc` or
//! `jhash` slot maps from [`kernel_plan`]). Pure.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::net::SocketAddr;

use svcnet_lb::{Algorithm, Backend, Dataplane, KernelPlan, MaglevError, kernel_plan};
use svcnet_proxy::{DesiredEndpoint, DesiredNode, Masquerade, ServiceGraph};

use crate::names::*;
use crate::render::{CASCADE_MAX, Element, Fragment, ip_kw, ip_literal, nets};
use crate::tx::{Family, SetDef, SetKind};

/// The chain choosing among `eps`: when the pool serves internal traffic, the masquerade check
/// for cluster-IP traffic (`internal`: its rule), affinity lookups, then the choice by the
/// port's resolved algorithm.
pub(crate) fn policy_chain(
    family: Family,
    g: &ServiceGraph<'_>,
    node: &DesiredNode,
    eps: &[DesiredEndpoint],
    internal: Option<Masquerade>,
    chain: &str,
    f: &mut Fragment,
) -> Vec<String> {
    let ip = ip_kw(family);
    let d = g.port;
    let mut rules = Vec::new();
    let m = format!(
        "{ip} daddr {} {} dport {}",
        ip_literal(d.cluster_ip),
        d.protocol,
        d.port
    );
    match internal {
        Some(Masquerade::Always) => rules.push(format!("{m} jump {MARK_FOR_MASQUERADE}")),
        Some(Masquerade::OffCluster) => rules.push(format!(
            "{m} {ip} saddr != {} jump {MARK_FOR_MASQUERADE}",
            nets(&node.cluster_cidrs)
        )),
        Some(Masquerade::Never) | None => {}
    }
    if g.affinity.is_some() {
        for ep in eps {
            rules.push(format!(
                "{ip} saddr @{} goto {}",
                affinity_set(&d.name, ep),
                endpoint_chain(&d.name, ep)
            ));
        }
    }
    rules.extend(endpoint_choice(family, g, eps, chain, f));
    rules
}

/// Compiles `algorithm` for nftables over `eps` ([`kernel_plan`]); an error when its lookup
/// table (Maglev's) cannot be built for them.
pub(crate) fn algorithm_plan(
    algorithm: Algorithm,
    eps: &[DesiredEndpoint],
    affinity: bool,
) -> Result<KernelPlan, MaglevError> {
    let backends = eps
        .iter()
        .map(|e| Backend {
            addr: SocketAddr::new(e.ip, e.port),
            weight: e.weight.max(1),
        })
        .collect();
    kernel_plan(Some(algorithm), Dataplane::Nftables, backends, affinity)
}

/// The rules picking one of `eps` for a new flow with the port's resolved algorithm (the
/// graph's; any fallback is already decided and reported there). Random (the default, and
/// every fallback) is a cascade or a `numgen random` verdict map; rr/wrr, sh, dh and maglev
/// are the [`kernel_plan`]'s slot expression (`numgen inc` or `jhash`) looked up in a verdict
/// map of its slots. A random vmap is the named map [`endpoints_map`] of `chain`, which this
/// adds to `f`.
fn endpoint_choice(
    family: Family,
    g: &ServiceGraph<'_>,
    eps: &[DesiredEndpoint],
    chain: &str,
    f: &mut Fragment,
) -> Vec<String> {
    let d = g.port;
    // The default needs no plan (and most services have it: keep their rendering cheap).
    let plan = (g.algorithm != Algorithm::Random)
        .then(|| algorithm_plan(g.algorithm, eps, g.affinity.is_some()).ok())
        .flatten();
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
        return vec![format!("{expr} vmap {{ {} }}", entries.join(", "))];
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
    rules
}

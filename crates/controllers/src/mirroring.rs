//! The EndpointSlice mirroring controller's pure core, after upstream's
//! `pkg/controller/endpointslicemirroring`: Endpoints that a user wrote by hand for a service
//! without a selector (the seeds' external MySQL example) are copied into EndpointSlices that
//! proxies and DNS read.
//!
//! Mirrored: Endpoints whose service exists and has no selector, unless labelled
//! `endpointslice.kubernetes.io/skip-mirror: "true"` (the Endpoints controller labels its own
//! objects so) or carrying a leader-election annotation. Each (address type, port set) gets one
//! slice of at most [`MAX_ENDPOINTS_PER_SUBSET`] endpoints; invalid IPs are skipped. Slices are
//! owned by the Endpoints object, labelled with its labels plus `kubernetes.io/service-name`
//! and `managed-by: endpointslicemirroring-controller.k8s.io`, and carry its annotations
//! except the last-applied configuration and the trigger time.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{EndpointAddress, Endpoints, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::endpointslice::{
    EndpointKey, PortKey, SlicePlan, controller_ref, endpoint_key, port_key,
};
use crate::podutil;
use crate::{
    ANNOTATION_LAST_CHANGE_TRIGGER_TIME, LABEL_MANAGED_BY, LABEL_SERVICE_NAME, LABEL_SKIP_MIRROR,
    MIRRORING_CONTROLLER_NAME,
};

/// Upstream's `--mirroring-max-endpoints-per-subset` default.
pub const MAX_ENDPOINTS_PER_SUBSET: usize = 1000;

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
const LEADER_ELECTION: &str = "control-plane.alpha.kubernetes.io/leader";

/// Whether these Endpoints should be mirrored at all, given their service.
pub fn should_mirror(endpoints: &Endpoints, service: Option<&Service>) -> bool {
    let Some(service) = service else {
        return false;
    };
    if podutil::service_selector(service).is_some() {
        return false;
    }
    let skip = endpoints
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_SKIP_MIRROR))
        .is_some_and(|v| v == "true");
    let leader = endpoints
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(LEADER_ELECTION));
    !skip && !leader
}

/// Computes the plan for the Endpoints `namespace/name`. `existing` are the slices labelled
/// with that name and the mirroring controller's `managed-by`.
pub fn plan(
    endpoints: Option<&Endpoints>,
    service: Option<&Service>,
    existing: &[&EndpointSlice],
) -> SlicePlan {
    let Some(endpoints) = endpoints.filter(|e| should_mirror(e, service)) else {
        return crate::endpointslice::plan_without_service(existing);
    };

    // Desired endpoints by (address type, port set), in the order the user wrote them.
    type Group = (Vec<EndpointPort>, Vec<Endpoint>, BTreeSet<EndpointKey>);
    let mut desired: BTreeMap<(String, PortKey), Group> = BTreeMap::new();
    for subset in endpoints.subsets.iter().flatten() {
        let ports: Vec<EndpointPort> = subset
            .ports
            .iter()
            .flatten()
            .map(|p| EndpointPort {
                name: Some(p.name.clone().unwrap_or_default()),
                port: Some(p.port),
                protocol: Some(p.protocol.clone().unwrap_or_else(|| "TCP".into())),
                app_protocol: p.app_protocol.clone(),
            })
            .collect();
        let pk = port_key(&ports);
        let ready = subset.addresses.iter().flatten().map(|a| (a, true));
        let not_ready = subset
            .not_ready_addresses
            .iter()
            .flatten()
            .map(|a| (a, false));
        let mut added = 0;
        for (addr, is_ready) in ready.chain(not_ready) {
            if added >= MAX_ENDPOINTS_PER_SUBSET {
                break;
            }
            let Some((ep, family)) = address_to_endpoint(addr, is_ready) else {
                continue;
            };
            added += 1;
            let group = desired
                .entry((family.to_string(), pk.clone()))
                .or_insert_with(|| (ports.clone(), Vec::new(), BTreeSet::new()));
            if group.2.insert(endpoint_key(&ep)) {
                group.1.push(ep);
            }
        }
    }

    let mut existing_by_key: BTreeMap<(String, PortKey), Vec<&EndpointSlice>> = BTreeMap::new();
    let mut sorted = existing.to_vec();
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for s in sorted {
        let key = (
            s.address_type.clone(),
            port_key(s.ports.as_deref().unwrap_or_default()),
        );
        existing_by_key.entry(key).or_default().push(s);
    }

    let mut out = SlicePlan::default();
    for (key, (ports, eps, _)) in &desired {
        let slices = existing_by_key.remove(key).unwrap_or_default();
        let new = new_slice(endpoints, ports.clone(), &key.0, eps.clone());
        match slices.split_first() {
            None => out.create.push(new),
            Some((first, rest)) => {
                out.delete.extend(rest.iter().map(|s| (*s).clone()));
                if !same_content(first, &new) {
                    let mut s = new;
                    s.metadata.name = first.metadata.name.clone();
                    s.metadata.generate_name = first.metadata.generate_name.clone();
                    s.metadata.resource_version = first.metadata.resource_version.clone();
                    s.metadata.uid = first.metadata.uid.clone();
                    out.update.push(s);
                }
            }
        }
    }
    out.delete
        .extend(existing_by_key.into_values().flatten().cloned());

    // Recycle slices to delete into creates of the same address type.
    let mut i = 0;
    while i < out.delete.len() {
        let Some(pos) = out
            .create
            .iter()
            .position(|c| c.address_type == out.delete[i].address_type)
        else {
            i += 1;
            continue;
        };
        let old = out.delete.remove(i);
        let mut s = out.create.remove(pos);
        s.metadata.name = old.metadata.name;
        s.metadata.generate_name = old.metadata.generate_name;
        s.metadata.resource_version = old.metadata.resource_version;
        s.metadata.uid = old.metadata.uid;
        out.update.push(s);
    }
    out
}

/// Upstream's `addressToEndpoint`: `None` for an address that is not an IP.
fn address_to_endpoint(addr: &EndpointAddress, ready: bool) -> Option<(Endpoint, &'static str)> {
    let ip = podutil::canonical_ip(&addr.ip)?;
    let family = if podutil::is_ipv6(&ip) == Some(true) {
        "IPv6"
    } else {
        "IPv4"
    };
    let ep = Endpoint {
        addresses: vec![ip],
        conditions: Some(EndpointConditions {
            ready: Some(ready),
            ..Default::default()
        }),
        target_ref: addr.target_ref.clone(),
        node_name: addr.node_name.clone(),
        hostname: addr.hostname.clone().filter(|h| !h.is_empty()),
        ..Default::default()
    };
    Some((ep, family))
}

fn new_slice(
    endpoints: &Endpoints,
    ports: Vec<EndpointPort>,
    address_type: &str,
    eps: Vec<Endpoint>,
) -> EndpointSlice {
    let name = endpoints.metadata.name.clone().unwrap_or_default();
    let mut labels = endpoints.metadata.labels.clone().unwrap_or_default();
    labels.insert(LABEL_SERVICE_NAME.into(), name.clone());
    labels.insert(LABEL_MANAGED_BY.into(), MIRRORING_CONTROLLER_NAME.into());
    let annotations: BTreeMap<String, String> = endpoints
        .metadata
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| {
            k.as_str() != LAST_APPLIED && k.as_str() != ANNOTATION_LAST_CHANGE_TRIGGER_TIME
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    EndpointSlice {
        metadata: ObjectMeta {
            generate_name: Some(format!("{name}-")),
            namespace: endpoints.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            owner_references: Some(vec![controller_ref("v1", "Endpoints", &endpoints.metadata)]),
            ..Default::default()
        },
        address_type: address_type.into(),
        endpoints: eps,
        ports: Some(ports),
    }
}

/// Same endpoints (as a set), labels, annotations and owners: no write needed.
fn same_content(existing: &EndpointSlice, want: &EndpointSlice) -> bool {
    let set = |s: &EndpointSlice| -> BTreeMap<EndpointKey, Endpoint> {
        s.endpoints
            .iter()
            .map(|e| (endpoint_key(e), e.clone()))
            .collect()
    };
    set(existing) == set(want)
        && existing.endpoints.len() == want.endpoints.len()
        && existing.metadata.labels == want.metadata.labels
        && existing.metadata.annotations.clone().unwrap_or_default()
            == want.metadata.annotations.clone().unwrap_or_default()
        && existing.metadata.owner_references == want.metadata.owner_references
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::*;
    use k8s_openapi::api::core::v1::{EndpointPort as CorePort, EndpointSubset};

    fn mysql_endpoints(ips: &[&str]) -> Endpoints {
        Endpoints {
            metadata: ObjectMeta {
                labels: Some(map(&[("app", "mysql")])),
                annotations: Some(map(&[(LAST_APPLIED, "{}"), ("note", "external")])),
                ..meta("default", "mysql")
            },
            subsets: Some(vec![EndpointSubset {
                addresses: Some(
                    ips.iter()
                        .map(|ip| EndpointAddress {
                            ip: ip.to_string(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                not_ready_addresses: Some(vec![EndpointAddress {
                    ip: "192.168.1.9".into(),
                    ..Default::default()
                }]),
                ports: Some(vec![CorePort {
                    name: Some("mysql".into()),
                    port: 3306,
                    protocol: Some("TCP".into()),
                    app_protocol: None,
                }]),
            }]),
        }
    }

    fn selectorless() -> Service {
        service("default", "mysql", |s| {
            s.no_selector();
        })
    }

    #[test]
    fn mirrors_user_endpoints() {
        let ep = mysql_endpoints(&["192.168.1.5", "not-an-ip", "fd00::5"]);
        let p = plan(Some(&ep), Some(&selectorless()), &[]);
        assert_eq!((p.create.len(), p.update.len(), p.delete.len()), (2, 0, 0));
        let v4 = p.create.iter().find(|s| s.address_type == "IPv4").unwrap();
        assert_eq!(v4.metadata.generate_name.as_deref(), Some("mysql-"));
        let labels = v4.metadata.labels.clone().unwrap();
        assert_eq!(
            labels.get(LABEL_MANAGED_BY).map(String::as_str),
            Some(MIRRORING_CONTROLLER_NAME)
        );
        assert_eq!(
            labels.get(LABEL_SERVICE_NAME).map(String::as_str),
            Some("mysql")
        );
        assert_eq!(labels.get("app").map(String::as_str), Some("mysql"));
        assert_eq!(v4.metadata.annotations, Some(map(&[("note", "external")])));
        let owner = &v4.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("Endpoints", "mysql")
        );
        let got: Vec<(String, Option<bool>)> = v4
            .endpoints
            .iter()
            .map(|e| (e.addresses[0].clone(), e.conditions.as_ref().unwrap().ready))
            .collect();
        assert_eq!(
            got,
            vec![
                ("192.168.1.5".into(), Some(true)),
                ("192.168.1.9".into(), Some(false))
            ]
        );
        assert_eq!(v4.ports.as_ref().unwrap()[0].port, Some(3306));

        // Applied, it converges; changing an address updates the one slice in place.
        let mut stored: Vec<EndpointSlice> = p.create.clone();
        for (i, s) in stored.iter_mut().enumerate() {
            s.metadata.name = Some(format!("mysql-{i}"));
            s.metadata.resource_version = Some("1".into());
        }
        let refs: Vec<&EndpointSlice> = stored.iter().collect();
        assert!(plan(Some(&ep), Some(&selectorless()), &refs).is_empty());
        let ep2 = mysql_endpoints(&["192.168.1.6", "fd00::5"]);
        let p = plan(Some(&ep2), Some(&selectorless()), &refs);
        assert_eq!((p.create.len(), p.update.len(), p.delete.len()), (0, 1, 0));
        assert_eq!(p.update[0].metadata.resource_version.as_deref(), Some("1"));
    }

    #[test]
    fn not_mirrored_cases_delete_slices() {
        let ep = mysql_endpoints(&["192.168.1.5"]);
        let stored = EndpointSlice {
            metadata: meta("default", "mysql-abc"),
            address_type: "IPv4".into(),
            ..Default::default()
        };
        let refs = [&stored];
        let with_selector = service("default", "mysql", |_| {});
        let mut skip = ep.clone();
        skip.metadata.labels = Some(map(&[(LABEL_SKIP_MIRROR, "true")]));
        for (what, p) in [
            (
                "service has a selector",
                plan(Some(&ep), Some(&with_selector), &refs),
            ),
            ("service missing", plan(Some(&ep), None, &refs)),
            (
                "endpoints deleted",
                plan(None, Some(&selectorless()), &refs),
            ),
            (
                "skip-mirror",
                plan(Some(&skip), Some(&selectorless()), &refs),
            ),
        ] {
            assert_eq!(
                (p.create.len(), p.update.len(), p.delete.len()),
                (0, 0, 1),
                "{what}"
            );
        }
    }

    #[test]
    fn caps_each_subset_at_1000() {
        let ips: Vec<String> = (0..1100)
            .map(|i| format!("10.1.{}.{}", i / 250, i % 250))
            .collect();
        let refs: Vec<&str> = ips.iter().map(String::as_str).collect();
        let p = plan(Some(&mysql_endpoints(&refs)), Some(&selectorless()), &[]);
        assert_eq!(p.create[0].endpoints.len(), 1000);
    }
}

//! The Endpoints controller's pure core (legacy `v1/Endpoints`, what `kubectl get endpoints`
//! shows), after upstream's `pkg/controller/endpoint`:
//!
//! - only services with a selector; the Endpoints of selector-less services are the user's;
//! - one address per pod, of the service's primary family, with `nodeName`, `targetRef` and
//!   `hostname` (when the pod's subdomain names the service);
//! - Ready pods in `addresses`, the others in `notReadyAddresses`; with
//!   `publishNotReadyAddresses` every pod is ready, including terminating ones, which are left
//!   out otherwise;
//! - subsets packed canonically (addresses grouped by their exact port set, sorted);
//! - at most [`MAX_ENDPOINTS_ADDRESSES`] addresses, with `endpoints.kubernetes.io/over-capacity:
//!   truncated` when cut;
//! - labels: the service's, plus `service.kubernetes.io/headless` for headless services and
//!   `endpointslice.kubernetes.io/skip-mirror: "true"` (the slices come from the EndpointSlice
//!   controller, not from mirroring).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, ObjectReference, Pod, Service,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::podutil::{self, is_ipv6};
use crate::{ANNOTATION_OVER_CAPACITY, LABEL_HEADLESS, LABEL_SKIP_MIRROR};

/// Upstream's `maxCapacity`.
pub const MAX_ENDPOINTS_ADDRESSES: usize = 1000;

/// What to do to a service's Endpoints object.
#[derive(Debug, Clone, PartialEq)]
pub enum EndpointsPlan {
    /// It is as it should be (or the service has no selector).
    Nothing,
    Create(Endpoints),
    /// Replace, carrying the existing resourceVersion.
    Update(Endpoints),
    Delete {
        namespace: String,
        name: String,
    },
}

/// The plan when the service does not exist. Its Endpoints go when the service was deleted
/// (`service_deleted`: the controller saw it exist), or when this controller wrote them (they
/// carry its `skip-mirror` label, so they are left over from a deletion it missed). Endpoints
/// a user wrote before their selector-less Service (the seeds' external-database manifest
/// applied Endpoints first) are the user's: upstream's controller never deletes them in
/// reaction to their creation.
pub fn plan_without_service(existing: Option<&Endpoints>, service_deleted: bool) -> EndpointsPlan {
    let written_here = |ep: &Endpoints| {
        ep.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_SKIP_MIRROR))
            .is_some_and(|v| v == "true")
    };
    match existing {
        Some(ep) if service_deleted || written_here(ep) => EndpointsPlan::Delete {
            namespace: ep.metadata.namespace.clone().unwrap_or_default(),
            name: ep.metadata.name.clone().unwrap_or_default(),
        },
        _ => EndpointsPlan::Nothing,
    }
}

/// Computes the plan for `service`; `pods` may be every pod of the namespace.
pub fn plan(service: &Service, pods: &[&Pod], existing: Option<&Endpoints>) -> EndpointsPlan {
    let Some(selector) = podutil::service_selector(service) else {
        return EndpointsPlan::Nothing;
    };
    let tolerate = service
        .spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false);
    let headless = !podutil::is_service_ip_set(service);
    let svc_ports = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_deref())
        .unwrap_or_default();

    let mut entries: Vec<(EndpointAddress, Option<EndpointPort>, bool)> = Vec::new();
    let selector = svcnet_apimachinery::selector::LabelSelector::from_map(selector);
    for pod in pods {
        if pod.metadata.namespace != service.metadata.namespace
            || !podutil::labels_match(&selector, pod)
            || !podutil::should_be_endpoint(pod, tolerate)
        {
            continue;
        }
        let Some(mut addr) = pod_address(service, pod) else {
            continue;
        };
        if podutil::should_set_hostname(pod, service) {
            addr.hostname = pod.spec.as_ref().and_then(|s| s.hostname.clone());
        }
        let ready = tolerate || podutil::is_ready(pod);
        if headless && svc_ports.is_empty() {
            entries.push((addr, None, ready));
            continue;
        }
        for sp in svc_ports {
            let Some(port) = podutil::find_port(pod, sp) else {
                continue;
            };
            let epp = EndpointPort {
                name: sp.name.clone(),
                port,
                protocol: Some(podutil::protocol(sp)),
                app_protocol: sp.app_protocol.clone(),
            };
            entries.push((addr.clone(), Some(epp), ready));
        }
    }
    let (subsets, truncated) = truncate(repack(entries));

    let mut labels = service.metadata.labels.clone().unwrap_or_default();
    if headless {
        labels.insert(LABEL_HEADLESS.into(), String::new());
    } else {
        labels.remove(LABEL_HEADLESS);
    }
    labels.insert(LABEL_SKIP_MIRROR.into(), "true".into());

    let mut annotations = existing
        .and_then(|e| e.metadata.annotations.clone())
        .unwrap_or_default();
    if truncated {
        annotations.insert(ANNOTATION_OVER_CAPACITY.into(), "truncated".into());
    } else {
        annotations.remove(ANNOTATION_OVER_CAPACITY);
    }
    let annotations = (!annotations.is_empty()).then_some(annotations);
    let subsets = (!subsets.is_empty()).then_some(subsets);

    match existing {
        None => EndpointsPlan::Create(Endpoints {
            metadata: ObjectMeta {
                name: service.metadata.name.clone(),
                namespace: service.metadata.namespace.clone(),
                labels: Some(labels),
                annotations,
                ..Default::default()
            },
            subsets,
        }),
        Some(current) => {
            let same_subsets = current.subsets.as_deref().unwrap_or_default()
                == subsets.as_deref().unwrap_or_default();
            let same_labels = current.metadata.labels.clone().unwrap_or_default() == labels;
            let same_annotations = current.metadata.annotations.clone().unwrap_or_default()
                == annotations.clone().unwrap_or_default();
            if same_subsets && same_labels && same_annotations {
                return EndpointsPlan::Nothing;
            }
            let mut ep = current.clone();
            ep.metadata.labels = Some(labels);
            ep.metadata.annotations = annotations;
            ep.subsets = subsets;
            EndpointsPlan::Update(ep)
        }
    }
}

/// Upstream's `podToEndpointAddressForService`: the pod IP of the service's primary family.
fn pod_address(service: &Service, pod: &Pod) -> Option<EndpointAddress> {
    let spec = service.spec.as_ref();
    let want_v6 = match spec
        .and_then(|s| s.ip_families.as_ref())
        .and_then(|f| f.first())
    {
        Some(f) => f == "IPv6",
        None if podutil::is_service_ip_set(service) => {
            is_ipv6(spec.and_then(|s| s.cluster_ip.as_deref()).unwrap_or("")) == Some(true)
        }
        None => podutil::pod_ips(pod).first().and_then(|ip| is_ipv6(ip)) == Some(true),
    };
    let ip = podutil::pod_ips(pod)
        .into_iter()
        .find(|ip| is_ipv6(ip) == Some(want_v6))?;
    Some(EndpointAddress {
        ip,
        node_name: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        target_ref: Some(ObjectReference {
            kind: Some("Pod".into()),
            namespace: pod.metadata.namespace.clone(),
            name: pod.metadata.name.clone(),
            uid: pod.metadata.uid.clone(),
            ..Default::default()
        }),
        hostname: None,
    })
}

type AddrKey = (String, String);
type PortTuple = (String, i32, String, String);

fn addr_key(a: &EndpointAddress) -> AddrKey {
    let uid = a
        .target_ref
        .as_ref()
        .and_then(|t| t.uid.clone())
        .unwrap_or_default();
    (a.ip.clone(), uid)
}

fn port_tuple(p: &EndpointPort) -> PortTuple {
    (
        p.name.clone().unwrap_or_default(),
        p.port,
        p.protocol.clone().unwrap_or_default(),
        p.app_protocol.clone().unwrap_or_default(),
    )
}

/// Upstream's `RepackSubsets` + `SortSubsets`: every address goes to the subset of its exact
/// port set; an address ready anywhere is ready; addresses sorted by IP then UID, ports by
/// name, subsets by their ports.
fn repack(entries: Vec<(EndpointAddress, Option<EndpointPort>, bool)>) -> Vec<EndpointSubset> {
    let mut by_addr: BTreeMap<AddrKey, (EndpointAddress, bool, BTreeMap<PortTuple, EndpointPort>)> =
        BTreeMap::new();
    for (addr, port, ready) in entries {
        let e = by_addr
            .entry(addr_key(&addr))
            .or_insert_with(|| (addr, false, BTreeMap::new()));
        e.1 |= ready;
        if let Some(p) = port {
            e.2.insert(port_tuple(&p), p);
        }
    }
    let mut by_ports: BTreeMap<Vec<PortTuple>, EndpointSubset> = BTreeMap::new();
    for (addr, ready, ports) in by_addr.into_values() {
        let key: Vec<PortTuple> = ports.keys().cloned().collect();
        let subset = by_ports.entry(key).or_insert_with(|| EndpointSubset {
            ports: (!ports.is_empty()).then(|| ports.into_values().collect()),
            ..Default::default()
        });
        let list = if ready {
            &mut subset.addresses
        } else {
            &mut subset.not_ready_addresses
        };
        list.get_or_insert_with(Vec::new).push(addr);
    }
    by_ports.into_values().collect()
}

/// Upstream's `truncateEndpoints`: keep at most [`MAX_ENDPOINTS_ADDRESSES`], ready ones first,
/// spreading the cut across subsets in proportion to their size.
fn truncate(mut subsets: Vec<EndpointSubset>) -> (Vec<EndpointSubset>, bool) {
    let len = |v: &Option<Vec<EndpointAddress>>| v.as_ref().map_or(0, Vec::len);
    let total_ready: usize = subsets.iter().map(|s| len(&s.addresses)).sum();
    let total_not_ready: usize = subsets.iter().map(|s| len(&s.not_ready_addresses)).sum();
    if total_ready + total_not_ready <= MAX_ENDPOINTS_ADDRESSES {
        return (subsets, false);
    }
    let truncate_ready = total_ready > MAX_ENDPOINTS_ADDRESSES;
    let (max, num_total) = if truncate_ready {
        (MAX_ENDPOINTS_ADDRESSES, total_ready)
    } else {
        (MAX_ENDPOINTS_ADDRESSES - total_ready, total_not_ready)
    };
    let mut can_add = max;
    for subset in &mut subsets {
        let in_subset = if truncate_ready {
            len(&subset.addresses)
        } else {
            len(&subset.not_ready_addresses)
        };
        let share = (in_subset * max).div_ceil(num_total).min(can_add);
        if truncate_ready {
            if let Some(a) = subset.addresses.as_mut() {
                a.truncate(share);
            }
            subset.not_ready_addresses = None;
            can_add -= len(&subset.addresses);
        } else {
            if let Some(a) = subset.not_ready_addresses.as_mut() {
                a.truncate(share);
            }
            can_add -= len(&subset.not_ready_addresses);
        }
    }
    subsets.retain(|s| len(&s.addresses) + len(&s.not_ready_addresses) > 0);
    for s in &mut subsets {
        if s.not_ready_addresses.as_ref().is_some_and(Vec::is_empty) {
            s.not_ready_addresses = None;
        }
    }
    (subsets, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::*;
    use expect_test::expect;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    fn render(plan: &EndpointsPlan) -> String {
        let ep = match plan {
            EndpointsPlan::Create(e) => e,
            EndpointsPlan::Update(e) => e,
            other => return format!("{other:?}\n"),
        };
        let mut out = String::new();
        for s in ep.subsets.iter().flatten() {
            let ports: Vec<String> = s
                .ports
                .iter()
                .flatten()
                .map(|p| format!("{}:{}", p.name.as_deref().unwrap_or(""), p.port))
                .collect();
            out += &format!("subset ports=[{}]\n", ports.join(","));
            for (kind, list) in [
                ("ready", &s.addresses),
                ("notready", &s.not_ready_addresses),
            ] {
                for a in list.iter().flatten() {
                    out += &format!(
                        "  {kind} {} node={} host={} pod={}\n",
                        a.ip,
                        a.node_name.as_deref().unwrap_or("-"),
                        a.hostname.as_deref().unwrap_or("-"),
                        a.target_ref
                            .as_ref()
                            .and_then(|t| t.name.as_deref())
                            .unwrap_or("-")
                    );
                }
            }
        }
        out
    }

    fn run(svc: &Service, pods: &[Pod], existing: Option<&Endpoints>) -> EndpointsPlan {
        let pods: Vec<&Pod> = pods.iter().collect();
        plan(svc, &pods, existing)
    }

    #[test]
    fn ready_not_ready_and_ports() {
        let svc = service("default", "web", |s| {
            s.ports(&[
                ("http", 80, IntOrString::String("web".into())),
                ("metrics", 9100, IntOrString::Int(9100)),
            ])
            .headless();
        });
        let pods = [
            pod("default", "b", |p| {
                p.ip("10.244.0.20").container_port("web", 8080);
            }),
            pod("default", "a", |p| {
                p.ip("10.244.0.3")
                    .container_port("web", 8080)
                    .ready(false)
                    .hostname("a", "web");
            }),
            pod("default", "c", |p| {
                p.ip("10.244.0.4").container_port("web", 9090);
            }),
            pod("default", "d", |p| {
                p.ip("10.244.0.5").container_port("web", 8080).deleting();
            }),
            pod("default", "e", |p| {
                p.ip("10.244.0.6").phase("Failed");
            }),
        ];
        let p = run(&svc, &pods, None);
        expect![[r#"
            subset ports=[http:8080,metrics:9100]
              ready 10.244.0.20 node=node-a host=- pod=b
              notready 10.244.0.3 node=node-a host=a pod=a
            subset ports=[http:9090,metrics:9100]
              ready 10.244.0.4 node=node-a host=- pod=c
        "#]]
        .assert_eq(&render(&p));
        let EndpointsPlan::Create(ep) = &p else {
            panic!("{p:?}")
        };
        let labels = ep.metadata.labels.clone().unwrap();
        assert_eq!(labels.get(LABEL_HEADLESS).map(String::as_str), Some(""));
        assert_eq!(
            labels.get(LABEL_SKIP_MIRROR).map(String::as_str),
            Some("true")
        );
        assert_eq!(ep.metadata.name.as_deref(), Some("web"));
        // Applying it and planning again changes nothing.
        let mut stored = ep.clone();
        stored.metadata.resource_version = Some("7".into());
        assert_eq!(run(&svc, &pods, Some(&stored)), EndpointsPlan::Nothing);
        // A pod turning unready moves it, as an update carrying the resourceVersion.
        let mut pods2 = pods.clone();
        pods2[0].ready(false);
        let EndpointsPlan::Update(up) = run(&svc, &pods2, Some(&stored)) else {
            panic!()
        };
        assert_eq!(up.metadata.resource_version.as_deref(), Some("7"));
        assert!(up.subsets.unwrap()[0].addresses.is_none());
    }

    #[test]
    fn publish_not_ready_makes_everything_ready() {
        let svc = service("default", "web", |s| {
            s.publish_not_ready();
        });
        let pods = [
            pod("default", "a", |p| {
                p.ip("10.244.0.3").ready(false);
            }),
            pod("default", "b", |p| {
                p.ip("10.244.0.4").deleting();
            }),
        ];
        expect![[r#"
            subset ports=[http:8080]
              ready 10.244.0.3 node=node-a host=- pod=a
              ready 10.244.0.4 node=node-a host=- pod=b
        "#]]
        .assert_eq(&render(&run(&svc, &pods, None)));
    }

    #[test]
    fn primary_family_only() {
        let svc = service("default", "web", |s| {
            s.families(&["IPv6", "IPv4"]);
        });
        let pods = [pod("default", "a", |p| {
            p.ips(&["10.244.0.3", "fd00::3"]);
        })];
        expect![[r#"
            subset ports=[http:8080]
              ready fd00::3 node=node-a host=- pod=a
        "#]]
        .assert_eq(&render(&run(&svc, &pods, None)));
    }

    #[test]
    fn selectorless_and_deleted_services() {
        let svc = service("default", "mysql", |s| {
            s.no_selector();
        });
        let user = Endpoints {
            metadata: meta("default", "mysql"),
            subsets: None,
        };
        assert_eq!(run(&svc, &[], Some(&user)), EndpointsPlan::Nothing);
        let delete = EndpointsPlan::Delete {
            namespace: "default".into(),
            name: "mysql".into(),
        };
        // Written before their service exists: the user's, kept.
        assert_eq!(
            plan_without_service(Some(&user), false),
            EndpointsPlan::Nothing
        );
        // Their service was deleted: they go with it, as upstream.
        assert_eq!(plan_without_service(Some(&user), true), delete);
        // Written by this controller and left over: they go.
        let mut ours = user.clone();
        ours.metadata.labels = Some([(LABEL_SKIP_MIRROR.to_string(), "true".to_string())].into());
        assert_eq!(plan_without_service(Some(&ours), false), delete);
        assert_eq!(plan_without_service(None, true), EndpointsPlan::Nothing);
    }

    #[test]
    fn truncated_at_1000() {
        let svc = service("default", "web", |_| {});
        let pods: Vec<Pod> = (0..1200)
            .map(|i| {
                pod("default", &format!("p{i}"), |p| {
                    p.ip(&format!("10.244.{}.{}", i / 250, i % 250 + 1))
                        .ready(i % 3 != 0);
                })
            })
            .collect();
        let EndpointsPlan::Create(ep) = run(&svc, &pods, None) else {
            panic!()
        };
        let s = &ep.subsets.as_ref().unwrap()[0];
        // 800 ready pods all kept; the 400 not-ready cut to 200.
        assert_eq!(s.addresses.as_ref().unwrap().len(), 800);
        assert_eq!(s.not_ready_addresses.as_ref().unwrap().len(), 200);
        assert_eq!(
            ep.metadata
                .annotations
                .as_ref()
                .unwrap()
                .get(ANNOTATION_OVER_CAPACITY)
                .map(String::as_str),
            Some("truncated")
        );
        // More than 1000 ready: not-ready dropped entirely.
        let all_ready: Vec<Pod> = pods
            .into_iter()
            .map(|mut p| {
                p.ready(true);
                p
            })
            .collect();
        let EndpointsPlan::Create(ep) = run(&svc, &all_ready, None) else {
            panic!()
        };
        let s = &ep.subsets.as_ref().unwrap()[0];
        assert_eq!(s.addresses.as_ref().unwrap().len(), 1000);
        assert!(s.not_ready_addresses.is_none());
        // Back under capacity: the annotation is removed.
        let few: Vec<Pod> = all_ready.into_iter().take(10).collect();
        let EndpointsPlan::Update(ep) = run(&svc, &few, Some(&ep)) else {
            panic!()
        };
        assert!(ep.metadata.annotations.is_none());
    }

    #[test]
    fn truncation_is_proportional_across_subsets() {
        let a = EndpointSubset {
            addresses: Some(
                (0..900)
                    .map(|i| EndpointAddress {
                        ip: format!("10.0.0.{i}"),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        };
        let b = EndpointSubset {
            addresses: Some(
                (0..300)
                    .map(|i| EndpointAddress {
                        ip: format!("10.1.0.{i}"),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        };
        let (out, cut) = truncate(vec![a, b]);
        assert!(cut);
        let sizes: Vec<usize> = out
            .iter()
            .map(|s| s.addresses.as_ref().unwrap().len())
            .collect();
        assert_eq!(sizes, vec![750, 250]);
    }
}

//! Test fixture builders: `service("ns", "name", |s| ...)`, `pod("ns", "name", |p| ...)`,
//! `node("name", Some("zone"))`, with small mutator traits so tables stay one line per case.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, Node, Pod, PodCondition, PodIP, PodSpec, PodStatus, Service,
    ServicePort, ServiceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;

pub(crate) fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub(crate) fn meta(ns: &str, name: &str) -> ObjectMeta {
    ObjectMeta {
        namespace: Some(ns.into()),
        name: Some(name.into()),
        uid: Some(format!("uid-{name}")),
        ..Default::default()
    }
}

/// A ClusterIP service `10.96.0.5`, IPv4, selector `app=<name>`, port `http` 80 → 8080.
pub(crate) fn service(ns: &str, name: &str, f: impl FnOnce(&mut Service)) -> Service {
    let mut s = Service {
        metadata: meta(ns, name),
        spec: Some(ServiceSpec {
            selector: Some(map(&[("app", name)])),
            cluster_ip: Some("10.96.0.5".into()),
            cluster_ips: Some(vec!["10.96.0.5".into()]),
            ip_families: Some(vec!["IPv4".into()]),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: 80,
                target_port: Some(IntOrString::Int(8080)),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    };
    f(&mut s);
    s
}

pub(crate) trait ServiceExt {
    fn spec_mut(&mut self) -> &mut ServiceSpec;
    fn headless(&mut self) -> &mut Self {
        let spec = self.spec_mut();
        spec.cluster_ip = Some("None".into());
        spec.cluster_ips = Some(vec!["None".into()]);
        self
    }
    fn families(&mut self, f: &[&str]) -> &mut Self {
        self.spec_mut().ip_families = Some(f.iter().map(|s| s.to_string()).collect());
        self
    }
    fn publish_not_ready(&mut self) -> &mut Self {
        self.spec_mut().publish_not_ready_addresses = Some(true);
        self
    }
    fn no_selector(&mut self) -> &mut Self {
        self.spec_mut().selector = None;
        self
    }
    /// Replace the ports with `(name, port, targetPort)` triples (TCP).
    fn ports(&mut self, ports: &[(&str, i32, IntOrString)]) -> &mut Self {
        self.spec_mut().ports = Some(
            ports
                .iter()
                .map(|(n, p, t)| ServicePort {
                    name: Some(n.to_string()),
                    port: *p,
                    target_port: Some(t.clone()),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                })
                .collect(),
        );
        self
    }
}

impl ServiceExt for Service {
    fn spec_mut(&mut self) -> &mut ServiceSpec {
        self.spec.get_or_insert_with(Default::default)
    }
}

/// A Running, Ready pod labelled `app=web` on `node-a` with IP `10.244.0.<n>` where n is
/// derived from nothing: callers set the IP with `.ip(...)`.
pub(crate) fn pod(ns: &str, name: &str, f: impl FnOnce(&mut Pod)) -> Pod {
    let mut p = Pod {
        metadata: ObjectMeta {
            labels: Some(map(&[("app", "web")])),
            creation_timestamp: Some(Time(Timestamp::from_second(1_700_000_000).unwrap())),
            ..meta(ns, name)
        },
        spec: Some(PodSpec {
            node_name: Some("node-a".into()),
            containers: vec![Container {
                name: "main".into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    };
    f(&mut p);
    p
}

pub(crate) trait PodExt {
    fn pod(&mut self) -> &mut Pod;
    fn ip(&mut self, ip: &str) -> &mut Self {
        self.ips(&[ip])
    }
    fn ips(&mut self, ips: &[&str]) -> &mut Self {
        let st = self.pod().status.get_or_insert_with(Default::default);
        st.pod_ip = ips.first().map(|s| s.to_string());
        st.pod_ips = Some(ips.iter().map(|s| PodIP { ip: s.to_string() }).collect());
        self
    }
    fn ready(&mut self, ready: bool) -> &mut Self {
        let st = self.pod().status.get_or_insert_with(Default::default);
        st.conditions = Some(vec![PodCondition {
            type_: "Ready".into(),
            status: if ready { "True" } else { "False" }.into(),
            ..Default::default()
        }]);
        self
    }
    fn phase(&mut self, phase: &str) -> &mut Self {
        self.pod().status.get_or_insert_with(Default::default).phase = Some(phase.into());
        self
    }
    fn deleting(&mut self) -> &mut Self {
        self.pod().metadata.deletion_timestamp =
            Some(Time(Timestamp::from_second(1_700_000_100).unwrap()));
        self
    }
    fn labels(&mut self, l: &[(&str, &str)]) -> &mut Self {
        self.pod().metadata.labels = Some(map(l));
        self
    }
    fn node(&mut self, n: &str) -> &mut Self {
        self.pod()
            .spec
            .get_or_insert_with(Default::default)
            .node_name = Some(n.into());
        self
    }
    fn hostname(&mut self, h: &str, sub: &str) -> &mut Self {
        let spec = self.pod().spec.get_or_insert_with(Default::default);
        spec.hostname = Some(h.into());
        spec.subdomain = Some(sub.into());
        self
    }
    fn container_port(&mut self, name: &str, port: i32) -> &mut Self {
        let spec = self.pod().spec.get_or_insert_with(Default::default);
        if spec.containers.is_empty() {
            spec.containers.push(Container::default());
        }
        spec.containers[0]
            .ports
            .get_or_insert_with(Vec::new)
            .push(ContainerPort {
                name: Some(name.into()),
                container_port: port,
                protocol: Some("TCP".into()),
                ..Default::default()
            });
        self
    }
    fn created(&mut self, secs: i64) -> &mut Self {
        self.pod().metadata.creation_timestamp =
            Some(Time(Timestamp::from_second(1_700_000_000 + secs).unwrap()));
        self
    }
}

impl PodExt for Pod {
    fn pod(&mut self) -> &mut Pod {
        self
    }
}

/// A selector `app=<app>` and a pod template with that label and one container `c` running
/// `image`: the shape every workload fixture starts from.
pub(crate) fn workload_parts(
    app: &str,
    image: &str,
) -> (
    k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    k8s_openapi::api::core::v1::PodTemplateSpec,
) {
    let selector = k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
        match_labels: Some(map(&[("app", app)])),
        ..Default::default()
    };
    let template = k8s_openapi::api::core::v1::PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(map(&[("app", app)])),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                image: Some(image.into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
    };
    (selector, template)
}

pub(crate) fn node(name: &str, zone: Option<&str>) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: zone.map(|z| map(&[(crate::LABEL_TOPOLOGY_ZONE, z)])),
            ..Default::default()
        },
        ..Default::default()
    }
}

//! The per-service load-balancing algorithm: the `svcnet.io/lb-algorithm` annotation, else the
//! proxy-wide `--scheduler` ([`crate::CoreConfig::scheduler`]), else the dataplane's default.
//!
//! The choice travels in the desired state ([`crate::DesiredServicePort::lb_algorithm`]) so
//! every dataplane sees it; each resolves it against what it can express with
//! `svcnet_lb::resolve` and reports a fallback. A misspelt annotation never makes a service
//! unreachable: [`service_info`](crate::service::service_info) treats it as absent, and the
//! runtime reports it through [`annotated_algorithm`] (log and Event).

use k8s_openapi::api::core::v1::Service;
use svcnet_lb::Algorithm;
pub use svcnet_lb::algorithm::ANNOTATION;

use crate::names::NamespacedName;
use crate::service::ServiceError;

/// The algorithm a Service's annotation asks for: `Ok(None)` without the annotation, an error
/// naming the service and the annotation for a value that is no algorithm.
pub fn annotated_algorithm(svc: &Service) -> Result<Option<Algorithm>, ServiceError> {
    let Some(raw) = svc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION))
    else {
        return Ok(None);
    };
    raw.parse::<Algorithm>()
        .map(Some)
        .map_err(|e| ServiceError {
            service: NamespacedName::new(
                svc.metadata.namespace.clone().unwrap_or_default(),
                svc.metadata.name.clone().unwrap_or_default(),
            ),
            field: format!("metadata.annotations[{ANNOTATION}]"),
            message: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::service;

    #[test]
    fn parses_the_annotation_and_names_the_field_when_wrong() {
        let mut svc = service("default", "web", |s| {
            s.cluster_ip(&["10.96.0.10"]).port("http", "TCP", 80);
        });
        assert_eq!(annotated_algorithm(&svc), Ok(None));
        let set = |svc: &mut Service, v: &str| {
            svc.metadata.annotations = Some(
                [(ANNOTATION.to_string(), v.to_string())]
                    .into_iter()
                    .collect(),
            );
        };
        set(&mut svc, "maglev");
        assert_eq!(annotated_algorithm(&svc), Ok(Some(Algorithm::Maglev)));
        set(&mut svc, "fastest");
        let e = annotated_algorithm(&svc).unwrap_err();
        assert_eq!(
            e.to_string(),
            "service default/web: field metadata.annotations[svcnet.io/lb-algorithm]: \"fastest\" \
             is not a load-balancing algorithm (expected one of rr, wrr, random, lc, sed, nq, sh, \
             dh, maglev)"
        );
    }

    #[test]
    fn desired_state_carries_annotation_else_scheduler() {
        use crate::names::{IpFamily, Protocol, ServicePortName};
        use crate::{CoreConfig, ProxyState};
        let config = CoreConfig {
            scheduler: Some(Algorithm::LeastConnection),
            ..Default::default()
        };
        let mut state = ProxyState::new(config);
        let mut annotated = service("default", "a", |s| {
            s.cluster_ip(&["10.96.0.10"]).port("", "TCP", 80);
        });
        annotated.metadata.annotations = Some(
            [(ANNOTATION.to_string(), "maglev".to_string())]
                .into_iter()
                .collect(),
        );
        let mut misspelt = service("default", "b", |s| {
            s.cluster_ip(&["10.96.0.11"]).port("", "TCP", 80);
        });
        misspelt.metadata.annotations = Some(
            [(ANNOTATION.to_string(), "magelv".to_string())]
                .into_iter()
                .collect(),
        );
        state.update_service(&annotated).unwrap();
        state.update_service(&misspelt).unwrap();
        let d = state.desired(IpFamily::V4);
        let alg = |name: &str| {
            d.services[&ServicePortName::new("default", name, "", Protocol::Tcp)].lb_algorithm
        };
        assert_eq!(alg("a"), Some(Algorithm::Maglev));
        // A bad annotation keeps the service programmed with the proxy-wide choice.
        assert_eq!(alg("b"), Some(Algorithm::LeastConnection));
        assert_eq!(
            ProxyState::new(CoreConfig::default())
                .node_state(IpFamily::V4)
                .scheduler,
            None
        );
    }
}

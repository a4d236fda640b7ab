//! Reporting load-balancing choices the proxy could not honour: an algorithm the dataplane
//! cannot express (it falls back to random) and a misspelt `svcnet.io/lb-algorithm`
//! annotation (the service keeps the proxy-wide choice). Each is logged as a warning and
//! recorded as a Kubernetes Warning Event on the Service (reason
//! [`svcnet_lb::capability::EVENT_REASON`]), once per service and change: [`Notices`] remembers
//! what was reported per service and only lets a new or different message through, and forgets
//! a service's messages when they stop applying (so a later recurrence is reported again).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use svcnet_lb::Fallback;
use svcnet_proxy::{NamespacedName, ServicePortName};
use tokio::sync::mpsc;

use crate::dataplane::Scope;

/// One Warning to publish on a Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub service: NamespacedName,
    pub message: String,
}

/// Where a message comes from; each source is replaced independently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Source {
    Fallback,
    Annotation,
}

/// What was reported per service (pure; the sync loop owns one).
#[derive(Debug, Default)]
pub struct Notices {
    reported: BTreeMap<(NamespacedName, Source), BTreeSet<String>>,
}

impl Notices {
    fn replace(
        &mut self,
        service: &NamespacedName,
        source: Source,
        messages: BTreeSet<String>,
    ) -> Vec<Notice> {
        let key = (service.clone(), source);
        let before = self.reported.remove(&key).unwrap_or_default();
        let new: Vec<Notice> = messages
            .difference(&before)
            .map(|m| Notice {
                service: service.clone(),
                message: m.clone(),
            })
            .collect();
        if !messages.is_empty() {
            self.reported.insert(key, messages);
        }
        new
    }

    /// A sync's fallbacks for the services in `scope`: returns those not reported yet.
    pub fn fallbacks(
        &mut self,
        scope: &Scope,
        fallbacks: &[(ServicePortName, Fallback)],
    ) -> Vec<Notice> {
        let mut by_service: BTreeMap<NamespacedName, BTreeSet<String>> = BTreeMap::new();
        for (spn, f) in fallbacks {
            by_service
                .entry(spn.service.clone())
                .or_default()
                .insert(format!("service port {spn}: {f}"));
        }
        let covered: BTreeSet<NamespacedName> = match scope {
            Scope::All => self
                .reported
                .keys()
                .filter(|(_, s)| *s == Source::Fallback)
                .map(|(n, _)| n.clone())
                .chain(by_service.keys().cloned())
                .collect(),
            Scope::Services(s) => s.iter().chain(by_service.keys()).cloned().collect(),
        };
        let mut out = Vec::new();
        for name in covered {
            let msgs = by_service.remove(&name).unwrap_or_default();
            out.extend(self.replace(&name, Source::Fallback, msgs));
        }
        out
    }

    /// A service's annotation was (re)read: `error` is the parse error, if any.
    pub fn annotation(&mut self, service: &NamespacedName, error: Option<String>) -> Vec<Notice> {
        let msgs = error
            .map(|e| format!("{e}; the service uses the proxy-wide algorithm instead"))
            .into_iter()
            .collect();
        self.replace(service, Source::Annotation, msgs)
    }

    /// The service is gone: forget everything reported about it.
    pub fn forget(&mut self, service: &NamespacedName) {
        self.reported.retain(|(n, _), _| n != service);
    }
}

/// Publishes notices as Warning Events until the sender side closes.
pub async fn publish(mut rx: mpsc::UnboundedReceiver<Notice>, recorder: Option<Recorder>) {
    while let Some(n) = rx.recv().await {
        let Some(r) = &recorder else { continue };
        let event = Event {
            type_: EventType::Warning,
            reason: svcnet_lb::EVENT_REASON.into(),
            note: Some(n.message.clone()),
            action: "SyncProxyRules".into(),
            secondary: None,
        };
        let regarding = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Service".into()),
            namespace: Some(n.service.namespace.clone()),
            name: Some(n.service.name.clone()),
            ..Default::default()
        };
        if let Err(e) = r.publish(&event, &regarding).await {
            tracing::debug!(service = %n.service, "publishing the {} event: {e}", svcnet_lb::EVENT_REASON);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use svcnet_lb::{Algorithm, Dataplane, resolve};
    use svcnet_proxy::Protocol;

    fn lc() -> Fallback {
        resolve(Some(Algorithm::LeastConnection), Dataplane::Nftables)
            .fallback
            .unwrap()
    }

    fn spn(name: &str, port: &str) -> ServicePortName {
        ServicePortName::new("default", name, port, Protocol::Tcp)
    }

    #[test]
    fn each_fallback_is_reported_once_per_service_and_change() {
        let mut n = Notices::default();
        let web = NamespacedName::new("default", "web");
        let first = n.fallbacks(&Scope::All, &[(spn("web", "http"), lc())]);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].service, web);
        assert!(
            first[0]
                .message
                .starts_with("service port default/web/tcp/http: load-balancing algorithm lc"),
            "{}",
            first[0].message
        );
        // The same fallback again (a resync, an endpoint change): nothing new.
        assert!(
            n.fallbacks(&Scope::All, &[(spn("web", "http"), lc())])
                .is_empty()
        );
        let only_web = Scope::Services([web.clone()].into());
        assert!(
            n.fallbacks(&only_web, &[(spn("web", "http"), lc())])
                .is_empty()
        );
        // A partial sync of another service keeps web's memory.
        let other = Scope::Services([NamespacedName::new("default", "db")].into());
        assert!(n.fallbacks(&other, &[]).is_empty());
        assert!(
            n.fallbacks(&only_web, &[(spn("web", "http"), lc())])
                .is_empty()
        );
        // The fallback goes away (annotation fixed), then comes back: reported again.
        assert!(n.fallbacks(&only_web, &[]).is_empty());
        assert_eq!(
            n.fallbacks(&only_web, &[(spn("web", "http"), lc())]).len(),
            1
        );
        // A second port of the same service is a different message.
        let two = [(spn("web", "http"), lc()), (spn("web", "https"), lc())];
        assert_eq!(n.fallbacks(&Scope::All, &two).len(), 1);
        // A full sync without it forgets it.
        assert!(n.fallbacks(&Scope::All, &[]).is_empty());
        assert_eq!(n.fallbacks(&Scope::All, &two).len(), 2);
    }

    #[test]
    fn annotation_errors_are_reported_once_until_fixed() {
        let mut n = Notices::default();
        let web = NamespacedName::new("default", "web");
        let err = || Some("service default/web: field x: bad".to_string());
        assert_eq!(n.annotation(&web, err()).len(), 1);
        assert!(n.annotation(&web, err()).is_empty());
        assert!(n.annotation(&web, None).is_empty());
        let again = n.annotation(&web, err());
        assert_eq!(again.len(), 1);
        assert!(
            again[0]
                .message
                .ends_with("uses the proxy-wide algorithm instead")
        );
        n.forget(&web);
        assert_eq!(n.annotation(&web, err()).len(), 1);
    }
}

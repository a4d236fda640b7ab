//! The one-node scheduler's pure core: every pod without `spec.nodeName` is bound to the local
//! node. Pods that name another node are left alone, so tests can create pods "on other nodes"
//! and set their status by hand, the way kwok does. Pods asking for another scheduler
//! (`spec.schedulerName` other than `default-scheduler`), terminal pods and pods being deleted
//! are skipped.

use k8s_openapi::api::core::v1::Pod;

use crate::podutil;

/// Bind `namespace/name` to `node`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub namespace: String,
    pub name: String,
    pub node: String,
}

/// The bindings to make, in pod order.
pub fn plan(pods: &[&Pod], node_name: &str) -> Vec<Binding> {
    pods.iter()
        .filter(|p| {
            let spec = p.spec.as_ref();
            let unbound = spec
                .and_then(|s| s.node_name.as_deref())
                .is_none_or(str::is_empty);
            let ours = spec
                .and_then(|s| s.scheduler_name.as_deref())
                .is_none_or(|s| s.is_empty() || s == "default-scheduler");
            unbound && ours && podutil::is_active(p)
        })
        .map(|p| Binding {
            namespace: p.metadata.namespace.clone().unwrap_or_default(),
            name: p.metadata.name.clone().unwrap_or_default(),
            node: node_name.to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::*;

    #[test]
    fn binds_only_unscheduled_pods() {
        let unbound = pod("default", "a", |p| {
            p.spec.as_mut().unwrap().node_name = None;
        });
        let elsewhere = pod("default", "b", |p| {
            p.node("other-node");
        });
        let other_sched = pod("default", "c", |p| {
            let s = p.spec.as_mut().unwrap();
            s.node_name = None;
            s.scheduler_name = Some("my-scheduler".into());
        });
        let done = pod("default", "d", |p| {
            p.spec.as_mut().unwrap().node_name = Some(String::new());
            p.phase("Succeeded");
        });
        let empty = pod("kube-system", "e", |p| {
            p.spec.as_mut().unwrap().node_name = Some(String::new());
        });
        let got = plan(
            &[&unbound, &elsewhere, &other_sched, &done, &empty],
            "node-1",
        );
        assert_eq!(
            got,
            vec![
                Binding {
                    namespace: "default".into(),
                    name: "a".into(),
                    node: "node-1".into()
                },
                Binding {
                    namespace: "kube-system".into(),
                    name: "e".into(),
                    node: "node-1".into()
                },
            ]
        );
    }
}

//! The scheduler's pure core: every pod without `spec.nodeName` is bound to one of the local
//! nodes, in turn (round-robin from a turn counter the runtime keeps), so the pods of a
//! Deployment spread over the embedded cluster's nodes. Pods that name another node are left alone, so tests can create pods "on other nodes"
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

/// The bindings to make, in pod order: the `i`-th pod to bind goes to
/// `nodes[(turn + i) % nodes.len()]`. No nodes, no bindings.
pub fn plan(pods: &[&Pod], nodes: &[String], turn: usize) -> Vec<Binding> {
    if nodes.is_empty() {
        return Vec::new();
    }
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
        .enumerate()
        .map(|(i, p)| Binding {
            namespace: p.metadata.namespace.clone().unwrap_or_default(),
            name: p.metadata.name.clone().unwrap_or_default(),
            node: nodes[(turn + i) % nodes.len()].clone(),
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
            &["node-1".to_string()],
            0,
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

    #[test]
    fn spreads_pods_over_the_nodes_in_turn() {
        let pods: Vec<Pod> = ["a", "b", "c"]
            .iter()
            .map(|name| {
                pod("default", name, |p| {
                    p.spec.as_mut().unwrap().node_name = None
                })
            })
            .collect();
        let refs: Vec<&Pod> = pods.iter().collect();
        let nodes = ["n1".to_string(), "n2".to_string()];
        let placed: Vec<String> = plan(&refs, &nodes, 1).into_iter().map(|b| b.node).collect();
        assert_eq!(placed, ["n2", "n1", "n2"]);
        assert!(plan(&refs, &[], 0).is_empty());
    }
}

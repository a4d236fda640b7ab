//! DaemonSet → one pod on every node that should run it, as upstream's DaemonSet controller:
//!
//! - a node should run the pod when it matches the template's `nodeSelector` and required node
//!   affinity (`matchExpressions` on labels, `matchFields` on `metadata.name`) and every
//!   `NoSchedule`/`NoExecute` taint is tolerated, counting the tolerations every daemon pod gets
//!   (`not-ready` and `unreachable` NoExecute; `disk-pressure`, `memory-pressure`,
//!   `pid-pressure`, `unschedulable` NoSchedule; `network-unavailable` with `hostNetwork`);
//! - a pod is created bound to its node (`spec.nodeName`, with upstream's required node
//!   affinity on `metadata.name`), named `<ds>-<random>` by the API server, labelled
//!   `controller-revision-hash` (the hash of its ControllerRevision, see
//!   [`super::history`], so `kubectl rollout history/undo ds` work) and
//!   `pod-template-generation`;
//! - a node that should not run it loses its pods; a node with more than one keeps the
//!   oldest; a failed pod is deleted (and recreated on the next pass); a node whose pod is
//!   terminating waits for it to go;
//! - `RollingUpdate` (default): pods of an older template are deleted, unavailable ones first
//!   and freely, available ones only while fewer than `maxUnavailable` (default 1, a
//!   percentage rounds up) of the nodes lack an available pod; the next pass creates their
//!   replacements. `OnDelete` leaves that to the user. `maxSurge` is not served (upstream's
//!   surge mode runs old and new pod side by side): a surge is treated as 0.
//!
//! Not done: adopting orphans that match the selector, `minReadySeconds` backed by a requeue.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{
    Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSpec,
    Taint, Toleration,
};
use k8s_openapi::jiff::Timestamp;

use super::{PodPlan, WorkloadError, is_available, owned, pod_from_template, scaled_value};
use crate::endpointslice::controller_ref;
use crate::podutil;
use svcnet_apimachinery::selector::LabelSelector;

pub const LABEL_REVISION: &str = "controller-revision-hash";
pub const LABEL_TEMPLATE_GENERATION: &str = "pod-template-generation";

/// The tolerations every daemon pod gets (upstream's `AddOrUpdateDaemonPodTolerations`).
fn daemon_tolerations(host_network: bool) -> Vec<Toleration> {
    let t = |key: &str, effect: &str| Toleration {
        key: Some(key.into()),
        operator: Some("Exists".into()),
        effect: Some(effect.into()),
        ..Default::default()
    };
    let mut out = vec![
        t("node.kubernetes.io/not-ready", "NoExecute"),
        t("node.kubernetes.io/unreachable", "NoExecute"),
        t("node.kubernetes.io/disk-pressure", "NoSchedule"),
        t("node.kubernetes.io/memory-pressure", "NoSchedule"),
        t("node.kubernetes.io/pid-pressure", "NoSchedule"),
        t("node.kubernetes.io/unschedulable", "NoSchedule"),
    ];
    if host_network {
        out.push(t("node.kubernetes.io/network-unavailable", "NoSchedule"));
    }
    out
}

/// Whether `tol` tolerates `taint` (upstream's `ToleratesTaint`).
fn tolerates(tol: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = tol.effect.as_deref().filter(|e| !e.is_empty())
        && effect != taint.effect
    {
        return false;
    }
    let key = tol.key.as_deref().unwrap_or("");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match tol.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => {
            !key.is_empty()
                && tol.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
        _ => false,
    }
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let int = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => {
            matches!((value.and_then(int), values.first().and_then(|x| int(x))), (Some(v), Some(x)) if v > x)
        }
        "Lt" => {
            matches!((value.and_then(int), values.first().and_then(|x| int(x))), (Some(v), Some(x)) if v < x)
        }
        _ => false,
    }
}

/// A required node selector: any term matches, a term is all its requirements; an empty term
/// matches nothing (upstream).
fn node_selector_matches(sel: &NodeSelector, node: &Node) -> bool {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let name = node.metadata.name.as_deref();
    sel.node_selector_terms
        .iter()
        .any(|term: &NodeSelectorTerm| {
            let exprs = term.match_expressions.as_deref().unwrap_or_default();
            let fields = term.match_fields.as_deref().unwrap_or_default();
            if exprs.is_empty() && fields.is_empty() {
                return false;
            }
            exprs
                .iter()
                .all(|r| requirement_matches(r, labels.get(&r.key).map(String::as_str)))
                && fields.iter().all(|r| {
                    let v = if r.key == "metadata.name" { name } else { None };
                    requirement_matches(r, v)
                })
        })
}

/// Whether a daemon pod of `spec` should run on `node` (upstream's `NodeShouldRunDaemonPod`
/// without resources, which a process runtime does not account).
pub fn should_run(spec: &PodSpec, node: &Node) -> bool {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    if let Some(sel) = &spec.node_selector
        && sel.iter().any(|(k, v)| labels.get(k) != Some(v))
    {
        return false;
    }
    if let Some(req) = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        && !node_selector_matches(req, node)
    {
        return false;
    }
    let mut tolerations = spec.tolerations.clone().unwrap_or_default();
    tolerations.extend(daemon_tolerations(spec.host_network.unwrap_or(false)));
    node.spec
        .iter()
        .flat_map(|s| s.taints.iter().flatten())
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .all(|taint| tolerations.iter().any(|tol| tolerates(tol, taint)))
}

/// Computes the plan for `ds` over `nodes`; `pods` may be every pod of its namespace.
pub fn plan(
    ds: &DaemonSet,
    nodes: &[&Node],
    pods: &[&Pod],
    now: Timestamp,
) -> Result<PodPlan<DaemonSetStatus>, WorkloadError> {
    let ns = ds.metadata.namespace.clone().unwrap_or_default();
    let name = ds.metadata.name.clone().unwrap_or_default();
    let spec = ds.spec.clone().unwrap_or_default();
    let template_labels = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    match LabelSelector::from_k8s(&spec.selector).map(|sel| sel.matches(&template_labels)) {
        Err(e) => {
            return Err(WorkloadError::InvalidSelector {
                kind: "DaemonSet",
                namespace: ns,
                name,
                message: e.to_string(),
            });
        }
        Ok(false) => {
            return Err(WorkloadError::TemplateNotSelected {
                kind: "DaemonSet",
                namespace: ns,
                name,
            });
        }
        Ok(true) => {}
    }
    let hash = super::history::revision_hash(&super::history::Owner::daemonset(ds));
    let generation = ds.metadata.generation.unwrap_or(1);
    let pod_spec = spec.template.spec.clone().unwrap_or_default();
    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    let strategy = spec.update_strategy.clone().unwrap_or_default();
    let rolling = strategy.type_.as_deref() != Some("OnDelete");

    let uid = ds.metadata.uid.clone().unwrap_or_default();
    let mut by_node: BTreeMap<String, Vec<&Pod>> = BTreeMap::new();
    for p in owned(pods, &uid, ds.metadata.namespace.as_ref()) {
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        by_node.entry(node).or_default().push(p);
    }
    for list in by_node.values_mut() {
        // Oldest first: the one a node keeps.
        list.sort_by(|a, b| {
            let t = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
            t(a).cmp(&t(b)).then(a.metadata.name.cmp(&b.metadata.name))
        });
    }
    let is_current = |p: &Pod| {
        p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_REVISION))
            == Some(&hash)
    };

    let mut out = PodPlan::default();
    let mut status = DaemonSetStatus {
        observed_generation: Some(generation),
        ..Default::default()
    };
    // Nodes that should run the pod, with the pod they keep (if any, not terminating).
    let mut kept: Vec<(&str, Option<&Pod>)> = Vec::new();
    for node in nodes {
        let node_name = node.metadata.name.as_deref().unwrap_or_default();
        let on_node = by_node.remove(node_name).unwrap_or_default();
        if !should_run(&pod_spec, node) {
            if !on_node.is_empty() {
                status.number_misscheduled += 1;
            }
            out.delete.extend(
                on_node
                    .iter()
                    .filter(|p| !podutil::is_terminating(p))
                    .filter_map(|p| p.metadata.name.clone()),
            );
            continue;
        }
        status.desired_number_scheduled += 1;
        if !on_node.is_empty() {
            status.current_number_scheduled += 1;
        }
        if let Some(first) = on_node.first() {
            if podutil::is_ready(first) {
                status.number_ready += 1;
            }
            if is_available(first, min_ready, now) {
                status.number_available = Some(status.number_available.unwrap_or(0) + 1);
            }
            if is_current(first) {
                status.updated_number_scheduled =
                    Some(status.updated_number_scheduled.unwrap_or(0) + 1);
            }
        }
        let live: Vec<&Pod> = on_node
            .iter()
            .copied()
            .filter(|p| !podutil::is_terminating(p))
            .collect();
        let failed: Vec<&Pod> = live
            .iter()
            .copied()
            .filter(|p| podutil::phase(p) == "Failed")
            .collect();
        if !failed.is_empty() {
            out.delete
                .extend(failed.iter().filter_map(|p| p.metadata.name.clone()));
            kept.push((node_name, None));
            continue;
        }
        if live.is_empty() {
            // A terminating pod still there: wait for it to go.
            if on_node.is_empty() {
                out.create.push(new_pod(ds, node_name, &hash, generation));
            }
            kept.push((node_name, None));
            continue;
        }
        out.delete
            .extend(live[1..].iter().filter_map(|p| p.metadata.name.clone()));
        kept.push((node_name, Some(live[0])));
    }
    // Pods on nodes that are gone.
    out.delete.extend(
        by_node
            .values()
            .flatten()
            .filter(|p| !podutil::is_terminating(p))
            .filter_map(|p| p.metadata.name.clone()),
    );

    if rolling {
        let desired = status.desired_number_scheduled;
        let max_unavailable = scaled_value(
            strategy
                .rolling_update
                .as_ref()
                .and_then(|r| r.max_unavailable.as_ref()),
            0,
            desired,
            true,
        )
        .map_err(|message| WorkloadError::InvalidField {
            kind: "DaemonSet",
            namespace: ns.clone(),
            name: name.clone(),
            field: "spec.updateStrategy.rollingUpdate.maxUnavailable",
            message,
        })?
        .max(1);
        let available = |p: &Pod| is_available(p, min_ready, now);
        let mut unavailable = i32::try_from(
            kept.iter()
                .filter(|(_, p)| !p.is_some_and(available))
                .count(),
        )
        .unwrap_or(i32::MAX);
        // Old pods that are unavailable go at once: deleting them costs nothing.
        for (_, p) in &kept {
            if let Some(p) = p
                && !is_current(p)
                && !available(p)
            {
                out.delete.extend(p.metadata.name.clone());
            }
        }
        for (_, p) in &kept {
            if unavailable >= max_unavailable {
                break;
            }
            if let Some(p) = p
                && !is_current(p)
                && available(p)
            {
                out.delete.extend(p.metadata.name.clone());
                unavailable += 1;
            }
        }
    }
    status.number_unavailable =
        Some(status.desired_number_scheduled - status.number_available.unwrap_or(0))
            .filter(|n| *n > 0);
    if ds.status.as_ref() != Some(&status) {
        out.status = Some(status);
    }
    Ok(out)
}

fn new_pod(ds: &DaemonSet, node: &str, hash: &str, generation: i64) -> Pod {
    let spec = ds.spec.clone().unwrap_or_default();
    let labels: BTreeMap<String, String> = [
        (LABEL_REVISION, hash.to_string()),
        (LABEL_TEMPLATE_GENERATION, generation.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let mut pod = pod_from_template(
        &spec.template,
        ds.metadata.namespace.clone(),
        controller_ref("apps/v1", "DaemonSet", &ds.metadata),
        labels,
    );
    pod.metadata.generate_name = Some(format!(
        "{}-",
        ds.metadata.name.as_deref().unwrap_or_default()
    ));
    let pod_spec = pod.spec.get_or_insert_with(Default::default);
    pod_spec.node_name = Some(node.to_string());
    // Upstream's `ReplaceDaemonSetPodNodeNameNodeAffinity`: the pod names its node as a
    // required node affinity on `metadata.name`.
    let affinity = pod_spec.affinity.get_or_insert_with(Default::default);
    let node_affinity = affinity
        .node_affinity
        .get_or_insert_with(NodeAffinity::default);
    node_affinity.required_during_scheduling_ignored_during_execution = Some(NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_fields: Some(vec![NodeSelectorRequirement {
                key: "metadata.name".into(),
                operator: "In".into(),
                values: Some(vec![node.to_string()]),
            }]),
            ..Default::default()
        }],
    });
    let mut tolerations = pod_spec.tolerations.take().unwrap_or_default();
    for t in daemon_tolerations(pod_spec.host_network.unwrap_or(false)) {
        if !tolerations
            .iter()
            .any(|x| x.key == t.key && x.effect == t.effect)
        {
            tolerations.push(t);
        }
    }
    pod_spec.tolerations = Some(tolerations);
    pod
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::*;
    use k8s_openapi::api::apps::v1::{
        DaemonSetSpec, DaemonSetUpdateStrategy, RollingUpdateDaemonSet,
    };
    use k8s_openapi::api::core::v1::NodeSpec;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    fn ds(f: impl FnOnce(&mut DaemonSetSpec)) -> DaemonSet {
        let (selector, template) = workload_parts("proxy", "svcnet:1");
        let mut spec = DaemonSetSpec {
            selector,
            template,
            ..Default::default()
        };
        f(&mut spec);
        DaemonSet {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                uid: Some("ds-uid".into()),
                generation: Some(1),
                ..meta("kube-system", "proxy")
            },
            spec: Some(spec),
            status: None,
        }
    }

    fn daemon_pod(d: &DaemonSet, name: &str, node_name: &str, ready: bool, current: bool) -> Pod {
        let hash =
            super::super::history::revision_hash(&super::super::history::Owner::daemonset(d));
        let mut p = pod("kube-system", name, |p| {
            p.node(node_name).ready(ready).phase("Running").created(10);
        });
        p.metadata.owner_references =
            Some(vec![controller_ref("apps/v1", "DaemonSet", &d.metadata)]);
        p.metadata.labels = Some(map(&[
            ("app", "proxy"),
            (LABEL_REVISION, if current { &hash } else { "old" }),
        ]));
        p
    }

    fn tainted(name: &str, key: &str, effect: &str) -> Node {
        let mut n = node(name, None);
        n.spec = Some(NodeSpec {
            taints: Some(vec![Taint {
                key: key.into(),
                effect: effect.into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        n
    }

    fn now() -> Timestamp {
        Timestamp::now()
    }

    #[test]
    fn one_pod_per_node_bound_with_affinity_and_daemon_tolerations() {
        let d = ds(|_| {});
        let (n1, n2) = (node("n1", None), node("n2", None));
        let plan = plan(&d, &[&n1, &n2], &[], now()).unwrap();
        assert_eq!(plan.create.len(), 2);
        let p = &plan.create[0];
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert_eq!(p.metadata.generate_name.as_deref(), Some("proxy-"));
        let term = &spec
            .affinity
            .as_ref()
            .unwrap()
            .node_affinity
            .as_ref()
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .as_ref()
            .unwrap()
            .node_selector_terms[0];
        assert_eq!(
            term.match_fields.as_ref().unwrap()[0].values,
            Some(vec!["n1".to_string()])
        );
        let tols = spec.tolerations.as_ref().unwrap();
        assert!(
            tols.iter()
                .any(|t| t.key.as_deref() == Some("node.kubernetes.io/unschedulable"))
        );
        assert!(
            p.metadata
                .labels
                .as_ref()
                .unwrap()
                .contains_key(LABEL_REVISION)
        );
        let status = plan.status.unwrap();
        assert_eq!(
            (
                status.desired_number_scheduled,
                status.current_number_scheduled
            ),
            (2, 0)
        );
        assert_eq!(status.number_unavailable, Some(2));
    }

    #[test]
    fn node_selection_selector_affinity_and_taints() {
        let mut spec = PodSpec {
            node_selector: Some(map(&[("kubernetes.io/os", "linux")])),
            ..Default::default()
        };
        let mut linux = node("a", None);
        linux.metadata.labels = Some(map(&[("kubernetes.io/os", "linux")]));
        assert!(should_run(&spec, &linux));
        assert!(!should_run(&spec, &node("b", None)));
        // A NoSchedule taint needs a toleration; the daemon's own ones count; PreferNoSchedule
        // does not keep it off.
        spec.node_selector = None;
        assert!(!should_run(
            &spec,
            &tainted("c", "node-role.kubernetes.io/control-plane", "NoSchedule")
        ));
        assert!(should_run(
            &spec,
            &tainted("c", "node.kubernetes.io/unschedulable", "NoSchedule")
        ));
        assert!(should_run(&spec, &tainted("c", "x", "PreferNoSchedule")));
        assert!(!should_run(
            &spec,
            &tainted("c", "node.kubernetes.io/network-unavailable", "NoSchedule")
        ));
        spec.host_network = Some(true);
        assert!(should_run(
            &spec,
            &tainted("c", "node.kubernetes.io/network-unavailable", "NoSchedule")
        ));
        spec.tolerations = Some(vec![Toleration {
            operator: Some("Exists".into()),
            ..Default::default()
        }]);
        assert!(should_run(&spec, &tainted("c", "anything", "NoExecute")));
        // Required node affinity on labels and on the node's name.
        spec.tolerations = None;
        spec.affinity = Some(k8s_openapi::api::core::v1::Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: "kubernetes.io/os".into(),
                            operator: "In".into(),
                            values: Some(vec!["linux".into()]),
                        }]),
                        match_fields: Some(vec![NodeSelectorRequirement {
                            key: "metadata.name".into(),
                            operator: "NotIn".into(),
                            values: Some(vec!["skip".into()]),
                        }]),
                    }],
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        assert!(should_run(&spec, &linux));
        let mut skip = linux.clone();
        skip.metadata.name = Some("skip".into());
        assert!(!should_run(&spec, &skip));
        assert!(!should_run(&spec, &node("b", None)));
    }

    #[test]
    fn extra_failed_misscheduled_and_orphaned_pods_go() {
        let d = ds(|s| {
            s.template.spec.as_mut().unwrap().node_selector = Some(map(&[("pick", "yes")]));
        });
        let mut n1 = node("n1", None);
        n1.metadata.labels = Some(map(&[("pick", "yes")]));
        let mut n2 = n1.clone();
        n2.metadata.name = Some("n2".into());
        let n3 = node("n3", None); // not picked
        let mut a = daemon_pod(&d, "a", "n1", true, true);
        a.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            Timestamp::from_second(100).unwrap(),
        ));
        let mut b = daemon_pod(&d, "b", "n1", true, true);
        b.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            Timestamp::from_second(200).unwrap(),
        ));
        let mut failed = daemon_pod(&d, "f", "n2", false, true);
        failed.status.as_mut().unwrap().phase = Some("Failed".into());
        let mis = daemon_pod(&d, "m", "n3", true, true);
        let gone = daemon_pod(&d, "g", "n9", true, true);
        let pods = [&a, &b, &failed, &mis, &gone];
        let plan = plan(&d, &[&n1, &n2, &n3], &pods, now()).unwrap();
        let mut deleted = plan.delete.clone();
        deleted.sort();
        assert_eq!(deleted, ["b", "f", "g", "m"]);
        assert!(
            plan.create.is_empty(),
            "the failed pod's node waits for the next pass"
        );
        let s = plan.status.unwrap();
        assert_eq!(
            (
                s.desired_number_scheduled,
                s.number_misscheduled,
                s.number_ready
            ),
            (2, 1, 1)
        );
    }

    #[test]
    fn rolling_update_respects_max_unavailable() {
        let d = ds(|s| {
            s.update_strategy = Some(DaemonSetUpdateStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDaemonSet {
                    max_unavailable: Some(IntOrString::Int(1)),
                    ..Default::default()
                }),
            });
        });
        let nodes: Vec<Node> = (1..=4).map(|i| node(&format!("n{i}"), None)).collect();
        let nodes: Vec<&Node> = nodes.iter().collect();
        // All four on the old template and ready: one goes.
        let old: Vec<Pod> = (1..=4)
            .map(|i| daemon_pod(&d, &format!("p{i}"), &format!("n{i}"), true, false))
            .collect();
        let refs: Vec<&Pod> = old.iter().collect();
        let plan1 = plan(&d, &nodes, &refs, now()).unwrap();
        assert_eq!(plan1.delete.len(), 1);
        assert_eq!(
            plan1.status.as_ref().unwrap().updated_number_scheduled,
            None
        );
        // One node's pod is being replaced (missing): nothing more goes until it is available.
        let refs: Vec<&Pod> = old.iter().skip(1).collect();
        let plan2 = plan(&d, &nodes, &refs, now()).unwrap();
        assert_eq!(plan2.create.len(), 1);
        assert!(plan2.delete.is_empty(), "{:?}", plan2.delete);
        // An old pod that is not ready goes regardless of the budget.
        let mut sick = old.clone();
        sick[3] = daemon_pod(&d, "p4", "n4", false, false);
        let refs: Vec<&Pod> = sick.iter().skip(1).collect();
        let plan3 = plan(&d, &nodes, &refs, now()).unwrap();
        assert_eq!(plan3.delete, ["p4"]);
        // Done: every node on the new template.
        let new: Vec<Pod> = (1..=4)
            .map(|i| daemon_pod(&d, &format!("q{i}"), &format!("n{i}"), true, true))
            .collect();
        let refs: Vec<&Pod> = new.iter().collect();
        let plan4 = plan(&d, &nodes, &refs, now()).unwrap();
        assert!(plan4.delete.is_empty() && plan4.create.is_empty());
        let s = plan4.status.unwrap();
        assert_eq!(
            (
                s.updated_number_scheduled,
                s.number_available,
                s.number_unavailable
            ),
            (Some(4), Some(4), None)
        );
        // OnDelete never deletes an old pod.
        let mut on_delete = d.clone();
        on_delete.spec.as_mut().unwrap().update_strategy = Some(DaemonSetUpdateStrategy {
            type_: Some("OnDelete".into()),
            rolling_update: None,
        });
        let refs: Vec<&Pod> = old.iter().collect();
        assert!(
            plan(&on_delete, &nodes, &refs, now())
                .unwrap()
                .delete
                .is_empty()
        );
        // A percentage rounds up: 25 % of 4 nodes with 1 missing blocks, 50 % lets one more go.
        let mut half = d.clone();
        half.spec.as_mut().unwrap().update_strategy = Some(DaemonSetUpdateStrategy {
            type_: Some("RollingUpdate".into()),
            rolling_update: Some(RollingUpdateDaemonSet {
                max_unavailable: Some(IntOrString::String("50%".into())),
                ..Default::default()
            }),
        });
        let refs: Vec<&Pod> = old.iter().skip(1).collect();
        assert_eq!(plan(&half, &nodes, &refs, now()).unwrap().delete.len(), 1);
    }
}

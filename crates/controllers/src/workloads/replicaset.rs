//! ReplicaSet → pods, as upstream's ReplicaSet controller:
//!
//! - the pods it controls are those whose controller ownerReference names its uid; an orphan
//!   pod (no controller) in its namespace that its selector matches is adopted, a controlled
//!   pod the selector no longer matches is released;
//! - missing replicas are created from the template (`generateName: <replicaset>-`), excess
//!   ones deleted in upstream's `ActivePods` ranking: unscheduled, then pending, then not
//!   ready, then the newest first;
//! - the status counts the active pods (`replicas`), those carrying every template label
//!   (`fullyLabeledReplicas`), the ready and the available ones (ready for `minReadySeconds`),
//!   and the generation observed.

use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use svcnet_apimachinery::selector::LabelSelector;

use super::{PodPlan, WorkloadError, controller_uid, deletion_order, is_available, owned};
use crate::endpointslice::controller_ref;
use crate::podutil;

/// Computes the plan for `rs`; `pods` may be every pod of its namespace.
pub fn plan(
    rs: &ReplicaSet,
    pods: &[&Pod],
    now: Timestamp,
) -> Result<PodPlan<ReplicaSetStatus>, WorkloadError> {
    let ns = rs.metadata.namespace.clone().unwrap_or_default();
    let name = rs.metadata.name.clone().unwrap_or_default();
    let spec = rs.spec.clone().unwrap_or_default();
    let selector =
        LabelSelector::from_k8s(&spec.selector).map_err(|e| WorkloadError::InvalidSelector {
            kind: "ReplicaSet",
            namespace: ns.clone(),
            name: name.clone(),
            message: e.to_string(),
        })?;
    let template = spec.template.clone().unwrap_or_default();
    let template_labels = template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    if !selector.matches(&template_labels) {
        return Err(WorkloadError::TemplateNotSelected {
            kind: "ReplicaSet",
            namespace: ns,
            name,
        });
    }
    let replicas = spec.replicas.unwrap_or(1).max(0);
    let uid = rs.metadata.uid.clone().unwrap_or_default();
    let deleting = rs.metadata.deletion_timestamp.is_some();

    let mut out = PodPlan::default();
    // Upstream adopts orphans only while the ReplicaSet is not being deleted; an adopted pod
    // counts at once (the adoption is applied before creates and deletes).
    // Upstream's `ClaimPods` also releases controlled pods its selector no longer matches
    // (relabelled by hand): written back without the reference, and no longer counted.
    let mut mine: Vec<&Pod> = Vec::new();
    for p in owned(pods, &uid, rs.metadata.namespace.as_ref()) {
        if podutil::labels_match(&selector, p) || podutil::is_terminating(p) {
            mine.push(p);
        } else {
            let mut released = p.clone();
            if let Some(refs) = released.metadata.owner_references.as_mut() {
                refs.retain(|o| o.uid != uid);
            }
            out.adopt.push(released);
        }
    }
    if !deleting {
        for p in pods.iter().copied() {
            let orphan = p.metadata.namespace == rs.metadata.namespace
                && controller_uid(&p.metadata).is_none()
                && !podutil::is_terminating(p)
                && podutil::labels_match(&selector, p);
            if orphan {
                let mut adopted = p.clone();
                adopted
                    .metadata
                    .owner_references
                    .get_or_insert_with(Vec::new)
                    .push(controller_ref("apps/v1", "ReplicaSet", &rs.metadata));
                out.adopt.push(adopted);
                mine.push(p);
            }
        }
    }
    let mut active: Vec<&Pod> = mine
        .iter()
        .copied()
        .filter(|p| podutil::is_active(p))
        .collect();
    active.sort_by(|a, b| deletion_order(a, b));
    let n = i32::try_from(active.len()).unwrap_or(i32::MAX);
    if !deleting && n < replicas {
        for _ in n..replicas {
            let mut pod = super::pod_from_template(
                &template,
                rs.metadata.namespace.clone(),
                controller_ref("apps/v1", "ReplicaSet", &rs.metadata),
                Default::default(),
            );
            pod.metadata.generate_name = Some(format!("{name}-"));
            out.create.push(pod);
        }
    } else if n > replicas {
        let excess = usize::try_from(n - replicas).unwrap_or(0);
        out.delete.extend(
            active
                .iter()
                .take(excess)
                .map(|p| p.metadata.name.clone().unwrap_or_default()),
        );
    }

    let count = |it: usize| i32::try_from(it).unwrap_or(i32::MAX);
    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    let fully_labeled = count(
        active
            .iter()
            .filter(|p| {
                let l = p.metadata.labels.clone().unwrap_or_default();
                template_labels.iter().all(|(k, v)| l.get(k) == Some(v))
            })
            .count(),
    );
    let old = rs.status.clone().unwrap_or_default();
    let status = ReplicaSetStatus {
        replicas: n,
        fully_labeled_replicas: Some(fully_labeled),
        ready_replicas: Some(count(
            active.iter().filter(|p| podutil::is_ready(p)).count(),
        )),
        available_replicas: Some(count(
            active
                .iter()
                .filter(|p| is_available(p, min_ready, now))
                .count(),
        )),
        observed_generation: rs.metadata.generation,
        conditions: old.conditions.clone(),
        terminating_replicas: old.terminating_replicas,
    };
    if rs.status.as_ref() != Some(&status) {
        out.status = Some(status);
    }
    Ok(out)
}

#[cfg(test)]
#[path = "replicaset_tests.rs"]
mod tests;

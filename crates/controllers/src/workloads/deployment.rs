//! Deployment → pods, as upstream's deployment + ReplicaSet controllers together (there is no
//! ReplicaSet object: see the module above). Pods of the current template (label
//! `pod-template-hash`) are the "new" set, all others the "old" set.
//!
//! - No old pods: scale the new set to `replicas`, deleting the worst-ranked pods first.
//! - `Recreate`: delete every old pod, create new ones once none is left.
//! - `RollingUpdate` (default 25%/25%): create new pods while the total stays within
//!   `replicas + maxSurge`, delete old pods (unready first) while the ready count stays at or
//!   above `replicas - maxUnavailable`, counting pods not yet ready in the new set as
//!   unavailable, as upstream's `reconcileOldReplicaSets` does.
//!
//! Status (`replicas`, `updatedReplicas`, `readyReplicas`, `availableReplicas`,
//! `unavailableReplicas`, `observedGeneration`, conditions `Available`/`Progressing`) is
//! computed from the pods observed, and only written when it differs.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::{
    PodPlan, WorkloadError, deletion_order, owned, pod_from_template, pod_template_hash,
    scaled_value,
};
use crate::endpointslice::controller_ref;
use crate::podutil;
use svcnet_apimachinery::selector::LabelSelector;

pub const LABEL_POD_TEMPLATE_HASH: &str = "pod-template-hash";

/// Computes the plan for `deploy`; `pods` may be every pod of its namespace.
pub fn plan(
    deploy: &Deployment,
    pods: &[&Pod],
    now: Timestamp,
) -> Result<PodPlan<DeploymentStatus>, WorkloadError> {
    let ns = deploy.metadata.namespace.clone().unwrap_or_default();
    let name = deploy.metadata.name.clone().unwrap_or_default();
    let spec = deploy.spec.clone().unwrap_or_default();
    let err_field = |field: &'static str, message: String| WorkloadError::InvalidField {
        kind: "Deployment",
        namespace: ns.clone(),
        name: name.clone(),
        field,
        message,
    };
    let template_labels = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone());
    let matches = LabelSelector::from_k8s(&spec.selector)
        .map(|sel| sel.matches(&template_labels.clone().unwrap_or_default()));
    match matches {
        Err(e) => {
            return Err(WorkloadError::InvalidSelector {
                kind: "Deployment",
                namespace: ns,
                name,
                message: e.to_string(),
            });
        }
        Ok(false) => {
            return Err(WorkloadError::TemplateNotSelected {
                kind: "Deployment",
                namespace: ns,
                name,
            });
        }
        Ok(true) => {}
    }
    let replicas = spec.replicas.unwrap_or(1).max(0);
    let hash = pod_template_hash(&spec.template);
    let uid = deploy.metadata.uid.clone().unwrap_or_default();

    let mine = owned(pods, &uid, deploy.metadata.namespace.as_ref());
    let active: Vec<&Pod> = mine
        .iter()
        .copied()
        .filter(|p| podutil::is_active(p))
        .collect();
    let is_new = |p: &Pod| {
        p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_POD_TEMPLATE_HASH))
            == Some(&hash)
    };
    let mut new: Vec<&Pod> = active.iter().copied().filter(|p| is_new(p)).collect();
    let mut old: Vec<&Pod> = active.iter().copied().filter(|p| !is_new(p)).collect();
    new.sort_by(|a, b| deletion_order(a, b));
    old.sort_by(|a, b| deletion_order(a, b));
    let old_terminating = mine
        .iter()
        .any(|p| !is_new(p) && podutil::is_terminating(p));

    let recreate = spec.strategy.as_ref().and_then(|s| s.type_.as_deref()) == Some("Recreate");
    let rolling = spec
        .strategy
        .as_ref()
        .and_then(|s| s.rolling_update.clone())
        .unwrap_or_default();
    let mut max_surge = scaled_value(rolling.max_surge.as_ref(), 25, replicas, true)
        .map_err(|m| err_field("spec.strategy.rollingUpdate.maxSurge", m))?;
    let mut max_unavailable =
        scaled_value(rolling.max_unavailable.as_ref(), 25, replicas, false)
            .map_err(|m| err_field("spec.strategy.rollingUpdate.maxUnavailable", m))?;
    if recreate {
        (max_surge, max_unavailable) = (0, 0);
    } else if max_surge == 0 && max_unavailable == 0 {
        max_unavailable = 1;
    }

    let mut out = PodPlan::default();
    let n = |v: &Vec<&Pod>| i32::try_from(v.len()).unwrap_or(i32::MAX);
    let mut to_create: i32 = 0;
    if spec.paused == Some(true) {
        // A paused deployment is neither scaled nor rolled; only its status is kept.
    } else if old.is_empty() {
        if recreate && old_terminating {
            // Wait until the old pods are gone.
        } else if n(&new) < replicas {
            to_create = replicas - n(&new);
        } else {
            let excess = usize::try_from(n(&new) - replicas).unwrap_or(0);
            out.delete
                .extend(new.iter().take(excess).map(|p| pod_name(p)));
        }
    } else if recreate {
        out.delete.extend(old.iter().map(|p| pod_name(p)));
        if n(&new) > replicas {
            let excess = usize::try_from(n(&new) - replicas).unwrap_or(0);
            out.delete
                .extend(new.iter().take(excess).map(|p| pod_name(p)));
        }
    } else {
        let total = n(&new) + n(&old);
        if n(&new) < replicas {
            to_create = (replicas - n(&new)).min((replicas + max_surge - total).max(0));
        } else if n(&new) > replicas {
            let excess = usize::try_from(n(&new) - replicas).unwrap_or(0);
            out.delete
                .extend(new.iter().take(excess).map(|p| pod_name(p)));
        }
        let new_ready =
            i32::try_from(new.iter().filter(|p| podutil::is_ready(p)).count()).unwrap_or(0);
        let new_unavailable = (n(&new) + to_create - new_ready).max(0);
        let min_available = replicas - max_unavailable;
        let max_scaled_down = (total + to_create - min_available - new_unavailable).max(0);
        let k = usize::try_from(max_scaled_down).unwrap_or(0).min(old.len());
        out.delete.extend(old.iter().take(k).map(|p| pod_name(p)));
    }
    for _ in 0..to_create {
        let mut labels = BTreeMap::new();
        labels.insert(LABEL_POD_TEMPLATE_HASH.to_string(), hash.clone());
        let mut pod = pod_from_template(
            &spec.template,
            deploy.metadata.namespace.clone(),
            controller_ref("apps/v1", "Deployment", &deploy.metadata),
            labels,
        );
        pod.metadata.generate_name = Some(format!("{name}-{hash}-"));
        out.create.push(pod);
    }

    let status = compute_status(deploy, &active, &new, replicas, max_unavailable, &hash, now);
    if deploy.status.as_ref() != Some(&status) {
        out.status = Some(status);
    }
    Ok(out)
}

fn pod_name(p: &Pod) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

fn compute_status(
    deploy: &Deployment,
    active: &[&Pod],
    new: &[&Pod],
    replicas: i32,
    max_unavailable: i32,
    hash: &str,
    now: Timestamp,
) -> DeploymentStatus {
    let count = |it: usize| i32::try_from(it).unwrap_or(i32::MAX);
    let min_ready = i64::from(
        deploy
            .spec
            .as_ref()
            .and_then(|s| s.min_ready_seconds)
            .unwrap_or(0),
    );
    let available = |p: &Pod| {
        podutil::is_ready(p) && {
            let since = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                .and_then(|c| c.last_transition_time.as_ref())
                .map(|t| t.0);
            min_ready == 0 || since.is_some_and(|t| now.as_second() - t.as_second() >= min_ready)
        }
    };
    let total = count(active.len());
    let ready = count(active.iter().filter(|p| podutil::is_ready(p)).count());
    let avail = count(active.iter().filter(|p| available(p)).count());
    let updated = count(new.len());
    let name = deploy.metadata.name.clone().unwrap_or_default();
    let old = deploy.status.clone().unwrap_or_default();

    let is_available = avail >= replicas - max_unavailable;
    let complete = updated == replicas && avail == replicas && total == replicas;
    let mut conditions = vec![
        condition(
            &old,
            "Available",
            is_available,
            if is_available {
                "MinimumReplicasAvailable"
            } else {
                "MinimumReplicasUnavailable"
            },
            if is_available {
                "Deployment has minimum availability.".to_string()
            } else {
                "Deployment does not have minimum availability.".to_string()
            },
            now,
        ),
        condition(
            &old,
            "Progressing",
            true,
            if complete {
                "NewReplicaSetAvailable"
            } else {
                "ReplicaSetUpdated"
            },
            if complete {
                format!("ReplicaSet \"{name}-{hash}\" has successfully progressed.")
            } else {
                format!("ReplicaSet \"{name}-{hash}\" is progressing.")
            },
            now,
        ),
    ];
    conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
    let opt = |v: i32| (v != 0).then_some(v);
    DeploymentStatus {
        observed_generation: deploy.metadata.generation,
        replicas: opt(total),
        updated_replicas: opt(updated),
        ready_replicas: opt(ready),
        available_replicas: opt(avail),
        unavailable_replicas: opt((replicas - avail).max(0)),
        conditions: Some(conditions),
        collision_count: old.collision_count,
        terminating_replicas: old.terminating_replicas,
    }
}

/// A condition keeping its timestamps when nothing about it changed.
fn condition(
    old: &DeploymentStatus,
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    now: Timestamp,
) -> DeploymentCondition {
    let status = if status { "True" } else { "False" }.to_string();
    let prev = old.conditions.iter().flatten().find(|c| c.type_ == type_);
    let same = prev.is_some_and(|p| {
        p.status == status
            && p.reason.as_deref() == Some(reason)
            && p.message.as_deref() == Some(message.as_str())
    });
    let transition = match prev {
        Some(p) if p.status == status => p.last_transition_time.clone(),
        _ => Some(Time(now)),
    };
    DeploymentCondition {
        type_: type_.into(),
        status,
        reason: Some(reason.into()),
        message: Some(message),
        last_transition_time: transition,
        last_update_time: if same {
            prev.and_then(|p| p.last_update_time.clone())
        } else {
            Some(Time(now))
        },
    }
}

#[cfg(test)]
#[path = "deployment_tests.rs"]
mod tests;

//! A Deployment's status from its ReplicaSets: the replica counts summed, and the
//! `Available` and `Progressing` conditions (with `progressDeadlineSeconds`) naming the real
//! ReplicaSet.

use super::*;

pub(super) fn compute_status(
    d: &Deployment,
    sets: &Sets,
    replicas: i32,
    fp: &Fenceposts,
    new_name: Option<&str>,
    collision_count: Option<i32>,
    now: Timestamp,
) -> DeploymentStatus {
    let old = d.status.clone().unwrap_or_default();
    let sum = |f: &dyn Fn(&ReplicaSet) -> i32, only: Option<usize>| sets.status_sum(f, only);
    let available = sum(&|rs| rs_status(rs).available_replicas.unwrap_or(0), None);
    let total_spec = sets.total_spec();
    let actual = sum(&|rs| rs_status(rs).replicas, None);
    let updated = match sets.new {
        Some(n) if !sets.created => sum(&|rs| rs_status(rs).replicas, Some(n)),
        _ => 0,
    };
    let ready = sum(&|rs| rs_status(rs).ready_replicas.unwrap_or(0), None);
    let is_available = available >= replicas - fp.unavailable;
    let mut conditions: Vec<DeploymentCondition> = Vec::new();
    conditions.push(condition(
        &old,
        "Available",
        "True".into(),
        if is_available {
            (
                "MinimumReplicasAvailable",
                "Deployment has minimum availability.",
            )
        } else {
            (
                "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.",
            )
        },
        is_available,
        now,
    ));

    let prev = old
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Progressing")
        .cloned();
    let prev_reason = prev.as_ref().and_then(|c| c.reason.clone());
    let rs_label = new_name.unwrap_or_default();
    let paused = d.spec.as_ref().and_then(|s| s.paused) == Some(true);
    let complete = updated == replicas
        && actual == replicas
        && available == replicas
        && total_spec == replicas;
    let old_replicas =
        |s: &DeploymentStatus| s.replicas.unwrap_or(0) - s.updated_replicas.unwrap_or(0);
    let progressed = updated > old.updated_replicas.unwrap_or(0)
        || ready > old.ready_replicas.unwrap_or(0)
        || available > old.available_replicas.unwrap_or(0)
        || actual - updated < old_replicas(&old);
    let progressing: Option<(&str, String, &str)> = if paused {
        Some(("Unknown", "Deployment is paused".into(), "DeploymentPaused"))
    } else if prev_reason.as_deref() == Some("DeploymentPaused") {
        Some((
            "Unknown",
            "Deployment is resumed".into(),
            "DeploymentResumed",
        ))
    } else if sets.created {
        Some((
            "True",
            format!("Created new replica set \"{rs_label}\""),
            "NewReplicaSetCreated",
        ))
    } else if complete && new_name.is_some() {
        Some((
            "True",
            format!("ReplicaSet \"{rs_label}\" has successfully progressed."),
            "NewReplicaSetAvailable",
        ))
    } else if new_name.is_some() && (progressed || prev.is_none()) {
        if prev.is_none() {
            Some((
                "True",
                format!("Found new replica set \"{rs_label}\""),
                "FoundNewReplicaSet",
            ))
        } else {
            Some((
                "True",
                format!("ReplicaSet \"{rs_label}\" is progressing."),
                "ReplicaSetUpdated",
            ))
        }
    } else if prev.as_ref().is_some_and(|p| timed_out(d, p, now)) {
        Some((
            "False",
            format!("ReplicaSet \"{rs_label}\" has timed out progressing."),
            "ProgressDeadlineExceeded",
        ))
    } else {
        None
    };
    match (progressing, prev) {
        (Some((status, message, reason)), _) => conditions.push(condition(
            &old,
            "Progressing",
            status.into(),
            (reason, &message),
            true,
            now,
        )),
        (None, Some(p)) => conditions.push(p),
        (None, None) => {}
    }
    conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
    let opt = |v: i32| (v != 0).then_some(v);
    DeploymentStatus {
        observed_generation: d.metadata.generation,
        replicas: opt(actual),
        updated_replicas: opt(updated),
        ready_replicas: opt(ready),
        available_replicas: opt(available),
        unavailable_replicas: opt((total_spec - available).max(0)),
        conditions: Some(conditions),
        collision_count,
        terminating_replicas: old.terminating_replicas,
    }
}

/// Upstream's `DeploymentTimedOut`: no progress reported for `progressDeadlineSeconds`.
fn timed_out(d: &Deployment, progressing: &DeploymentCondition, now: Timestamp) -> bool {
    match progressing.reason.as_deref() {
        Some("NewReplicaSetAvailable") => return false,
        Some("ProgressDeadlineExceeded") => return true,
        _ => {}
    }
    seconds_to_deadline(d, progressing, now).is_some_and(|s| s < 0)
}

/// Seconds left before a rollout reporting `progressing` exceeds its deadline (negative once
/// past it); `None` without a deadline or a time to count from.
pub(super) fn seconds_to_deadline(
    d: &Deployment,
    progressing: &DeploymentCondition,
    now: Timestamp,
) -> Option<i64> {
    let deadline = d.spec.as_ref().and_then(|s| s.progress_deadline_seconds)?;
    let from = progressing.last_update_time.as_ref()?.0;
    Some(from.as_second() + i64::from(deadline) - now.as_second())
}

/// A condition keeping its timestamps when nothing about it changed. `status` is `"True"`
/// unless `truth` is false (then `"False"`), or as given for `Unknown`.
fn condition(
    old: &DeploymentStatus,
    type_: &str,
    status: String,
    (reason, message): (&str, &str),
    truth: bool,
    now: Timestamp,
) -> DeploymentCondition {
    let status = if truth { status } else { "False".to_string() };
    let prev = old.conditions.iter().flatten().find(|c| c.type_ == type_);
    let same = prev.is_some_and(|p| {
        p.status == status
            && p.reason.as_deref() == Some(reason)
            && p.message.as_deref() == Some(message)
    });
    let transition = match prev {
        Some(p) if p.status == status => p.last_transition_time.clone(),
        _ => Some(Time(now)),
    };
    DeploymentCondition {
        type_: type_.into(),
        status,
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_transition_time: transition,
        last_update_time: if same {
            prev.and_then(|p| p.last_update_time.clone())
        } else {
            Some(Time(now))
        },
    }
}

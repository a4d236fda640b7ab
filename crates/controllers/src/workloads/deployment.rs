//! Deployment → ReplicaSets, as upstream's deployment controller (`pkg/controller/deployment`):
//! one pass computes the ReplicaSets to create, scale and delete, and the status, from the
//! Deployment and the ReplicaSets it controls; the ReplicaSet controller makes the pods.
//!
//! - It controls the ReplicaSets whose controller reference names it, and adopts orphans its
//!   selector matches (a Deployment re-created after `kubectl delete --cascade=orphan`).
//! - The new ReplicaSet is the oldest one whose template equals the Deployment's once the
//!   `pod-template-hash` label is removed (upstream's `EqualIgnoreHash`); all others are old.
//!   Rolling back (`kubectl rollout undo` writes an old ReplicaSet's template into the
//!   Deployment) therefore makes that old ReplicaSet the new one again, and its revision is
//!   bumped past every other (the previous number goes to `revision-history`).
//! - A new ReplicaSet is `<deployment>-<hash>`, with the hash label on its selector, template
//!   and pods; annotations `revision`, `desired-replicas`, `max-replicas` and the
//!   Deployment's own annotations (`kubernetes.io/change-cause`, …).
//! - `spec.paused`: no new ReplicaSet and no rollout, only scaling; a replica change that is
//!   not a rollout (`desired-replicas` of an active ReplicaSet differs) scales the one active
//!   ReplicaSet, or all of them in proportion (upstream's `scale`).
//! - `RollingUpdate` (default 25%/25%, surge rounded up, unavailable down, both 0 → 1
//!   unavailable): scale the new ReplicaSet up while the total stays within
//!   `replicas + maxSurge`; else scale old ones down, unhealthy replicas first, while the
//!   available count stays at or above `replicas - maxUnavailable`.
//! - `Recreate`: scale every old ReplicaSet to 0, wait until their pods are gone, then create
//!   or scale the new one.
//! - Once complete, old ReplicaSets with no replicas beyond `revisionHistoryLimit` (default 10)
//!   are deleted, the lowest revisions first.
//!
//! Status sums the ReplicaSets' statuses; conditions `Available` and `Progressing` (reasons
//! `NewReplicaSetCreated`, `FoundNewReplicaSet`, `ReplicaSetUpdated`, `NewReplicaSetAvailable`,
//! `DeploymentPaused`, `DeploymentResumed`) name the real ReplicaSet.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentCondition, DeploymentStatus, ReplicaSet, ReplicaSetSpec,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

use super::{WorkloadError, controller_uid, pod_template_hash_with, scaled_value};
use crate::endpointslice::controller_ref;
use crate::podutil;
use svcnet_apimachinery::selector::LabelSelector;

pub const LABEL_POD_TEMPLATE_HASH: &str = "pod-template-hash";
pub const ANNOTATION_REVISION: &str = "deployment.kubernetes.io/revision";
pub const ANNOTATION_REVISION_HISTORY: &str = "deployment.kubernetes.io/revision-history";
pub const ANNOTATION_DESIRED_REPLICAS: &str = "deployment.kubernetes.io/desired-replicas";
pub const ANNOTATION_MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";

/// Annotations never copied between a Deployment and its ReplicaSets (upstream's
/// `annotationsToSkip`).
pub const ANNOTATIONS_TO_SKIP: &[&str] = &[
    "kubectl.kubernetes.io/last-applied-configuration",
    ANNOTATION_REVISION,
    ANNOTATION_REVISION_HISTORY,
    ANNOTATION_DESIRED_REPLICAS,
    ANNOTATION_MAX_REPLICAS,
    "deprecated.deployment.rollback.to",
];

/// What one pass over a Deployment writes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DeploymentPlan {
    /// The new ReplicaSet to create.
    pub create: Option<ReplicaSet>,
    /// ReplicaSets to replace (scaled or re-annotated), with their resourceVersion.
    pub update: Vec<ReplicaSet>,
    /// Names of old ReplicaSets beyond the history limit.
    pub delete: Vec<String>,
    /// The Deployment's `revision` annotation, when it must change.
    pub revision: Option<String>,
    pub status: Option<DeploymentStatus>,
    /// Pods the Deployment controls directly (svcnet before ReplicaSets made them): deleted
    /// once its new ReplicaSet has every replica available, as an old ReplicaSet would be.
    pub legacy_pods: Vec<String>,
    /// Seconds until a rollout still in progress would exceed its `progressDeadlineSeconds`:
    /// look again then, even if nothing changes.
    pub recheck_after: Option<i64>,
}

impl DeploymentPlan {
    pub fn is_empty(&self) -> bool {
        self.create.is_none()
            && self.update.is_empty()
            && self.delete.is_empty()
            && self.revision.is_none()
            && self.status.is_none()
    }
}

/// The ReplicaSets being planned: copies of those owned, the new one's index, and which changed.
struct Sets {
    all: Vec<ReplicaSet>,
    changed: Vec<bool>,
    new: Option<usize>,
    created: bool,
}

impl Sets {
    fn spec_replicas(&self, i: usize) -> i32 {
        self.all[i]
            .spec
            .as_ref()
            .and_then(|s| s.replicas)
            .unwrap_or(0)
    }
    fn old(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.all.len()).filter(move |i| Some(*i) != self.new)
    }
    fn total_spec(&self) -> i32 {
        (0..self.all.len()).map(|i| self.spec_replicas(i)).sum()
    }
    fn status_sum(&self, f: impl Fn(&ReplicaSet) -> i32, only: Option<usize>) -> i32 {
        (0..self.all.len())
            .filter(|i| only.is_none_or(|o| o == *i))
            .map(|i| f(&self.all[i]))
            .sum()
    }
    /// Upstream's `scaleReplicaSet`: the size and the replica annotations.
    fn scale(&mut self, i: usize, to: i32, desired: i32, max: i32) -> bool {
        let rs = &mut self.all[i];
        let mut changed = false;
        let spec = rs.spec.get_or_insert_with(Default::default);
        if spec.replicas != Some(to) {
            spec.replicas = Some(to);
            changed = true;
        }
        let ann = rs.metadata.annotations.get_or_insert_with(BTreeMap::new);
        for (k, v) in [
            (ANNOTATION_DESIRED_REPLICAS, desired),
            (ANNOTATION_MAX_REPLICAS, max),
        ] {
            if ann.get(k) != Some(&v.to_string()) {
                ann.insert(k.to_string(), v.to_string());
                changed = true;
            }
        }
        self.changed[i] |= changed;
        changed
    }
}

fn revision_of(meta: &ObjectMeta) -> i64 {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_REVISION))
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

fn rs_status(rs: &ReplicaSet) -> k8s_openapi::api::apps::v1::ReplicaSetStatus {
    rs.status.clone().unwrap_or_default()
}

/// Resolved `maxSurge` and `maxUnavailable` (upstream's `ResolveFenceposts`, `MaxUnavailable`).
struct Fenceposts {
    surge: i32,
    unavailable: i32,
}

fn fenceposts(d: &Deployment, replicas: i32) -> Result<Fenceposts, WorkloadError> {
    let spec = d.spec.clone().unwrap_or_default();
    let field = |field: &'static str, message: String| WorkloadError::InvalidField {
        kind: "Deployment",
        namespace: d.metadata.namespace.clone().unwrap_or_default(),
        name: d.metadata.name.clone().unwrap_or_default(),
        field,
        message,
    };
    if is_recreate(d) {
        return Ok(Fenceposts {
            surge: 0,
            unavailable: 0,
        });
    }
    let rolling = spec
        .strategy
        .as_ref()
        .and_then(|s| s.rolling_update.clone())
        .unwrap_or_default();
    let surge = scaled_value(rolling.max_surge.as_ref(), 25, replicas, true)
        .map_err(|m| field("spec.strategy.rollingUpdate.maxSurge", m))?;
    let mut unavailable = scaled_value(rolling.max_unavailable.as_ref(), 25, replicas, false)
        .map_err(|m| field("spec.strategy.rollingUpdate.maxUnavailable", m))?;
    if surge == 0 && unavailable == 0 {
        unavailable = 1;
    }
    Ok(Fenceposts {
        surge,
        unavailable: unavailable.min(replicas),
    })
}

fn is_recreate(d: &Deployment) -> bool {
    d.spec
        .as_ref()
        .and_then(|s| s.strategy.as_ref())
        .and_then(|s| s.type_.as_deref())
        == Some("Recreate")
}

/// Computes the plan for `d`. `replicasets` and `pods` may be every one of its namespace; pods
/// are read only by `Recreate`, to wait until the old ones are gone, and to find pods the
/// Deployment controls directly (made by svcnet before it had ReplicaSets).
pub fn plan(
    d: &Deployment,
    replicasets: &[&ReplicaSet],
    pods: &[&Pod],
    now: Timestamp,
) -> Result<DeploymentPlan, WorkloadError> {
    let ns = d.metadata.namespace.clone().unwrap_or_default();
    let name = d.metadata.name.clone().unwrap_or_default();
    let spec = d.spec.clone().unwrap_or_default();
    let template_labels = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let selector =
        LabelSelector::from_k8s(&spec.selector).map_err(|e| WorkloadError::InvalidSelector {
            kind: "Deployment",
            namespace: ns.clone(),
            name: name.clone(),
            message: e.to_string(),
        })?;
    if !selector.matches(&template_labels) {
        return Err(WorkloadError::TemplateNotSelected {
            kind: "Deployment",
            namespace: ns,
            name,
        });
    }
    let replicas = spec.replicas.unwrap_or(1).max(0);
    let fp = fenceposts(d, replicas)?;
    let max_replicas = replicas + fp.surge;
    let uid = d.metadata.uid.clone().unwrap_or_default();
    let paused = spec.paused == Some(true);

    // Upstream's `ClaimReplicaSets`: ReplicaSets it controls, and orphans its selector
    // matches (adopted: written back with its controller reference).
    let mut adopted = Vec::new();
    let mut owned: Vec<ReplicaSet> = Vec::new();
    for rs in replicasets
        .iter()
        .filter(|rs| rs.metadata.namespace == d.metadata.namespace)
    {
        match controller_uid(&rs.metadata) {
            Some(u) if u == uid => owned.push((*rs).clone()),
            None if rs.metadata.deletion_timestamp.is_none()
                && selector.matches(&rs.metadata.labels.clone().unwrap_or_default()) =>
            {
                let mut rs = (*rs).clone();
                rs.metadata
                    .owner_references
                    .get_or_insert_with(Vec::new)
                    .push(controller_ref("apps/v1", "Deployment", &d.metadata));
                adopted.push(rs.metadata.name.clone());
                owned.push(rs);
            }
            _ => {}
        }
    }
    owned.sort_by(|a, b| {
        let t = |r: &ReplicaSet| r.metadata.creation_timestamp.as_ref().map(|t| t.0);
        t(a).cmp(&t(b))
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
    let new = owned.iter().position(|rs| {
        rs.spec
            .as_ref()
            .and_then(|s| s.template.as_ref())
            .is_some_and(|t| super::templates_equal_ignoring_hash(t, &spec.template))
    });
    let changed = owned
        .iter()
        .map(|rs| adopted.contains(&rs.metadata.name))
        .collect();
    let mut sets = Sets {
        all: owned,
        changed,
        new,
        created: false,
    };
    let max_old_revision = sets
        .old()
        .map(|i| revision_of(&sets.all[i].metadata))
        .max()
        .unwrap_or(0);
    let new_revision = max_old_revision + 1;
    let mut out = DeploymentPlan::default();
    let mut collision_count = d.status.as_ref().and_then(|s| s.collision_count);

    if let Some(i) = sets.new {
        sync_new_annotations(d, &mut sets, i, new_revision);
    }
    let scaling = sets.all.iter().enumerate().any(|(i, rs)| {
        sets.spec_replicas(i) > 0
            && rs
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_DESIRED_REPLICAS))
                .and_then(|v| v.parse::<i32>().ok())
                .is_some_and(|v| v != replicas)
    });

    if paused || scaling {
        scale(d, &mut sets, replicas, &fp);
    } else if is_recreate(d) {
        let mut scaled_down = false;
        for i in sets.old().collect::<Vec<_>>() {
            if sets.spec_replicas(i) > 0 {
                scaled_down |= sets.scale(i, 0, replicas, max_replicas);
            }
        }
        let old_uids: Vec<&str> = sets
            .old()
            .filter_map(|i| sets.all[i].metadata.uid.as_deref())
            .collect();
        let old_running = pods.iter().any(|p| {
            p.metadata.namespace == d.metadata.namespace
                && controller_uid(&p.metadata).is_some_and(|u| old_uids.contains(&u))
                && !podutil::is_terminal(p)
        });
        if !scaled_down && !old_running {
            if sets.new.is_none() {
                create_new(d, &mut sets, replicas, new_revision, &mut collision_count);
            }
            if let Some(i) = sets.new
                && !sets.created
            {
                sets.scale(i, replicas, replicas, max_replicas);
            }
        }
    } else {
        if sets.new.is_none() {
            let size = (max_replicas - sets.total_spec()).clamp(0, replicas);
            create_new(d, &mut sets, size, new_revision, &mut collision_count);
        }
        if let Some(i) = sets.new
            && !sets.created
            && !reconcile_new(&mut sets, i, replicas, max_replicas)
        {
            reconcile_old(&mut sets, i, replicas, max_replicas, &fp);
        }
    }

    // Pods from before ReplicaSets go once their replacements are all available.
    let new_available = sets.new.filter(|_| !sets.created).map_or(0, |i| {
        rs_status(&sets.all[i]).available_replicas.unwrap_or(0)
    });
    if new_available >= replicas {
        out.legacy_pods = pods
            .iter()
            .filter(|p| p.metadata.namespace == d.metadata.namespace)
            .filter(|p| controller_uid(&p.metadata) == Some(uid.as_str()))
            .filter(|p| !podutil::is_terminating(p))
            .filter_map(|p| p.metadata.name.clone())
            .collect();
    }

    // History: only once the rollout is complete and nothing else changed.
    let quiet = !sets.created && !sets.changed.iter().any(|c| *c);
    if quiet && (paused || rollout_complete(&sets, replicas)) {
        out.delete = history_cleanup(&sets, spec.revision_history_limit.unwrap_or(10));
    }

    let new_name = sets.new.and_then(|i| sets.all[i].metadata.name.clone());
    let want_revision = sets
        .new
        .map(|i| revision_of(&sets.all[i].metadata).to_string());
    let have_revision = d
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_REVISION))
        .cloned();
    if want_revision.is_some() && want_revision != have_revision {
        out.revision = want_revision;
    }
    let status = compute_status(
        d,
        &sets,
        replicas,
        &fp,
        new_name.as_deref(),
        collision_count,
        now,
    );
    out.recheck_after = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Progressing")
        .filter(|c| {
            !matches!(
                c.reason.as_deref(),
                Some("NewReplicaSetAvailable" | "ProgressDeadlineExceeded" | "DeploymentPaused")
            )
        })
        .and_then(|c| seconds_to_deadline(d, c, now))
        .map(|s| s.max(0) + 1);
    if d.status.as_ref() != Some(&status) {
        out.status = Some(status);
    }
    if sets.created {
        out.create = sets.new.map(|i| sets.all[i].clone());
    }
    out.update = sets
        .all
        .iter()
        .zip(&sets.changed)
        .enumerate()
        .filter(|(i, (_, c))| **c && !(sets.created && Some(*i) == sets.new))
        .map(|(_, (rs, _))| rs.clone())
        .collect();
    Ok(out)
}

/// Upstream's `SetNewReplicaSetAnnotations` on an existing new ReplicaSet: the Deployment's
/// annotations, and a revision above every old one (the previous number kept in history).
fn sync_new_annotations(d: &Deployment, sets: &mut Sets, i: usize, new_revision: i64) {
    let rs = &mut sets.all[i];
    let mut changed = false;
    let current = revision_of(&rs.metadata);
    let ann = rs.metadata.annotations.get_or_insert_with(BTreeMap::new);
    for (k, v) in d.metadata.annotations.iter().flatten() {
        if !ANNOTATIONS_TO_SKIP.contains(&k.as_str()) && ann.get(k) != Some(v) {
            ann.insert(k.clone(), v.clone());
            changed = true;
        }
    }
    if current < new_revision {
        if current > 0 {
            let history = match ann.get(ANNOTATION_REVISION_HISTORY) {
                Some(h) if !h.is_empty() => format!("{h},{current}"),
                _ => current.to_string(),
            };
            ann.insert(ANNOTATION_REVISION_HISTORY.to_string(), history);
        }
        ann.insert(ANNOTATION_REVISION.to_string(), new_revision.to_string());
        changed = true;
    }
    sets.changed[i] |= changed;
}

/// The new ReplicaSet `<deployment>-<hash>`. A name already taken by a ReplicaSet with
/// another template is a hash collision: the count goes up and the next pass tries again.
fn create_new(
    d: &Deployment,
    sets: &mut Sets,
    size: i32,
    revision: i64,
    collision_count: &mut Option<i32>,
) {
    let spec = d.spec.clone().unwrap_or_default();
    let name = d.metadata.name.clone().unwrap_or_default();
    let hash = pod_template_hash_with(&spec.template, *collision_count);
    let rs_name = format!("{name}-{hash}");
    if sets
        .all
        .iter()
        .any(|rs| rs.metadata.name.as_deref() == Some(rs_name.as_str()))
    {
        *collision_count = Some(collision_count.unwrap_or(0).saturating_add(1));
        return;
    }
    let mut template = spec.template.clone();
    template
        .metadata
        .get_or_insert_with(Default::default)
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(LABEL_POD_TEMPLATE_HASH.into(), hash.clone());
    let mut selector = spec.selector.clone();
    selector
        .match_labels
        .get_or_insert_with(BTreeMap::new)
        .insert(LABEL_POD_TEMPLATE_HASH.into(), hash);
    let mut annotations: BTreeMap<String, String> = d
        .metadata
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| !ANNOTATIONS_TO_SKIP.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let replicas = spec.replicas.unwrap_or(1).max(0);
    let max = fenceposts(d, replicas).map_or(replicas, |f| replicas + f.surge);
    annotations.insert(ANNOTATION_REVISION.into(), revision.to_string());
    annotations.insert(ANNOTATION_DESIRED_REPLICAS.into(), replicas.to_string());
    annotations.insert(ANNOTATION_MAX_REPLICAS.into(), max.to_string());
    let rs = ReplicaSet {
        metadata: ObjectMeta {
            name: Some(rs_name),
            namespace: d.metadata.namespace.clone(),
            labels: template.metadata.as_ref().and_then(|m| m.labels.clone()),
            annotations: Some(annotations),
            owner_references: Some(vec![controller_ref("apps/v1", "Deployment", &d.metadata)]),
            ..Default::default()
        },
        spec: Some(ReplicaSetSpec {
            replicas: Some(size),
            min_ready_seconds: spec.min_ready_seconds,
            selector,
            template: Some(template),
        }),
        status: None,
    };
    sets.all.push(rs);
    sets.changed.push(true);
    sets.new = Some(sets.all.len() - 1);
    sets.created = true;
}

/// Upstream's `reconcileNewReplicaSet`; true when it scaled.
fn reconcile_new(sets: &mut Sets, i: usize, replicas: i32, max: i32) -> bool {
    let cur = sets.spec_replicas(i);
    if cur == replicas {
        return false;
    }
    if cur > replicas {
        return sets.scale(i, replicas, replicas, max);
    }
    let room = (max - sets.total_spec()).max(0);
    let to = cur + room.min(replicas - cur);
    to != cur && sets.scale(i, to, replicas, max)
}

/// Upstream's `reconcileOldReplicaSets`: unhealthy replicas first, then healthy ones while
/// availability allows, oldest ReplicaSet first.
fn reconcile_old(sets: &mut Sets, new: usize, replicas: i32, max: i32, fp: &Fenceposts) {
    let old: Vec<usize> = sets.old().filter(|i| sets.spec_replicas(*i) > 0).collect();
    if old.is_empty() {
        return;
    }
    let min_available = replicas - fp.unavailable;
    let new_unavailable =
        sets.spec_replicas(new) - rs_status(&sets.all[new]).available_replicas.unwrap_or(0);
    let max_scaled_down = sets.total_spec() - min_available - new_unavailable;
    if max_scaled_down <= 0 {
        return;
    }
    let mut cleaned = 0;
    for &i in &old {
        let st = rs_status(&sets.all[i]);
        let avail = st.available_replicas.unwrap_or(0);
        let cur = sets.spec_replicas(i);
        if cleaned >= max_scaled_down || cur == avail {
            continue;
        }
        let down = (max_scaled_down - cleaned).min(cur - avail).max(0);
        cleaned += down;
        sets.scale(i, cur - down, replicas, max);
    }
    let available = sets.status_sum(|rs| rs_status(rs).available_replicas.unwrap_or(0), None);
    if available <= min_available {
        return;
    }
    let total = available - min_available;
    let mut done = 0;
    for &i in &old {
        if done >= total {
            break;
        }
        let cur = sets.spec_replicas(i);
        if cur == 0 {
            continue;
        }
        let down = cur.min(total - done);
        done += down;
        sets.scale(i, cur - down, replicas, max);
    }
}

/// Upstream's `scale`: a paused Deployment or a replica change that is not a rollout.
fn scale(d: &Deployment, sets: &mut Sets, replicas: i32, fp: &Fenceposts) {
    let max = replicas + fp.surge;
    let active: Vec<usize> = (0..sets.all.len())
        .filter(|i| sets.spec_replicas(*i) > 0)
        .collect();
    let target = match active.as_slice() {
        [] => sets.new.or_else(|| sets.all.len().checked_sub(1)),
        [one] => Some(*one),
        _ => None,
    };
    if let Some(i) = target {
        sets.scale(i, replicas, replicas, max);
        return;
    }
    if let Some(n) = sets.new
        && sets.spec_replicas(n) == replicas
        && rs_status(&sets.all[n]).available_replicas.unwrap_or(0) == replicas
    {
        for i in active.into_iter().filter(|i| *i != n) {
            sets.scale(i, 0, replicas, max);
        }
        return;
    }
    if is_recreate(d) {
        return;
    }
    // Proportional scaling: each active ReplicaSet gets its share of the change, by the
    // size the Deployment had when it was last scaled (`max-replicas`).
    let allowed = if replicas > 0 { max } else { 0 };
    let to_add = allowed - sets.total_spec();
    let mut order = active;
    order.sort_by(|a, b| {
        let t = |i: usize| {
            sets.all[i]
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0)
        };
        let by_size = sets.spec_replicas(*b).cmp(&sets.spec_replicas(*a));
        if to_add > 0 {
            by_size.then(t(*b).cmp(&t(*a)))
        } else {
            by_size.then(t(*a).cmp(&t(*b)))
        }
    });
    let status_replicas = d.status.as_ref().and_then(|s| s.replicas).unwrap_or(0);
    let mut added = 0;
    let mut sizes: Vec<(usize, i32)> = Vec::new();
    for &i in &order {
        let cur = sets.spec_replicas(i);
        let proportion = if to_add == 0 || to_add == added {
            0
        } else {
            let annotated = sets.all[i]
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_MAX_REPLICAS))
                .and_then(|v| v.parse::<i32>().ok())
                .unwrap_or(status_replicas);
            let fraction = if replicas == 0 || annotated == 0 {
                -cur
            } else {
                let scaled = f64::from(cur) * f64::from(max) / f64::from(annotated);
                // Sizes are far below 2^31; the cast cannot truncate.
                #[allow(clippy::cast_possible_truncation)]
                let rounded = scaled.round() as i32;
                rounded - cur
            };
            let allowed = to_add - added;
            if to_add > 0 {
                fraction.min(allowed)
            } else {
                fraction.max(allowed)
            }
        };
        added += proportion;
        sizes.push((i, cur + proportion));
    }
    if let Some(first) = sizes.first_mut() {
        first.1 = (first.1 + to_add - added).max(0);
    }
    for (i, size) in sizes {
        sets.scale(i, size.max(0), replicas, max);
    }
}

fn rollout_complete(sets: &Sets, replicas: i32) -> bool {
    let Some(n) = sets.new else {
        return false;
    };
    let st = rs_status(&sets.all[n]);
    sets.spec_replicas(n) == replicas
        && st.replicas == replicas
        && st.available_replicas.unwrap_or(0) == replicas
        && sets
            .old()
            .all(|i| sets.spec_replicas(i) == 0 && rs_status(&sets.all[i]).replicas == 0)
}

/// Upstream's `cleanupDeployment`: old ReplicaSets beyond the limit, lowest revision first,
/// only those with no replicas whose controller has seen their latest spec.
fn history_cleanup(sets: &Sets, limit: i32) -> Vec<String> {
    let mut old: Vec<&ReplicaSet> = sets
        .old()
        .map(|i| &sets.all[i])
        .filter(|rs| rs.metadata.deletion_timestamp.is_none())
        .collect();
    let limit = usize::try_from(limit.max(0)).unwrap_or(0);
    if old.len() <= limit {
        return Vec::new();
    }
    let excess = old.len() - limit;
    old.sort_by(|a, b| {
        revision_of(&a.metadata)
            .cmp(&revision_of(&b.metadata))
            .then_with(|| {
                let t = |r: &ReplicaSet| r.metadata.creation_timestamp.as_ref().map(|t| t.0);
                t(a).cmp(&t(b))
            })
    });
    old.into_iter()
        .take(excess)
        .filter(|rs| {
            let st = rs_status(rs);
            let spec = rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
            st.replicas == 0
                && spec == 0
                && rs.metadata.generation.unwrap_or(0) <= st.observed_generation.unwrap_or(0)
        })
        .filter_map(|rs| rs.metadata.name.clone())
        .collect()
}

#[path = "deployment_status.rs"]
mod status;

use status::{compute_status, seconds_to_deadline};

#[cfg(test)]
#[path = "deployment_tests.rs"]
mod tests;

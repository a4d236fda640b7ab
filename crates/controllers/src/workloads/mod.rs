//! Pure cores of the workload controllers, as upstream's: [`replicaset`] and [`statefulset`]
//! turn a workload and the pods it owns into the pods to create, the pods to delete and the
//! status to write; [`deployment`] turns a Deployment and the ReplicaSets it owns into the
//! ReplicaSets to create, scale or delete (it never touches a pod).
//!
//! A Deployment's ReplicaSet is `<deployment>-<pod-template-hash>`, its pods
//! `<replicaset>-<5 random chars>`: the plan asks for `generateName: <replicaset>-` and the API
//! server draws the suffix, so planning stays deterministic. The hash (label
//! `pod-template-hash`) is computed from the pod template like upstream's (FNV-32a, plus the
//! collision count, encoded with the safe alphabet), over its canonical JSON rather than Go's
//! spew dump, so the values differ from a real cluster's but have the same shape.

pub mod daemonset;
pub mod deployment;
pub mod history;
pub mod replicaset;
pub mod statefulset;

use std::cmp::Ordering;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;

use crate::podutil;

/// Pods to create and delete, and the status to write (`None` when it is already right).
#[derive(Debug, Clone, PartialEq)]
pub struct PodPlan<S> {
    pub create: Vec<Pod>,
    /// Names of pods to delete, in the order they should go.
    pub delete: Vec<String>,
    /// Pods whose ownerReferences change: orphans adopted (the controller's reference added)
    /// and pods released (it removed). Written back as they are, with their resourceVersion.
    pub adopt: Vec<Pod>,
    pub status: Option<S>,
}

impl<S> Default for PodPlan<S> {
    fn default() -> Self {
        Self {
            create: Vec::new(),
            delete: Vec::new(),
            adopt: Vec::new(),
            status: None,
        }
    }
}

impl<S> PodPlan<S> {
    pub fn is_empty(&self) -> bool {
        self.create.is_empty()
            && self.delete.is_empty()
            && self.adopt.is_empty()
            && self.status.is_none()
    }
}

/// A workload that cannot be acted on; the message names the object and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkloadError {
    #[error("{kind} {namespace}/{name}: spec.selector: {message}")]
    InvalidSelector {
        kind: &'static str,
        namespace: String,
        name: String,
        message: String,
    },
    #[error("{kind} {namespace}/{name}: spec.template.metadata.labels: do not match spec.selector")]
    TemplateNotSelected {
        kind: &'static str,
        namespace: String,
        name: String,
    },
    #[error("{kind} {namespace}/{name}: {field}: {message}")]
    InvalidField {
        kind: &'static str,
        namespace: String,
        name: String,
        field: &'static str,
        message: String,
    },
}

/// Upstream's `ComputeHash` without a collision count: FNV-32a of the template, as the
/// decimal number mapped onto the alphabet of `rand.SafeEncodeString`.
pub fn pod_template_hash(template: &PodTemplateSpec) -> String {
    pod_template_hash_with(template, None)
}

/// Upstream's `ComputeHash`: the template, then (when set) the collision count as four
/// little-endian bytes, so a Deployment whose hash collided gets a new name.
pub fn pod_template_hash_with(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    let mut bytes = serde_json::to_vec(template).unwrap_or_default();
    if let Some(c) = collision_count {
        bytes.extend_from_slice(&c.to_le_bytes());
    }
    safe_encode(fnv32a(&bytes))
}

pub(crate) fn fnv32a(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in bytes {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// `rand.SafeEncodeString(fmt.Sprint(h))`.
pub(crate) fn safe_encode(h: u32) -> String {
    const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    h.to_string()
        .bytes()
        .map(|b| ALPHANUMS[usize::from(b) % ALPHANUMS.len()] as char)
        .collect()
}

/// Upstream's `EqualIgnoreHash`: two pod templates are the same once the `pod-template-hash`
/// label is removed. Like Go's semantic equality, an empty map or list equals an absent one.
pub fn templates_equal_ignoring_hash(a: &PodTemplateSpec, b: &PodTemplateSpec) -> bool {
    fn canonical(t: &PodTemplateSpec) -> serde_json::Value {
        let mut t = t.clone();
        if let Some(l) = t.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
            l.remove(deployment::LABEL_POD_TEMPLATE_HASH);
        }
        prune(serde_json::to_value(&t).unwrap_or_default())
    }
    canonical(a) == canonical(b)
}

/// Drops nulls, empty lists and empty maps, recursively.
fn prune(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    let empty = |v: &Value| match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    };
    match v {
        Value::Object(o) => Value::Object(
            o.into_iter()
                .map(|(k, v)| (k, prune(v)))
                .filter(|(_, v)| !empty(v))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(prune).collect()),
        other => other,
    }
}

/// The uid of the object's controller (the ownerReference with `controller: true`).
pub(crate) fn controller_uid(meta: &ObjectMeta) -> Option<&str> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.as_str())
}

/// Pods with the same ranking for availability: Ready for at least `min_ready_seconds` at
/// `now` (upstream's `IsPodAvailable`).
pub(crate) fn is_available(p: &Pod, min_ready_seconds: i32, now: Timestamp) -> bool {
    if !podutil::is_ready(p) {
        return false;
    }
    if min_ready_seconds <= 0 {
        return true;
    }
    let since = p
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0);
    since.is_some_and(|t| now.as_second() - t.as_second() >= i64::from(min_ready_seconds))
}

/// Pods controlled by the object with this uid.
pub(crate) fn owned<'a>(pods: &[&'a Pod], uid: &str, namespace: Option<&String>) -> Vec<&'a Pod> {
    pods.iter()
        .copied()
        .filter(|p| p.metadata.namespace.as_ref() == namespace)
        .filter(|p| {
            p.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.controller == Some(true) && o.uid == uid)
        })
        .collect()
}

/// A pod from a template: its labels, annotations and spec, plus the owner.
pub(crate) fn pod_from_template(
    template: &PodTemplateSpec,
    namespace: Option<String>,
    owner: OwnerReference,
    extra_labels: BTreeMap<String, String>,
) -> Pod {
    let tmeta = template.metadata.clone().unwrap_or_default();
    let mut labels = tmeta.labels.unwrap_or_default();
    labels.extend(extra_labels);
    Pod {
        metadata: ObjectMeta {
            namespace,
            labels: Some(labels),
            annotations: tmeta.annotations,
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: template.spec.clone(),
        status: None,
    }
}

/// Upstream's `ActivePods` ranking for scale-down: the pod that should go first sorts first —
/// unscheduled before scheduled, Pending before Unknown before Running, not ready before
/// ready, newer before older.
pub(crate) fn deletion_order(a: &Pod, b: &Pod) -> Ordering {
    let scheduled = |p: &Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| !n.is_empty())
    };
    let phase_rank = |p: &Pod| match podutil::phase(p) {
        "Pending" | "" => 0,
        "Running" => 2,
        _ => 1,
    };
    scheduled(a)
        .cmp(&scheduled(b))
        .then(phase_rank(a).cmp(&phase_rank(b)))
        .then(podutil::is_ready(a).cmp(&podutil::is_ready(b)))
        .then_with(|| {
            let t = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
            t(b).cmp(&t(a))
        })
        .then_with(|| b.metadata.name.cmp(&a.metadata.name))
}

/// Resolves an int-or-percent (`maxSurge`, `maxUnavailable`) against `total`.
pub(crate) fn scaled_value(
    v: Option<&k8s_openapi::apimachinery::pkg::util::intstr::IntOrString>,
    default_percent: i32,
    total: i32,
    round_up: bool,
) -> Result<i32, String> {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let percent = match v {
        None => default_percent,
        Some(IntOrString::Int(n)) => return Ok((*n).max(0)),
        Some(IntOrString::String(s)) => s
            .strip_suffix('%')
            .and_then(|n| n.parse::<i32>().ok())
            .ok_or_else(|| format!("invalid value {s:?}: must be an integer or a percentage"))?,
    };
    let num = i64::from(percent) * i64::from(total);
    let v = if round_up {
        (num + 99).div_euclid(100)
    } else {
        num.div_euclid(100)
    };
    Ok(i32::try_from(v.max(0)).unwrap_or(i32::MAX))
}

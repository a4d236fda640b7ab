//! ControllerRevisions of a StatefulSet or a DaemonSet, as upstream's `pkg/controller/history`
//! and the two controllers' use of it:
//!
//! - a revision's `data` is the strategic merge patch that restores the template,
//!   `{"spec":{"template":{…,"$patch":"replace"}}}` (what `kubectl rollout undo` applies), its
//!   labels the template's, its controller the workload, its name `<workload>-<hash>` with the
//!   hash FNV-32 of the data (plus the collision count); a StatefulSet's pods carry the
//!   revision's name in `controller-revision-hash`, a DaemonSet's the hash alone;
//! - the update revision is the latest one when its data equals the StatefulSet's; an older
//!   equal one (a rollback) gets its `revision` bumped past every other; otherwise a new
//!   revision numbered one above the highest is created;
//! - revisions neither current, nor update, nor named by a live pod's
//!   `controller-revision-hash` are deleted beyond `revisionHistoryLimit` (default 10), the
//!   lowest numbers first.

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use serde_json::{Value, json};

use super::{controller_uid, safe_encode};
use crate::endpointslice::controller_ref;
use crate::podutil;
use crate::workloads::statefulset::LABEL_REVISION;

/// What to write to a StatefulSet's history.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RevisionPlan {
    pub create: Option<ControllerRevision>,
    /// An existing revision renumbered (a rollback to it), with its resourceVersion.
    pub update: Option<ControllerRevision>,
    pub delete: Vec<String>,
    /// The update revision's name: the `controller-revision-hash` of new pods.
    pub update_revision: String,
    /// The current revision (`status.currentRevision`) when it is another one still in the
    /// history: its name and template, for pods below a rolling update's partition.
    pub current: Option<(String, PodTemplateSpec)>,
}

/// What the history needs of its workload.
#[derive(Debug, Clone)]
pub struct Owner<'a> {
    pub kind: &'static str,
    pub meta: &'a ObjectMeta,
    pub template: Option<&'a PodTemplateSpec>,
    pub collision_count: Option<i32>,
    pub history_limit: Option<i32>,
    /// `status.currentRevision` (StatefulSets; a DaemonSet has none).
    pub current_revision: Option<String>,
    /// Whether pods carry the hash alone (DaemonSets) or the revision's name (StatefulSets).
    pub label_is_hash: bool,
}

impl<'a> Owner<'a> {
    pub fn statefulset(sts: &'a StatefulSet) -> Self {
        Owner {
            kind: "StatefulSet",
            meta: &sts.metadata,
            template: sts.spec.as_ref().map(|s| &s.template),
            collision_count: sts.status.as_ref().and_then(|s| s.collision_count),
            history_limit: sts.spec.as_ref().and_then(|s| s.revision_history_limit),
            current_revision: sts.status.as_ref().and_then(|s| s.current_revision.clone()),
            label_is_hash: false,
        }
    }

    pub fn daemonset(ds: &'a DaemonSet) -> Self {
        Owner {
            kind: "DaemonSet",
            meta: &ds.metadata,
            template: ds.spec.as_ref().map(|s| &s.template),
            collision_count: ds.status.as_ref().and_then(|s| s.collision_count),
            history_limit: ds.spec.as_ref().and_then(|s| s.revision_history_limit),
            current_revision: None,
            label_is_hash: true,
        }
    }

    /// The `controller-revision-hash` its pods of revision `name` carry.
    fn pod_label<'n>(&self, name: &'n str) -> &'n str {
        if !self.label_is_hash {
            return name;
        }
        name.rsplit_once('-').map_or(name, |(_, hash)| hash)
    }
}

/// The revision data of `sts`: the patch restoring its template.
pub fn revision_data(sts: &StatefulSet) -> Value {
    template_data(Owner::statefulset(sts).template)
}

/// The patch restoring `template` (none: an empty one).
fn template_data(template: Option<&PodTemplateSpec>) -> Value {
    let template = template
        .map(|t| serde_json::to_value(t).unwrap_or(Value::Null))
        .unwrap_or(Value::Null);
    let mut template = match template {
        Value::Object(m) => m,
        _ => serde_json::Map::new(),
    };
    template.insert("$patch".into(), json!("replace"));
    json!({"spec": {"template": Value::Object(template)}})
}

/// Upstream's `HashControllerRevision`: FNV-32 (not 1a) of the data, then the collision
/// count in decimal, safe-encoded.
fn hash(data: &Value, collision_count: Option<i32>) -> String {
    let mut bytes = serde_json::to_vec(data).unwrap_or_default();
    if let Some(c) = collision_count {
        bytes.extend_from_slice(c.to_string().as_bytes());
    }
    let mut h: u32 = 0x811c_9dc5;
    for b in bytes {
        h = h.wrapping_mul(0x0100_0193);
        h ^= u32::from(b);
    }
    safe_encode(h)
}

/// The name of the revision `sts` is at now: `<name>-<hash>`.
pub fn revision_name(sts: &StatefulSet) -> String {
    name_of(&Owner::statefulset(sts))
}

/// The hash of the revision `owner` is at now (a DaemonSet's pods' `controller-revision-hash`).
pub fn revision_hash(owner: &Owner<'_>) -> String {
    hash(&template_data(owner.template), owner.collision_count)
}

fn name_of(owner: &Owner<'_>) -> String {
    let name = owner.meta.name.clone().unwrap_or_default();
    // Upstream truncates the prefix so the name stays a valid label value with the hash.
    let prefix: String = name.chars().take(223).collect();
    format!("{prefix}-{}", revision_hash(owner))
}

fn number(r: &ControllerRevision) -> i64 {
    r.revision
}

fn data_of(r: &ControllerRevision) -> Option<&Value> {
    r.data.as_ref().map(|d| &d.0)
}

/// The template a revision restores (its data without the `$patch` directive).
pub fn template_of(r: &ControllerRevision) -> Option<PodTemplateSpec> {
    let mut t = data_of(r)?.pointer("/spec/template")?.clone();
    if let Value::Object(m) = &mut t {
        m.remove("$patch");
    }
    serde_json::from_value(t).ok()
}

/// Computes the history writes for `owner`; `revisions` and `pods` may be all of its
/// namespace.
pub fn plan(owner: &Owner<'_>, revisions: &[&ControllerRevision], pods: &[&Pod]) -> RevisionPlan {
    let meta = owner.meta;
    let uid = meta.uid.clone().unwrap_or_default();
    let mut mine: Vec<&ControllerRevision> = revisions
        .iter()
        .copied()
        .filter(|r| r.metadata.namespace == meta.namespace)
        .filter(|r| controller_uid(&r.metadata) == Some(uid.as_str()))
        .collect();
    mine.sort_by(|a, b| {
        number(a)
            .cmp(&number(b))
            .then_with(|| {
                let t =
                    |r: &ControllerRevision| r.metadata.creation_timestamp.as_ref().map(|t| t.0);
                t(a).cmp(&t(b))
            })
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
    let data = template_data(owner.template);
    let next = mine.last().map_or(1, |r| number(r) + 1);
    let mut out = RevisionPlan::default();
    let equal: Vec<&ControllerRevision> = mine
        .iter()
        .copied()
        .filter(|r| data_of(r) == Some(&data))
        .collect();
    match (equal.last(), mine.last()) {
        (Some(eq), Some(last)) if eq.metadata.name == last.metadata.name => {
            out.update_revision = last.metadata.name.clone().unwrap_or_default();
        }
        (Some(eq), _) => {
            let mut bumped = (*eq).clone();
            bumped.revision = next;
            out.update_revision = bumped.metadata.name.clone().unwrap_or_default();
            out.update = Some(bumped);
        }
        (None, _) => {
            let name = name_of(owner);
            out.update_revision = name.clone();
            out.create = Some(ControllerRevision {
                metadata: ObjectMeta {
                    name: Some(name),
                    namespace: meta.namespace.clone(),
                    labels: owner
                        .template
                        .and_then(|t| t.metadata.as_ref())
                        .and_then(|m| m.labels.clone()),
                    // The workload's annotations (`kubernetes.io/change-cause` is what
                    // `kubectl rollout history` shows), as upstream copies them.
                    annotations: meta.annotations.clone(),
                    owner_references: Some(vec![controller_ref("apps/v1", owner.kind, meta)]),
                    ..Default::default()
                },
                data: Some(RawExtension(data)),
                revision: next,
            });
        }
    }

    // History beyond the limit: never the current or update revision, nor one a pod runs.
    let current = owner.current_revision.clone().unwrap_or_default();
    if !current.is_empty() && current != out.update_revision {
        out.current = mine
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(current.as_str()))
            .and_then(|r| template_of(r))
            .map(|t| (current.clone(), t));
    }
    let live = |name: &str| {
        name == current
            || name == out.update_revision
            || pods.iter().any(|p| {
                p.metadata.namespace == meta.namespace
                    && controller_uid(&p.metadata) == Some(uid.as_str())
                    && podutil::is_active(p)
                    && p.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(LABEL_REVISION))
                        .is_some_and(|h| h == owner.pod_label(name))
            })
    };
    let limit = owner.history_limit.unwrap_or(10).max(0);
    let historic: Vec<&ControllerRevision> = mine
        .iter()
        .copied()
        .filter(|r| !live(r.metadata.name.as_deref().unwrap_or("")))
        .collect();
    let excess = historic
        .len()
        .saturating_sub(usize::try_from(limit).unwrap_or(0));
    out.delete = historic
        .iter()
        .take(excess)
        .filter_map(|r| r.metadata.name.clone())
        .collect();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::*;
    use k8s_openapi::api::apps::v1::StatefulSetSpec;

    fn sts(image: &str) -> StatefulSet {
        let (selector, template) = workload_parts("nginx", image);
        StatefulSet {
            metadata: meta("default", "web"),
            spec: Some(StatefulSetSpec {
                selector,
                template,
                revision_history_limit: Some(1),
                ..Default::default()
            }),
            status: None,
        }
    }

    /// Applies a plan to a history, like the API server would.
    fn apply(history: &mut Vec<ControllerRevision>, p: &RevisionPlan) {
        if let Some(c) = &p.create {
            history.push(c.clone());
        }
        if let Some(u) = &p.update {
            for r in history.iter_mut() {
                if r.metadata.name == u.metadata.name {
                    *r = u.clone();
                }
            }
        }
        history.retain(|r| !p.delete.contains(r.metadata.name.as_ref().unwrap()));
    }

    fn numbers(history: &[ControllerRevision]) -> Vec<(String, i64)> {
        let mut v: Vec<_> = history
            .iter()
            .map(|r| (r.metadata.name.clone().unwrap(), r.revision))
            .collect();
        v.sort_by_key(|(_, n)| *n);
        v
    }

    #[test]
    fn creates_then_keeps_then_rolls_back_by_renumbering() {
        let mut history = Vec::new();
        let one = sts("nginx:1");
        let p = plan(&Owner::statefulset(&one), &[], &[]);
        let r1 = p.create.clone().expect("a first revision");
        assert_eq!(r1.revision, 1);
        assert_eq!(
            r1.metadata.name.as_deref(),
            Some(revision_name(&one).as_str())
        );
        assert!(r1.metadata.name.as_deref().unwrap().starts_with("web-"));
        assert_eq!(r1.metadata.labels, Some(map(&[("app", "nginx")])));
        assert_eq!(
            data_of(&r1).unwrap()["spec"]["template"]["$patch"],
            json!("replace")
        );
        assert_eq!(
            r1.metadata.owner_references.as_ref().unwrap()[0].kind,
            "StatefulSet"
        );
        assert_eq!(p.update_revision, r1.metadata.name.clone().unwrap());
        apply(&mut history, &p);
        let refs: Vec<&ControllerRevision> = history.iter().collect();
        let again = plan(&Owner::statefulset(&one), &refs, &[]);
        assert!(again.create.is_none() && again.update.is_none() && again.delete.is_empty());

        let two = sts("nginx:2");
        let refs: Vec<&ControllerRevision> = history.iter().collect();
        let p = plan(&Owner::statefulset(&two), &refs, &[]);
        assert_eq!(p.create.as_ref().unwrap().revision, 2);
        assert_ne!(p.update_revision, r1.metadata.name.clone().unwrap());
        apply(&mut history, &p);
        // Back to the first template: revision 1 becomes 3, no new object.
        let refs: Vec<&ControllerRevision> = history.iter().collect();
        let p = plan(&Owner::statefulset(&one), &refs, &[]);
        assert!(p.create.is_none());
        assert_eq!(p.update.as_ref().unwrap().revision, 3);
        apply(&mut history, &p);
        let names = numbers(&history);
        assert_eq!(
            names.iter().map(|(_, n)| *n).collect::<Vec<_>>(),
            vec![2, 3]
        );
        assert_eq!(names[1].0, r1.metadata.name.clone().unwrap());
    }

    #[test]
    fn history_beyond_the_limit_goes_unless_live() {
        let mut history = Vec::new();
        for i in 1..=3 {
            let s = sts(&format!("img:{i}"));
            let refs: Vec<&ControllerRevision> = history.iter().collect();
            let p = plan(&Owner::statefulset(&s), &refs, &[]);
            apply(&mut history, &p);
        }
        // Limit 1: of the two old revisions, the lowest went.
        let nums: Vec<i64> = numbers(&history).iter().map(|(_, n)| *n).collect();
        assert_eq!(nums, vec![2, 3]);
        // A pod still running revision 2 keeps it while more revisions come.
        let r2 = numbers(&history)[0].0.clone();
        let mut p2 = pod("default", "web-0", |p| {
            p.labels(&[("app", "nginx"), (LABEL_REVISION, r2.as_str())]);
        });
        p2.metadata.owner_references = Some(vec![controller_ref(
            "apps/v1",
            "StatefulSet",
            &sts("x").metadata,
        )]);
        for i in 4..=5 {
            let s = sts(&format!("img:{i}"));
            let refs: Vec<&ControllerRevision> = history.iter().collect();
            let p = plan(&Owner::statefulset(&s), &refs, &[&p2]);
            apply(&mut history, &p);
        }
        let nums: Vec<i64> = numbers(&history).iter().map(|(_, n)| *n).collect();
        assert_eq!(nums, vec![2, 4, 5]);
    }

    #[test]
    fn a_daemonsets_history_labels_pods_with_the_hash() {
        use k8s_openapi::api::apps::v1::DaemonSetSpec;
        let ds = |image: &str| {
            let (selector, template) = workload_parts("agent", image);
            let mut d = DaemonSet {
                metadata: meta("kube-system", "agent"),
                spec: Some(DaemonSetSpec {
                    selector,
                    template,
                    revision_history_limit: Some(1),
                    ..Default::default()
                }),
                status: None,
            };
            d.metadata.annotations = Some(map(&[("kubernetes.io/change-cause", image)]));
            d
        };
        let mut history = Vec::new();
        let one = ds("agent:1");
        let p = plan(&Owner::daemonset(&one), &[], &[]);
        let r1 = p.create.clone().unwrap();
        let hash1 = revision_hash(&Owner::daemonset(&one));
        assert_eq!(
            r1.metadata.name.as_deref(),
            Some(format!("agent-{hash1}").as_str())
        );
        assert_eq!(
            r1.metadata.owner_references.as_ref().unwrap()[0].kind,
            "DaemonSet"
        );
        assert_eq!(
            r1.metadata.annotations,
            Some(map(&[("kubernetes.io/change-cause", "agent:1")]))
        );
        assert!(p.current.is_none());
        apply(&mut history, &p);
        // A pod of revision 1 (labelled with the hash alone) keeps it beyond the limit.
        let mut old_pod = pod("kube-system", "agent-x", |p| {
            p.labels(&[("app", "agent"), (LABEL_REVISION, hash1.as_str())]);
        });
        old_pod.metadata.owner_references =
            Some(vec![controller_ref("apps/v1", "DaemonSet", &one.metadata)]);
        // Revisions 2 to 4, and one more pass at 4 (a sync sees its own creation the next time).
        for i in [2, 3, 4, 4] {
            let d = ds(&format!("agent:{i}"));
            let refs: Vec<&ControllerRevision> = history.iter().collect();
            let p = plan(&Owner::daemonset(&d), &refs, &[&old_pod]);
            apply(&mut history, &p);
        }
        let nums: Vec<i64> = numbers(&history).iter().map(|(_, n)| *n).collect();
        assert_eq!(
            nums,
            vec![1, 3, 4],
            "revision 1 is live, 4 the update revision, 3 the one kept, 2 beyond the limit"
        );
        // Undo to revision 1's template: renumbered, not recreated.
        let refs: Vec<&ControllerRevision> = history.iter().collect();
        let back = plan(&Owner::daemonset(&one), &refs, &[&old_pod]);
        assert!(back.create.is_none());
        assert_eq!(back.update.as_ref().unwrap().revision, 5);
    }

    #[test]
    fn the_current_revision_is_offered_while_it_differs() {
        let mut history = Vec::new();
        let one = sts("nginx:1");
        apply(&mut history, &plan(&Owner::statefulset(&one), &[], &[]));
        let mut two = sts("nginx:2");
        two.status = Some(k8s_openapi::api::apps::v1::StatefulSetStatus {
            current_revision: Some(revision_name(&one)),
            ..Default::default()
        });
        let refs: Vec<&ControllerRevision> = history.iter().collect();
        let p = plan(&Owner::statefulset(&two), &refs, &[]);
        let (name, template) = p.current.expect("the current revision");
        assert_eq!(name, revision_name(&one));
        assert_eq!(template, one.spec.unwrap().template);
        assert!(
            plan(&Owner::statefulset(&sts("nginx:1")), &refs, &[])
                .current
                .is_none()
        );
    }
}

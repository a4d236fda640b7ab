//! StatefulSet → pods `<name>-0`, `<name>-1`, …, as upstream's StatefulSet controller:
//!
//! - each pod has `spec.hostname` = its name and `spec.subdomain` = `serviceName`, so the
//!   headless service gives it a stable DNS name, and labels
//!   `statefulset.kubernetes.io/pod-name`, `apps.kubernetes.io/pod-index` and
//!   `controller-revision-hash` (the name of the ControllerRevision of its template, see
//!   [`super::history`]);
//! - `OrderedReady` (default): pod N+1 is created only when pods 0..=N are Running and Ready;
//!   scale-down removes the highest ordinal first, one at a time, only when every remaining
//!   pod is healthy; failed pods are deleted and recreated in place;
//! - `Parallel`: all missing pods are created and all condemned pods deleted at once;
//! - `RollingUpdate` (default): once all pods are Running and Ready, the highest-ordinal pod
//!   (at or above `partition`) of an old revision is deleted, to be recreated from the new
//!   template; `OnDelete` leaves that to the user.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};

use super::{PodPlan, WorkloadError, owned, pod_from_template};
use crate::endpointslice::controller_ref;
use crate::podutil;
use svcnet_apimachinery::selector::LabelSelector;

pub const LABEL_POD_NAME: &str = "statefulset.kubernetes.io/pod-name";
pub const LABEL_POD_INDEX: &str = "apps.kubernetes.io/pod-index";
pub const LABEL_REVISION: &str = "controller-revision-hash";

/// Computes the plan for `sts`; `pods` may be every pod of its namespace.
pub fn plan(sts: &StatefulSet, pods: &[&Pod]) -> Result<PodPlan<StatefulSetStatus>, WorkloadError> {
    plan_at(sts, pods, &super::history::revision_name(sts), None)
}

/// [`plan`] with the revisions the history decided: the update revision's name, and the
/// current revision (name and template) when it differs. As upstream's
/// `newVersionedStatefulSetPod`, a pod recreated below a rolling update's partition comes
/// from the current revision, every other from the update revision.
pub fn plan_at(
    sts: &StatefulSet,
    pods: &[&Pod],
    update_revision: &str,
    current: Option<(&str, &PodTemplateSpec)>,
) -> Result<PodPlan<StatefulSetStatus>, WorkloadError> {
    let ns = sts.metadata.namespace.clone().unwrap_or_default();
    let name = sts.metadata.name.clone().unwrap_or_default();
    let spec = sts.spec.clone().unwrap_or_default();
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
                kind: "StatefulSet",
                namespace: ns,
                name,
                message: e.to_string(),
            });
        }
        Ok(false) => {
            return Err(WorkloadError::TemplateNotSelected {
                kind: "StatefulSet",
                namespace: ns,
                name,
            });
        }
        Ok(true) => {}
    }
    let replicas = usize::try_from(spec.replicas.unwrap_or(1).max(0)).unwrap_or(0);
    let revision = update_revision.to_string();
    let parallel = spec.pod_management_policy.as_deref() == Some("Parallel");
    let strategy = spec.update_strategy.clone().unwrap_or_default();
    let on_delete = strategy.type_.as_deref() == Some("OnDelete");
    let partition = strategy
        .rolling_update
        .and_then(|r| r.partition)
        .and_then(|p| usize::try_from(p).ok())
        .unwrap_or(0);

    let uid = sts.metadata.uid.clone().unwrap_or_default();
    let prefix = format!("{name}-");
    let mut by_ordinal: BTreeMap<usize, &Pod> = BTreeMap::new();
    for p in owned(pods, &uid, sts.metadata.namespace.as_ref()) {
        let ord = p
            .metadata
            .name
            .as_deref()
            .and_then(|n| n.strip_prefix(&prefix))
            .filter(|s| !s.starts_with('0') || *s == "0")
            .and_then(|s| s.parse::<usize>().ok());
        if let Some(ord) = ord {
            by_ordinal.insert(ord, p);
        }
    }
    let rev_of = |p: &Pod| {
        p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_REVISION))
            .cloned()
    };

    let mut out = PodPlan::default();
    let mut blocked = false;
    for ord in 0..replicas {
        match by_ordinal.get(&ord) {
            None => {
                let (template, rev) = match current {
                    Some((cur, t)) if !on_delete && ord < partition => (t, cur),
                    _ => (&spec.template, revision.as_str()),
                };
                out.create.push(new_pod(
                    sts,
                    template,
                    &name,
                    ord,
                    rev,
                    spec.service_name.as_deref(),
                ));
                if !parallel {
                    blocked = true;
                    break;
                }
            }
            Some(p) if podutil::is_terminal(p) && !podutil::is_terminating(p) => {
                out.delete.push(p.metadata.name.clone().unwrap_or_default());
                if !parallel {
                    blocked = true;
                    break;
                }
            }
            Some(p)
                if !parallel
                    && (podutil::is_terminating(p) || !podutil::is_running_and_ready(p)) =>
            {
                blocked = true;
                break;
            }
            Some(_) => {}
        }
    }

    let condemned: Vec<&Pod> = by_ordinal
        .range(replicas..)
        .rev()
        .map(|(_, p)| *p)
        .collect();
    if parallel {
        out.delete.extend(
            condemned
                .iter()
                .filter(|p| !podutil::is_terminating(p))
                .map(|p| p.metadata.name.clone().unwrap_or_default()),
        );
    } else if !blocked {
        let any_terminating = by_ordinal.values().any(|p| podutil::is_terminating(p));
        let all_healthy = by_ordinal
            .range(..replicas)
            .all(|(_, p)| podutil::is_running_and_ready(p));
        if let Some(first) = condemned.first()
            && !any_terminating
            && all_healthy
        {
            out.delete
                .push(first.metadata.name.clone().unwrap_or_default());
            blocked = true;
        }
    }

    // Rolling update: one pod at a time, highest ordinal first, once everything is healthy.
    let all_present_healthy = (0..replicas).all(|o| {
        by_ordinal
            .get(&o)
            .is_some_and(|p| podutil::is_running_and_ready(p) && !podutil::is_terminating(p))
    });
    let settled = !blocked && !on_delete && condemned.is_empty() && out.is_empty();
    if settled
        && all_present_healthy
        && let Some((_, p)) = by_ordinal
            .range(partition..replicas)
            .rev()
            .find(|(_, p)| rev_of(p).as_deref() != Some(revision.as_str()))
    {
        out.delete.push(p.metadata.name.clone().unwrap_or_default());
    }

    let active: Vec<&Pod> = by_ordinal
        .values()
        .copied()
        .filter(|p| podutil::is_active(p))
        .collect();
    let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    let updated = count(
        active
            .iter()
            .filter(|p| rev_of(p).as_deref() == Some(revision.as_str()))
            .count(),
    );
    let old = sts.status.clone().unwrap_or_default();
    let all_updated = usize::try_from(updated).unwrap_or(0) == replicas && active.len() == replicas;
    let current_revision = if all_updated || old.current_revision.is_none() {
        revision.clone()
    } else {
        old.current_revision.clone().unwrap_or_default()
    };
    let current = count(
        active
            .iter()
            .filter(|p| rev_of(p).as_deref() == Some(current_revision.as_str()))
            .count(),
    );
    let ready = count(active.iter().filter(|p| podutil::is_ready(p)).count());
    let status = StatefulSetStatus {
        observed_generation: sts.metadata.generation,
        replicas: count(active.len()),
        ready_replicas: Some(ready),
        available_replicas: Some(ready),
        current_replicas: Some(current),
        updated_replicas: Some(updated),
        current_revision: Some(current_revision),
        update_revision: Some(revision),
        collision_count: old.collision_count,
        conditions: old.conditions,
    };
    if sts.status.as_ref() != Some(&status) {
        out.status = Some(status);
    }
    Ok(out)
}

fn new_pod(
    sts: &StatefulSet,
    template: &PodTemplateSpec,
    name: &str,
    ord: usize,
    revision: &str,
    service_name: Option<&str>,
) -> Pod {
    let pod_name = format!("{name}-{ord}");
    let labels: BTreeMap<String, String> = [
        (LABEL_POD_NAME, pod_name.clone()),
        (LABEL_POD_INDEX, ord.to_string()),
        (LABEL_REVISION, revision.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let mut pod = pod_from_template(
        template,
        sts.metadata.namespace.clone(),
        controller_ref("apps/v1", "StatefulSet", &sts.metadata),
        labels,
    );
    pod.metadata.name = Some(pod_name.clone());
    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.hostname = Some(pod_name);
    spec.subdomain = service_name.filter(|s| !s.is_empty()).map(str::to_string);
    pod
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::*;
    use k8s_openapi::api::apps::v1::StatefulSetSpec;

    fn sts(replicas: i32, policy: Option<&str>) -> StatefulSet {
        let (selector, template) = workload_parts("nginx", "nginx:1");
        StatefulSet {
            metadata: meta("default", "web"),
            spec: Some(StatefulSetSpec {
                replicas: Some(replicas),
                service_name: Some("nginx".into()),
                pod_management_policy: policy.map(str::to_string),
                selector,
                template,
                ..Default::default()
            }),
            status: None,
        }
    }

    fn apply(pods: &mut Vec<Pod>, p: &PodPlan<StatefulSetStatus>, running: bool) {
        pods.retain(|pod| !p.delete.contains(pod.metadata.name.as_ref().unwrap()));
        for c in &p.create {
            let mut pod = c.clone();
            if running {
                pod.phase("Running").ready(true);
            } else {
                pod.phase("Pending").ready(false);
            }
            pods.push(pod);
        }
    }

    fn names(p: &PodPlan<StatefulSetStatus>) -> (Vec<String>, Vec<String>) {
        (
            p.create
                .iter()
                .map(|p| p.metadata.name.clone().unwrap())
                .collect(),
            p.delete.clone(),
        )
    }

    #[test]
    fn ordered_ready_creates_one_at_a_time() {
        let s = sts(3, None);
        let mut pods: Vec<Pod> = vec![];
        let mut order = vec![];
        for _ in 0..3 {
            let refs: Vec<&Pod> = pods.iter().collect();
            let p = plan(&s, &refs).unwrap();
            assert_eq!(p.create.len(), 1);
            order.push(p.create[0].metadata.name.clone().unwrap());
            apply(&mut pods, &p, false);
            // While the new pod is not Running and Ready, nothing else happens.
            let refs: Vec<&Pod> = pods.iter().collect();
            let waiting = plan(&s, &refs).unwrap();
            assert!(waiting.create.is_empty() && waiting.delete.is_empty());
            pods.last_mut().unwrap().phase("Running").ready(true);
        }
        assert_eq!(order, vec!["web-0", "web-1", "web-2"]);
        let p0 = &pods[0];
        let spec = p0.spec.as_ref().unwrap();
        assert_eq!(
            (spec.hostname.as_deref(), spec.subdomain.as_deref()),
            (Some("web-0"), Some("nginx"))
        );
        let l = p0.metadata.labels.as_ref().unwrap();
        assert_eq!(l[LABEL_POD_NAME], "web-0");
        assert_eq!(l[LABEL_POD_INDEX], "0");
        assert_eq!(l["app"], "nginx");
        assert!(l[LABEL_REVISION].starts_with("web-"));
        let refs: Vec<&Pod> = pods.iter().collect();
        let st = plan(&s, &refs).unwrap().status.unwrap();
        assert_eq!(
            (
                st.replicas,
                st.ready_replicas,
                st.current_replicas,
                st.updated_replicas
            ),
            (3, Some(3), Some(3), Some(3))
        );
    }

    #[test]
    fn scale_down_in_reverse_order() {
        let mut s = sts(3, None);
        let mut pods = vec![];
        for _ in 0..3 {
            let refs: Vec<&Pod> = pods.iter().collect();
            let p = plan(&s, &refs).unwrap();
            apply(&mut pods, &p, true);
        }
        s.spec.as_mut().unwrap().replicas = Some(1);
        let mut deleted = vec![];
        for _ in 0..2 {
            let refs: Vec<&Pod> = pods.iter().collect();
            let p = plan(&s, &refs).unwrap();
            assert_eq!(p.delete.len(), 1);
            deleted.extend(p.delete.clone());
            apply(&mut pods, &p, true);
        }
        assert_eq!(deleted, vec!["web-2", "web-1"]);
        // An unhealthy remaining pod blocks scale-down.
        s.spec.as_mut().unwrap().replicas = Some(3);
        for _ in 0..2 {
            let refs: Vec<&Pod> = pods.iter().collect();
            let p = plan(&s, &refs).unwrap();
            apply(&mut pods, &p, true);
        }
        s.spec.as_mut().unwrap().replicas = Some(1);
        pods[0].ready(false);
        let refs: Vec<&Pod> = pods.iter().collect();
        assert!(plan(&s, &refs).unwrap().delete.is_empty());
    }

    #[test]
    fn parallel_creates_all_and_deletes_all() {
        let mut s = sts(3, Some("Parallel"));
        let p = plan(&s, &[]).unwrap();
        assert_eq!(names(&p).0, vec!["web-0", "web-1", "web-2"]);
        let mut pods = vec![];
        apply(&mut pods, &p, false);
        s.spec.as_mut().unwrap().replicas = Some(0);
        let refs: Vec<&Pod> = pods.iter().collect();
        assert_eq!(
            names(&plan(&s, &refs).unwrap()).1,
            vec!["web-2", "web-1", "web-0"]
        );
    }

    #[test]
    fn failed_pod_recreated_and_rolling_update() {
        let mut s = sts(2, None);
        let mut pods = vec![];
        for _ in 0..2 {
            let refs: Vec<&Pod> = pods.iter().collect();
            let p = plan(&s, &refs).unwrap();
            apply(&mut pods, &p, true);
        }
        pods[0].phase("Failed");
        let refs: Vec<&Pod> = pods.iter().collect();
        assert_eq!(names(&plan(&s, &refs).unwrap()).1, vec!["web-0"]);
        pods[0].phase("Running");

        s.spec
            .as_mut()
            .unwrap()
            .template
            .spec
            .as_mut()
            .unwrap()
            .containers[0]
            .image = Some("nginx:2".into());
        let mut deleted = vec![];
        for _ in 0..6 {
            let refs: Vec<&Pod> = pods.iter().collect();
            let p = plan(&s, &refs).unwrap();
            deleted.extend(p.delete.clone());
            apply(&mut pods, &p, true);
            if let Some(st) = p.status {
                s.status = Some(st);
            }
        }
        assert_eq!(deleted, vec!["web-1", "web-0"]);
        let st = s.status.unwrap();
        assert_eq!(st.current_revision, st.update_revision);
        assert_eq!(st.updated_replicas, Some(2));
    }

    #[test]
    fn below_the_partition_pods_come_from_the_current_revision() {
        use k8s_openapi::api::apps::v1::{
            RollingUpdateStatefulSetStrategy, StatefulSetUpdateStrategy,
        };
        let mut s = sts(3, Some("Parallel"));
        s.spec.as_mut().unwrap().update_strategy = Some(StatefulSetUpdateStrategy {
            type_: Some("RollingUpdate".into()),
            rolling_update: Some(RollingUpdateStatefulSetStrategy {
                partition: Some(2),
                max_unavailable: None,
            }),
        });
        let (_, old_template) = workload_parts("nginx", "nginx:0");
        let p = plan_at(&s, &[], "web-new", Some(("web-old", &old_template))).unwrap();
        let got: Vec<(String, String, String)> = p
            .create
            .iter()
            .map(|pod| {
                (
                    pod.metadata.name.clone().unwrap(),
                    pod.metadata.labels.as_ref().unwrap()[LABEL_REVISION].clone(),
                    pod.spec.as_ref().unwrap().containers[0]
                        .image
                        .clone()
                        .unwrap(),
                )
            })
            .collect();
        let row = |n: &str, r: &str, i: &str| (n.to_string(), r.to_string(), i.to_string());
        assert_eq!(
            got,
            vec![
                row("web-0", "web-old", "nginx:0"),
                row("web-1", "web-old", "nginx:0"),
                row("web-2", "web-new", "nginx:1"),
            ]
        );
    }
}

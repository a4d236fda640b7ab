use super::*;
use crate::fixtures::*;
use crate::workloads::pod_template_hash;
use k8s_openapi::api::apps::v1::{
    DeploymentSpec, DeploymentStrategy, ReplicaSetStatus, RollingUpdateDeployment,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

fn deployment(replicas: i32, image: &str, f: impl FnOnce(&mut DeploymentSpec)) -> Deployment {
    let (selector, template) = workload_parts("myapp", image);
    let mut spec = DeploymentSpec {
        replicas: Some(replicas),
        selector,
        template,
        ..Default::default()
    };
    f(&mut spec);
    Deployment {
        metadata: ObjectMeta {
            generation: Some(3),
            ..meta("default", "myapp")
        },
        spec: Some(spec),
        status: None,
    }
}

fn rolling(surge: IntOrString, unavailable: IntOrString) -> impl FnOnce(&mut DeploymentSpec) {
    move |s| {
        s.strategy = Some(DeploymentStrategy {
            type_: Some("RollingUpdate".into()),
            rolling_update: Some(RollingUpdateDeployment {
                max_surge: Some(surge),
                max_unavailable: Some(unavailable),
            }),
        })
    }
}

fn set_image(d: &mut Deployment, image: &str) {
    d.spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap()
        .containers[0]
        .image = Some(image.into());
    d.metadata.generation = Some(d.metadata.generation.unwrap_or(0) + 1);
}

/// A tiny cluster: applies Deployment plans to a set of ReplicaSets, and plays the ReplicaSet
/// controller: each step, a ReplicaSet's pods follow its spec, and pods that existed at the
/// previous step become available when `ready` says so.
struct Sim {
    sets: Vec<ReplicaSet>,
    seq: i64,
}

impl Sim {
    fn new() -> Self {
        Self {
            sets: Vec::new(),
            seq: 0,
        }
    }

    fn plan(&self, d: &Deployment) -> DeploymentPlan {
        let refs: Vec<&ReplicaSet> = self.sets.iter().collect();
        plan(
            d,
            &refs,
            &[],
            Timestamp::from_second(1_700_000_500).unwrap(),
        )
        .unwrap()
    }

    /// Applies one plan (then the ReplicaSet controller's reaction) and returns it.
    fn step(&mut self, d: &mut Deployment, ready: bool) -> DeploymentPlan {
        let p = self.plan(d);
        if let Some(rs) = &p.create {
            self.seq += 1;
            let mut rs = rs.clone();
            rs.metadata.uid = Some(format!("rs-uid-{}", self.seq));
            rs.metadata.creation_timestamp = Some(Time(
                Timestamp::from_second(1_700_000_000 + self.seq).unwrap(),
            ));
            rs.metadata.generation = Some(1);
            self.sets.push(rs);
        }
        for u in &p.update {
            let i = self
                .sets
                .iter()
                .position(|s| s.metadata.name == u.metadata.name)
                .unwrap();
            let mut u = u.clone();
            u.metadata.generation = Some(u.metadata.generation.unwrap_or(1) + 1);
            self.sets[i] = u;
        }
        self.sets
            .retain(|s| !p.delete.contains(s.metadata.name.as_ref().unwrap()));
        if let Some(r) = &p.revision {
            d.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(ANNOTATION_REVISION.into(), r.clone());
        }
        if let Some(s) = &p.status {
            d.status = Some(s.clone());
        }
        // The ReplicaSet controller: scale-downs are immediate; new pods are available at
        // once when `ready`, else only from the next step on.
        for rs in &mut self.sets {
            let want = rs.spec.as_ref().unwrap().replicas.unwrap();
            let st = rs.status.get_or_insert_with(Default::default);
            let prev = st.replicas;
            let avail = if ready { want } else { prev.min(want) };
            *st = ReplicaSetStatus {
                replicas: want,
                ready_replicas: Some(avail),
                available_replicas: Some(avail),
                fully_labeled_replicas: Some(want),
                observed_generation: rs.metadata.generation,
                ..Default::default()
            };
        }
        p
    }

    /// Steps until a plan changes nothing but status; returns the sizes seen after each step.
    fn settle(&mut self, d: &mut Deployment, ready: bool) -> Vec<Vec<i32>> {
        let mut seen = Vec::new();
        let mut quiet = 0;
        for _ in 0..40 {
            let p = self.step(d, ready);
            seen.push(self.sizes());
            // Two quiet passes: the ReplicaSets' statuses have caught up too.
            quiet = if p.create.is_none() && p.update.is_empty() && p.delete.is_empty() {
                quiet + 1
            } else {
                0
            };
            if quiet == 2 {
                return seen;
            }
        }
        panic!("no steady state: {seen:?}");
    }

    fn sizes(&self) -> Vec<i32> {
        self.sets
            .iter()
            .map(|s| s.spec.as_ref().unwrap().replicas.unwrap())
            .collect()
    }

    fn revision(&self, i: usize) -> String {
        self.sets[i].metadata.annotations.as_ref().unwrap()[ANNOTATION_REVISION].clone()
    }

    fn available(&self) -> i32 {
        self.sets
            .iter()
            .map(|s| s.status.as_ref().unwrap().available_replicas.unwrap())
            .sum()
    }
}

fn progressing(d: &Deployment) -> (String, String, String) {
    let c = d
        .status
        .as_ref()
        .unwrap()
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == "Progressing")
        .unwrap();
    (
        c.status.clone(),
        c.reason.clone().unwrap(),
        c.message.clone().unwrap(),
    )
}

#[test]
fn creates_a_named_labelled_owned_replicaset() {
    let mut d = deployment(3, "nginx:1", |_| {});
    d.metadata.annotations = Some(map(&[
        ("kubernetes.io/change-cause", "first"),
        ("kubectl.kubernetes.io/last-applied-configuration", "{}"),
    ]));
    let p = plan(&d, &[], &[], Timestamp::UNIX_EPOCH).unwrap();
    let rs = p.create.expect("a new ReplicaSet");
    let hash = pod_template_hash(&d.spec.as_ref().unwrap().template);
    assert!(
        !hash.is_empty()
            && hash
                .chars()
                .all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c))
    );
    assert_eq!(rs.metadata.name, Some(format!("myapp-{hash}")));
    let spec = rs.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(3));
    assert_eq!(
        spec.selector.match_labels,
        Some(map(&[("app", "myapp"), (LABEL_POD_TEMPLATE_HASH, &hash)]))
    );
    let tlabels = spec.template.as_ref().unwrap().metadata.as_ref().unwrap();
    assert_eq!(
        tlabels.labels,
        Some(map(&[("app", "myapp"), (LABEL_POD_TEMPLATE_HASH, &hash)]))
    );
    assert_eq!(
        rs.metadata.annotations,
        Some(map(&[
            (ANNOTATION_DESIRED_REPLICAS, "3"),
            (ANNOTATION_MAX_REPLICAS, "4"),
            (ANNOTATION_REVISION, "1"),
            ("kubernetes.io/change-cause", "first"),
        ]))
    );
    let owner = &rs.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.name.as_str(),
            owner.uid.as_str(),
            owner.controller
        ),
        ("apps/v1", "Deployment", "myapp", "uid-myapp", Some(true))
    );
    let st = p.status.unwrap();
    let c = st
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Progressing")
        .unwrap();
    assert_eq!(
        (c.reason.as_deref(), c.message.as_deref()),
        (
            Some("NewReplicaSetCreated"),
            Some(format!("Created new replica set \"myapp-{hash}\"").as_str())
        )
    );
    // A different template hashes differently; the same one the same; a collision count
    // changes the hash.
    assert_ne!(
        hash,
        pod_template_hash(&deployment(3, "nginx:2", |_| {}).spec.unwrap().template)
    );
    assert_eq!(
        hash,
        pod_template_hash(&deployment(5, "nginx:1", |_| {}).spec.unwrap().template)
    );
    assert_ne!(
        hash,
        super::super::pod_template_hash_with(&d.spec.as_ref().unwrap().template, Some(1))
    );
}

#[test]
fn scaling_resizes_the_one_replicaset_and_completes() {
    let mut sim = Sim::new();
    let mut d = deployment(3, "nginx:1", |_| {});
    sim.settle(&mut d, true);
    assert_eq!(sim.sizes(), vec![3]);
    assert!(sim.plan(&d).is_empty(), "steady state");
    let st = d.status.clone().unwrap();
    assert_eq!(
        (
            st.replicas,
            st.ready_replicas,
            st.available_replicas,
            st.updated_replicas,
            st.observed_generation
        ),
        (Some(3), Some(3), Some(3), Some(3), Some(3))
    );
    let name = sim.sets[0].metadata.name.clone().unwrap();
    assert_eq!(
        progressing(&d),
        (
            "True".into(),
            "NewReplicaSetAvailable".into(),
            format!("ReplicaSet \"{name}\" has successfully progressed.")
        )
    );
    assert_eq!(
        d.metadata.annotations.as_ref().unwrap()[ANNOTATION_REVISION],
        "1"
    );
    d.spec.as_mut().unwrap().replicas = Some(1);
    sim.settle(&mut d, true);
    assert_eq!(sim.sizes(), vec![1]);
    assert_eq!(
        sim.sets[0].metadata.annotations.as_ref().unwrap()[ANNOTATION_DESIRED_REPLICAS],
        "1"
    );
}

/// Every step of a rolling update keeps the pods within `replicas + maxSurge` and the
/// available ones at or above `replicas - maxUnavailable`.
#[test]
fn rolling_update_respects_surge_and_unavailable() {
    let cases = [
        (4, IntOrString::Int(1), IntOrString::Int(0), 5, 4),
        (4, IntOrString::Int(0), IntOrString::Int(1), 4, 3),
        // 25% of 10: surge rounds up to 3, unavailable down to 2.
        (
            10,
            IntOrString::String("25%".into()),
            IntOrString::String("25%".into()),
            13,
            8,
        ),
        // Both 0 would never progress: one pod may be unavailable.
        (3, IntOrString::Int(0), IntOrString::Int(0), 3, 2),
    ];
    for (replicas, surge, unavail, max_total, min_avail) in cases {
        let mut sim = Sim::new();
        let mut d = deployment(replicas, "nginx:1", rolling(surge.clone(), unavail.clone()));
        sim.settle(&mut d, true);
        set_image(&mut d, "nginx:2");
        let mut steps = Vec::new();
        let mut quiet = 0;
        for _ in 0..60 {
            let p = sim.step(&mut d, false);
            let total: i32 = sim.sizes().iter().sum();
            steps.push(sim.sizes());
            assert!(
                total <= max_total,
                "{surge:?}/{unavail:?}: surge exceeded: {steps:?}"
            );
            assert!(
                sim.available() >= min_avail,
                "{surge:?}/{unavail:?}: too few available: {steps:?}"
            );
            quiet = if p.create.is_none() && p.update.is_empty() && p.delete.is_empty() {
                quiet + 1
            } else {
                0
            };
            if quiet == 2 {
                break;
            }
        }
        assert_eq!(sim.sizes(), vec![0, replicas], "{steps:?}");
        let st = d.status.clone().unwrap();
        assert_eq!(st.updated_replicas, Some(replicas));
        assert_eq!(progressing(&d).1, "NewReplicaSetAvailable");
        assert_eq!((sim.revision(0), sim.revision(1)), ("1".into(), "2".into()));
        assert_eq!(
            d.metadata.annotations.as_ref().unwrap()[ANNOTATION_REVISION],
            "2"
        );
    }
}

#[test]
fn rolling_update_first_step_surges_and_scales_down() {
    // 4 replicas, 25%/25%: surge 1, unavailable 1. The new ReplicaSet starts at 1 (4 + 1 - 4),
    // then the old one goes to 3 (1 unavailable allowed).
    let mut sim = Sim::new();
    let mut d = deployment(4, "nginx:1", |_| {});
    sim.settle(&mut d, true);
    set_image(&mut d, "nginx:2");
    let p = sim.step(&mut d, false);
    assert_eq!(
        p.create.as_ref().unwrap().spec.as_ref().unwrap().replicas,
        Some(1)
    );
    assert_eq!(sim.sizes(), vec![4, 1]);
    sim.step(&mut d, false);
    assert_eq!(sim.sizes(), vec![3, 1]);
    assert_eq!(progressing(&d).1, "ReplicaSetUpdated");
}

#[test]
fn recreate_scales_old_to_zero_then_waits_for_their_pods() {
    let mut sim = Sim::new();
    let mut d = deployment(2, "nginx:1", |s| {
        s.strategy = Some(DeploymentStrategy {
            type_: Some("Recreate".into()),
            rolling_update: None,
        });
    });
    sim.settle(&mut d, true);
    set_image(&mut d, "nginx:2");
    let p = sim.step(&mut d, true);
    assert!(p.create.is_none());
    assert_eq!(sim.sizes(), vec![0]);
    // A pod of the old ReplicaSet is still there (terminating): nothing new yet.
    let old_uid = sim.sets[0].metadata.uid.clone().unwrap();
    let mut lingering = pod("default", "old-pod", |p| {
        p.labels(&[("app", "myapp")]).deleting();
    });
    lingering.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "apps/v1".into(),
        kind: "ReplicaSet".into(),
        name: "old".into(),
        uid: old_uid,
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    let refs: Vec<&ReplicaSet> = sim.sets.iter().collect();
    let p = plan(&d, &refs, &[&lingering], Timestamp::UNIX_EPOCH).unwrap();
    assert!(p.create.is_none() && p.update.is_empty(), "{p:?}");
    // Gone: the new ReplicaSet is created at full size.
    let p = sim.step(&mut d, true);
    assert_eq!(p.create.unwrap().spec.unwrap().replicas, Some(2));
    sim.settle(&mut d, true);
    assert_eq!(sim.sizes(), vec![0, 2]);
}

#[test]
fn paused_deployment_scales_but_does_not_roll() {
    let mut sim = Sim::new();
    let mut d = deployment(2, "nginx:1", |_| {});
    sim.settle(&mut d, true);
    d.spec.as_mut().unwrap().paused = Some(true);
    set_image(&mut d, "nginx:2");
    d.spec.as_mut().unwrap().replicas = Some(3);
    sim.settle(&mut d, true);
    assert_eq!(sim.sizes(), vec![3], "scaled, no new ReplicaSet");
    assert_eq!(
        progressing(&d),
        (
            "Unknown".into(),
            "DeploymentPaused".into(),
            "Deployment is paused".into()
        )
    );
    d.spec.as_mut().unwrap().paused = Some(false);
    let p = sim.step(&mut d, true);
    assert!(p.create.is_some(), "resumed: the rollout starts");
    sim.settle(&mut d, true);
    assert_eq!(sim.sizes(), vec![0, 3]);
    assert_eq!(progressing(&d).1, "NewReplicaSetAvailable");
}

#[test]
fn rollback_reuses_the_old_replicaset_and_bumps_its_revision() {
    let mut sim = Sim::new();
    let mut d = deployment(2, "nginx:1", |_| {});
    sim.settle(&mut d, true);
    set_image(&mut d, "nginx:2");
    sim.settle(&mut d, true);
    assert_eq!(sim.sizes(), vec![0, 2]);
    // `kubectl rollout undo` writes the first ReplicaSet's template (without the hash label)
    // back into the Deployment.
    let mut template = sim.sets[0].spec.as_ref().unwrap().template.clone().unwrap();
    template
        .metadata
        .as_mut()
        .unwrap()
        .labels
        .as_mut()
        .unwrap()
        .remove(LABEL_POD_TEMPLATE_HASH);
    d.spec.as_mut().unwrap().template = template;
    sim.settle(&mut d, true);
    assert_eq!(sim.sets.len(), 2, "no third ReplicaSet");
    assert_eq!(sim.sizes(), vec![2, 0]);
    assert_eq!((sim.revision(0), sim.revision(1)), ("3".into(), "2".into()));
    assert_eq!(
        sim.sets[0].metadata.annotations.as_ref().unwrap()[ANNOTATION_REVISION_HISTORY],
        "1"
    );
    assert_eq!(
        d.metadata.annotations.as_ref().unwrap()[ANNOTATION_REVISION],
        "3"
    );
    let name = sim.sets[0].metadata.name.clone().unwrap();
    assert!(progressing(&d).2.contains(&name));
}

#[test]
fn history_beyond_the_limit_is_deleted_lowest_revision_first() {
    let mut sim = Sim::new();
    let mut d = deployment(1, "img:0", |s| s.revision_history_limit = Some(2));
    sim.settle(&mut d, true);
    for i in 1..=4 {
        set_image(&mut d, &format!("img:{i}"));
        sim.settle(&mut d, true);
    }
    let mut revs: Vec<String> = (0..sim.sets.len()).map(|i| sim.revision(i)).collect();
    revs.sort();
    assert_eq!(revs, vec!["3", "4", "5"], "two old and the current");
    let images: Vec<String> = sim
        .sets
        .iter()
        .map(|s| {
            s.spec
                .as_ref()
                .unwrap()
                .template
                .as_ref()
                .unwrap()
                .spec
                .as_ref()
                .unwrap()
                .containers[0]
                .image
                .clone()
                .unwrap()
        })
        .collect();
    assert_eq!(images, vec!["img:2", "img:3", "img:4"]);
}

#[test]
fn proportional_scaling_during_a_rollout() {
    // Mid-rollout (both ReplicaSets active), 10 → 20 replicas: each grows in proportion.
    let mut sim = Sim::new();
    let mut d = deployment(
        10,
        "nginx:1",
        rolling(IntOrString::Int(3), IntOrString::Int(2)),
    );
    sim.settle(&mut d, true);
    set_image(&mut d, "nginx:2");
    sim.step(&mut d, false);
    sim.step(&mut d, false);
    let before = sim.sizes();
    assert!(before.iter().all(|n| *n > 0), "{before:?}");
    d.spec.as_mut().unwrap().replicas = Some(20);
    sim.step(&mut d, false);
    let after = sim.sizes();
    assert_eq!(after.iter().sum::<i32>(), 23, "{before:?} → {after:?}");
    assert!(
        after[0] > before[0] && after[1] > before[1],
        "{before:?} → {after:?}"
    );
}

#[test]
fn replicasets_of_others_are_ignored() {
    let mut sim = Sim::new();
    let mut d = deployment(1, "x", |_| {});
    sim.settle(&mut d, true);
    let mut other = sim.sets[0].clone();
    other.metadata.owner_references.as_mut().unwrap()[0].uid = "someone-else".into();
    other.metadata.name = Some("stranger".into());
    let p = plan(&d, &[&other], &[], Timestamp::UNIX_EPOCH).unwrap();
    let rs = p.create.expect("its own ReplicaSet");
    assert_eq!(rs.spec.unwrap().replicas, Some(1));
    assert!(p.update.is_empty());
}

#[test]
fn a_name_collision_bumps_the_collision_count() {
    let mut sim = Sim::new();
    let mut d = deployment(1, "x", |_| {});
    sim.settle(&mut d, true);
    // Another template under the very name the next ReplicaSet would get.
    let mut d2 = d.clone();
    set_image(&mut d2, "y");
    let hash = pod_template_hash(&d2.spec.as_ref().unwrap().template);
    sim.sets[0].metadata.name = Some(format!("myapp-{hash}"));
    let p = sim.step(&mut d2, true);
    assert!(p.create.is_none());
    assert_eq!(d2.status.as_ref().unwrap().collision_count, Some(1));
    let p = sim.step(&mut d2, true);
    let name = p.create.unwrap().metadata.name.unwrap();
    assert_ne!(name, format!("myapp-{hash}"));
}

#[test]
fn bad_specs_are_errors_naming_the_field() {
    let d = deployment(1, "x", |s| {
        s.selector.match_labels = Some(map(&[("app", "other")]));
    });
    let e = plan(&d, &[], &[], Timestamp::UNIX_EPOCH).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Deployment default/myapp: spec.template.metadata.labels: do not match spec.selector"
    );
    let d = deployment(1, "x", |s| {
        s.strategy = Some(DeploymentStrategy {
            type_: None,
            rolling_update: Some(RollingUpdateDeployment {
                max_surge: Some(IntOrString::String("lots".into())),
                max_unavailable: None,
            }),
        });
    });
    let e = plan(&d, &[], &[], Timestamp::UNIX_EPOCH).unwrap_err();
    assert!(
        e.to_string()
            .contains("spec.strategy.rollingUpdate.maxSurge"),
        "{e}"
    );
}

#[test]
fn orphaned_replicasets_are_adopted_not_duplicated() {
    // `kubectl delete deployment --cascade=orphan`, then the same Deployment again.
    let mut sim = Sim::new();
    let mut d = deployment(2, "nginx:1", |_| {});
    sim.settle(&mut d, true);
    sim.sets[0].metadata.owner_references = None;
    let mut again = deployment(2, "nginx:1", |_| {});
    again.metadata.uid = Some("uid-new".into());
    let p = sim.step(&mut again, true);
    assert!(p.create.is_none(), "{p:?}");
    assert_eq!(p.update.len(), 1);
    let owner = &p.update[0].metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.uid.as_str(), owner.controller),
        ("uid-new", Some(true))
    );
    sim.settle(&mut again, true);
    assert_eq!(sim.sizes(), vec![2]);
}

#[test]
fn a_stuck_rollout_exceeds_its_progress_deadline() {
    let mut sim = Sim::new();
    let mut d = deployment(2, "nginx:1", |s| s.progress_deadline_seconds = Some(600));
    sim.settle(&mut d, true);
    set_image(&mut d, "nginx:bad");
    sim.step(&mut d, false);
    // The new pods never become available.
    for rs in &mut sim.sets {
        if rs.metadata.annotations.as_ref().unwrap()[ANNOTATION_REVISION] == "2" {
            let st = rs.status.as_mut().unwrap();
            st.available_replicas = Some(0);
            st.ready_replicas = Some(0);
        }
    }
    let t0 = 1_700_000_500;
    let refs: Vec<&ReplicaSet> = sim.sets.iter().collect();
    let at = |d: &Deployment, secs: i64| {
        plan(d, &refs, &[], Timestamp::from_second(t0 + secs).unwrap()).unwrap()
    };
    let p = at(&d, 0);
    assert!(p.update.is_empty(), "nothing can move: {p:?}");
    d.status = p.status;
    assert_eq!(progressing(&d).1, "ReplicaSetUpdated");
    // Before the deadline: asked to look again when it would pass.
    let p = at(&d, 100);
    assert_eq!(p.recheck_after, Some(501));
    assert!(p.status.is_none(), "no progress, no change");
    let p = at(&d, 601);
    d.status = p.status;
    let name = sim.sets[1].metadata.name.clone().unwrap();
    assert_eq!(
        progressing(&d),
        (
            "False".into(),
            "ProgressDeadlineExceeded".into(),
            format!("ReplicaSet \"{name}\" has timed out progressing.")
        )
    );
    assert_eq!(at(&d, 700).recheck_after, None);
}

#[test]
fn pods_owned_directly_from_before_replicasets_go_once_replaced() {
    let d = deployment(2, "nginx:1", |_| {});
    let legacy = pod("default", "myapp-abc-x1", |p| {
        p.labels(&[("app", "myapp")]);
        p.metadata.owner_references = Some(vec![crate::endpointslice::controller_ref(
            "apps/v1",
            "Deployment",
            &d.metadata,
        )]);
    });
    let mut sim = Sim::new();
    let mut d = d;
    // While the new ReplicaSet is not available, they stay.
    let refs: Vec<&ReplicaSet> = sim.sets.iter().collect();
    let p = plan(&d, &refs, &[&legacy], Timestamp::UNIX_EPOCH).unwrap();
    assert!(p.legacy_pods.is_empty());
    sim.settle(&mut d, true);
    let refs: Vec<&ReplicaSet> = sim.sets.iter().collect();
    let p = plan(&d, &refs, &[&legacy], Timestamp::UNIX_EPOCH).unwrap();
    assert_eq!(p.legacy_pods, vec!["myapp-abc-x1"]);
}

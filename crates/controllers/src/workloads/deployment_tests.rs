use super::*;
use crate::fixtures::*;
use k8s_openapi::api::apps::v1::{DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

fn deployment(replicas: i32, image: &str, f: impl FnOnce(&mut DeploymentSpec)) -> Deployment {
    let mut spec = DeploymentSpec {
        replicas: Some(replicas),
        selector: LabelSelector {
            match_labels: Some(map(&[("app", "myapp")])),
            ..Default::default()
        },
        template: PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(map(&[("app", "myapp")])),
                ..Default::default()
            }),
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    image: Some(image.into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
        },
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

/// A tiny cluster: applies plans (naming pods like the API server, binding and readying them
/// when `ready_new` says so) and re-plans until nothing changes.
struct Sim {
    pods: Vec<Pod>,
    seq: u32,
}

impl Sim {
    fn step(&mut self, d: &mut Deployment, ready_new: bool) -> PodPlan<DeploymentStatus> {
        let refs: Vec<&Pod> = self.pods.iter().collect();
        let p = plan(d, &refs, Timestamp::from_second(1_700_000_500).unwrap()).unwrap();
        self.pods
            .retain(|pod| !p.delete.contains(pod.metadata.name.as_ref().unwrap()));
        for c in &p.create {
            self.seq += 1;
            let mut pod = c.clone();
            pod.metadata.name = Some(format!(
                "{}{:05}",
                c.metadata.generate_name.clone().unwrap(),
                self.seq
            ));
            pod.metadata.uid = Some(format!("uid-{}", self.seq));
            pod.ready(ready_new)
                .phase("Running")
                .node("node-a")
                .created(i64::from(self.seq));
            self.pods.push(pod);
        }
        if let Some(s) = &p.status {
            d.status = Some(s.clone());
        }
        p
    }
    fn hashes(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for p in &self.pods {
            *m.entry(p.metadata.labels.as_ref().unwrap()[LABEL_POD_TEMPLATE_HASH].clone())
                .or_default() += 1;
        }
        m
    }
}

#[test]
fn creates_named_labelled_owned_pods() {
    let d = deployment(3, "nginx:1", |_| {});
    let p = plan(&d, &[], Timestamp::UNIX_EPOCH).unwrap();
    assert_eq!(p.create.len(), 3);
    let hash = pod_template_hash(&d.spec.as_ref().unwrap().template);
    assert!(
        !hash.is_empty()
            && hash
                .chars()
                .all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c))
    );
    let pod = &p.create[0];
    assert_eq!(pod.metadata.generate_name, Some(format!("myapp-{hash}-")));
    assert_eq!(
        pod.metadata.labels,
        Some(map(&[("app", "myapp"), (LABEL_POD_TEMPLATE_HASH, &hash)]))
    );
    let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.name.as_str(),
            owner.uid.as_str()
        ),
        ("apps/v1", "Deployment", "myapp", "uid-myapp")
    );
    assert_eq!(owner.controller, Some(true));
    // A different template hashes differently; the same one the same.
    assert_ne!(
        hash,
        pod_template_hash(&deployment(3, "nginx:2", |_| {}).spec.unwrap().template)
    );
    assert_eq!(
        hash,
        pod_template_hash(&deployment(5, "nginx:1", |_| {}).spec.unwrap().template)
    );
}

#[test]
fn scale_up_and_down_deletes_unready_and_newest_first() {
    let mut sim = Sim {
        pods: vec![],
        seq: 0,
    };
    let mut d = deployment(3, "nginx:1", |_| {});
    sim.step(&mut d, true);
    assert_eq!(sim.pods.len(), 3);
    // The status seen so far predates the pods; the next pass records them, then all is quiet.
    let p = sim.step(&mut d, true);
    assert!(p.create.is_empty() && p.delete.is_empty() && p.status.is_some());
    assert!(sim.step(&mut d, true).is_empty(), "steady state");
    let st = d.status.clone().unwrap();
    assert_eq!(
        (
            st.replicas,
            st.ready_replicas,
            st.available_replicas,
            st.updated_replicas
        ),
        (Some(3), Some(3), Some(3), Some(3))
    );
    assert_eq!(st.observed_generation, Some(3));
    let avail = st
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == "Available")
        .unwrap();
    assert_eq!(
        (avail.status.as_str(), avail.reason.as_deref()),
        ("True", Some("MinimumReplicasAvailable"))
    );

    // Oldest pod unready: scaling to 1 deletes it and the newest, keeping the middle one.
    let names: Vec<String> = sim
        .pods
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    sim.pods[0].ready(false);
    d.spec.as_mut().unwrap().replicas = Some(1);
    let p = sim.step(&mut d, true);
    assert_eq!(p.delete, vec![names[0].clone(), names[2].clone()]);
    assert_eq!(sim.pods.len(), 1);
    sim.step(&mut d, true);
    assert!(sim.step(&mut d, true).is_empty());
}

#[test]
fn rolling_update_respects_surge_and_unavailable() {
    let mut sim = Sim {
        pods: vec![],
        seq: 0,
    };
    let mut d = deployment(4, "nginx:1", |s| {
        s.strategy = Some(DeploymentStrategy {
            type_: Some("RollingUpdate".into()),
            rolling_update: Some(RollingUpdateDeployment {
                max_surge: Some(IntOrString::Int(1)),
                max_unavailable: Some(IntOrString::Int(0)),
            }),
        });
    });
    sim.step(&mut d, true);
    d.spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap()
        .containers[0]
        .image = Some("nginx:2".into());
    let mut steps = 0;
    loop {
        // New pods come up unready; they turn ready before the next step.
        let p = sim.step(&mut d, false);
        let total = sim.pods.len();
        let ready = sim
            .pods
            .iter()
            .filter(|p| crate::podutil::is_ready(p))
            .count();
        assert!(total <= 5, "surge exceeded: {total}");
        assert!(ready >= 4, "unavailable exceeded: ready={ready}");
        for pod in &mut sim.pods {
            pod.ready(true);
        }
        if p.create.is_empty() && p.delete.is_empty() {
            break;
        }
        steps += 1;
        assert!(steps < 20);
    }
    assert_eq!(sim.hashes().len(), 1);
    assert_eq!(sim.pods.len(), 4);
    let st = d.status.clone().unwrap();
    assert_eq!(st.updated_replicas, Some(4));
}

#[test]
fn recreate_deletes_old_first() {
    let mut sim = Sim {
        pods: vec![],
        seq: 0,
    };
    let mut d = deployment(2, "nginx:1", |s| {
        s.strategy = Some(DeploymentStrategy {
            type_: Some("Recreate".into()),
            rolling_update: None,
        });
    });
    sim.step(&mut d, true);
    d.spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap()
        .containers[0]
        .image = Some("nginx:2".into());
    let p = sim.step(&mut d, true);
    assert_eq!((p.create.len(), p.delete.len()), (0, 2));
    let p = sim.step(&mut d, true);
    assert_eq!((p.create.len(), p.delete.len()), (2, 0));
}

#[test]
fn bad_specs_are_errors_naming_the_field() {
    let d = deployment(1, "x", |s| {
        s.selector.match_labels = Some(map(&[("app", "other")]));
    });
    let e = plan(&d, &[], Timestamp::UNIX_EPOCH).unwrap_err();
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
    let e = plan(&d, &[], Timestamp::UNIX_EPOCH).unwrap_err();
    assert!(
        e.to_string()
            .contains("spec.strategy.rollingUpdate.maxSurge"),
        "{e}"
    );
}

#[test]
fn pods_of_others_are_ignored() {
    let d = deployment(1, "x", |_| {});
    let stranger = pod("default", "stranger", |p| {
        p.labels(&[("app", "myapp")]);
    });
    let p = plan(&d, &[&stranger], Timestamp::UNIX_EPOCH).unwrap();
    assert_eq!((p.create.len(), p.delete.len()), (1, 0));
}

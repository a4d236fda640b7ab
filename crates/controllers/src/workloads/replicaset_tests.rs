use super::*;
use crate::fixtures::*;
use k8s_openapi::api::apps::v1::ReplicaSetSpec;
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, ObjectMeta, OwnerReference, Time,
};

fn rs(replicas: i32) -> ReplicaSet {
    let labels = map(&[("app", "web"), ("pod-template-hash", "abc")]);
    ReplicaSet {
        metadata: ObjectMeta {
            generation: Some(2),
            ..meta("default", "web-abc")
        },
        spec: Some(ReplicaSetSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..Default::default()
            },
            template: Some(PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "c".into(),
                        image: Some("nginx".into()),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
            }),
            min_ready_seconds: None,
        }),
        status: None,
    }
}

fn owned_pod(name: &str, f: impl FnOnce(&mut Pod)) -> Pod {
    pod("default", name, |p| {
        p.labels(&[("app", "web"), ("pod-template-hash", "abc")]);
        p.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: "web-abc".into(),
            uid: "uid-web-abc".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
        f(p);
    })
}

fn now() -> Timestamp {
    Timestamp::from_second(1_700_000_500).unwrap()
}

#[test]
fn creates_missing_pods_from_the_template() {
    let p = plan(&rs(3), &[], now()).unwrap();
    assert_eq!(p.create.len(), 3);
    let pod = &p.create[0];
    assert_eq!(pod.metadata.generate_name.as_deref(), Some("web-abc-"));
    assert_eq!(
        pod.metadata.labels,
        Some(map(&[("app", "web"), ("pod-template-hash", "abc")]))
    );
    let o = &pod.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (
            o.kind.as_str(),
            o.name.as_str(),
            o.uid.as_str(),
            o.controller
        ),
        ("ReplicaSet", "web-abc", "uid-web-abc", Some(true))
    );
    assert_eq!(p.status.unwrap().observed_generation, Some(2));
}

#[test]
fn deletes_unscheduled_pending_unready_and_newest_first() {
    let pods = [
        owned_pod("old-ready", |p| {
            p.created(1);
        }),
        owned_pod("new-ready", |p| {
            p.created(9);
        }),
        owned_pod("unready", |p| {
            p.created(2).ready(false);
        }),
        owned_pod("pending", |p| {
            p.created(3).phase("Pending").ready(false);
        }),
        owned_pod("unscheduled", |p| {
            p.created(4).phase("Pending").ready(false);
            p.spec.as_mut().unwrap().node_name = None;
        }),
    ];
    let refs: Vec<&Pod> = pods.iter().collect();
    let p = plan(&rs(1), &refs, now()).unwrap();
    assert_eq!(
        p.delete,
        vec!["unscheduled", "pending", "unready", "new-ready"]
    );
    assert!(p.create.is_empty());
}

#[test]
fn status_counts_ready_available_and_fully_labeled() {
    let mut set = rs(3);
    set.spec.as_mut().unwrap().min_ready_seconds = Some(60);
    // The template carries a label the selector does not ask for.
    let labels = &[
        ("app", "web"),
        ("pod-template-hash", "abc"),
        ("tier", "front"),
    ];
    set.spec
        .as_mut()
        .unwrap()
        .template
        .as_mut()
        .unwrap()
        .metadata
        .as_mut()
        .unwrap()
        .labels = Some(map(labels));
    let pods = [
        owned_pod("a", |p| {
            p.labels(labels);
            p.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].last_transition_time =
                Some(Time(Timestamp::from_second(1_700_000_000).unwrap()));
        }),
        // Ready only 10 s ago: not yet available.
        owned_pod("b", |p| {
            p.labels(labels);
            p.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].last_transition_time =
                Some(Time(Timestamp::from_second(1_700_000_490).unwrap()));
        }),
        // Selected, but without every template label: not fully labelled.
        owned_pod("c", |p| {
            p.ready(false);
        }),
        // Terminating pods do not count.
        owned_pod("d", |p| {
            p.deleting();
        }),
    ];
    let refs: Vec<&Pod> = pods.iter().collect();
    let p = plan(&set, &refs, now()).unwrap();
    let st = p.status.unwrap();
    assert_eq!(
        (
            st.replicas,
            st.ready_replicas,
            st.available_replicas,
            st.fully_labeled_replicas
        ),
        (3, Some(2), Some(1), Some(2))
    );
    assert!(p.create.is_empty() && p.delete.is_empty());
}

#[test]
fn adopts_matching_orphans_and_ignores_others() {
    let orphan = pod("default", "orphan", |p| {
        p.labels(&[("app", "web"), ("pod-template-hash", "abc")]);
    });
    let unmatched = pod("default", "unmatched", |p| {
        p.labels(&[("app", "web")]);
    });
    let mut foreign = orphan.clone();
    foreign.metadata.name = Some("foreign".into());
    foreign.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "apps/v1".into(),
        kind: "ReplicaSet".into(),
        name: "other".into(),
        uid: "uid-other".into(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    let p = plan(&rs(2), &[&orphan, &unmatched, &foreign], now()).unwrap();
    assert_eq!(p.adopt.len(), 1);
    let adopted = &p.adopt[0];
    assert_eq!(adopted.metadata.name.as_deref(), Some("orphan"));
    assert_eq!(
        adopted.metadata.owner_references.as_ref().unwrap()[0].uid,
        "uid-web-abc"
    );
    assert_eq!(p.create.len(), 1, "the adopted pod counts");
    // Being deleted, it adopts nothing and creates nothing.
    let mut dying = rs(2);
    dying.metadata.deletion_timestamp = Some(Time(now()));
    let p = plan(&dying, &[&orphan], now()).unwrap();
    assert!(p.adopt.is_empty() && p.create.is_empty());
}

#[test]
fn steady_state_is_quiet_and_bad_selectors_are_errors() {
    let pods = [owned_pod("a", |_| {})];
    let refs: Vec<&Pod> = pods.iter().collect();
    let mut set = rs(1);
    set.status = plan(&set, &refs, now()).unwrap().status;
    assert!(plan(&set, &refs, now()).unwrap().is_empty());
    let mut bad = rs(1);
    bad.spec.as_mut().unwrap().selector.match_labels = Some(map(&[("app", "other")]));
    assert_eq!(
        plan(&bad, &[], now()).unwrap_err().to_string(),
        "ReplicaSet default/web-abc: spec.template.metadata.labels: do not match spec.selector"
    );
}

#[test]
fn releases_pods_the_selector_no_longer_matches() {
    let pods = [
        owned_pod("kept", |_| {}),
        owned_pod("relabelled", |p| {
            p.labels(&[("app", "debug")]);
        }),
    ];
    let refs: Vec<&Pod> = pods.iter().collect();
    let p = plan(&rs(2), &refs, now()).unwrap();
    assert_eq!(p.adopt.len(), 1);
    let released = &p.adopt[0];
    assert_eq!(released.metadata.name.as_deref(), Some("relabelled"));
    assert_eq!(released.metadata.owner_references, Some(vec![]));
    assert_eq!(p.create.len(), 1, "the released pod no longer counts");
}

#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;

const NOW: &str = "2026-01-01T00:00:00Z";
const LATER: &str = "2026-01-01T00:01:00Z";

fn applier(name: &str) -> ManagerId {
    ManagerId {
        manager: name.into(),
        operation: Operation::Apply,
        api_version: "apps/v1".into(),
        subresource: String::new(),
    }
}

fn updater(name: &str) -> ManagerId {
    ManagerId {
        operation: Operation::Update,
        ..applier(name)
    }
}

const MAIN: Part = Part::Main { status_apart: true };

fn deployment(replicas: i64, labels: Value, ports: Value) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "nginx", "ports": ports}]}
            }
        }
    })
}

fn deploy_write<'a>(manager: &'a ManagerId, now: &'a str) -> Write<'a> {
    Write {
        kind: "Deployment",
        part: MAIN,
        manager,
        now,
    }
}

fn apply_ok(
    live: &Value,
    cfg: &Value,
    entries: Vec<Entry>,
    who: &str,
    now: &str,
) -> (Value, Vec<Entry>) {
    apply(&deploy_write(&applier(who), now), live, cfg, entries, false).unwrap()
}

fn fields_of<'a>(entries: &'a [Entry], who: &str) -> &'a FieldSet {
    &entries.iter().find(|e| e.id.manager == who).unwrap().fields
}

#[test]
fn fields_v1_round_trips_upstream_encoding() {
    // As kube-apiserver writes it for `kubectl apply --server-side` of a Deployment.
    let v1 = json!({
        "f:metadata": {"f:labels": {"f:app": {}}},
        "f:spec": {
            "f:replicas": {},
            "f:selector": {},
            "f:template": {"f:spec": {"f:containers": {
                "k:{\"name\":\"web\"}": {
                    ".": {}, "f:image": {}, "f:name": {},
                    "f:ports": {"k:{\"containerPort\":80,\"protocol\":\"TCP\"}": {".": {}, "f:containerPort": {}}}
                }
            }}}
        },
        "f:metadata2": {"f:finalizers": {"v:\"a\"": {}}}
    });
    let set = FieldSet::from_fields_v1(&v1).unwrap();
    assert_eq!(set.to_fields_v1(), v1);
    let paths: Vec<String> = set.paths().iter().map(ToString::to_string).collect();
    assert!(
        paths.contains(&".spec.template.spec.containers[name=\"web\"].ports[containerPort=80,protocol=\"TCP\"]".to_string()),
        "{paths:?}"
    );
    assert!(paths.contains(&".metadata2.finalizers[=\"a\"]".to_string()));
    for bad in [
        json!({"x:y": {}}),
        json!({"f:a": 1}),
        json!({"k:[1]": {}}),
        json!({"k:{}": {}}),
        json!([]),
    ] {
        assert!(FieldSet::from_fields_v1(&bad).is_err(), "{bad}");
    }
}

#[test]
fn apply_owns_its_configuration_with_defaulted_keys() {
    let cfg = deployment(2, json!({"app": "web"}), json!([{"containerPort": 80}]));
    let (obj, entries) = apply_ok(&Value::Null, &cfg, Vec::new(), "mgr", NOW);
    assert_eq!(obj["spec"]["replicas"], 2);
    let v1 = encode(&entries).unwrap();
    assert_eq!(v1[0]["manager"], "mgr");
    assert_eq!(v1[0]["operation"], "Apply");
    assert_eq!(v1[0]["fieldsType"], "FieldsV1");
    assert_eq!(v1[0]["time"], NOW);
    let f = &v1[0]["fieldsV1"];
    // Server-owned metadata and apiVersion/kind are never owned; a selector is atomic.
    assert!(f.get("f:apiVersion").is_none() && f["f:metadata"].get("f:name").is_none());
    assert_eq!(f["f:spec"]["f:selector"], json!({}));
    let port = &f["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"web\"}"]["f:ports"]
        ["k:{\"containerPort\":80,\"protocol\":\"TCP\"}"];
    assert_eq!(port, &json!({".": {}, "f:containerPort": {}}));
}

#[test]
fn apply_without_a_field_removes_it_unless_another_manager_owns_it() {
    let first = deployment(
        2,
        json!({"app": "web", "tier": "front"}),
        json!([{"containerPort": 80}, {"containerPort": 443}]),
    );
    let (live, entries) = apply_ok(&Value::Null, &first, Vec::new(), "mgr", NOW);
    let second = deployment(2, json!({"app": "web"}), json!([{"containerPort": 80}]));
    let (next, entries2) = apply_ok(&live, &second, entries.clone(), "mgr", LATER);
    assert_eq!(next["metadata"]["labels"], json!({"app": "web"}));
    assert_eq!(
        next["spec"]["template"]["spec"]["containers"][0]["ports"],
        json!([{"containerPort": 80}])
    );
    assert_eq!(entries2[0].time.as_deref(), Some(LATER));

    // Another manager co-owning the label (same value: no conflict) keeps it.
    let other_cfg = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                           "metadata": {"name": "web", "labels": {"tier": "front"}}});
    let (live2, entries3) = apply_ok(&live, &other_cfg, entries, "other", NOW);
    assert_eq!(live2, live, "co-owning changes nothing");
    let (next2, entries4) = apply_ok(&live2, &second, entries3, "mgr", LATER);
    assert_eq!(next2["metadata"]["labels"]["tier"], "front");
    assert!(fields_of(&entries4, "other").has(&Path(vec![
        PathElement::Field("metadata".into()),
        PathElement::Field("labels".into()),
        PathElement::Field("tier".into()),
    ])));
    // Dropping every label removes the emptied map too.
    let mut none = second.clone();
    none["metadata"].as_object_mut().unwrap().remove("labels");
    let (bare, _) = apply_ok(&next, &none, entries2, "mgr", LATER);
    assert!(bare["metadata"].get("labels").is_none(), "{bare}");
}

#[test]
fn conflicts_name_the_manager_and_path_and_force_takes_ownership() {
    let cfg = deployment(2, json!({"app": "web"}), json!([]));
    let (live, entries) = apply_ok(&Value::Null, &cfg, Vec::new(), "mgr", NOW);
    // `kubectl scale` through the scale subresource.
    let mut scaled = live.clone();
    scaled["spec"]["replicas"] = json!(5);
    let scaler = ManagerId {
        subresource: "scale".into(),
        ..updater("kubectl")
    };
    let entries = update(
        &Write {
            kind: "Deployment",
            part: Part::Scale,
            manager: &scaler,
            now: NOW,
        },
        &live,
        &scaled,
        entries,
    );
    assert!(
        !fields_of(&entries, "mgr").has(&Path(vec![
            PathElement::Field("spec".into()),
            PathElement::Field("replicas".into())
        ])),
        "the update took replicas from the applier"
    );
    // Re-applying 2 conflicts; re-applying the live value 5 does not.
    let err = apply(
        &deploy_write(&applier("mgr"), LATER),
        &scaled,
        &cfg,
        entries.clone(),
        false,
    )
    .unwrap_err();
    let ApplyError::Conflicts(c) = err else {
        panic!("{err:?}")
    };
    assert_eq!(
        conflict_message(&c),
        "Apply failed with 1 conflict: conflict with \"kubectl\" with subresource \"scale\" using apps/v1: .spec.replicas"
    );
    assert_eq!(
        c[0].cause_message(),
        "conflict with \"kubectl\" with subresource \"scale\" using apps/v1"
    );
    let same = deployment(5, json!({"app": "web"}), json!([]));
    let (_, shared) = apply_ok(&scaled, &same, entries.clone(), "mgr", LATER);
    assert_eq!(shared.len(), 2, "shared ownership: {shared:?}");

    let (forced, entries) = apply(
        &deploy_write(&applier("mgr"), LATER),
        &scaled,
        &cfg,
        entries,
        true,
    )
    .unwrap();
    assert_eq!(forced["spec"]["replicas"], 2);
    assert_eq!(
        entries.len(),
        1,
        "the scaler lost its only field: {entries:?}"
    );
}

#[test]
fn multiple_conflicts_are_grouped_by_manager() {
    let c = vec![
        Conflict {
            manager: updater("b"),
            path: Path(vec![PathElement::Field("x".into())]),
        },
        Conflict {
            manager: applier("a"),
            path: Path(vec![PathElement::Field("y".into())]),
        },
        Conflict {
            manager: updater("b"),
            path: Path(vec![PathElement::Field("z".into())]),
        },
    ];
    assert_eq!(
        conflict_message(&c),
        "Apply failed with 3 conflicts: conflicts with \"a\":\n- .y\nconflicts with \"b\" using apps/v1:\n- .x\n- .z"
    );
}

#[test]
fn updates_take_what_they_change_and_lose_what_disappears() {
    let created = deployment(1, json!({"app": "web"}), json!([{"containerPort": 80}]));
    let entries = update(
        &deploy_write(&updater("kubectl-create"), NOW),
        &Value::Null,
        &created,
        Vec::new(),
    );
    let owned = fields_of(&entries, "kubectl-create").paths();
    assert!(owned.iter().any(|p| p.to_string() == ".spec.replicas"));
    assert!(
        !owned
            .iter()
            .any(|p| p.to_string().starts_with(".metadata.name"))
    );

    let mut edited = created.clone();
    edited["spec"]["replicas"] = json!(3);
    edited["metadata"]["labels"] = json!({});
    let entries = update(
        &deploy_write(&updater("kubectl-edit"), LATER),
        &created,
        &edited,
        entries,
    );
    let edit: Vec<String> = fields_of(&entries, "kubectl-edit")
        .paths()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(edit, vec![".metadata.labels", ".spec.replicas"]);
    let create: Vec<String> = fields_of(&entries, "kubectl-create")
        .paths()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(!create.contains(&".spec.replicas".to_string()));
    assert!(!create.iter().any(|p| p.starts_with(".metadata.labels")));

    // A main-resource write never owns status; a status write owns only status.
    let mut with_status = edited.clone();
    with_status["status"] = json!({"replicas": 3});
    let entries = update(
        &Write {
            kind: "Deployment",
            part: Part::Status,
            manager: &ManagerId {
                subresource: "status".into(),
                ..updater("controller")
            },
            now: LATER,
        },
        &edited,
        &with_status,
        entries,
    );
    let v1 = encode(&entries).unwrap();
    let status = v1
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["manager"] == "controller")
        .unwrap();
    assert_eq!(status["subresource"], "status");
    assert_eq!(status["fieldsV1"], json!({"f:status": {"f:replicas": {}}}));
    // A write that changes nothing owns nothing new and keeps the time.
    let again = update(
        &deploy_write(&updater("someone"), "2027-01-01T00:00:00Z"),
        &with_status,
        &with_status,
        entries.clone(),
    );
    assert_eq!(again, entries);
}

#[test]
fn unmanaged_objects_stay_unmanaged_until_their_first_apply() {
    let live = deployment(1, json!({"app": "web"}), json!([]));
    let mut edited = live.clone();
    edited["spec"]["replicas"] = json!(3);
    let editor = updater("editor");
    let w = deploy_write(&editor, NOW);
    assert_eq!(update(&w, &live, &edited, Vec::new()), Vec::new());
    let cfg = deployment(2, json!({"app": "web"}), json!([]));
    let w = Write {
        manager: &applier("mgr"),
        ..w
    };
    let Err(ApplyError::Conflicts(c)) = apply(&w, &edited, &cfg, Vec::new(), false) else {
        panic!("the first apply conflicts with what the object held");
    };
    assert_eq!(
        conflict_message(&c),
        "Apply failed with 1 conflict: conflict with \"before-first-apply\" using apps/v1: .spec.replicas"
    );
    let (_, entries) = apply(&w, &edited, &cfg, Vec::new(), true).unwrap();
    let names: Vec<&str> = entries.iter().map(|e| e.id.manager.as_str()).collect();
    assert_eq!(names, [BEFORE_FIRST_APPLY, "mgr"]);
}

#[test]
fn update_entries_beyond_ten_merge_into_ancient_changes() {
    let mut obj =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {}});
    let mut entries = Vec::new();
    for i in 0..12 {
        let mut next = obj.clone();
        next["data"][format!("k{i}")] = json!("v");
        let id = updater(&format!("m{i:02}"));
        let now = format!("2026-01-01T00:00:{i:02}Z");
        let w = Write {
            kind: "ConfigMap",
            part: MAIN,
            manager: &id,
            now: &now,
        };
        let live = if i == 0 { Value::Null } else { obj.clone() };
        entries = update(&w, &live, &next, entries);
        obj = next;
    }
    assert_eq!(entries.len(), MAX_UPDATE_MANAGERS);
    let ancient = entries
        .iter()
        .find(|e| e.id.manager == ANCIENT_CHANGES)
        .unwrap();
    let owned: Vec<String> = ancient
        .fields
        .paths()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(owned, [".data.k0", ".data.k1", ".data.k2"]);
    assert_eq!(ancient.time.as_deref(), Some("2026-01-01T00:00:02Z"));
    assert!(entries.iter().any(|e| e.id.manager == "m11"));
}

#[test]
fn kubectl_upgrades_from_client_side_apply_without_conflicts() {
    // Created by client-side `kubectl apply`: the annotation holds replicas 2 and the
    // Update entry owns it.
    let mut live = deployment(2, json!({"app": "web"}), json!([]));
    let last = live.to_string();
    live["metadata"]["annotations"] =
        json!({"kubectl.kubernetes.io/last-applied-configuration": last});
    let csa = updater("kubectl-client-side-apply");
    let w = deploy_write(&csa, NOW);
    let entries = update(&w, &Value::Null, &live, Vec::new());
    let cfg = deployment(3, json!({"app": "web"}), json!([]));
    // Another applier conflicts; `kubectl` does not, and rewrites the annotation.
    let other = applier("helm");
    let w_other = Write {
        manager: &other,
        ..w
    };
    assert!(apply(&w_other, &live, &cfg, entries.clone(), false).is_err());
    let kubectl = applier("kubectl");
    let w_kubectl = Write {
        manager: &kubectl,
        ..w
    };
    let (merged, _) = apply(&w_kubectl, &live, &cfg, entries.clone(), false).unwrap();
    assert_eq!(merged["spec"]["replicas"], 3);
    let annotation: Value = serde_json::from_str(
        merged["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(annotation, cfg);
    // A field changed since the client-side apply is no longer covered.
    let mut drifted = live.clone();
    drifted["spec"]["replicas"] = json!(7);
    let drifted_entries = update(
        &Write {
            manager: &updater("scaler"),
            ..w
        },
        &live,
        &drifted,
        entries,
    );
    assert!(apply(&w_kubectl, &drifted, &cfg, drifted_entries, false).is_err());
}

#[test]
fn apply_refuses_items_without_keys_and_duplicates() {
    let no_name = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                         "spec": {"containers": [{"image": "x"}]}});
    let err = apply(
        &Write {
            kind: "Pod",
            part: MAIN,
            manager: &applier("m"),
            now: NOW,
        },
        &Value::Null,
        &no_name,
        Vec::new(),
        false,
    )
    .unwrap_err();
    assert_eq!(
        err,
        ApplyError::Invalid(".spec.containers: element 0: associative list with keys has an element that omits key field \"name\" (and doesn't have default value)".into())
    );
    let dup = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
                     "spec": {"ports": [{"port": 80}, {"port": 80, "protocol": "TCP"}]}});
    let err = apply(
        &Write {
            kind: "Service",
            part: MAIN,
            manager: &applier("m"),
            now: NOW,
        },
        &Value::Null,
        &dup,
        Vec::new(),
        false,
    )
    .unwrap_err();
    assert!(
        matches!(&err, ApplyError::Invalid(m) if m.contains("duplicate entries for key [port=80,protocol=\"TCP\"]")),
        "{err:?}"
    );
}

#[test]
fn managed_fields_decode_validate_and_order() {
    let v = json!([
        {"manager": "b", "operation": "Update", "apiVersion": "v1", "time": "2026-01-01T00:00:02Z",
         "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:x": {}}}},
        {"manager": "a", "operation": "Update", "apiVersion": "v1", "time": "2026-01-01T00:00:01Z",
         "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:y": {}}}},
        {"manager": "z", "operation": "Apply", "apiVersion": "v1", "time": "2026-01-01T00:00:09Z",
         "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:z": {}}}}
    ]);
    let entries = decode(Some(&v)).unwrap();
    let out = encode(&entries).unwrap();
    let order: Vec<&str> = out
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["manager"].as_str().unwrap())
        .collect();
    assert_eq!(order, ["z", "a", "b"], "Apply first, then by time");
    // The documented reset is an empty entry; entries upstream cannot decode are errors
    // (the caller keeps the stored ones).
    assert!(is_reset(&json!([{}])) && is_reset(&json!([{}, {}])));
    assert!(!is_reset(&json!([])) && !is_reset(&json!([{"manager": "m"}])));
    for bad in [
        json!([{}]),
        json!([{"manager": "m", "operation": "Patch", "apiVersion": "v1", "fieldsType": "FieldsV1"}]),
        json!([{"manager": "m", "operation": "Update", "apiVersion": "v1"}]),
        json!([{"manager": "m", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV2"}]),
        json!([{"manager": "m", "operation": "Update", "fieldsType": "FieldsV1"}]),
        json!([{"manager": "m", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1",
                "fieldsV1": {"bogus": {}}}]),
    ] {
        assert!(decode(Some(&bad)).is_err(), "{bad}");
    }
    let long = "m".repeat(129);
    assert_eq!(
        validate(&json!([{"manager": long, "operation": "Update"}])),
        vec![(
            "metadata.managedFields[0].manager".to_string(),
            long.clone(),
            "Too long: may not be more than 128 bytes".to_string()
        )]
    );
    assert!(validate(&json!([{"manager": "m"}])).is_empty());
    assert!(decode(Some(&json!("x"))).is_err());
}

#[test]
fn user_agent_prefix_is_the_default_manager() {
    assert_eq!(
        manager_from_user_agent("kubectl/v1.33.0 (linux/amd64) kubernetes/abc"),
        "kubectl"
    );
    assert_eq!(manager_from_user_agent("kube-rs"), "kube-rs");
    assert_eq!(manager_from_user_agent(&"é".repeat(100)).len(), 128);
}

// Property tests over generated ConfigMap-like and Deployment-like configurations.

fn label_map() -> impl Strategy<Value = Value> {
    proptest::collection::btree_map("[a-c]", "[xy]", 0..3).prop_map(|m| json!(m))
}

fn ports() -> impl Strategy<Value = Value> {
    proptest::collection::btree_set(79u16..83, 0..3).prop_map(|s| {
        Value::Array(
            s.into_iter()
                .map(|p| json!({"containerPort": p, "name": format!("p{p}")}))
                .collect(),
        )
    })
}

fn config() -> impl Strategy<Value = Value> {
    (1i64..4, label_map(), ports()).prop_map(|(r, l, p)| deployment(r, l, p))
}

/// Every path a manager owns exists in the object.
fn owned_paths_exist(obj: &Value, entries: &[Entry]) -> Result<(), TestCaseError> {
    let root = walk::root("Deployment");
    for e in entries {
        for p in e.fields.paths() {
            prop_assert!(
                walk::get(obj, &p.0, root).is_some(),
                "{} owns {p}, absent from {obj}",
                e.id.manager
            );
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn applying_the_same_configuration_twice_is_a_no_op(cfg in config(), base in config()) {
        let (live, entries) = apply_ok(&Value::Null, &base, Vec::new(), "base", NOW);
        let (once, e1) = apply(&Write { kind: "Deployment", part: MAIN, manager: &applier("m"), now: NOW }, &live, &cfg, entries, true).unwrap();
        let (twice, e2) = apply(&Write { kind: "Deployment", part: MAIN, manager: &applier("m"), now: LATER }, &once, &cfg, e1.clone(), false).unwrap();
        prop_assert_eq!(&once, &twice);
        prop_assert_eq!(e1, e2);
    }

    #[test]
    fn a_field_dropped_from_the_configuration_is_removed_exactly(
        cfg in config(), extra_label in "[d-f]", extra_port in 90u16..93
    ) {
        let mut with = cfg.clone();
        with["metadata"]["labels"][&extra_label] = json!("v");
        with["spec"]["template"]["spec"]["containers"][0]["ports"]
            .as_array_mut().unwrap()
            .push(json!({"containerPort": extra_port}));
        let (live, entries) = apply_ok(&Value::Null, &with, Vec::new(), "m", NOW);
        let (after, entries) = apply_ok(&live, &cfg, entries, "m", LATER);
        // Exactly what the configuration has: the added label and port are gone, the rest
        // is as applied.
        prop_assert_eq!(&after, &cfg);
        owned_paths_exist(&after, &entries)?;
    }

    #[test]
    fn ownership_covers_only_existing_fields(
        steps in proptest::collection::vec((config(), 0usize..3, any::<bool>()), 1..6)
    ) {
        let mut obj = Value::Null;
        let mut entries = Vec::new();
        for (cfg, who, is_apply) in steps {
            let name = ["a", "b", "c"][who];
            if is_apply {
                match apply(&Write { kind: "Deployment", part: MAIN, manager: &applier(name), now: NOW }, &obj, &cfg, entries.clone(), false) {
                    Ok((o, e)) => { obj = o; entries = e; }
                    Err(ApplyError::Conflicts(c)) => prop_assert!(!c.is_empty()),
                    Err(e) => return Err(TestCaseError::fail(format!("{e:?}"))),
                }
            } else {
                entries = update(&Write { kind: "Deployment", part: MAIN, manager: &updater(name), now: NOW }, &obj, &cfg, entries);
                obj = cfg;
            }
            owned_paths_exist(&obj, &entries)?;
            let decoded = decode(encode(&entries).as_ref()).unwrap();
            prop_assert_eq!(decoded.len(), entries.len());
        }
    }
}

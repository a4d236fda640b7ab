//! Server-side apply with field ownership, end to end: `metadata.managedFields` recorded by
//! every write, apply conflicts (409 with upstream's message and causes) and `force`, and the
//! removal of fields a manager stops applying — through kube-rs `Patch::Apply`, raw HTTP and
//! the real kubectl (1.33, and 1.27 once).
#![allow(clippy::unwrap_used)]

mod common;

use common::kubectl::{KUBECTL_1_27, KUBECTL_1_33, Kubectl};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

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

/// The managedFields entries of an object as JSON, by manager name.
fn entry<'a>(obj: &'a Value, manager: &str) -> Option<&'a Value> {
    obj["metadata"]["managedFields"]
        .as_array()?
        .iter()
        .find(|e| e["manager"] == manager)
}

fn managers(obj: &Value) -> Vec<String> {
    obj["metadata"]["managedFields"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| {
                    format!(
                        "{}/{}",
                        e["manager"].as_str().unwrap(),
                        e["operation"].as_str().unwrap()
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn api_error(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn kube_rs_apply_owns_removes_conflicts_and_forces() {
    let ts = common::TestServer::start().await;
    let client = ts.client().await;
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let a = PatchParams::apply("owner-a");
    let first = deployment(
        2,
        json!({"app": "web", "tier": "front"}),
        json!([{"containerPort": 80}, {"containerPort": 443}]),
    );
    let created = deploys
        .patch("web", &a, &Patch::Apply(&first))
        .await
        .unwrap();
    let created = serde_json::to_value(&created).unwrap();
    assert_eq!(managers(&created), ["owner-a/Apply"]);
    let e = entry(&created, "owner-a").unwrap();
    assert_eq!(e["apiVersion"], "apps/v1");
    assert_eq!(e["fieldsType"], "FieldsV1");
    assert!(e["time"].is_string());
    let f = &e["fieldsV1"];
    assert_eq!(f["f:metadata"]["f:labels"]["f:tier"], json!({}));
    assert!(
        f["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"web\"}"]["f:ports"]
            ["k:{\"containerPort\":443,\"protocol\":\"TCP\"}"]
            .is_object(),
        "{f}"
    );

    // Dropping a label and a port from the configuration removes them.
    let second = deployment(2, json!({"app": "web"}), json!([{"containerPort": 80}]));
    let after = deploys
        .patch("web", &a, &Patch::Apply(&second))
        .await
        .unwrap();
    let labels = after.metadata.labels.clone().unwrap();
    assert_eq!(labels.get("tier"), None, "{labels:?}");
    let ports = after
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .ports
        .clone()
        .unwrap();
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0].container_port, 80);
    // Applying the same configuration again writes nothing.
    let again = deploys
        .patch("web", &a, &Patch::Apply(&second))
        .await
        .unwrap();
    assert_eq!(
        again.metadata.resource_version,
        after.metadata.resource_version
    );

    // Another manager setting replicas to another value conflicts...
    let b = PatchParams::apply("owner-b");
    let scale_to_5 = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                            "metadata": {"name": "web"}, "spec": {"replicas": 5}});
    let err = api_error(
        deploys
            .patch("web", &b, &Patch::Apply(&scale_to_5))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 409);
    assert_eq!(err.reason, "Conflict");
    assert_eq!(
        err.message,
        "Apply failed with 1 conflict: conflict with \"owner-a\": .spec.replicas"
    );
    // ...the same value is shared ownership...
    let same = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                      "metadata": {"name": "web"}, "spec": {"replicas": 2}});
    let shared = deploys
        .patch("web", &b, &Patch::Apply(&same))
        .await
        .unwrap();
    let shared = serde_json::to_value(&shared).unwrap();
    for m in ["owner-a", "owner-b"] {
        assert_eq!(
            entry(&shared, m).unwrap()["fieldsV1"]["f:spec"]["f:replicas"],
            json!({}),
            "{m}"
        );
    }
    // ...and force takes it over.
    let forced = deploys
        .patch("web", &b.clone().force(), &Patch::Apply(&scale_to_5))
        .await
        .unwrap();
    assert_eq!(forced.spec.as_ref().unwrap().replicas, Some(5));
    let forced = serde_json::to_value(&forced).unwrap();
    assert!(
        entry(&forced, "owner-a").unwrap()["fieldsV1"]["f:spec"]
            .get("f:replicas")
            .is_none()
    );
    // owner-a dropping replicas now removes nothing: owner-b owns it.
    let mut without = second.clone();
    without["spec"].as_object_mut().unwrap().remove("replicas");
    let kept = deploys
        .patch("web", &a, &Patch::Apply(&without))
        .await
        .unwrap();
    assert_eq!(kept.spec.unwrap().replicas, Some(5));

    // An Update (merge patch) takes the fields it changes from the appliers.
    let patcher = PatchParams {
        field_manager: Some("patcher".into()),
        ..PatchParams::default()
    };
    let patched = deploys
        .patch(
            "web",
            &patcher,
            &Patch::Merge(json!({"metadata": {"labels": {"app": "other"}}})),
        )
        .await
        .unwrap();
    let patched = serde_json::to_value(&patched).unwrap();
    let p = entry(&patched, "patcher").unwrap();
    assert_eq!(p["operation"], "Update");
    assert_eq!(
        p["fieldsV1"],
        json!({"f:metadata": {"f:labels": {"f:app": {}}}})
    );
    assert!(
        entry(&patched, "owner-a").unwrap()["fieldsV1"]["f:metadata"]
            .get("f:labels")
            .is_none()
    );

    // Applies through the scale and status subresources own only their part, under their
    // subresource.
    let hpa = PatchParams::apply("hpa").force();
    let scale = json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
                       "metadata": {"name": "web"}, "spec": {"replicas": 7}});
    deploys
        .patch_scale("web", &hpa, &Patch::Apply(&scale))
        .await
        .unwrap();
    let status = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                        "spec": {"replicas": 1}, "status": {"observedGeneration": 9}});
    deploys
        .patch_status(
            "web",
            &PatchParams::apply("reporter"),
            &Patch::Apply(&status),
        )
        .await
        .unwrap();
    let now = serde_json::to_value(deploys.get("web").await.unwrap()).unwrap();
    assert_eq!(now["spec"]["replicas"], 7);
    assert_eq!(now["status"]["observedGeneration"], 9);
    let h = entry(&now, "hpa").unwrap();
    assert_eq!(
        (&h["operation"], &h["subresource"], &h["apiVersion"]),
        (&json!("Apply"), &json!("scale"), &json!("apps/v1"))
    );
    assert_eq!(h["fieldsV1"], json!({"f:spec": {"f:replicas": {}}}));
    let r = entry(&now, "reporter").unwrap();
    assert_eq!(r["subresource"], "status");
    assert_eq!(
        r["fieldsV1"],
        json!({"f:status": {"f:observedGeneration": {}}})
    );
    let err = api_error(
        deploys
            .patch("web", &b, &Patch::Apply(&scale_to_5))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        err.message,
        "Apply failed with 1 conflict: conflict with \"hpa\" with subresource \"scale\": .spec.replicas"
    );

    // dryRun=All computes the conflict-free result and stores nothing.
    let before = deploys.get("web").await.unwrap();
    let dry = PatchParams {
        dry_run: true,
        ..PatchParams::apply("owner-c")
    };
    let cfg = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                     "metadata": {"name": "web", "labels": {"dry": "run"}}});
    let answered = deploys
        .patch("web", &dry, &Patch::Apply(&cfg))
        .await
        .unwrap();
    assert!(entry(&serde_json::to_value(&answered).unwrap(), "owner-c").is_some());
    let after = deploys.get("web").await.unwrap();
    assert_eq!(
        after.metadata.resource_version,
        before.metadata.resource_version
    );
    assert_eq!(
        after.metadata.managed_fields,
        before.metadata.managed_fields
    );
    ts.stop().await;
}

#[tokio::test]
async fn raw_managed_fields_defaults_reset_and_refusals() {
    let ts = common::TestServer::start().await;
    let raw = common::raw::raw(&ts).await;
    // The server's own objects are kube-apiserver's.
    let svc = raw
        .get("/api/v1/namespaces/default/services/kubernetes")
        .await
        .body;
    assert_eq!(managers(&svc), ["kube-apiserver/Update"], "{svc}");
    let cms = "/api/v1/namespaces/default/configmaps";
    // An Update without fieldManager is owned by the User-Agent's product name.
    let req = http::Request::builder()
        .method("POST")
        .uri(cms)
        .header("content-type", "application/json")
        .header("user-agent", "my-tool/1.2 (linux/amd64)")
        .body(
            json!({"metadata": {"name": "cm"}, "data": {"a": "1"}})
                .to_string()
                .into_bytes(),
        )
        .unwrap();
    let created: ConfigMap = raw.client.request(req).await.unwrap();
    let created = serde_json::to_value(&created).unwrap();
    let e = entry(&created, "my-tool").unwrap();
    assert_eq!(e["operation"], "Update");
    assert_eq!(e["apiVersion"], "v1");
    assert_eq!(e["fieldsV1"], json!({"f:data": {"f:a": {}}}));
    assert!(e.get("subresource").is_none());

    // Conflicts carry upstream's causes.
    let apply = |body: Value, query: &str| {
        let raw = &raw;
        let path = format!("{cms}/cm?fieldManager=applier{query}");
        async move {
            raw.send(
                "PATCH",
                &path,
                "application/apply-patch+yaml",
                body.to_string().as_bytes(),
            )
            .await
        }
    };
    let cfg = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"},
                     "data": {"a": "2", "b": "x"}});
    let r = apply(cfg.clone(), "").await;
    assert_eq!(r.code, 409, "{}", r.body);
    assert_eq!(r.body["reason"], "Conflict");
    assert_eq!(
        r.body["message"],
        "Apply failed with 1 conflict: conflict with \"my-tool\" using v1: .data.a"
    );
    assert_eq!(
        r.body["details"]["causes"],
        json!([{"reason": "FieldManagerConflict", "message": "conflict with \"my-tool\" using v1", "field": ".data.a"}])
    );
    // An apply configuration may not carry managedFields; force only goes with apply.
    let mut with_mf = cfg.clone();
    with_mf["metadata"]["managedFields"] = json!([{"manager": "x", "operation": "Apply"}]);
    let r = apply(with_mf, "").await;
    assert_eq!(
        (r.code, r.body["message"].as_str()),
        (400, Some("metadata.managedFields must be nil"))
    );
    let r = raw
        .send(
            "PATCH",
            &format!("{cms}/cm?force=true"),
            "application/merge-patch+json",
            b"{}",
        )
        .await;
    assert_eq!(r.code, 422, "{}", r.body);
    let r = apply(cfg.clone(), "&force=true").await;
    assert_eq!(r.code, 200, "{}", r.body);
    assert_eq!(r.body["data"], json!({"a": "2", "b": "x"}));
    assert!(entry(&r.body, "my-tool").is_none(), "{}", r.body);

    // managedFields from a client, as upstream: entries it cannot decode (a wrong operation,
    // a bad field set) leave the stored ones, a manager over 128 bytes is 422, `[{}]`
    // resets them.
    let mut obj = r.body.clone();
    for bad in [
        json!([{"manager": "m", "operation": "Bogus", "apiVersion": "v1", "fieldsType": "FieldsV1"}]),
        json!([{"manager": "m", "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1",
                "fieldsV1": {"nonsense": {}}}]),
    ] {
        obj["metadata"]["managedFields"] = bad;
        let r = raw.json("PUT", &format!("{cms}/cm"), &obj).await;
        assert_eq!(r.code, 200, "{}", r.body);
        assert_eq!(managers(&r.body), ["applier/Apply"]);
    }
    obj["metadata"]["managedFields"] = json!([{"manager": "m".repeat(129), "operation": "Update",
        "apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:a": {}}}}]);
    let r = raw.json("PUT", &format!("{cms}/cm"), &obj).await;
    assert_eq!(r.code, 422, "{}", r.body);
    assert_eq!(
        r.body["details"]["causes"][0]["field"],
        "metadata.managedFields[0].manager"
    );
    // A value of the wrong type does not decode into ObjectMeta: 400, as upstream; with
    // fieldValidation=Ignore it is never stored either (the object stays readable).
    for bad in [
        json!("x"),
        json!([1]),
        json!([{"manager": "m", "time": "yesterday"}]),
    ] {
        obj["metadata"]["managedFields"] = bad.clone();
        let r = raw.json("PUT", &format!("{cms}/cm"), &obj).await;
        assert_eq!(r.code, 400, "{bad}: {}", r.body);
        let r = raw
            .json("PUT", &format!("{cms}/cm?fieldValidation=Ignore"), &obj)
            .await;
        assert_eq!(r.code, 200, "{bad}: {}", r.body);
        assert_eq!(managers(&r.body), ["applier/Apply"], "{bad}");
        Api::<ConfigMap>::namespaced(raw.client.clone(), "default")
            .get("cm")
            .await
            .unwrap();
    }
    // Entries that decode replace the stored ones (a client may rewrite ownership).
    obj["metadata"]["managedFields"] = json!([{"manager": "importer", "operation": "Update",
        "apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:a": {}}}}]);
    let r = raw.json("PUT", &format!("{cms}/cm"), &obj).await;
    assert_eq!(r.code, 200, "{}", r.body);
    assert_eq!(managers(&r.body), ["importer/Update"]);
    let mut obj = r.body.clone();
    obj["metadata"]["managedFields"] = json!([{}]);
    let r = raw.json("PUT", &format!("{cms}/cm"), &obj).await;
    assert_eq!(r.code, 200, "{}", r.body);
    assert!(
        r.body["metadata"].get("managedFields").is_none(),
        "{}",
        r.body
    );
    // The object stays readable through kube-rs.
    let api: Api<ConfigMap> = Api::namespaced(raw.client.clone(), "default");
    api.get("cm").await.unwrap();
    // Once reset, Updates are not tracked until the next apply (upstream's skip-non-applied
    // manager), which first gives what the object holds to before-first-apply.
    let mut obj = r.body.clone();
    obj["data"]["c"] = json!("3");
    let put = PostParams {
        field_manager: Some("putter".into()),
        ..PostParams::default()
    };
    let cm: ConfigMap = serde_json::from_value(obj).unwrap();
    let replaced = api.replace("cm", &put, &cm).await.unwrap();
    assert_eq!(replaced.metadata.managed_fields, None);
    let mut change_c = cfg.clone();
    change_c["data"] = json!({"c": "4"});
    let r = apply(change_c, "").await;
    assert_eq!(r.code, 409, "{}", r.body);
    assert_eq!(
        r.body["message"],
        "Apply failed with 1 conflict: conflict with \"before-first-apply\" using v1: .data.c"
    );
    let mut keep_c = cfg.clone();
    keep_c["data"] = json!({"c": "3"});
    let r = apply(keep_c, "").await;
    assert_eq!(r.code, 200, "{}", r.body);
    assert_eq!(
        managers(&r.body),
        ["applier/Apply", "before-first-apply/Update"]
    );
    assert_eq!(r.body["data"], json!({"a": "2", "b": "x", "c": "3"}));
    ts.stop().await;
}

const MANIFEST: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web, tier: front}
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: nginx
        ports:
        - containerPort: 80
        - containerPort: 443
"#;

/// `kubectl apply --server-side`, the field dropped from the manifest, `kubectl scale` then
/// the conflict and `--force-conflicts`, as upstream. The scale manager is the User-Agent's
/// product name: the binary's file name, `kubectl.1.33` here.
fn kubectl_server_side_flow(k: &Kubectl) {
    // kubectl 1.27 validates against OpenAPI v2, which svcnet does not serve (v3 only).
    let validate = if k.bin == KUBECTL_1_27 {
        "--validate=false"
    } else {
        "--validate=strict"
    };
    let apply = ["apply", "--server-side", validate, "-f", "-"];
    let forced = [
        "apply",
        "--server-side",
        validate,
        "--force-conflicts",
        "-f",
        "-",
    ];
    let out = k.ok_in(&apply, Some(MANIFEST));
    assert!(
        out.contains("deployment.apps/web serverside-applied"),
        "{out}"
    );
    let shown = k.json(&["get", "deployment", "web", "--show-managed-fields"]);
    let e = entry(&shown, "kubectl").unwrap();
    assert_eq!(e["operation"], "Apply");
    assert!(
        k.json(&["get", "deployment", "web"])["metadata"]
            .get("managedFields")
            .is_none(),
        "kubectl hides managedFields unless asked"
    );
    let yaml = k.ok(&[
        "get",
        "deployment",
        "web",
        "-o",
        "yaml",
        "--show-managed-fields",
    ]);
    assert!(
        yaml.contains("manager: kubectl") && yaml.contains("f:replicas: {}"),
        "{yaml}"
    );

    let trimmed = MANIFEST
        .replace(", tier: front", "")
        .replace("        - containerPort: 443\n", "");
    k.ok_in(&apply, Some(&trimmed));
    let d = k.json(&["get", "deployment", "web"]);
    assert_eq!(d["metadata"]["labels"], json!({"app": "web"}));
    assert_eq!(
        d["spec"]["template"]["spec"]["containers"][0]["ports"],
        json!([{"containerPort": 80, "protocol": "TCP"}])
    );

    k.ok(&["scale", "deployment", "web", "--replicas=5"]);
    let scaled = k.json(&["get", "deployment", "web", "--show-managed-fields"]);
    let scaler = k.bin.rsplit('/').next().unwrap();
    let s = entry(&scaled, scaler).unwrap_or_else(|| panic!("{scaled}"));
    assert_eq!(s["operation"], "Update");
    assert_eq!(s["subresource"], "scale");
    let err = k.fails_in(&apply, &trimmed);
    assert!(
        err.contains(&format!(
            "Apply failed with 1 conflict: conflict with \"{scaler}\" with subresource \"scale\" using apps/v1: .spec.replicas"
        )),
        "{err}"
    );
    assert_eq!(k.json(&["get", "deployment", "web"])["spec"]["replicas"], 5);
    k.ok_in(&forced, Some(&trimmed));
    let d = k.json(&["get", "deployment", "web", "--show-managed-fields"]);
    assert_eq!(d["spec"]["replicas"], 2);
    assert!(entry(&d, scaler).is_none(), "{d}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_33_server_side_apply_and_update_managers() {
    let ts = common::TestServer::start().await;
    let kc = ts.server().kubeconfig_path().to_path_buf();
    let dir = ts.dir.path().to_path_buf();
    tokio::task::spawn_blocking(move || {
        let mut k = Kubectl::new(KUBECTL_1_33, &kc);
        kubectl_server_side_flow(&k);

        // Client-side apply writes Updates under kubectl-client-side-apply.
        let cm =
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  a: \"1\"\n";
        k.ok_in(&["apply", "-f", "-"], Some(cm));
        k.ok_in(&["apply", "-f", "-"], Some(&cm.replace("\"1\"", "\"2\"")));
        let got = k.json(&["get", "configmap", "settings", "--show-managed-fields"]);
        let e = entry(&got, "kubectl-client-side-apply").unwrap_or_else(|| panic!("{got}"));
        assert_eq!(e["operation"], "Update");
        assert_eq!(e["fieldsV1"]["f:data"]["f:a"], json!({}));

        // `kubectl apply --server-side` takes over what the client-side apply set (no
        // conflict while the values are the last-applied ones) and rewrites the annotation.
        k.ok_in(
            &["apply", "--server-side", "-f", "-"],
            Some(&cm.replace("\"1\"", "\"5\"")),
        );
        let got = k.json(&["get", "configmap", "settings", "--show-managed-fields"]);
        assert_eq!(got["data"]["a"], "5");
        let last =
            got["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
                .as_str()
                .unwrap();
        assert!(last.contains("\"a\":\"5\""), "{last}");
        assert_eq!(entry(&got, "kubectl").unwrap()["operation"], "Apply");

        // `kubectl edit` through an editor script: an Update under kubectl-edit.
        let editor = dir.join("editor.sh");
        std::fs::write(&editor, "#!/bin/sh\nsed -i 's/a: \"5\"/a: \"3\"/' \"$1\"\n").unwrap();
        std::process::Command::new("chmod")
            .args(["+x"])
            .arg(&editor)
            .status()
            .unwrap();
        k.env = vec![("KUBE_EDITOR".into(), editor.display().to_string())];
        k.ok(&["edit", "configmap", "settings"]);
        let got = k.json(&["get", "configmap", "settings", "--show-managed-fields"]);
        assert_eq!(got["data"]["a"], "3");
        let e = entry(&got, "kubectl-edit").unwrap_or_else(|| panic!("{got}"));
        assert_eq!(e["fieldsV1"], json!({"f:data": {"f:a": {}}}));
        for other in ["kubectl-client-side-apply", "kubectl"] {
            assert!(
                entry(&got, other).is_none_or(|e| e["fieldsV1"]["f:data"].get("f:a").is_none()),
                "the edit took .data.a from {other}: {got}"
            );
        }
    })
    .await
    .unwrap();
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_27_server_side_apply_conflicts_as_upstream() {
    let ts = common::TestServer::start().await;
    let kc = ts.server().kubeconfig_path().to_path_buf();
    tokio::task::spawn_blocking(move || {
        kubectl_server_side_flow(&Kubectl::new(KUBECTL_1_27, &kc));
    })
    .await
    .unwrap();
    ts.stop().await;
}

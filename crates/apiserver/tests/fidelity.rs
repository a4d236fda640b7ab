//! What tools rely on: bodies read by their media type, upstream's smaller refusals of
//! metadata and apply options, and lists at an exact resource version.
#![allow(clippy::unwrap_used)]

mod common;

use common::raw::{NS, Raw, Reply, raw};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_are_read_by_their_media_type() {
    let ts = common::TestServer::start().await;
    let api = raw(&ts).await;
    let cms = "/api/v1/namespaces/default/configmaps";
    let json_body = json!({"metadata": {"name": "j"}}).to_string();
    for ct in [
        "text/plain",
        "application/xml",
        "*/*",
        "application/x-www-form-urlencoded",
    ] {
        let s = api
            .refused(415, "POST", cms, ct, json_body.as_bytes())
            .await;
        assert_eq!(s["reason"], "UnsupportedMediaType", "{ct}: {s}");
        assert!(
            s["message"].as_str().unwrap().contains("application/yaml"),
            "{s}"
        );
    }
    // YAML is a body format of the API, as upstream's.
    let yaml = b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-yaml\ndata:\n  k: v\n";
    let r = api.send("POST", cms, "application/yaml", yaml).await;
    assert_eq!(r.code, 201, "{}", r.body);
    assert_eq!(
        api.get(&format!("{cms}/from-yaml")).await.body["data"]["k"],
        "v"
    );
    let r = api
        .send(
            "PUT",
            &format!("{cms}/from-yaml"),
            "application/yaml; charset=utf-8",
            b"metadata:\n  name: from-yaml\ndata:\n  k: w\n",
        )
        .await;
    assert_eq!(
        (r.code, &r.body["data"]["k"]),
        (200, &json!("w")),
        "{}",
        r.body
    );
    api.refused(400, "POST", cms, "application/yaml", b"metadata: [unclosed")
        .await;
    // Every 404 carries details, as upstream's (clients read them).
    for path in [
        "/api/v1/namespaces/default/pods/p/nosuch",
        "/apis/nosuch.io/v1/things",
        "/nope",
    ] {
        let r = api.get(path).await;
        assert_eq!(r.code, 404, "{path}");
        assert!(r.body["details"].is_object(), "{path}: {}", r.body);
    }
}

/// The smaller refusals of upstream: metadata that names nothing (finalizers, owner
/// references), apply configurations without their version and kind or a manager, field
/// managers over 128 bytes, and the object named when its namespace is terminating.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_and_apply_options_are_validated() {
    let ts = common::TestServer::start().await;
    let api = raw(&ts).await;
    let cms = "/api/v1/namespaces/default/configmaps";
    let cm = |meta: Value| json!({"metadata": meta}).to_string();
    for (meta, want) in [
        (
            json!({"name": "f", "finalizers": ["hold"]}),
            "name is neither a standard finalizer name nor is it fully qualified",
        ),
        (
            json!({"name": "f", "finalizers": ["example.com/-bad"]}),
            "metadata.finalizers: Invalid value",
        ),
        (
            json!({"name": "o", "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": ""}]}),
            "metadata.ownerReferences.uid: Invalid value: \"\": uid must not be empty",
        ),
        (
            json!({"name": "o", "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "", "uid": "u"}]}),
            "name must not be empty",
        ),
        (
            json!({"name": "o", "ownerReferences": [{"apiVersion": "", "kind": "Pod", "name": "p", "uid": "u"}]}),
            "version must not be empty",
        ),
    ] {
        let s = api
            .refused(422, "POST", cms, "application/json", cm(meta).as_bytes())
            .await;
        assert!(s["message"].as_str().unwrap().contains(want), "{s}");
    }
    let ok = cm(json!({"name": "fine", "finalizers": ["example.com/hold", "kubernetes"]}));
    assert_eq!(
        api.send("POST", cms, "application/json", ok.as_bytes())
            .await
            .code,
        201
    );

    let apply = "application/apply-patch+yaml";
    let item = format!("{cms}/applied");
    let body = b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: applied\n";
    let s = api.refused(422, "PATCH", &item, apply, body).await;
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains("fieldManager: Required value: is required for apply patch"),
        "{s}"
    );
    let q = format!("{item}?fieldManager=me");
    let s = api
        .refused(
            400,
            "PATCH",
            &q,
            apply,
            b"kind: ConfigMap\nmetadata:\n  name: applied\n",
        )
        .await;
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains("Incorrect version specified in apply patch"),
        "{s}"
    );
    api.refused(
        400,
        "PATCH",
        &q,
        apply,
        b"apiVersion: v1\nmetadata:\n  name: applied\n",
    )
    .await;
    let long = format!("{item}?fieldManager={}", "m".repeat(129));
    let s = api.refused(422, "PATCH", &long, apply, body).await;
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains("may not be more than 128 bytes"),
        "{s}"
    );
    api.refused(
        422,
        "POST",
        &format!("{cms}?fieldManager={}", "m".repeat(129)),
        "application/json",
        cm(json!({"name": "x"})).as_bytes(),
    )
    .await;
    assert_eq!(api.send("PATCH", &q, apply, body).await.code, 201);

    // Creating in a terminating namespace names the object refused.
    assert_eq!(
        api.json("POST", NS, &json!({"metadata": {"name": "going"}}))
            .await
            .code,
        201
    );
    let going = "/api/v1/namespaces/going/configmaps";
    assert_eq!(
        api.json(
            "POST",
            going,
            &json!({"metadata": {"name": "held", "finalizers": ["example.com/x"]}})
        )
        .await
        .code,
        201
    );
    assert_eq!(
        api.send("DELETE", &format!("{NS}/going"), "application/json", b"")
            .await
            .code,
        200
    );
    api.settle().await;
    let s = api
        .refused(
            403,
            "POST",
            going,
            "application/json",
            cm(json!({"name": "late"})).as_bytes(),
        )
        .await;
    assert!(
        s["message"].as_str().unwrap().starts_with(
            "configmaps \"late\" is forbidden: unable to create new content in namespace going"
        ),
        "{s}"
    );
}

/// `resourceVersionMatch=Exact` lists the state at that revision (410 once compacted away),
/// `NotOlderThan` the current state (504 for a revision the server has not reached), and
/// anything else is refused as upstream refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_at_an_exact_resource_version() {
    let ts = common::TestServer::start_with(|c| c.watch_history = 50).await;
    let api = raw(&ts).await;
    let cms = "/api/v1/namespaces/default/configmaps";
    // The test's own ConfigMaps (every namespace also holds `kube-root-ca.crt`).
    let data = |r: &Reply| -> Vec<(String, String)> {
        r.body["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["metadata"]["name"] != "kube-root-ca.crt")
            .map(|i| {
                (
                    i["metadata"]["name"].as_str().unwrap().to_string(),
                    i["data"]["v"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect()
    };
    assert_eq!(
        api.json(
            "POST",
            cms,
            &json!({"metadata": {"name": "a"}, "data": {"v": "1"}})
        )
        .await
        .code,
        201
    );
    let then = api.get(cms).await.body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let r = api
        .send(
            "PATCH",
            &format!("{cms}/a"),
            "application/merge-patch+json",
            br#"{"data":{"v":"2"}}"#,
        )
        .await;
    assert_eq!(r.code, 200);
    assert_eq!(
        api.json(
            "POST",
            cms,
            &json!({"metadata": {"name": "b"}, "data": {"v": "1"}})
        )
        .await
        .code,
        201
    );

    let exact = api
        .get(&format!(
            "{cms}?resourceVersion={then}&resourceVersionMatch=Exact"
        ))
        .await;
    assert_eq!(exact.code, 200, "{}", exact.body);
    assert_eq!(data(&exact), vec![("a".into(), "1".into())]);
    assert_eq!(exact.body["metadata"]["resourceVersion"], then.as_str());
    let newer = api
        .get(&format!(
            "{cms}?resourceVersion={then}&resourceVersionMatch=NotOlderThan"
        ))
        .await;
    assert_eq!(
        data(&newer),
        vec![("a".into(), "2".into()), ("b".into(), "1".into())]
    );
    // kube-rs retries a 504 (as client-go does): ask once, without its retries.
    let once = {
        let kc = kube::config::Kubeconfig::read_from(ts.server().kubeconfig_path()).unwrap();
        let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        cfg.default_retry = false;
        Raw {
            client: kube::Client::try_from(cfg).unwrap(),
        }
    };
    let future = once
        .get(&format!(
            "{cms}?resourceVersion=99999&resourceVersionMatch=NotOlderThan"
        ))
        .await;
    assert_eq!(
        (future.code, &future.body["reason"]),
        (504, &json!("Timeout")),
        "{}",
        future.body
    );
    for bad in [
        format!("{cms}?resourceVersion={then}&resourceVersionMatch=Sometimes"),
        format!("{cms}?resourceVersionMatch=Exact"),
        format!("{cms}?resourceVersion=0&resourceVersionMatch=Exact"),
    ] {
        let r = api.get(&bad).await;
        assert_eq!(
            (r.code, &r.body["details"]["kind"]),
            (422, &json!("ListOptions")),
            "{bad}: {}",
            r.body
        );
    }
    // Once the history no longer reaches back there: 410 Expired, as after a compaction.
    for i in 0..80 {
        let r = api
            .send(
                "PATCH",
                &format!("{cms}/b"),
                "application/merge-patch+json",
                format!("{{\"data\":{{\"v\":\"{i}\"}}}}").as_bytes(),
            )
            .await;
        assert_eq!(r.code, 200);
    }
    let gone = api
        .get(&format!(
            "{cms}?resourceVersion={then}&resourceVersionMatch=Exact"
        ))
        .await;
    assert_eq!(
        (gone.code, &gone.body["reason"]),
        (410, &json!("Expired")),
        "{}",
        gone.body
    );
}

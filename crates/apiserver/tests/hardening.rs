//! Requests as users and scripts really send them, which must never delete or write what was
//! not asked for: collection deletes where upstream has none, empty names, `dryRun` values
//! other than `All`, malformed DeleteOptions, bodies that blank or mistype fields, immutable
//! ConfigMaps, objects over the size limits. Every refused request is checked against a
//! snapshot of the whole store: its revision and every object are as before.
#![allow(clippy::unwrap_used)]

mod common;

use common::raw::{NS, raw};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collection_deletes_only_where_upstream_has_them() {
    let ts = common::TestServer::start().await;
    let api = raw(&ts).await;
    for ns in ["aaa", "abc", "team-a"] {
        let r = api
            .json("POST", NS, &json!({"metadata": {"name": ns}}))
            .await;
        assert_eq!(r.code, 201, "{}", r.body);
    }
    // Each new namespace gets its ServiceAccount and `kube-root-ca.crt` in the background.
    api.settle().await;
    // kube-apiserver has no collection delete on namespaces: 405, and none goes.
    let s = api
        .refused(405, "DELETE", NS, "application/json", b"")
        .await;
    assert_eq!(s["reason"], "MethodNotAllowed");
    let names: Vec<String> = api.get(NS).await.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    for ns in ["aaa", "abc", "default", "kube-system", "team-a"] {
        assert!(names.contains(&ns.to_string()), "{ns} is gone: {names:?}");
    }
    // Discovery says so.
    let core = api.get("/api/v1").await.body;
    let verbs = |name: &str| -> Vec<String> {
        core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap()["verbs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    };
    assert!(!verbs("namespaces").contains(&"deletecollection".to_string()));
    assert!(verbs("configmaps").contains(&"deletecollection".to_string()));

    // A collection delete that can go, goes whole (the test's own ConfigMaps, by label: the
    // namespace also holds `kube-root-ca.crt`, which its publisher puts back).
    let cms = "/api/v1/namespaces/team-a/configmaps";
    for i in 0..3 {
        let r = api
            .json(
                "POST",
                cms,
                &json!({"metadata": {"name": format!("c{i}"), "labels": {"set": "c"}}}),
            )
            .await;
        assert_eq!(r.code, 201);
    }
    let selected = format!("{cms}?labelSelector=set%3Dc");
    let r = api.send("DELETE", &selected, "application/json", b"").await;
    assert_eq!(r.code, 200, "{}", r.body);
    assert_eq!(r.body["items"].as_array().unwrap().len(), 3);
    assert_eq!(api.get(&selected).await.body["items"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_name_never_reaches_a_collection() {
    let ts = common::TestServer::start().await;
    let api = raw(&ts).await;
    let cms = "/api/v1/namespaces/default/configmaps";
    let svcs = "/api/v1/namespaces/default/services";
    assert_eq!(
        api.json("POST", cms, &json!({"metadata": {"name": "keep"}}))
            .await
            .code,
        201
    );
    let svc = json!({"metadata": {"name": "keep"}, "spec": {"ports": [{"port": 80}]}});
    assert_eq!(api.json("POST", svcs, &svc).await.code, 201);
    for base in [cms, svcs] {
        let path = format!("{base}/");
        for method in ["DELETE", "PUT", "PATCH"] {
            let ct = if method == "PATCH" {
                "application/merge-patch+json"
            } else {
                "application/json"
            };
            let s = api.refused(400, method, &path, ct, b"{}").await;
            assert_eq!(s["message"], "name must be provided", "{method} {path}");
        }
    }
    assert_eq!(api.get(&format!("{cms}/keep")).await.code, 200);
    assert_eq!(api.get(&format!("{svcs}/keep")).await.code, 200);
    // Empty segments inside a path name nothing.
    api.refused(
        404,
        "DELETE",
        "/api/v1/namespaces//configmaps/keep",
        "application/json",
        b"",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_other_than_all_is_refused_and_all_never_writes() {
    let ts = common::TestServer::start().await;
    let api = raw(&ts).await;
    let cms = "/api/v1/namespaces/default/configmaps";
    let cm = |v: &str| json!({"metadata": {"name": "c"}, "data": {"v": v}});
    let body = cm("1").to_string();
    for bad in ["true", "1", "all", "All&dryRun=true"] {
        let s = api
            .refused(
                422,
                "POST",
                &format!("{cms}?dryRun={bad}"),
                "application/json",
                body.as_bytes(),
            )
            .await;
        assert_eq!(s["details"]["kind"], "CreateOptions", "{s}");
        assert_eq!(s["details"]["group"], "meta.k8s.io", "{s}");
        assert!(
            s["message"]
                .as_str()
                .unwrap()
                .contains("dryRun: Unsupported value: []string{"),
            "{s}"
        );
    }
    assert_eq!(api.json("POST", cms, &cm("1")).await.code, 201);
    let c = format!("{cms}/c");
    let put = cm("2").to_string();
    api.refused(
        422,
        "PUT",
        &format!("{c}?dryRun=true"),
        "application/json",
        put.as_bytes(),
    )
    .await;
    api.refused(
        422,
        "PATCH",
        &format!("{c}?dryRun=true"),
        "application/merge-patch+json",
        br#"{"data":{"v":"3"}}"#,
    )
    .await;
    api.refused(
        422,
        "DELETE",
        &format!("{c}?dryRun=true"),
        "application/json",
        b"",
    )
    .await;
    api.refused(
        422,
        "DELETE",
        &c,
        "application/json",
        br#"{"dryRun":["true"]}"#,
    )
    .await;
    api.refused(
        422,
        "DELETE",
        &format!("{cms}?dryRun=yes"),
        "application/json",
        b"",
    )
    .await;

    // dryRun=All answers as the write would, and writes nothing, on every verb.
    let before = api.world().await;
    let r = api
        .send(
            "POST",
            &format!("{cms}?dryRun=All"),
            "application/json",
            cm("9").to_string().replace("\"c\"", "\"d\"").as_bytes(),
        )
        .await;
    assert_eq!(r.code, 201, "{}", r.body);
    let r = api
        .send(
            "PUT",
            &format!("{c}?dryRun=All"),
            "application/json",
            put.as_bytes(),
        )
        .await;
    assert_eq!(
        (r.code, &r.body["data"]["v"]),
        (200, &json!("2")),
        "{}",
        r.body
    );
    let r = api
        .send(
            "PATCH",
            &format!("{c}?dryRun=All"),
            "application/merge-patch+json",
            br#"{"data":{"v":"3"}}"#,
        )
        .await;
    assert_eq!((r.code, &r.body["data"]["v"]), (200, &json!("3")));
    let r = api
        .send(
            "PATCH",
            &format!("{cms}/new?dryRun=All&fieldManager=t"),
            "application/apply-patch+yaml",
            b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: new\n",
        )
        .await;
    assert_eq!(r.code, 201, "{}", r.body);
    let r = api
        .send(
            "DELETE",
            &format!("{c}?dryRun=All"),
            "application/json",
            b"",
        )
        .await;
    assert_eq!(r.code, 200);
    let r = api
        .send(
            "DELETE",
            &format!("{cms}?dryRun=All"),
            "application/json",
            b"",
        )
        .await;
    assert_eq!(r.code, 200);
    assert!(
        api.world().await == before,
        "a dryRun=All request changed the store"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_delete_options_delete_nothing() {
    let ts = common::TestServer::start().await;
    let api = raw(&ts).await;
    let cms = "/api/v1/namespaces/default/configmaps";
    assert_eq!(
        api.json("POST", cms, &json!({"metadata": {"name": "c"}}))
            .await
            .code,
        201
    );
    let c = format!("{cms}/c");
    for body in [
        r#"{"preconditions":{"uid":123}}"#,
        r#"{"preconditions":"x"}"#,
        r#"{"gracePeriodSeconds":"soon"}"#,
        r#"{"propagationPolicy":7}"#,
        r#"[1,2]"#,
        r#"{"preconditions":"#,
    ] {
        let s = api
            .refused(400, "DELETE", &c, "application/json", body.as_bytes())
            .await;
        assert_eq!(s["reason"], "BadRequest", "{body}: {s}");
    }
    for (body, query) in [
        (r#"{"propagationPolicy":"Sometimes"}"#, ""),
        ("", "?propagationPolicy=garbage"),
        (
            r#"{"propagationPolicy":"Orphan","orphanDependents":true}"#,
            "",
        ),
    ] {
        let s = api
            .refused(
                422,
                "DELETE",
                &format!("{c}{query}"),
                "application/json",
                body.as_bytes(),
            )
            .await;
        assert_eq!(s["details"]["kind"], "DeleteOptions", "{s}");
    }
    // A well-formed precondition that does not hold is a conflict; one that holds deletes.
    let uid = api.get(&c).await.body["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    api.refused(
        409,
        "DELETE",
        &c,
        "application/json",
        br#"{"preconditions":{"uid":"nope"}}"#,
    )
    .await;
    let ok = json!({"preconditions": {"uid": uid}});
    assert_eq!(api.json("DELETE", &c, &ok).await.code, 200);
    assert_eq!(api.get(&c).await.code, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immutable_configmaps_stay_as_they_are() {
    let ts = common::TestServer::start().await;
    let api = raw(&ts).await;
    let cms = "/api/v1/namespaces/default/configmaps";
    let cm = json!({"metadata": {"name": "frozen"}, "data": {"a": "1"}, "immutable": true});
    assert_eq!(api.json("POST", cms, &cm).await.code, 201);
    let item = format!("{cms}/frozen");
    let merge = "application/merge-patch+json";
    for patch in [
        r#"{"data":{"a":"2"}}"#,
        r#"{"immutable":false}"#,
        r#"{"immutable":null}"#,
        r#"{"binaryData":{"b":"AAAA"}}"#,
    ] {
        let s = api
            .refused(422, "PATCH", &item, merge, patch.as_bytes())
            .await;
        assert!(
            s["message"]
                .as_str()
                .unwrap()
                .contains("field is immutable when `immutable` is set"),
            "{s}"
        );
    }
    let mut put = api.get(&item).await.body;
    put["data"]["a"] = json!("3");
    api.refused(
        422,
        "PUT",
        &item,
        "application/json",
        put.to_string().as_bytes(),
    )
    .await;
    // Its metadata may still change, and it may be deleted.
    let r = api
        .send(
            "PATCH",
            &item,
            merge,
            br#"{"metadata":{"labels":{"l":"v"}}}"#,
        )
        .await;
    assert_eq!(r.code, 200, "{}", r.body);
    assert_eq!(
        api.send("DELETE", &item, "application/json", b"")
            .await
            .code,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_over_the_size_limits_are_refused() {
    let ts = common::TestServer::start().await;
    let api = raw(&ts).await;
    let cms = "/api/v1/namespaces/default/configmaps";
    let big = "x".repeat(1024 * 1024 + 1);
    let body = json!({"metadata": {"name": "big"}, "data": {"k": big}}).to_string();
    let s = api
        .refused(422, "POST", cms, "application/json", body.as_bytes())
        .await;
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains("Too long: may not be more than 1048576 bytes"),
        "{s}"
    );
    // Growing a small one past the limit by a patch is refused too.
    assert_eq!(
        api.json("POST", cms, &json!({"metadata": {"name": "small"}}))
            .await
            .code,
        201
    );
    let patch = json!({"data": {"k": "y".repeat(1024 * 1024)}}).to_string();
    api.refused(
        422,
        "PATCH",
        &format!("{cms}/small"),
        "application/merge-patch+json",
        patch.as_bytes(),
    )
    .await;
    // Any kind: an object encoded larger than etcd's 1.5 MiB request limit is a 413.
    let leases = "/apis/coordination.k8s.io/v1/namespaces/default/leases";
    let lease =
        json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "h".repeat(1600 * 1024)}})
            .to_string();
    let s = api
        .refused(413, "POST", leases, "application/json", lease.as_bytes())
        .await;
    assert_eq!(s["reason"], "RequestEntityTooLarge");
    // And bodies over the request limit (3 MiB) are refused before they are read whole.
    let huge =
        json!({"metadata": {"name": "huge"}, "data": {"k": "z".repeat(4 << 20)}}).to_string();
    api.refused(413, "POST", cms, "application/json", huge.as_bytes())
        .await;
}

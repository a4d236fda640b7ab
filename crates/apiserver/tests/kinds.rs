//! Every served kind, through every writing verb: typed decoding keeps each object's identity,
//! refused requests change nothing, and `dryRun=All` never writes.
#![allow(clippy::unwrap_used)]

mod common;

use common::fixtures::fixture;
use common::raw::raw;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_keeps_its_type_and_identity() {
    let ts = common::TestServer::start().await;
    let api = raw(&ts).await;
    let kinds = [
        (
            "/api/v1/namespaces/default/serviceaccounts",
            "v1",
            "ServiceAccount",
            json!({}),
        ),
        (
            "/apis/apps/v1/namespaces/default/replicasets",
            "apps/v1",
            "ReplicaSet",
            json!({"spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}}),
        ),
        (
            "/apis/apps/v1/namespaces/default/controllerrevisions",
            "apps/v1",
            "ControllerRevision",
            json!({"revision": 1, "data": {"spec": {"template": {}}}}),
        ),
        (
            "/apis/coordination.k8s.io/v1/namespaces/default/leases",
            "coordination.k8s.io/v1",
            "Lease",
            json!({"spec": {"holderIdentity": "me"}}),
        ),
        (
            "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies",
            "networking.k8s.io/v1",
            "NetworkPolicy",
            json!({"spec": {"podSelector": {}, "egress": [{"ports": [{"port": 53, "protocol": "UDP"}]}]}}),
        ),
        (
            "/apis/events.k8s.io/v1/namespaces/default/events",
            "events.k8s.io/v1",
            "Event",
            json!({"eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "x/y", "reportingInstance": "i", "action": "A", "reason": "R", "type": "Normal", "regarding": {"kind": "Pod", "name": "p", "namespace": "default"}}),
        ),
    ];
    for (path, api_version, kind, extra) in kinds {
        let mut obj = json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": "x"}});
        for (k, v) in extra.as_object().unwrap() {
            obj[k] = v.clone();
        }
        let r = api.json("POST", path, &obj).await;
        assert_eq!(r.code, 201, "{kind}: {}", r.body);
        let item = format!("{path}/x");
        // A merge patch blanking apiVersion and kind is stored with both intact.
        let r = api
            .send(
                "PATCH",
                &item,
                "application/merge-patch+json",
                br#"{"apiVersion":"","kind":"","metadata":{"labels":{"p":"1"}}}"#,
            )
            .await;
        assert_eq!(r.code, 200, "{kind}: {}", r.body);
        let got = api.get(&item).await.body;
        assert_eq!(
            (got["apiVersion"].as_str(), got["kind"].as_str()),
            (Some(api_version), Some(kind)),
            "{got}"
        );
        assert_eq!(got["metadata"]["labels"]["p"], "1");
        // Wrongly typed fields are a 400, in patches, PUTs and server-side apply bodies alike.
        let wrong = br#"{"metadata":{"labels":{"p":5}}}"#;
        api.refused(400, "PATCH", &item, "application/merge-patch+json", wrong)
            .await;
        let mut put = got.clone();
        put["metadata"]["name"] = json!(["x"]);
        api.refused(
            400,
            "PUT",
            &item,
            "application/json",
            put.to_string().as_bytes(),
        )
        .await;
        let apply = format!(
            "apiVersion: {api_version}\nkind: {kind}\nmetadata:\n  name: y\n  labels: [1]\n"
        );
        api.refused(
            400,
            "PATCH",
            &format!("{path}/y?fieldManager=t"),
            "application/apply-patch+yaml",
            apply.as_bytes(),
        )
        .await;
        // And a kind that is not the resource's is refused.
        let other = br#"{"kind":"Pod"}"#;
        api.refused(400, "PATCH", &item, "application/merge-patch+json", other)
            .await;
    }
}

/// Over every served kind and every writing verb: a refused request (a `dryRun` other than
/// `All`, an empty name, malformed DeleteOptions) changes nothing, and `dryRun=All` never
/// changes anything, while answering as the write would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_and_verb_refuses_or_dry_runs_without_writing() {
    let ts = common::TestServer::start().await;
    let api = raw(&ts).await;
    let mut collections = Vec::new();
    let mut gvs = vec!["/api/v1".to_string()];
    for g in api.get("/apis").await.body["groups"].as_array().unwrap() {
        gvs.push(format!(
            "/apis/{}",
            g["preferredVersion"]["groupVersion"].as_str().unwrap()
        ));
    }
    for gv in gvs {
        for r in api.get(&gv).await.body["resources"].as_array().unwrap() {
            let plural = r["name"].as_str().unwrap();
            if plural.contains('/') {
                continue;
            }
            let path = if r["namespaced"] == true {
                format!("{gv}/namespaces/default/{plural}")
            } else {
                format!("{gv}/{plural}")
            };
            collections.push(path);
        }
    }
    assert!(collections.len() >= 14, "{collections:?}");
    let merge = "application/merge-patch+json";
    for coll in &collections {
        let obj = fixture(coll).to_string();
        let item = format!("{coll}/fx");
        // Dry-run create answers 201 and stores nothing.
        let before = api.world().await;
        let r = api
            .send(
                "POST",
                &format!("{coll}?dryRun=All"),
                "application/json",
                obj.as_bytes(),
            )
            .await;
        assert_eq!(r.code, 201, "{coll}: {}", r.body);
        assert!(
            api.world().await == before,
            "dry-run create of {coll} wrote"
        );
        api.refused(
            422,
            "POST",
            &format!("{coll}?dryRun=true"),
            "application/json",
            obj.as_bytes(),
        )
        .await;
        // Now for real, then every refused and dry-run verb on the object.
        let r = api
            .send("POST", coll, "application/json", obj.as_bytes())
            .await;
        assert_eq!(r.code, 201, "{coll}: {}", r.body);
        if coll.ends_with("/namespaces") {
            // A new namespace gets its `default` ServiceAccount and `kube-root-ca.crt` from
            // the controllers, after the create answered: let them finish first.
            api.settle().await;
        }
        let current = api.get(&item).await.body.to_string();
        api.refused(
            422,
            "PUT",
            &format!("{item}?dryRun=true"),
            "application/json",
            current.as_bytes(),
        )
        .await;
        api.refused(
            422,
            "PATCH",
            &format!("{item}?dryRun=true"),
            merge,
            br#"{"metadata":{"labels":{"x":"y"}}}"#,
        )
        .await;
        api.refused(
            422,
            "DELETE",
            &format!("{item}?dryRun=true"),
            "application/json",
            b"",
        )
        .await;
        api.refused(
            400,
            "DELETE",
            &item,
            "application/json",
            br#"{"preconditions":{"uid":123}}"#,
        )
        .await;
        api.refused(400, "DELETE", &format!("{coll}/"), "application/json", b"")
            .await;
        api.refused(400, "PATCH", &format!("{coll}/"), merge, b"{}")
            .await;
        let before = api.world().await;
        for (method, path, ct, body) in [
            (
                "PUT",
                format!("{item}?dryRun=All"),
                "application/json",
                current.as_bytes(),
            ),
            (
                "PATCH",
                format!("{item}?dryRun=All"),
                merge,
                br#"{"metadata":{"labels":{"x":"y"}}}"#.as_slice(),
            ),
            (
                "DELETE",
                format!("{item}?dryRun=All"),
                "application/json",
                b"".as_slice(),
            ),
        ] {
            let r = api.send(method, &path, ct, body).await;
            assert!(r.code < 300, "{method} {path}: {}", r.body);
        }
        if !coll.ends_with("/namespaces") {
            let r = api
                .send(
                    "DELETE",
                    &format!("{coll}?dryRun=All"),
                    "application/json",
                    b"",
                )
                .await;
            assert_eq!(r.code, 200, "{coll}: {}", r.body);
        }
        assert!(
            api.world().await == before,
            "a dryRun=All request on {coll} wrote"
        );
        // Core and events.k8s.io Events are one stored object, as upstream: the next API
        // would find this one.
        if coll.ends_with("/events") {
            let r = api.send("DELETE", &item, "application/json", b"").await;
            assert_eq!(r.code, 200, "{item}: {}", r.body);
        }
    }
}

//! Requests as users and scripts really send them, which must never delete or write what was
//! not asked for: collection deletes where upstream has none, empty names, `dryRun` values
//! other than `All`, malformed DeleteOptions, bodies that blank or mistype fields, immutable
//! ConfigMaps, objects over the size limits. Every refused request is checked against a
//! snapshot of the whole store: its revision and every object are as before.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;

use http_body_util::BodyExt;
use serde_json::{Value, json};

/// A raw request through kube-rs's client (real TLS, the written kubeconfig).
struct Raw {
    client: kube::Client,
}

struct Reply {
    code: u16,
    body: Value,
}

impl Raw {
    async fn send(&self, method: &str, path: &str, content_type: &str, body: &[u8]) -> Reply {
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", content_type)
            .header("accept", "application/json")
            .body(kube::client::Body::from(body.to_vec()))
            .unwrap();
        let resp = self.client.send(req).await.unwrap();
        let code = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let body = serde_json::from_slice(&bytes)
            .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        Reply { code, body }
    }

    async fn json(&self, method: &str, path: &str, body: &Value) -> Reply {
        self.send(
            method,
            path,
            "application/json",
            body.to_string().as_bytes(),
        )
        .await
    }

    async fn get(&self, path: &str) -> Reply {
        self.send("GET", path, "application/json", b"").await
    }

    /// Every served list, by discovery: the store's revision and every object in it.
    async fn world(&self) -> (String, BTreeMap<String, Value>) {
        let mut paths = vec!["/api/v1".to_string()];
        let groups = self.get("/apis").await.body;
        for g in groups["groups"].as_array().unwrap() {
            paths.push(format!(
                "/apis/{}",
                g["preferredVersion"]["groupVersion"].as_str().unwrap()
            ));
        }
        let mut objects = BTreeMap::new();
        let mut revision = String::new();
        for gv in paths {
            let list = self.get(&gv).await.body;
            for r in list["resources"].as_array().unwrap() {
                let name = r["name"].as_str().unwrap();
                if name.contains('/') {
                    continue;
                }
                let l = self.get(&format!("{gv}/{name}")).await;
                assert_eq!(l.code, 200, "{gv}/{name}: {}", l.body);
                let rv = l.body["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap()
                    .to_string();
                revision = revision.max(rv);
                for item in l.body["items"].as_array().unwrap() {
                    let key = format!(
                        "{gv}/{name}/{}/{}",
                        item["metadata"]["namespace"].as_str().unwrap_or(""),
                        item["metadata"]["name"].as_str().unwrap()
                    );
                    objects.insert(key, item.clone());
                }
            }
        }
        (revision, objects)
    }

    /// Waits until background work (the namespace and garbage collectors) has stopped
    /// changing the store.
    async fn settle(&self) {
        let mut last = self.world().await;
        for _ in 0..50 {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            let now = self.world().await;
            if now == last {
                return;
            }
            last = now;
        }
        panic!("the store kept changing");
    }

    /// Sends a request that must be refused with `code`, and checks that it changed nothing.
    async fn refused(&self, code: u16, method: &str, path: &str, ct: &str, body: &[u8]) -> Value {
        let before = self.world().await;
        let r = self.send(method, path, ct, body).await;
        let shown: String = r.body.to_string().chars().take(400).collect();
        assert_eq!(r.code, code, "{method} {path}: {shown}");
        assert_eq!(r.body["kind"], "Status", "{method} {path}: {shown}");
        let after = self.world().await;
        assert_eq!(
            before.0, after.0,
            "{method} {path} moved the store's revision"
        );
        assert!(
            before.1 == after.1,
            "{method} {path} changed stored objects"
        );
        r.body
    }
}

async fn raw(ts: &common::TestServer) -> Raw {
    Raw {
        client: ts.client().await,
    }
}

const NS: &str = "/api/v1/namespaces";

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

    // A collection delete that can go, goes whole.
    let cms = "/api/v1/namespaces/team-a/configmaps";
    for i in 0..3 {
        let r = api
            .json("POST", cms, &json!({"metadata": {"name": format!("c{i}")}}))
            .await;
        assert_eq!(r.code, 201);
    }
    let r = api.send("DELETE", cms, "application/json", b"").await;
    assert_eq!(r.code, 200, "{}", r.body);
    assert_eq!(r.body["items"].as_array().unwrap().len(), 3);
    assert_eq!(api.get(cms).await.body["items"], json!([]));
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

/// A minimal valid object of every served resource, by its collection path.
fn fixture(collection: &str) -> Value {
    let pod_spec = json!({"containers": [{"name": "c", "image": "i"}]});
    let template = json!({"metadata": {"labels": {"a": "b"}}, "spec": pod_spec});
    let selector = json!({"matchLabels": {"a": "b"}});
    let name = json!({"name": "fx"});
    let plural = collection.rsplit('/').next().unwrap();
    let group = collection.split('/').nth(2).unwrap_or("");
    match (group, plural) {
        ("v1", "namespaces" | "nodes" | "configmaps" | "serviceaccounts") => {
            json!({"metadata": name})
        }
        ("v1", "pods") => json!({"metadata": name, "spec": pod_spec}),
        ("v1", "services") => json!({"metadata": name, "spec": {"ports": [{"port": 80}]}}),
        ("v1", "endpoints") => {
            json!({"metadata": name, "subsets": [{"addresses": [{"ip": "10.244.9.9"}], "ports": [{"port": 80}]}]})
        }
        ("v1", "events") => {
            json!({"metadata": name, "involvedObject": {"kind": "Pod", "name": "p"}, "reason": "R", "message": "m"})
        }
        ("discovery.k8s.io", "endpointslices") => {
            json!({"metadata": name, "addressType": "IPv4", "endpoints": [{"addresses": ["10.244.9.9"]}]})
        }
        ("apps", "deployments" | "replicasets") => {
            json!({"metadata": name, "spec": {"selector": selector, "template": template}})
        }
        ("apps", "statefulsets") => {
            json!({"metadata": name, "spec": {"serviceName": "s", "selector": selector, "template": template}})
        }
        ("events.k8s.io", "events") => {
            json!({"metadata": name, "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "x/y", "reportingInstance": "i", "action": "A", "reason": "R", "type": "Normal", "regarding": {"kind": "Pod", "name": "p"}})
        }
        ("coordination.k8s.io", "leases") => {
            json!({"metadata": name, "spec": {"holderIdentity": "me"}})
        }
        ("apps", "controllerrevisions") => {
            json!({"metadata": name, "revision": 1, "data": {"spec": {"template": template}}})
        }
        _ => panic!("no fixture for {collection}: add one for the new resource"),
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
    }
}

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
    let data = |r: &Reply| -> Vec<(String, String)> {
        r.body["items"]
            .as_array()
            .unwrap()
            .iter()
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

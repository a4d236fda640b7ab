//! Every served OpenAPI v3 document is valid OpenAPI 3.0 for schema-driven tools: it reads as
//! an `openapiv3::OpenAPI`, every `$ref` resolves, every path template's parameters are
//! declared (and only those), operation ids are unique, and the operations say what
//! kube-apiserver's say: lists take their query parameters and return the `…List` kind,
//! writes take `dryRun`/`fieldManager`/`fieldValidation`, PATCH bodies are patches, DELETE
//! bodies `DeleteOptions`. Every served resource and subresource is described, and every
//! served kind has exactly one full schema tagged with its group-version-kind (for
//! `kubectl explain`).
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};

use openapiv3::{OpenAPI, Operation, Parameter, PathItem, ReferenceOr};
use serde_json::Value;

use common::raw::{Raw, raw};

/// Every group-version's document, fetched as kubectl does: the index, then each URL.
async fn documents(raw: &Raw) -> BTreeMap<String, Value> {
    let index = raw.get("/openapi/v3").await;
    assert_eq!(index.code, 200);
    let mut docs = BTreeMap::new();
    for (gv, entry) in index.body["paths"].as_object().unwrap() {
        let url = entry["serverRelativeURL"].as_str().unwrap();
        assert!(url.starts_with(&format!("/openapi/v3/{gv}?hash=")), "{url}");
        let doc = raw.get(url).await;
        assert_eq!(doc.code, 200, "{url}");
        docs.insert(gv.clone(), doc.body);
    }
    docs
}

/// Every `$ref` in `v`, recursively.
fn refs<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    match v {
        Value::Object(o) => {
            if let Some(Value::String(r)) = o.get("$ref") {
                out.push(r);
            }
            o.values().for_each(|v| refs(v, out));
        }
        Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
        _ => {}
    }
}

fn item<T>(r: &ReferenceOr<T>) -> &T {
    match r {
        ReferenceOr::Item(t) => t,
        ReferenceOr::Reference { reference } => panic!("unexpected reference {reference}"),
    }
}

/// The `{name}`s of a path template.
fn template_params(path: &str) -> BTreeSet<String> {
    path.split('{')
        .skip(1)
        .map(|s| s.split_once('}').unwrap().0.to_string())
        .collect()
}

/// The parameters an operation takes: the path item's, overridden by the operation's.
fn params<'a>(path_item: &'a PathItem, op: &'a Operation) -> Vec<&'a Parameter> {
    let mut all: Vec<&Parameter> = path_item.parameters.iter().map(item).collect();
    for p in op.parameters.iter().map(item) {
        let d = p.parameter_data_ref();
        all.retain(|q| {
            let e = q.parameter_data_ref();
            !(e.name == d.name && std::mem::discriminant(*q) == std::mem::discriminant(p))
        });
        all.push(p);
    }
    all
}

fn query_names(ps: &[&Parameter]) -> BTreeSet<String> {
    ps.iter()
        .filter(|p| matches!(p, Parameter::Query { .. }))
        .map(|p| p.parameter_data_ref().name.clone())
        .collect()
}

/// The schema a JSON body or response references, by component name.
fn content_ref(content: &Value, media: &str) -> String {
    content[media]["schema"]["$ref"]
        .as_str()
        .unwrap_or_else(|| panic!("no {media} schema in {content}"))
        .trim_start_matches("#/components/schemas/")
        .to_string()
}

const LIST_PARAMS: [&str; 10] = [
    "allowWatchBookmarks",
    "continue",
    "fieldSelector",
    "labelSelector",
    "limit",
    "resourceVersion",
    "resourceVersionMatch",
    "sendInitialEvents",
    "timeoutSeconds",
    "watch",
];
const WRITE_PARAMS: [&str; 3] = ["dryRun", "fieldManager", "fieldValidation"];

/// Checks one document; returns how many operations it has.
fn check(gv: &str, raw_doc: &Value) -> usize {
    let doc: OpenAPI = serde_json::from_value(raw_doc.clone())
        .unwrap_or_else(|e| panic!("{gv}: not an OpenAPI 3 document: {e}"));
    assert!(doc.openapi.starts_with("3.0."), "{gv}: {}", doc.openapi);
    // Every reference resolves inside the document.
    let mut all = Vec::new();
    refs(raw_doc, &mut all);
    assert!(!all.is_empty());
    for r in all {
        let pointer = r
            .strip_prefix('#')
            .unwrap_or_else(|| panic!("{gv}: remote {r}"));
        assert!(raw_doc.pointer(pointer).is_some(), "{gv}: dangling {r}");
    }
    let schemas = raw_doc["components"]["schemas"].as_object().unwrap();
    let mut ids = BTreeSet::new();
    let mut operations = 0;
    for (path, path_item) in doc.paths.iter() {
        let path_item = item(path_item);
        let raw_item = &raw_doc["paths"][path];
        let wanted = template_params(path);
        for (method, op) in path_item.iter() {
            operations += 1;
            let what = format!("{gv}: {method} {path}");
            let id = op
                .operation_id
                .clone()
                .unwrap_or_else(|| panic!("{what}: no id"));
            assert!(ids.insert(id.clone()), "{what}: operation id {id} twice");
            assert!(!op.responses.responses.is_empty(), "{what}: no responses");
            let ps = params(path_item, op);
            // Path parameters: exactly the template's, each required.
            let declared: BTreeSet<String> = ps
                .iter()
                .filter(|p| matches!(p, Parameter::Path { .. }))
                .map(|p| {
                    assert!(
                        p.parameter_data_ref().required,
                        "{what}: optional path parameter"
                    );
                    p.parameter_data_ref().name.clone()
                })
                .collect();
            assert_eq!(declared, wanted, "{what}: path parameters");
            // No parameter twice.
            let mut seen = BTreeSet::new();
            for p in op.parameters.iter().map(item) {
                let key = (
                    p.parameter_data_ref().name.clone(),
                    format!("{:?}", std::mem::discriminant(p)),
                );
                assert!(seen.insert(key), "{what}: a parameter twice");
            }
            let raw_op = &raw_item[method];
            let action = raw_op["x-kubernetes-action"].as_str().unwrap_or("");
            let queries = query_names(&ps);
            let has = |names: &[&str]| names.iter().all(|n| queries.contains(*n));
            match action {
                "list" => {
                    assert!(has(&LIST_PARAMS), "{what}: list parameters {queries:?}");
                    let list =
                        content_ref(&raw_op["responses"]["200"]["content"], "application/json");
                    assert!(list.ends_with("List"), "{what}: returns {list}");
                    let items = &schemas[&list]["properties"]["items"];
                    assert_eq!(items["type"], "array", "{what}");
                    let kind = raw_op["x-kubernetes-group-version-kind"]["kind"]
                        .as_str()
                        .unwrap();
                    let item_schema = items["items"]["$ref"].as_str().unwrap();
                    let tagged = &schemas[item_schema.trim_start_matches("#/components/schemas/")];
                    assert_eq!(
                        tagged["x-kubernetes-group-version-kind"][0]["kind"], kind,
                        "{what}"
                    );
                }
                "post" | "put" => {
                    assert!(has(&WRITE_PARAMS), "{what}: write parameters {queries:?}");
                    let body = &raw_op["requestBody"];
                    assert_eq!(body["required"], true, "{what}");
                    content_ref(&body["content"], "application/json");
                }
                "patch" => {
                    assert!(
                        has(&WRITE_PARAMS) && queries.contains("force"),
                        "{what}: {queries:?}"
                    );
                    let content = raw_op["requestBody"]["content"].as_object().unwrap();
                    let types: BTreeSet<&str> = content.keys().map(String::as_str).collect();
                    for t in [
                        "application/apply-patch+yaml",
                        "application/json-patch+json",
                        "application/merge-patch+json",
                    ] {
                        assert!(types.contains(t), "{what}: {types:?}");
                        assert_eq!(
                            content_ref(&raw_op["requestBody"]["content"], t),
                            "io.k8s.apimachinery.pkg.apis.meta.v1.Patch",
                            "{what}"
                        );
                    }
                }
                "delete" | "deletecollection" => {
                    assert!(
                        has(&["dryRun", "gracePeriodSeconds", "propagationPolicy"]),
                        "{what}: {queries:?}"
                    );
                    assert_eq!(
                        content_ref(&raw_op["requestBody"]["content"], "application/json"),
                        "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions",
                        "{what}"
                    );
                    if action == "deletecollection" {
                        assert!(has(&["labelSelector", "fieldSelector"]), "{what}");
                    }
                }
                "watch" | "watchlist" => {
                    let mut wanted = LIST_PARAMS.to_vec();
                    wanted.retain(|p| *p != "watch");
                    assert!(has(&wanted), "{what}: watch parameters {queries:?}");
                    assert!(path.contains("/watch/"), "{what}");
                    assert_eq!(
                        content_ref(&raw_op["responses"]["200"]["content"], "application/json"),
                        "io.k8s.apimachinery.pkg.apis.meta.v1.WatchEvent",
                        "{what}"
                    );
                }
                "connect" => {
                    let kind = raw_op["x-kubernetes-group-version-kind"]["kind"]
                        .as_str()
                        .unwrap();
                    assert!(
                        kind.starts_with("Pod") && kind.ends_with("Options"),
                        "{what}"
                    );
                    assert!(
                        raw_op["responses"]["200"]["content"]["*/*"].is_object(),
                        "{what}"
                    );
                }
                "get" => {}
                other => panic!("{what}: x-kubernetes-action {other:?}"),
            }
        }
    }
    operations
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_documents_are_valid_and_describe_every_served_path() {
    let ts = common::TestServer::start().await;
    let raw = raw(&ts).await;
    let docs = documents(&raw).await;
    // SVCNET_OPENAPI_DUMP=DIR writes them out, for validators outside Rust
    // (`openapi-spec-validator DIR/*.json`).
    if let Some(dir) = std::env::var_os("SVCNET_OPENAPI_DUMP") {
        for (gv, doc) in &docs {
            let file = std::path::Path::new(&dir).join(format!("{}.json", gv.replace('/', "_")));
            std::fs::write(file, doc.to_string()).unwrap();
        }
    }
    let mut total = 0;
    for (gv, doc) in &docs {
        total += check(gv, doc);
        // Every resource and subresource discovery lists is described, with its verbs.
        let list = raw.get(&format!("/{gv}")).await.body;
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        let paths = doc["paths"].as_object().unwrap();
        for r in list["resources"].as_array().unwrap() {
            let name = r["name"].as_str().unwrap();
            let namespaced = r["namespaced"].as_bool().unwrap();
            let base = if namespaced {
                format!("/{gv}/namespaces/{{namespace}}/")
            } else {
                format!("/{gv}/")
            };
            let verbs: Vec<&str> = r["verbs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            match name.split_once('/') {
                None => {
                    let collection = &paths[&format!("{base}{name}")];
                    let named = &paths[&format!("{base}{name}/{{name}}")];
                    assert!(
                        collection["get"].is_object() && named["get"].is_object(),
                        "{gv} {name}"
                    );
                    assert_eq!(
                        collection["post"].is_object(),
                        verbs.contains(&"create"),
                        "{gv} {name}"
                    );
                    assert_eq!(
                        collection["delete"].is_object(),
                        verbs.contains(&"deletecollection"),
                        "{gv} {name}"
                    );
                    for m in ["put", "patch", "delete"] {
                        assert!(named[m].is_object(), "{gv} {name} {m}");
                    }
                    // The deprecated watch paths upstream still lists.
                    let watch = base.replacen(&format!("/{gv}/"), &format!("/{gv}/watch/"), 1);
                    for path in [format!("{watch}{name}"), format!("{watch}{name}/{{name}}")] {
                        assert!(paths[&path]["get"].is_object(), "{path}");
                    }
                    if namespaced {
                        assert!(paths[&format!("/{gv}/watch/{name}")]["get"].is_object());
                    }
                    // The kind's one full schema, tagged for kubectl explain.
                    let kind = r["kind"].as_str().unwrap();
                    let tagged: Vec<&Value> = schemas
                        .values()
                        .filter(|s| {
                            s["x-kubernetes-group-version-kind"]
                                .as_array()
                                .is_some_and(|a| a.iter().any(|k| k["kind"] == kind))
                        })
                        .collect();
                    assert_eq!(tagged.len(), 1, "{gv} {kind}");
                    assert!(tagged[0]["properties"]["metadata"].is_object(), "{kind}");
                    assert!(
                        tagged[0]
                            .get("x-kubernetes-preserve-unknown-fields")
                            .is_none(),
                        "{kind}"
                    );
                }
                Some((plural, sub @ ("exec" | "attach" | "portforward"))) => {
                    // Streams (WebSocket or SPDY upgrades): upstream's connect operations,
                    // `connectCoreV1GetNamespacedPodExec` and its POST twin.
                    let p = &paths[&format!("{base}{plural}/{{name}}/{sub}")];
                    for (m, verb) in [("get", "Get"), ("post", "Post")] {
                        assert_eq!(p[m]["x-kubernetes-action"], "connect", "{gv} {name} {m}");
                        let id = p[m]["operationId"].as_str().unwrap();
                        assert!(
                            id.starts_with(&format!("connectCoreV1{verb}NamespacedPod")),
                            "{id}"
                        );
                    }
                }
                Some((plural, sub)) => {
                    let p = &paths[&format!("{base}{plural}/{{name}}/{sub}")];
                    for v in verbs {
                        let m = match v {
                            "get" => "get",
                            "update" => "put",
                            "patch" => "patch",
                            other => panic!("{gv} {name}: verb {other}"),
                        };
                        assert!(p[m].is_object(), "{gv} {name} {m}");
                    }
                }
            }
        }
    }
    eprintln!("{} documents, {total} operations, all valid", docs.len());
    assert!(docs.contains_key("api/v1") && docs.contains_key("apis/apps/v1"));
    // The deprecated watch paths the documents list are served: a bounded watch of a
    // collection and of one object ends with 200.
    for path in [
        "/api/v1/watch/namespaces/default/services?timeoutSeconds=1",
        "/api/v1/watch/namespaces/default/services/kubernetes?timeoutSeconds=1",
        "/api/v1/watch/services?timeoutSeconds=1",
        "/apis/apps/v1/watch/namespaces/default/deployments?timeoutSeconds=1",
    ] {
        let reply = raw.get(path).await;
        assert_eq!(reply.code, 200, "{path}: {}", reply.body);
    }
    ts.stop().await;
}

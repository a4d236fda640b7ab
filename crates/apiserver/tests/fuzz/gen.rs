//! Request generation for the fuzz run: operations read from the served OpenAPI documents,
//! and for each one a request with generated path, query and body, valid or mutated along the
//! kind's schema.

use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use serde_json::{Map, Value, json};

use super::common::raw::Raw;

/// One operation of a document.
pub struct Operation {
    /// The document it comes from (`api/v1`).
    pub doc: String,
    pub method: String,
    /// The path template (`/api/v1/namespaces/{namespace}/pods/{name}`).
    pub path: String,
    pub action: String,
    /// Query parameters: name and schema type.
    pub query: Vec<(String, String)>,
    /// The body's media types and schema name, when it takes one.
    pub body: Option<(Vec<String>, String)>,
}

/// A request to send.
pub struct Generated {
    pub method: String,
    pub uri: String,
    pub content_type: String,
    pub body: Vec<u8>,
    /// `dryRun=All` and nothing else was asked: the request must never write.
    pub dry_run_all: bool,
}

pub async fn documents(raw: &Raw) -> Map<String, Value> {
    let index = raw.get("/openapi/v3").await.body;
    let mut docs = Map::new();
    for (gv, entry) in index["paths"].as_object().unwrap() {
        let doc = raw
            .get(entry["serverRelativeURL"].as_str().unwrap())
            .await
            .body;
        docs.insert(gv.clone(), doc);
    }
    docs
}

fn ref_name(schema: &Value) -> Option<&str> {
    schema["$ref"]
        .as_str()
        .map(|r| r.trim_start_matches("#/components/schemas/"))
}

pub fn operations(docs: &Map<String, Value>) -> Vec<Operation> {
    let mut out = Vec::new();
    for (gv, doc) in docs {
        for (path, item) in doc["paths"].as_object().unwrap() {
            for method in ["get", "put", "post", "delete", "patch"] {
                let Some(op) = item.get(method) else { continue };
                let query = op["parameters"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|p| p["in"] == "query")
                    .map(|p| {
                        (
                            p["name"].as_str().unwrap().to_string(),
                            p["schema"]["type"].as_str().unwrap_or("string").to_string(),
                        )
                    })
                    .collect();
                let body = op["requestBody"]["content"].as_object().map(|c| {
                    let types: Vec<String> = c.keys().cloned().collect();
                    let schema = c
                        .values()
                        .find_map(|m| ref_name(&m["schema"]))
                        .unwrap_or("")
                        .to_string();
                    (types, schema)
                });
                out.push(Operation {
                    doc: gv.clone(),
                    method: method.to_uppercase(),
                    path: path.clone(),
                    action: op["x-kubernetes-action"].as_str().unwrap_or("").into(),
                    query,
                    body,
                });
            }
        }
    }
    out
}

/// Follows `$ref` and a single `allOf` to the schema an object is checked against.
fn resolve<'a>(doc: &'a Value, mut schema: &'a Value) -> &'a Value {
    for _ in 0..8 {
        if let Some(name) = ref_name(schema) {
            schema = &doc["components"]["schemas"][name];
        } else if let Some(first) = schema["allOf"].as_array().and_then(|a| a.first()) {
            schema = first;
        } else {
            break;
        }
    }
    schema
}

fn pick<'a, T>(rng: &mut StdRng, items: &'a [T]) -> &'a T {
    items.choose(rng).unwrap()
}

/// A value of any JSON type, for a field that expects another.
fn wrong(rng: &mut StdRng) -> Value {
    pick(
        rng,
        &[
            json!(null),
            json!(-1),
            json!(1.5),
            json!(true),
            json!("x"),
            json!([]),
            json!({}),
            json!([1, "a"]),
            json!({"a": {"b": []}}),
            json!("9".repeat(40)),
        ],
    )
    .clone()
}

/// A value of `schema` (depth-bounded), from values that are valid for the type and often at
/// its edges.
fn instance(doc: &Value, schema: &Value, depth: u32, rng: &mut StdRng) -> Value {
    let schema = resolve(doc, schema);
    if depth == 0 || rng.random_ratio(1, 12) {
        return wrong(rng);
    }
    match schema["type"].as_str() {
        Some("string") => pick(
            rng,
            &[
                json!(""),
                json!("a"),
                json!("Ab-c.d_e"),
                json!("10.244.1.7"),
                json!("fd00::7"),
                json!("2026-01-01T00:00:00Z"),
                json!("TCP"),
                json!("ClusterIP"),
                json!("x".repeat(300)),
                json!("\u{0}\u{7f}é\n"),
            ],
        )
        .clone(),
        Some("integer") => pick(
            rng,
            &[
                json!(0),
                json!(1),
                json!(-1),
                json!(80),
                json!(65536),
                json!(2147483648i64),
                json!(i64::MAX),
            ],
        )
        .clone(),
        Some("number") => json!(rng.random_range(-1.0..1e6)),
        Some("boolean") => json!(rng.random_bool(0.5)),
        Some("array") => {
            let n = rng.random_range(0..3);
            Value::Array(
                (0..n)
                    .map(|_| instance(doc, &schema["items"], depth - 1, rng))
                    .collect(),
            )
        }
        _ => {
            let mut o = Map::new();
            if let Some(props) = schema["properties"].as_object() {
                let keys: Vec<&String> = props.keys().collect();
                for _ in 0..rng.random_range(0..4) {
                    let k = *pick(rng, &keys);
                    o.insert(k.clone(), instance(doc, &props[k], depth - 1, rng));
                }
            } else if schema["additionalProperties"].is_object() {
                o.insert(
                    "k".into(),
                    instance(doc, &schema["additionalProperties"], depth - 1, rng),
                );
            } else if schema.get("x-kubernetes-int-or-string").is_some() {
                return pick(rng, &[json!(8080), json!("http"), json!("")]).clone();
            } else {
                return wrong(rng);
            }
            Value::Object(o)
        }
    }
}

/// A random field path of `schema` and the schema there.
fn field_path<'a>(doc: &'a Value, schema: &'a Value, rng: &mut StdRng) -> (Vec<String>, &'a Value) {
    let mut path = Vec::new();
    let mut s = resolve(doc, schema);
    for _ in 0..rng.random_range(1..6) {
        if s["type"] == "array" {
            path.push("0".into());
            s = resolve(doc, &s["items"]);
            continue;
        }
        let Some(props) = s["properties"].as_object() else {
            break;
        };
        let keys: Vec<&String> = props.keys().collect();
        let k = *pick(rng, &keys);
        // Owner references to objects that do not exist would have the garbage collector
        // delete the object later, on its own time, in the middle of another request's check.
        if path.len() == 1 && path[0] == "metadata" && k == "ownerReferences" {
            break;
        }
        path.push(k.clone());
        s = resolve(doc, &props[k]);
    }
    (path, s)
}

/// Sets `value` at `path` in `obj`, making the objects and arrays on the way.
fn set(obj: &mut Value, path: &[String], value: Value) {
    let Some((first, rest)) = path.split_first() else {
        *obj = value;
        return;
    };
    if let Ok(i) = first.parse::<usize>() {
        if !obj.is_array() {
            *obj = json!([]);
        }
        let a = obj.as_array_mut().unwrap();
        while a.len() <= i {
            a.push(json!({}));
        }
        set(&mut a[i], rest, value);
    } else {
        if !obj.is_object() {
            *obj = json!({});
        }
        let o = obj.as_object_mut().unwrap();
        set(o.entry(first.clone()).or_insert(Value::Null), rest, value);
    }
}

/// A body of `schema_name`: a valid object of the kind, then (mostly) mutated.
fn object(op: &Operation, doc: &Value, schema_name: &str, name: &str, rng: &mut StdRng) -> Value {
    let collection = match op.path.find("/{name}") {
        Some(i) => op.path[..i].to_string(),
        None => op.path.clone(),
    };
    let mut obj = if schema_name.ends_with(".Scale") {
        json!({"apiVersion": "autoscaling/v1", "kind": "Scale", "spec": {"replicas": 2}})
    } else {
        let mut o = super::common::fixtures::fixture(&collection.replace("{namespace}", "fz-a"));
        let kind =
            doc["components"]["schemas"][schema_name]["x-kubernetes-group-version-kind"][0].clone();
        let gv = match kind["group"].as_str() {
            Some("") | None => kind["version"].as_str().unwrap_or("v1").to_string(),
            Some(g) => format!("{g}/{}", kind["version"].as_str().unwrap_or("v1")),
        };
        o["apiVersion"] = json!(gv);
        o["kind"] = kind["kind"].clone();
        o
    };
    obj["metadata"]["name"] = json!(name);
    let schema = json!({"$ref": format!("#/components/schemas/{schema_name}")});
    for _ in 0..rng.random_range(0..4) {
        match rng.random_range(0..6) {
            0..=2 => {
                let (path, s) = field_path(doc, &schema, rng);
                let v = instance(doc, s, 3, rng);
                set(&mut obj, &path, v);
            }
            3 => {
                let (path, _) = field_path(doc, &schema, rng);
                let v = wrong(rng);
                set(&mut obj, &path, v);
            }
            4 => {
                if let Some(o) = obj.as_object_mut() {
                    let keys: Vec<String> = o.keys().cloned().collect();
                    o.remove(pick(rng, &keys));
                }
            }
            _ => obj["unknownField"] = json!({"x": 1}),
        }
    }
    obj
}

fn query_value(name: &str, ty: &str, rng: &mut StdRng) -> String {
    let choices: &[&str] = match name {
        "dryRun" => &["All", "All", "true", "", "None"],
        "fieldManager" => &["fuzz", "kubectl", "", "\u{1}x"],
        "fieldValidation" => &["Strict", "Warn", "Ignore", "strict", ""],
        "propagationPolicy" => &["Orphan", "Background", "Foreground", "Sideways", ""],
        "labelSelector" => &["a=b", "a in (b,c)", "!a", "a=", "a in (b", "==", "a=b,c!=d"],
        "fieldSelector" => &[
            "metadata.name=fx",
            "metadata.namespace!=x",
            "spec.x=y",
            "==",
            "metadata.name",
        ],
        "resourceVersion" => &["", "0", "1", "2", "999999", "abc", "-1"],
        "resourceVersionMatch" => &["Exact", "NotOlderThan", "exact", ""],
        "continue" => &["", "abc", "eyJ4Ijoi", "%00"],
        "container" => &["c", "nope", ""],
        "sinceTime" => &["2026-01-01T00:00:00Z", "yesterday"],
        _ => match ty {
            "boolean" => &["true", "false", "1", "yes", ""],
            "integer" => &["0", "1", "5", "-1", "99999999999999999999", "x"],
            _ => &["", "x", "All"],
        },
    };
    pick(rng, choices).to_string()
}

/// Percent-encodes a query value.
fn encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A request for `op`.
pub fn generate(op: &Operation, docs: &Map<String, Value>, rng: &mut StdRng) -> Generated {
    let doc = &docs[&op.doc];
    let (long_ns, long_name) = ("n".repeat(70), "x".repeat(300));
    let ns = *pick(
        rng,
        &[
            "fz-a", "fz-a", "fz-b", "default", "no-such", "UPPER", "a.b", "..", &long_ns,
        ],
    );
    let name = pick(
        rng,
        &[
            "fx",
            "fx",
            "fx",
            "fz-new",
            "fz-other",
            "kubernetes",
            "default",
            "Bad_Name",
            &long_name,
        ],
    )
    .to_string();
    let path = op.path.replace("{namespace}", ns).replace("{name}", &name);
    let mut query: Vec<(String, String)> = Vec::new();
    for (k, ty) in &op.query {
        if rng.random_ratio(1, 3) {
            query.push((k.clone(), query_value(k, ty, rng)));
        }
    }
    if rng.random_ratio(1, 20) {
        query.push(("unknownParam".into(), "1".into()));
    }
    // A watch (a list with `watch`, or a deprecated `/watch/` path) must end for the run to
    // go on.
    if op.action.starts_with("watch")
        || query
            .iter()
            .any(|(k, v)| k == "watch" && v != "false" && !v.is_empty())
    {
        query.retain(|(k, _)| k != "timeoutSeconds");
        query.push(("timeoutSeconds".into(), "1".into()));
    }
    let dry: Vec<&String> = query
        .iter()
        .filter(|(k, _)| k == "dryRun")
        .map(|(_, v)| v)
        .collect();
    let dry_run_all = !dry.is_empty() && dry.iter().all(|v| *v == "All");
    let mut uri = path;
    if !query.is_empty() {
        let q: Vec<String> = query
            .iter()
            .map(|(k, v)| format!("{k}={}", encode(v)))
            .collect();
        uri = format!("{uri}?{}", q.join("&"));
    }
    let (content_type, body) = match &op.body {
        None => ("application/json".to_string(), Vec::new()),
        Some((types, schema)) => body(op, doc, types, schema, &name, rng),
    };
    Generated {
        method: op.method.clone(),
        uri,
        content_type,
        body,
        dry_run_all,
    }
}

fn body(
    op: &Operation,
    doc: &Value,
    types: &[String],
    schema: &str,
    name: &str,
    rng: &mut StdRng,
) -> (String, Vec<u8>) {
    // Now and then, whatever the operation: no body, garbage, the wrong media type.
    match rng.random_range(0..20) {
        0 => return ("application/json".into(), Vec::new()),
        1 => return ("application/json".into(), b"{\"metadata\": {".to_vec()),
        2 => return ("application/json".into(), b"[1,2]".to_vec()),
        3 => return ("text/plain".into(), b"hello".to_vec()),
        4 => {
            return (
                "application/vnd.kubernetes.protobuf".into(),
                b"k8s\0\x0a\x03abc".to_vec(),
            );
        }
        _ => {}
    }
    if schema.ends_with(".DeleteOptions") {
        let v = pick(
            rng,
            &[
                json!({"propagationPolicy": "Background"}),
                json!({"gracePeriodSeconds": 0}),
                json!({"preconditions": {"uid": 123}}),
                json!({"preconditions": {"resourceVersion": "1"}}),
                json!({"gracePeriodSeconds": "soon"}),
                json!({"dryRun": ["All"]}),
                json!({"kind": "DeleteOptions", "apiVersion": "v1", "orphanDependents": true}),
            ],
        )
        .clone();
        return ("application/json".into(), v.to_string().into_bytes());
    }
    let ct = pick(rng, types).clone();
    if op.method != "PATCH" {
        let obj = object(op, doc, schema, name, rng);
        return (ct, obj.to_string().into_bytes());
    }
    // A patch, in one of its media types (and now and then strategic merge).
    let ct = if rng.random_ratio(1, 8) {
        "application/strategic-merge-patch+json".to_string()
    } else {
        ct
    };
    let kind_schema = resolve_kind_schema(op, doc);
    let v = match ct.as_str() {
        "application/json-patch+json" => {
            let ops: Vec<Value> = (0..rng.random_range(1..4))
                .map(|_| {
                    let (path, s) = field_path(doc, &kind_schema, rng);
                    let pointer = format!("/{}", path.join("/"));
                    let verb = *pick(rng, &["add", "replace", "remove", "test", "move", "copy", "bogus"]);
                    json!({"op": verb, "path": pointer, "from": "/metadata/labels", "value": instance(doc, s, 2, rng)})
                })
                .collect();
            Value::Array(ops)
        }
        "application/apply-patch+yaml" => {
            let schema_name = ref_name(&kind_schema).unwrap_or("").to_string();
            object(op, doc, &schema_name, name, rng)
        }
        _ => {
            let mut patch = json!({});
            for _ in 0..rng.random_range(1..3) {
                let (path, s) = field_path(doc, &kind_schema, rng);
                let v = if rng.random_ratio(1, 4) {
                    Value::Null
                } else {
                    instance(doc, s, 2, rng)
                };
                set(&mut patch, &path, v);
            }
            patch
        }
    };
    (ct, v.to_string().into_bytes())
}

/// The schema of the object a PATCH changes (its GET's response).
fn resolve_kind_schema(op: &Operation, doc: &Value) -> Value {
    doc["paths"][&op.path]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
        .clone()
}

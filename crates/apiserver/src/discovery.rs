//! Discovery documents (`/api`, `/apis`, group versions), `/version`, and the OpenAPI v3
//! documents kubectl reads to learn that the server validates fields itself and to explain
//! the served kinds' fields (`kubectl explain`).

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::LazyLock;

use schemars::JsonSchema;
use schemars::generate::{SchemaGenerator, SchemaSettings};
use serde_json::{Value, json};

use crate::registry::{self, RESOURCES, ResourceInfo};
use crate::status::ApiError;

/// The Kubernetes version the server speaks (kubectl's version dispatcher keys on it).
pub const GIT_VERSION: &str = "v1.33.0";

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": GIT_VERSION,
        "gitCommit": "svcnet",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "rust",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, if cfg!(target_arch = "x86_64") { "amd64" } else if cfg!(target_arch = "aarch64") { "arm64" } else { std::env::consts::ARCH }),
    })
}

pub fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn group_doc(group: &str) -> Value {
    let versions: Vec<Value> = registry::group_versions()
        .into_iter()
        .filter(|(g, _)| *g == group)
        .map(|(g, v)| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
        .collect();
    json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": versions,
        "preferredVersion": versions.first().cloned().unwrap_or(Value::Null),
    })
}

pub fn group_list() -> Value {
    let mut groups: Vec<&str> = Vec::new();
    for (g, _) in registry::group_versions() {
        if !g.is_empty() && !groups.contains(&g) {
            groups.push(g);
        }
    }
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|g| {
            let mut doc = group_doc(g);
            if let Some(m) = doc.as_object_mut() {
                m.remove("kind");
                m.remove("apiVersion");
            }
            doc
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

pub fn group(group: &str) -> Result<Value, ApiError> {
    if group.is_empty() || !RESOURCES.iter().any(|r| r.group == group) {
        return Err(ApiError::NoRoute);
    }
    Ok(group_doc(group))
}

fn resource_entries(r: &ResourceInfo) -> Vec<Value> {
    let mut main = json!({
        "name": r.plural,
        "singularName": r.singular,
        "namespaced": r.namespaced,
        "kind": r.kind,
        "verbs": r.verbs(),
    });
    if !r.short_names.is_empty() {
        main["shortNames"] = json!(r.short_names);
    }
    if !r.categories.is_empty() {
        main["categories"] = json!(r.categories);
    }
    let mut out = vec![main];
    for sub in r.subresources {
        let mut e = json!({
            "name": format!("{}/{sub}", r.plural),
            "singularName": "",
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": ["get", "patch", "update"],
        });
        if *sub == "log" {
            e["verbs"] = json!(["get"]);
        }
        if let Some(kind) = match *sub {
            "exec" => Some("PodExecOptions"),
            "portforward" => Some("PodPortForwardOptions"),
            "attach" => Some("PodAttachOptions"),
            _ => None,
        } {
            e["verbs"] = json!(["create", "get"]);
            e["kind"] = json!(kind);
        }
        if *sub == "scale" {
            e["kind"] = json!("Scale");
            e["group"] = json!("autoscaling");
            e["version"] = json!("v1");
        }
        out.push(e);
    }
    out
}

pub fn resource_list(group: &str, version: &str) -> Result<Value, ApiError> {
    let resources: Vec<Value> = RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .flat_map(resource_entries)
        .collect();
    if resources.is_empty() {
        return Err(ApiError::NoRoute);
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Ok(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// Every group-version's OpenAPI v3 document, built once, with a hash of its content (kubectl
/// caches a document by its URL, so the URL changes when the document does).
static OPENAPI: LazyLock<BTreeMap<String, (Value, String)>> = LazyLock::new(|| {
    registry::group_versions()
        .into_iter()
        .filter_map(|(g, v)| {
            let doc = build_openapi(g, v).ok()?;
            let mut h = std::collections::hash_map::DefaultHasher::new();
            doc.to_string().hash(&mut h);
            Some((gv_path(g, v), (doc, format!("{:016x}", h.finish()))))
        })
        .collect()
});

/// `/openapi/v3`: where each group-version's document is.
pub fn openapi_index() -> Value {
    let paths: serde_json::Map<String, Value> = OPENAPI
        .iter()
        .map(|(p, (_, hash))| {
            (
                p.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={hash}")}),
            )
        })
        .collect();
    json!({"paths": paths})
}

/// The OpenAPI v3 document of one group-version.
pub fn openapi_group_version(group: &str, version: &str) -> Result<Value, ApiError> {
    OPENAPI
        .get(&gv_path(group, version))
        .map(|(doc, _)| doc.clone())
        .ok_or(ApiError::NoRoute)
}

/// The field schemas of a group-version's served kinds, as OpenAPI v3 components: k8s-openapi's
/// schemas of its types (descriptions from the Kubernetes API, and every type they reference),
/// each served kind tagged with its group-version-kind, which is how `kubectl explain` finds
/// it. Returns the components and each kind's schema name.
fn kind_schemas(
    group: &str,
    version: &str,
) -> (
    serde_json::Map<String, Value>,
    HashMap<&'static str, String>,
) {
    use k8s_openapi::api::apps::v1 as apps;
    use k8s_openapi::api::coordination::v1 as coordination;
    use k8s_openapi::api::core::v1 as core;
    use k8s_openapi::api::discovery::v1 as discovery;
    use k8s_openapi::api::events::v1 as events;

    fn add<T: JsonSchema>(g: &mut SchemaGenerator) -> String {
        g.subschema_for::<T>();
        T::schema_name().into_owned()
    }
    let mut g = SchemaSettings::openapi3().into_generator();
    let mut names = HashMap::new();
    for r in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let name = match (r.group, r.version, r.kind) {
            ("", "v1", "Namespace") => add::<core::Namespace>(&mut g),
            ("", "v1", "Node") => add::<core::Node>(&mut g),
            ("", "v1", "Pod") => add::<core::Pod>(&mut g),
            ("", "v1", "Service") => add::<core::Service>(&mut g),
            ("", "v1", "Endpoints") => add::<core::Endpoints>(&mut g),
            ("", "v1", "Event") => add::<core::Event>(&mut g),
            ("", "v1", "ConfigMap") => add::<core::ConfigMap>(&mut g),
            ("", "v1", "ServiceAccount") => add::<core::ServiceAccount>(&mut g),
            ("discovery.k8s.io", "v1", "EndpointSlice") => add::<discovery::EndpointSlice>(&mut g),
            ("apps", "v1", "Deployment") => add::<apps::Deployment>(&mut g),
            ("apps", "v1", "StatefulSet") => add::<apps::StatefulSet>(&mut g),
            ("apps", "v1", "ReplicaSet") => add::<apps::ReplicaSet>(&mut g),
            ("apps", "v1", "ControllerRevision") => add::<apps::ControllerRevision>(&mut g),
            ("events.k8s.io", "v1", "Event") => add::<events::Event>(&mut g),
            ("coordination.k8s.io", "v1", "Lease") => add::<coordination::Lease>(&mut g),
            _ => continue,
        };
        names.insert(r.kind, name);
    }
    let mut schemas = g.take_definitions(true);
    for (kind, name) in &names {
        if let Some(Value::Object(o)) = schemas.get_mut(name) {
            o.insert(
                "x-kubernetes-group-version-kind".into(),
                json!([{"group": group, "version": version, "kind": kind}]),
            );
        }
    }
    (schemas, names)
}

fn query_param(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "query", "description": description, "schema": {"type": "string", "uniqueItems": true}})
}

/// Builds the OpenAPI v3 document of one group-version. It describes every object path and
/// its operations; each PATCH lists `fieldValidation` (and `dryRun`), which tells kubectl to
/// leave field validation to the server. Each kind's schema is its full field schema (for
/// `kubectl explain`); a kind without one would get an open schema
/// (`x-kubernetes-preserve-unknown-fields`), since the server, not the client, validates.
fn build_openapi(group: &str, version: &str) -> Result<Value, ApiError> {
    let resources: Vec<&ResourceInfo> = RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if resources.is_empty() {
        return Err(ApiError::NoRoute);
    }
    let mut paths = serde_json::Map::new();
    let (mut schemas, names) = kind_schemas(group, version);
    for r in resources {
        let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
        let base = if r.group.is_empty() {
            format!("/api/{}", r.version)
        } else {
            format!("/apis/{}/{}", r.group, r.version)
        };
        let collection = if r.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}", r.plural)
        } else {
            format!("{base}/{}", r.plural)
        };
        let schema_name = names.get(r.kind).cloned().unwrap_or_else(|| {
            format!(
                "io.svcnet.{}.{}.{}",
                if r.group.is_empty() { "core" } else { r.group },
                r.version,
                r.kind
            )
        });
        let schema_ref = json!({"$ref": format!("#/components/schemas/{schema_name}")});
        let body = |ct: &[&str]| {
            let content: serde_json::Map<String, Value> = ct
                .iter()
                .map(|c| (c.to_string(), json!({"schema": schema_ref})))
                .collect();
            json!({"content": content, "required": true})
        };
        let ok = json!({"200": {"description": "OK", "content": {"application/json": {"schema": schema_ref}}}});
        let write_params = json!([
            query_param(
                "dryRun",
                "When present, indicates that modifications should not be persisted."
            ),
            query_param(
                "fieldManager",
                "A name associated with the actor or entity that is making these changes."
            ),
            query_param(
                "fieldValidation",
                "Ignore, Warn or Strict: how the server treats unknown or duplicate fields."
            ),
        ]);
        let mut patch_params = write_params.clone();
        if let Some(a) = patch_params.as_array_mut() {
            a.push(query_param(
                "force",
                "Force is going to \"force\" Apply requests.",
            ));
        }
        let name_path = format!("{collection}/{{name}}");
        paths.insert(
            collection.clone(),
            json!({
                "get": {"operationId": format!("list{}", r.kind), "x-kubernetes-action": "list", "x-kubernetes-group-version-kind": gvk, "responses": ok},
                "post": {"operationId": format!("create{}", r.kind), "x-kubernetes-action": "post", "x-kubernetes-group-version-kind": gvk, "parameters": write_params, "requestBody": body(&["*/*"]), "responses": ok},
            }),
        );
        paths.insert(
            name_path.clone(),
            json!({
                "get": {"operationId": format!("read{}", r.kind), "x-kubernetes-action": "get", "x-kubernetes-group-version-kind": gvk, "responses": ok},
                "put": {"operationId": format!("replace{}", r.kind), "x-kubernetes-action": "put", "x-kubernetes-group-version-kind": gvk, "parameters": write_params, "requestBody": body(&["*/*"]), "responses": ok},
                "patch": {"operationId": format!("patch{}", r.kind), "x-kubernetes-action": "patch", "x-kubernetes-group-version-kind": gvk, "parameters": patch_params,
                          // Strategic merge patch is deliberately not listed: kubectl then computes
                          // its patches from its compiled-in types (with their merge keys) instead
                          // of from these open schemas, which have none.
                          "requestBody": body(&["application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml"]),
                          "responses": ok},
                "delete": {"operationId": format!("delete{}", r.kind), "x-kubernetes-action": "delete", "x-kubernetes-group-version-kind": gvk, "parameters": [query_param("dryRun", "When present, indicates that modifications should not be persisted.")], "responses": ok},
            }),
        );
        schemas.entry(schema_name).or_insert_with(|| {
            json!({
                "type": "object",
                "description": format!("{} ({}). Validated by the server.", r.kind, r.api_version()),
                "x-kubernetes-group-version-kind": [gvk],
                "x-kubernetes-preserve-unknown-fields": true,
            })
        });
    }
    Ok(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": GIT_VERSION},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}

/// The answer to a `SelfSubjectAccessReview` or `SelfSubjectRulesReview` (`kubectl auth
/// can-i`): svcnet's API server has one kind of client, the holder of a certificate its CA
/// signed, and lets it do everything, so every review is allowed and the rules are `*`.
pub fn self_review(body: &[u8], rules: bool) -> Result<Value, ApiError> {
    let kind = if rules {
        "SelfSubjectRulesReview"
    } else {
        "SelfSubjectAccessReview"
    };
    // kubectl sends reviews as protobuf; the answer does not depend on what was asked, so
    // such a body is answered without being decoded (the JSON reply carries no spec).
    let mut review: Value = if body.starts_with(b"k8s\0") {
        json!({})
    } else {
        serde_json::from_slice(body).map_err(|e| {
            ApiError::BadRequest(format!(
                "{kind} in version \"v1\" cannot be handled as a {kind}: {e}"
            ))
        })?
    };
    if !review.is_object() {
        return Err(ApiError::BadRequest(format!(
            "{kind} in version \"v1\" cannot be handled as a {kind}: not an object"
        )));
    }
    review["apiVersion"] = json!("authorization.k8s.io/v1");
    review["kind"] = json!(kind);
    review["status"] = if rules {
        json!({
            "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],
            "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
            "incomplete": false,
        })
    } else {
        json!({
            "allowed": true,
            "reason": "svcnet's API server lets every client with a certificate of its CA do everything",
        })
    };
    Ok(review)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

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

    #[test]
    fn openapi_documents_are_closed_and_tag_every_served_kind() {
        for (g, v) in registry::group_versions() {
            let doc = openapi_group_version(g, v).unwrap();
            let schemas = doc["components"]["schemas"].as_object().unwrap();
            // No reference dangles: every one names a component of the same document.
            let mut all = Vec::new();
            refs(&doc, &mut all);
            assert!(!all.is_empty());
            for r in all {
                let name = r.strip_prefix("#/components/schemas/").unwrap();
                assert!(schemas.contains_key(name), "{g}/{v}: dangling {r}");
            }
            // Every served kind has a full schema tagged with its group-version-kind.
            for r in RESOURCES.iter().filter(|r| r.group == g && r.version == v) {
                let tagged: Vec<&Value> = schemas
                    .values()
                    .filter(|s| {
                        s["x-kubernetes-group-version-kind"]
                            .as_array()
                            .is_some_and(|a| a.iter().any(|k| k["kind"] == r.kind))
                    })
                    .collect();
                assert_eq!(tagged.len(), 1, "{g}/{v} {}", r.kind);
                assert!(
                    tagged[0]["properties"]["metadata"].is_object(),
                    "{}",
                    r.kind
                );
                assert!(
                    tagged[0]
                        .get("x-kubernetes-preserve-unknown-fields")
                        .is_none()
                );
            }
            eprintln!(
                "{g}/{v}: {} schemas, {} bytes",
                schemas.len(),
                doc.to_string().len()
            );
        }
        let core = openapi_group_version("", "v1").unwrap();
        let spec =
            &core["components"]["schemas"]["io.k8s.api.core.v1.Service"]["properties"]["spec"];
        assert_eq!(
            spec["allOf"][0]["$ref"],
            "#/components/schemas/io.k8s.api.core.v1.ServiceSpec"
        );
        // The index points at each document by a URL that carries the document's hash.
        let index = openapi_index();
        let url = index["paths"]["api/v1"]["serverRelativeURL"]
            .as_str()
            .unwrap();
        assert!(url.starts_with("/openapi/v3/api/v1?hash="), "{url}");
        assert_eq!(
            url,
            format!("/openapi/v3/api/v1?hash={}", OPENAPI["api/v1"].1)
        );
    }
}

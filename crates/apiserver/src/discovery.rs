//! Discovery documents (`/api`, `/apis`, group versions), `/version`, and the OpenAPI v3
//! documents kubectl reads to learn that the server validates fields itself.

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

/// `/openapi/v3`: where each group-version's document is.
pub fn openapi_index() -> Value {
    let mut paths = serde_json::Map::new();
    for (g, v) in registry::group_versions() {
        let p = gv_path(g, v);
        paths.insert(
            p.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash=svcnet-{}", crate::discovery::GIT_VERSION)}),
        );
    }
    json!({"paths": paths})
}

fn query_param(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "query", "description": description, "schema": {"type": "string", "uniqueItems": true}})
}

/// The OpenAPI v3 document of one group-version. It describes every object path and its
/// operations; each PATCH lists `fieldValidation` (and `dryRun`), which tells kubectl to leave
/// field validation to the server. Schemas are open (`x-kubernetes-preserve-unknown-fields`)
/// because the server, not the client, validates.
pub fn openapi_group_version(group: &str, version: &str) -> Result<Value, ApiError> {
    let resources: Vec<&ResourceInfo> = RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if resources.is_empty() {
        return Err(ApiError::NoRoute);
    }
    let mut paths = serde_json::Map::new();
    let mut schemas = serde_json::Map::new();
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
        let schema_name = format!(
            "io.svcnet.{}.{}.{}",
            if r.group.is_empty() { "core" } else { r.group },
            r.version,
            r.kind
        );
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
        schemas.insert(
            schema_name,
            json!({
                "type": "object",
                "description": format!("{} ({}). Validated by the server.", r.kind, r.api_version()),
                "x-kubernetes-group-version-kind": [gvk],
                "x-kubernetes-preserve-unknown-fields": true,
            }),
        );
    }
    Ok(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": GIT_VERSION},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}

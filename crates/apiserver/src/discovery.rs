//! Discovery documents (`/api`, `/apis`, group versions) and `/version`. The OpenAPI v3
//! documents are in `openapi`; `kubectl auth can-i` is answered in `auth::reviews`.

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

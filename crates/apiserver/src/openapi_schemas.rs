//! The component schemas of a group-version's OpenAPI v3 document: k8s-openapi's schemas of
//! the served kinds (descriptions from the Kubernetes API, and every type they reference), a
//! `…List` schema per kind as upstream names them, and the shared request and response
//! bodies (`DeleteOptions`, `Status`, `Patch`, `autoscaling/v1` `Scale`).

use std::collections::HashMap;

use schemars::JsonSchema;
use schemars::generate::{SchemaGenerator, SchemaSettings};
use serde_json::{Map, Value, json};

use crate::registry::RESOURCES;

/// The schema names of the shared bodies.
pub(crate) const DELETE_OPTIONS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions";
pub(crate) const STATUS: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Status";
pub(crate) const PATCH: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.Patch";
pub(crate) const SCALE: &str = "io.k8s.api.autoscaling.v1.Scale";
const LIST_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta";

/// A reference to a component schema.
pub(crate) fn schema_ref(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

/// What one group-version's document holds: its component schemas and, per served kind, the
/// names of its schema and of its list's.
pub(crate) struct Components {
    pub schemas: Map<String, Value>,
    pub kinds: HashMap<&'static str, (String, String)>,
}

fn add<T: JsonSchema>(g: &mut SchemaGenerator) -> String {
    g.subschema_for::<T>();
    T::schema_name().into_owned()
}

/// The components of `group`/`version`: each served kind tagged with its group-version-kind
/// (how `kubectl explain` finds it), its list likewise, and the shared bodies.
pub(crate) fn components(group: &str, version: &str) -> Components {
    use k8s_openapi::api::apps::v1 as apps;
    use k8s_openapi::api::autoscaling::v1 as autoscaling;
    use k8s_openapi::api::coordination::v1 as coordination;
    use k8s_openapi::api::core::v1 as core;
    use k8s_openapi::api::discovery::v1 as discovery;
    use k8s_openapi::api::events::v1 as events;
    use k8s_openapi::api::networking::v1 as networking;
    use k8s_openapi::api::rbac::v1 as rbac;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;

    let mut g = SchemaSettings::openapi3().into_generator();
    let mut names = HashMap::new();
    let served: Vec<_> = RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    for r in &served {
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
            ("apps", "v1", "DaemonSet") => add::<apps::DaemonSet>(&mut g),
            ("apps", "v1", "ReplicaSet") => add::<apps::ReplicaSet>(&mut g),
            ("apps", "v1", "ControllerRevision") => add::<apps::ControllerRevision>(&mut g),
            ("events.k8s.io", "v1", "Event") => add::<events::Event>(&mut g),
            ("coordination.k8s.io", "v1", "Lease") => add::<coordination::Lease>(&mut g),
            ("networking.k8s.io", "v1", "NetworkPolicy") => {
                add::<networking::NetworkPolicy>(&mut g)
            }
            ("rbac.authorization.k8s.io", "v1", "Role") => add::<rbac::Role>(&mut g),
            ("rbac.authorization.k8s.io", "v1", "ClusterRole") => add::<rbac::ClusterRole>(&mut g),
            ("rbac.authorization.k8s.io", "v1", "RoleBinding") => add::<rbac::RoleBinding>(&mut g),
            ("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding") => {
                add::<rbac::ClusterRoleBinding>(&mut g)
            }
            // A kind without a compiled-in schema gets an open one (the server, not the
            // client, validates it).
            _ => format!(
                "io.svcnet.{}.{}.{}",
                if r.group.is_empty() { "core" } else { r.group },
                r.version,
                r.kind
            ),
        };
        names.insert(r.kind, name);
    }
    add::<meta::DeleteOptions>(&mut g);
    add::<meta::Status>(&mut g);
    add::<meta::Patch>(&mut g);
    add::<meta::ListMeta>(&mut g);
    if served.iter().any(|r| r.subresources.contains(&"scale")) {
        add::<autoscaling::Scale>(&mut g);
    }
    let mut schemas = g.take_definitions(true);
    let mut kinds = HashMap::new();
    for r in &served {
        let Some(name) = names.get(r.kind) else {
            continue;
        };
        let gvk = json!([{"group": group, "version": version, "kind": r.kind}]);
        match schemas.get_mut(name) {
            Some(Value::Object(o)) => {
                o.insert("x-kubernetes-group-version-kind".into(), gvk);
            }
            _ => {
                schemas.insert(
                    name.clone(),
                    json!({
                        "type": "object",
                        "description": format!("{} ({}). Validated by the server.", r.kind, r.api_version()),
                        "x-kubernetes-group-version-kind": gvk,
                        "x-kubernetes-preserve-unknown-fields": true,
                    }),
                );
            }
        }
        let list = format!("{name}List");
        schemas.insert(
            list.clone(),
            json!({
                "description": format!("{}List is a list of {}.", r.kind, r.kind),
                "type": "object",
                "required": ["items"],
                "properties": {
                    "apiVersion": {"type": "string", "description": "The versioned schema of this representation of an object."},
                    "kind": {"type": "string", "description": "The REST resource this object represents."},
                    "metadata": schema_ref(LIST_META),
                    "items": {"type": "array", "items": schema_ref(name), "description": format!("The {}.", r.plural)},
                },
                "x-kubernetes-group-version-kind": [{"group": group, "version": version, "kind": format!("{}List", r.kind)}],
            }),
        );
        kinds.insert(r.kind, (name.clone(), list));
    }
    Components { schemas, kinds }
}

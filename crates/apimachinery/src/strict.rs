//! Strict field validation (`?fieldValidation=Strict`, kubectl's default `--validate=strict`):
//! the fields of an object that its typed API struct does not have, reported as upstream's
//! strict decoder reports them (`unknown field "spec.ports[0].foo"`).
//!
//! How: decode the object into its `k8s-openapi` type, encode it again, and walk both trees;
//! a key present in the input but absent after the round trip is unknown. The typed structs
//! keep every field they know, including empty maps and lists, quantities, int-or-strings
//! and timestamps (as strings), so only unknown keys disappear. A `null` value disappears
//! either way, so for each `null` the key is probed with a non-null value of each JSON type.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use k8s_openapi::api::networking::v1 as networking;
use k8s_openapi::api::{apps::v1 as apps, core::v1 as core, discovery::v1 as discovery};
use k8s_openapi::api::{coordination::v1 as coordination, events::v1 as events};

/// Why an object could not be checked: it does not decode into its type at all (a wrong
/// type for a known field). Upstream answers 400 `... cannot be handled as a <Kind>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} in version \"{version}\" cannot be handled as a {kind}: {reason}")]
pub struct DecodeError {
    pub kind: String,
    pub version: String,
    pub reason: String,
}

/// The dotted paths of fields in `obj` that the `kind`'s type does not have, sorted (so the
/// answer does not depend on serde_json's map order). Kinds without a typed struct here, and objects that do not decode (see [`check`]),
/// give an empty list.
pub fn unknown_fields(kind: &str, obj: &Value) -> Vec<String> {
    check(kind, obj).unwrap_or_default()
}

/// Like [`unknown_fields`], but reports an object that does not decode into its type.
pub fn check(kind: &str, obj: &Value) -> Result<Vec<String>, DecodeError> {
    match kind {
        "Service" => check_as::<core::Service>(kind, obj),
        "Pod" => check_as::<core::Pod>(kind, obj),
        "Endpoints" => check_as::<core::Endpoints>(kind, obj),
        "Node" => check_as::<core::Node>(kind, obj),
        "Namespace" => check_as::<core::Namespace>(kind, obj),
        "Event" => check_as::<core::Event>(kind, obj),
        "ConfigMap" => check_as::<core::ConfigMap>(kind, obj),
        "Secret" => check_as::<core::Secret>(kind, obj),
        "EndpointSlice" => check_as::<discovery::EndpointSlice>(kind, obj),
        "Deployment" => check_as::<apps::Deployment>(kind, obj),
        "StatefulSet" => check_as::<apps::StatefulSet>(kind, obj),
        "DaemonSet" => check_as::<apps::DaemonSet>(kind, obj),
        "ReplicaSet" => check_as::<apps::ReplicaSet>(kind, obj),
        "ControllerRevision" => check_as::<apps::ControllerRevision>(kind, obj),
        "ServiceAccount" => check_as::<core::ServiceAccount>(kind, obj),
        "Lease" => check_as::<coordination::Lease>(kind, obj),
        "NetworkPolicy" => check_as::<networking::NetworkPolicy>(kind, obj),
        "Role" => check_as::<k8s_openapi::api::rbac::v1::Role>(kind, obj),
        "ClusterRole" => check_as::<k8s_openapi::api::rbac::v1::ClusterRole>(kind, obj),
        "RoleBinding" => check_as::<k8s_openapi::api::rbac::v1::RoleBinding>(kind, obj),
        "ClusterRoleBinding" => {
            check_as::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>(kind, obj)
        }
        // events.k8s.io's Event, named with its group (its kind name is core's).
        "events.k8s.io/Event" => check_as::<events::Event>("Event", obj),
        _ => Ok(Vec::new()),
    }
}

/// upstream's message for a list of unknown fields:
/// `strict decoding error: unknown field "a", unknown field "b"`.
pub fn strict_error_message(unknown: &[String]) -> String {
    let fields: Vec<String> = unknown
        .iter()
        .map(|f| format!("unknown field {f:?}"))
        .collect();
    format!("strict decoding error: {}", fields.join(", "))
}

fn check_as<T>(kind: &str, obj: &Value) -> Result<Vec<String>, DecodeError>
where
    T: DeserializeOwned + Serialize + k8s_openapi::Resource,
{
    let Value::Object(input) = obj else {
        return Err(DecodeError {
            kind: kind.to_string(),
            version: T::API_VERSION.to_string(),
            reason: "the object is not a JSON object".to_string(),
        });
    };
    let mut nulls = Vec::new();
    let mut stripped = strip_nulls(input, &mut Vec::new(), &mut nulls);
    // The typed decoder insists on its own apiVersion and kind; the API server checks those.
    stripped.insert("apiVersion".into(), Value::from(T::API_VERSION));
    stripped.insert("kind".into(), Value::from(T::KIND));
    let stripped = Value::Object(stripped);
    let output = round_trip::<T>(&stripped).map_err(|reason| DecodeError {
        kind: kind.to_string(),
        version: T::API_VERSION.to_string(),
        reason,
    })?;
    let mut unknown = Vec::new();
    walk(obj, &output, "", &mut unknown);
    for path in nulls {
        if !null_key_known::<T>(&stripped, &path) {
            unknown.push(render(&path));
        }
    }
    unknown.sort();
    Ok(unknown)
}

fn round_trip<T: DeserializeOwned + Serialize>(v: &Value) -> Result<Value, String> {
    let typed: T = serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
    serde_json::to_value(&typed).map_err(|e| e.to_string())
}

#[derive(Debug, Clone)]
enum Step {
    Key(String),
    Index(usize),
}

fn render(path: &[Step]) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Step::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

fn strip_nulls(
    map: &Map<String, Value>,
    path: &mut Vec<Step>,
    nulls: &mut Vec<Vec<Step>>,
) -> Map<String, Value> {
    let mut out = Map::new();
    for (k, v) in map {
        path.push(Step::Key(k.clone()));
        match v {
            Value::Null => nulls.push(path.clone()),
            other => {
                out.insert(k.clone(), strip_value(other, path, nulls));
            }
        }
        path.pop();
    }
    out
}

fn strip_value(v: &Value, path: &mut Vec<Step>, nulls: &mut Vec<Vec<Step>>) -> Value {
    match v {
        Value::Object(m) => Value::Object(strip_nulls(m, path, nulls)),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, item)| {
                    path.push(Step::Index(i));
                    let out = strip_value(item, path, nulls);
                    path.pop();
                    out
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Whether the key at `path` (whose value was `null`) survives a round trip with some
/// non-null value in its place.
fn null_key_known<T: DeserializeOwned + Serialize>(doc: &Value, path: &[Step]) -> bool {
    let Some((Step::Key(key), parent)) = path.split_last() else {
        return true;
    };
    let probes = [
        Value::Object(Map::new()),
        Value::Array(Vec::new()),
        Value::from(""),
        // Timestamps reject other strings.
        Value::from("1970-01-01T00:00:00Z"),
        Value::from(0),
        Value::from(false),
    ];
    probes.into_iter().any(|probe| {
        let mut doc = doc.clone();
        let Some(Value::Object(m)) = get_mut(&mut doc, parent) else {
            return false;
        };
        m.insert(key.clone(), probe);
        round_trip::<T>(&doc)
            .ok()
            .and_then(|out| get(&out, parent).and_then(|p| p.get(key)).cloned())
            .is_some()
    })
}

fn get<'a>(v: &'a Value, path: &[Step]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, step| match step {
        Step::Key(k) => v.get(k),
        Step::Index(i) => v.get(i),
    })
}

fn get_mut<'a>(v: &'a mut Value, path: &[Step]) -> Option<&'a mut Value> {
    path.iter().try_fold(v, |v, step| match step {
        Step::Key(k) => v.get_mut(k),
        Step::Index(i) => v.get_mut(i),
    })
}

fn walk(input: &Value, output: &Value, path: &str, unknown: &mut Vec<String>) {
    match (input, output) {
        (Value::Object(i), Value::Object(o)) => {
            for (k, v) in i {
                if v.is_null() {
                    continue;
                }
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match o.get(k) {
                    Some(ov) => walk(v, ov, &p, unknown),
                    None => unknown.push(p),
                }
            }
        }
        (Value::Array(i), Value::Array(o)) => {
            for (n, (iv, ov)) in i.iter().zip(o).enumerate() {
                walk(iv, ov, &format!("{path}[{n}]"), unknown);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn finds_unknown_fields_with_upstream_paths() {
        let svc = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "labels": {"any-key": "x"}, "annotations": {},
                         "creationTimestamp": null, "bogusMeta": 1},
            "spec": {
                "selector": {"app": "web"},
                "ports": [
                    {"port": 80, "targetPort": "http", "protocol": "TCP"},
                    {"port": 443, "targetPort": 8443, "prot": "TCP", "nodePort": null}
                ],
                "clusterIP": "None", "ipFamilies": [], "tyep": "NodePort",
                "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 10800, "extra": true}}
            },
            "status": {},
            "unknownTop": {"a": 1},
            "nullUnknown": null
        });
        assert_eq!(
            unknown_fields("Service", &svc),
            vec![
                "metadata.bogusMeta",
                "nullUnknown",
                "spec.ports[1].prot",
                "spec.sessionAffinityConfig.clientIP.extra",
                "spec.tyep",
                "unknownTop",
            ]
        );
    }

    #[test]
    fn normalised_fields_are_not_unknown() {
        let cases = [
            (
                "Pod",
                json!({
                    "metadata": {"name": "p", "creationTimestamp": "2024-01-01T00:00:00Z",
                                 "managedFields": [{"manager": "kubectl", "fieldsType": "FieldsV1",
                                                    "fieldsV1": {"f:metadata": {"f:labels": {}}}}]},
                    "spec": {"containers": [{"name": "c", "image": "i",
                        "resources": {"limits": {"cpu": "100m", "memory": "1Gi"}, "requests": {}},
                        "ports": [{"containerPort": 80}],
                        "readinessProbe": {"httpGet": {"port": "http", "path": "/"}},
                        "env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]}],
                        "securityContext": {}, "nodeSelector": {}, "volumes": [{"name": "v", "emptyDir": {}}]},
                    "status": {"phase": "Running", "podIPs": [{"ip": "10.0.0.1"}]}
                }),
            ),
            (
                "ConfigMap",
                json!({"metadata": {"name": "c"}, "data": {"k": "v"}, "binaryData": {"b": "AAE="}}),
            ),
            (
                "Deployment",
                json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
                "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "d"}},
                         "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 1}},
                         "template": {"metadata": {"labels": {"app": "d"}, "creationTimestamp": null},
                                      "spec": {"containers": [{"name": "c", "image": "i"}]}}}}),
            ),
            (
                "EndpointSlice",
                json!({"addressType": "IPv4", "metadata": {"name": "s"},
                "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true}, "targetRef": {"kind": "Pod", "name": "p"}}],
                "ports": [{"port": 80, "name": "", "protocol": "TCP"}]}),
            ),
            (
                "Endpoints",
                json!({"metadata": {"name": "e"}, "subsets": [{"addresses": [{"ip": "1.2.3.4"}], "ports": [{"port": 3306}]}]}),
            ),
            (
                "Node",
                json!({"metadata": {"name": "n"}, "spec": {"podCIDRs": ["10.244.0.0/24"]},
                "status": {"capacity": {"cpu": "2"}, "addresses": [{"type": "InternalIP", "address": "1.2.3.4"}]}}),
            ),
        ];
        for (kind, obj) in cases {
            assert_eq!(check(kind, &obj), Ok(vec![]), "{kind}");
        }
        let bad = json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "imagePullPolicy": "Always", "imgae": "x"}]}}}});
        assert_eq!(
            unknown_fields("Deployment", &bad),
            vec!["spec.template.spec.containers[0].imgae"]
        );
        assert_eq!(
            strict_error_message(&unknown_fields("Deployment", &bad)),
            "strict decoding error: unknown field \"spec.template.spec.containers[0].imgae\""
        );
    }

    #[test]
    fn decode_errors_and_unchecked_kinds() {
        let err = check("Service", &json!({"spec": {"ports": [{"port": "eighty"}]}})).unwrap_err();
        assert_eq!(err.kind, "Service");
        assert!(
            err.to_string()
                .starts_with("Service in version \"v1\" cannot be handled as a Service"),
            "{err}"
        );
        assert!(unknown_fields("Service", &json!({"spec": {"ports": "x"}})).is_empty());
        assert!(check("Service", &json!([])).is_err());
        assert_eq!(check("Widget", &json!({"anything": 1})), Ok(vec![]));
    }

    #[test]
    fn every_served_kind_is_checked() {
        assert_eq!(
            check("Lease", &json!({"spec": {"holderIdentity": "a", "x": 1}})),
            Ok(vec!["spec.x".to_string()])
        );
        assert!(check("Lease", &json!({"spec": {"leaseDurationSeconds": "ten"}})).is_err());
        assert_eq!(
            check(
                "NetworkPolicy",
                &json!({"spec": {"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "exclude": []}}]}]}})
            ),
            Ok(vec!["spec.ingress[0].from[0].ipBlock.exclude".to_string()])
        );
        assert!(
            check(
                "NetworkPolicy",
                &json!({"spec": {"policyTypes": "Ingress"}})
            )
            .is_err()
        );
        assert!(check("ServiceAccount", &json!({"secrets": "none"})).is_err());
        assert_eq!(
            check(
                "ReplicaSet",
                &json!({"spec": {"replicas": 1, "selector": {}, "bogus": true}})
            ),
            Ok(vec!["spec.bogus".to_string()])
        );
        assert_eq!(
            check(
                "ControllerRevision",
                &json!({"revision": 1, "data": {"spec": {}}, "bogus": 1})
            ),
            Ok(vec!["bogus".to_string()])
        );
        assert!(check("ControllerRevision", &json!({"revision": "two"})).is_err());
        let err = check("events.k8s.io/Event", &json!({"note": 5})).unwrap_err();
        assert_eq!(err.kind, "Event");
        assert_eq!(err.version, "events.k8s.io/v1");
    }
}

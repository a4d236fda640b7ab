//! Object metadata handling on create and update: what the server owns (uid, timestamps,
//! generation, names) and what a client may change. Pure functions over JSON values.

use serde_json::{Map, Value, json};

use crate::registry::ResourceInfo;
use crate::request::Subresource;
use crate::status::{ApiError, Cause};

/// Now, as Kubernetes writes timestamps (RFC 3339, seconds, UTC).
pub fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// A name for `generateName`: the prefix plus five characters from upstream's alphabet.
pub fn generate_name(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let bytes = uuid::Uuid::new_v4().into_bytes();
    let suffix: String = bytes[..5]
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect();
    format!("{prefix}{suffix}")
}

pub fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

pub fn name_of(obj: &Value) -> &str {
    meta_str(obj, "name").unwrap_or("")
}

/// The metadata map, created when absent. `obj` must be a JSON object (callers decode first).
fn metadata_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    match obj.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        _ => unreachable!("metadata was just made an object"),
    }
}

pub fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

pub fn is_terminating(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
}

/// Decodes a request body into a JSON object of the resource's kind (filling in `kind` and
/// `apiVersion` when absent, refusing others).
pub fn decode_body(res: &ResourceInfo, body: &[u8], expect_kind: &str) -> Result<Value, ApiError> {
    let api_version = if expect_kind == "Scale" {
        "autoscaling/v1".to_string()
    } else {
        res.api_version()
    };
    let cannot = |detail: String| {
        ApiError::BadRequest(format!(
            "{expect_kind} in version \"{}\" cannot be handled as a {expect_kind}: {detail}",
            res.version
        ))
    };
    let mut obj: Value = serde_json::from_slice(body).map_err(|e| cannot(e.to_string()))?;
    if !obj.is_object() {
        return Err(cannot("the body is not a JSON object".into()));
    }
    match obj.get("kind").and_then(Value::as_str) {
        None | Some("") => obj["kind"] = json!(expect_kind),
        Some(k) if k == expect_kind => {}
        Some(k) => {
            return Err(ApiError::BadRequest(format!(
                "the kind in the data ({k}) does not match the expected kind ({expect_kind})"
            )));
        }
    }
    match obj.get("apiVersion").and_then(Value::as_str) {
        None | Some("") => obj["apiVersion"] = json!(api_version),
        Some(v) if v == api_version => {}
        Some(v) => {
            return Err(ApiError::BadRequest(format!(
                "the API version in the data ({v}) does not match the expected API version ({api_version})"
            )));
        }
    }
    if obj
        .get("metadata")
        .is_some_and(|m| !m.is_object() && !m.is_null())
    {
        return Err(cannot("metadata must be an object".into()));
    }
    Ok(obj)
}

/// Fills in what the server owns on create.
pub fn prepare_create(
    res: &ResourceInfo,
    namespace: Option<&str>,
    mut obj: Value,
) -> Result<Value, ApiError> {
    let meta = metadata_mut(&mut obj);
    if res.namespaced {
        let ns = namespace.unwrap_or("default");
        match meta.get("namespace").and_then(Value::as_str) {
            None | Some("") => {
                meta.insert("namespace".into(), json!(ns));
            }
            Some(given) if given == ns => {}
            Some(_) => {
                return Err(ApiError::BadRequest(
                    "the namespace of the provided object does not match the namespace sent on the request".into(),
                ));
            }
        }
    } else {
        meta.remove("namespace");
    }
    let name = meta
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if name.is_empty() {
        match meta.get("generateName").and_then(Value::as_str) {
            Some(prefix) if !prefix.is_empty() => {
                let generated = generate_name(prefix);
                meta.insert("name".into(), json!(generated));
            }
            _ => {
                return Err(ApiError::invalid(
                    res,
                    "",
                    vec![Cause {
                        reason: "FieldValueRequired".into(),
                        field: "metadata.name".into(),
                        message: "Required value: name or generateName is required".into(),
                    }],
                ));
            }
        }
    }
    meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
    meta.insert("creationTimestamp".into(), json!(now()));
    if has_generation(res) {
        meta.insert("generation".into(), json!(1));
    } else {
        meta.remove("generation");
    }
    for owned in [
        "resourceVersion",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
        "selfLink",
    ] {
        meta.remove(owned);
    }
    match res.kind {
        "Namespace" => {
            let name = name_of(&obj).to_string();
            let meta = metadata_mut(&mut obj);
            let labels = meta.entry("labels").or_insert_with(|| json!({}));
            if let Some(l) = labels.as_object_mut() {
                l.insert("kubernetes.io/metadata.name".into(), json!(name));
            }
            obj["spec"] = json!({"finalizers": ["kubernetes"]});
            obj["status"] = json!({"phase": "Active"});
        }
        "Pod" => {
            obj["status"] = json!({"phase": "Pending"});
        }
        "Service" | "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" => {
            obj["status"] = json!({});
        }
        _ => {}
    }
    Ok(obj)
}

/// Whether upstream's strategy for the kind keeps `metadata.generation`: the kinds with a spec
/// that a controller or the kubelet acts on (their `observedGeneration` follows it). Services,
/// ConfigMaps, Namespaces, Nodes, Leases, Events and the rest have none.
pub fn has_generation(res: &ResourceInfo) -> bool {
    matches!(
        (res.group, res.kind),
        ("", "Pod")
            | (
                "apps",
                "Deployment" | "ReplicaSet" | "StatefulSet" | "DaemonSet"
            )
            | ("discovery.k8s.io", "EndpointSlice")
    )
}

/// Everything but metadata and status: what a `generation` bump tracks.
fn spec_part(obj: &Value) -> Value {
    match obj {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| {
                    !matches!(k.as_str(), "metadata" | "status" | "kind" | "apiVersion")
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Merges an incoming full object (PUT body or patched object) onto the current one.
pub fn prepare_update(
    res: &ResourceInfo,
    sub: Option<Subresource>,
    current: &Value,
    incoming: Value,
) -> Result<Value, ApiError> {
    let name = name_of(current).to_string();
    let cur_rv = meta_str(current, "resourceVersion").unwrap_or("");
    if let Some(rv) = meta_str(&incoming, "resourceVersion")
        && !rv.is_empty()
        && rv != cur_rv
    {
        return Err(ApiError::conflict(res, &name));
    }
    if let Some(uid) = meta_str(&incoming, "uid")
        && !uid.is_empty()
        && Some(uid) != meta_str(current, "uid")
    {
        return Err(ApiError::Conflict {
            resource: res.qualified(),
            name,
            detail: format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                meta_str(current, "uid").unwrap_or("")
            ),
        });
    }
    if let Some(n) = meta_str(&incoming, "name")
        && n != name
    {
        return Err(ApiError::BadRequest(format!(
            "the name of the object ({n}) does not match the name on the URL ({name})"
        )));
    }
    let mut next = match sub {
        Some(Subresource::Status) => {
            let mut next = current.clone();
            match incoming.get("status") {
                Some(s) => next["status"] = s.clone(),
                None => {
                    if let Some(m) = next.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
            // A Node's status write keeps its labels and annotations too: upstream's
            // nodeStatusStrategy resets only the spec, and node daemons rely on it (flanneld
            // publishes its lease annotations through `nodes/status`, the one write its role
            // grants).
            if res.group.is_empty() && res.kind == "Node" {
                for key in ["labels", "annotations"] {
                    match incoming.pointer(&format!("/metadata/{key}")) {
                        Some(v) => next["metadata"][key] = v.clone(),
                        None => {
                            if let Some(m) = next["metadata"].as_object_mut() {
                                m.remove(key);
                            }
                        }
                    }
                }
            }
            return Ok(next);
        }
        Some(
            Subresource::Log | Subresource::Exec | Subresource::PortForward | Subresource::Attach,
        ) => {
            return Err(ApiError::MethodNotAllowed(
                "the log, exec, attach and portforward subresources cannot be written".into(),
            ));
        }
        Some(Subresource::Scale) => {
            let replicas = incoming
                .pointer("/spec/replicas")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            let mut next = current.clone();
            next["spec"]["replicas"] = json!(replicas);
            next
        }
        None => {
            let mut next = incoming;
            // A patch may blank `apiVersion`/`kind` (or a PUT omit them): the stored object
            // always carries its resource's; a different one is refused, as on create.
            for (field, want) in [("apiVersion", res.api_version()), ("kind", res.kind.into())] {
                match next.get(field).and_then(Value::as_str) {
                    None | Some("") => next[field] = json!(want),
                    Some(have) if have == want => {}
                    Some(have) => {
                        return Err(ApiError::BadRequest(format!(
                            "{field} of the object ({have}) does not match the resource ({want})"
                        )));
                    }
                }
            }
            if res.has_status() {
                match current.get("status") {
                    Some(s) => next["status"] = s.clone(),
                    None => {
                        if let Some(m) = next.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
            }
            next
        }
    };
    {
        let cur_meta = current.get("metadata").cloned().unwrap_or(json!({}));
        let meta = metadata_mut(&mut next);
        for owned in [
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ] {
            match cur_meta.get(owned) {
                Some(v) => meta.insert(owned.into(), v.clone()),
                None => meta.remove(owned),
            };
        }
        meta.insert("resourceVersion".into(), json!(cur_rv));
        meta.remove("managedFields");
        meta.remove("selfLink");
    }
    // A terminating object may lose finalizers but not gain new ones (upstream forbids it).
    if is_terminating(current) {
        let before = finalizers(current);
        if finalizers(&next).iter().any(|f| !before.contains(f)) {
            return Err(ApiError::invalid(
                res,
                &name,
                vec![Cause {
                    reason: "FieldValueForbidden".into(),
                    field: "metadata.finalizers".into(),
                    message:
                        "Forbidden: no new finalizers can be added if the object is being deleted"
                            .into(),
                }],
            ));
        }
    }
    // Upstream's strategies also count an EndpointSlice's labels (they decide which service
    // it serves) and a Deployment's annotations (copied to its ReplicaSets).
    let meta_changed = |field: &str| {
        next.pointer(&format!("/metadata/{field}"))
            != current.pointer(&format!("/metadata/{field}"))
    };
    let also = match res.kind {
        "EndpointSlice" => meta_changed("labels"),
        "Deployment" => meta_changed("annotations"),
        _ => false,
    };
    if has_generation(res) && (spec_part(&next) != spec_part(current) || also) {
        let generation = current
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        next["metadata"]["generation"] = json!(generation + 1);
    }
    Ok(next)
}

/// The `autoscaling/v1` Scale view of a workload.
pub fn scale_of(obj: &Value) -> Value {
    let selector = obj
        .pointer("/spec/selector/matchLabels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": name_of(obj),
            "namespace": meta_str(obj, "namespace").unwrap_or(""),
            "uid": meta_str(obj, "uid").unwrap_or(""),
            "resourceVersion": meta_str(obj, "resourceVersion").unwrap_or(""),
            "creationTimestamp": meta_str(obj, "creationTimestamp").unwrap_or(""),
        },
        "spec": {"replicas": obj.pointer("/spec/replicas").cloned().unwrap_or(json!(1))},
        "status": {
            "replicas": obj.pointer("/status/replicas").cloned().unwrap_or(json!(0)),
            "selector": selector,
        },
    })
}

/// The same object without its resourceVersion, for no-op detection.
pub fn without_rv(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
    }
    o
}

/// `PartialObjectMetadata` of an object.
pub fn partial_metadata(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::lookup;

    #[test]
    fn create_fills_server_fields() {
        let svc = lookup("", "v1", "services").unwrap();
        let obj = json!({"metadata": {"generateName": "web-", "resourceVersion": "9"}, "spec": {}, "status": {"x": 1}});
        let out = prepare_create(svc, Some("ns"), obj).unwrap();
        assert!(name_of(&out).starts_with("web-") && name_of(&out).len() == 9);
        assert_eq!(out["metadata"]["namespace"], "ns");
        // Services, ConfigMaps and the like have no generation upstream; pods and workloads do.
        assert!(out["metadata"].get("generation").is_none(), "{out}");
        let cm = lookup("", "v1", "configmaps").unwrap();
        let out_cm = prepare_create(
            cm,
            Some("ns"),
            json!({"metadata": {"name": "c", "generation": 5}}),
        )
        .unwrap();
        assert!(out_cm["metadata"].get("generation").is_none(), "{out_cm}");
        let changed = prepare_update(
            cm,
            None,
            &out_cm,
            json!({"metadata": {"name": "c"}, "data": {"a": "b"}}),
        )
        .unwrap();
        assert!(changed["metadata"].get("generation").is_none(), "{changed}");
        for (g, plural) in [
            ("", "pods"),
            ("apps", "deployments"),
            ("discovery.k8s.io", "endpointslices"),
        ] {
            let r = lookup(g, "v1", plural).unwrap();
            let o = prepare_create(r, Some("ns"), json!({"metadata": {"name": "x"}})).unwrap();
            assert_eq!(o["metadata"]["generation"], 1, "{plural}");
        }
        assert!(out["metadata"].get("resourceVersion").is_none());
        assert_eq!(out["status"], json!({}), "status is reset on create");
        let err = prepare_create(
            svc,
            Some("ns"),
            json!({"metadata": {"namespace": "other", "name": "a"}}),
        )
        .unwrap_err();
        assert_eq!(err.code(), 400);
        let err = prepare_create(svc, Some("ns"), json!({"metadata": {}})).unwrap_err();
        assert_eq!(err.code(), 422);
    }

    #[test]
    fn update_keeps_server_fields_and_bumps_generation() {
        let dep = lookup("apps", "v1", "deployments").unwrap();
        let cur = json!({"metadata": {"name": "d", "uid": "u1", "generation": 3, "resourceVersion": "7", "creationTimestamp": "t"},
                         "spec": {"replicas": 1}, "status": {"replicas": 1}});
        let incoming = json!({"metadata": {"name": "d", "uid": "", "labels": {"a": "b"}}, "spec": {"replicas": 2}, "status": {"replicas": 99}});
        let out = prepare_update(dep, None, &cur, incoming).unwrap();
        assert_eq!(out["metadata"]["generation"], 4);
        assert_eq!(out["metadata"]["uid"], "u1");
        assert_eq!(out["metadata"]["labels"]["a"], "b");
        assert_eq!(out["status"]["replicas"], 1, "main resource ignores status");

        let same = prepare_update(
            dep,
            None,
            &cur,
            json!({"metadata": {"name": "d"}, "spec": {"replicas": 1}}),
        )
        .unwrap();
        assert_eq!(same["metadata"]["generation"], 3);
        // A Deployment's annotations count (upstream copies them to its ReplicaSets); labels
        // do not.
        let annotated = prepare_update(
            dep,
            None,
            &cur,
            json!({"metadata": {"name": "d", "annotations": {"a": "b"}}, "spec": {"replicas": 1}}),
        )
        .unwrap();
        assert_eq!(annotated["metadata"]["generation"], 4);

        let status = prepare_update(dep, Some(Subresource::Status), &cur, json!({"metadata": {"name": "d", "labels": {"x": "y"}}, "spec": {"replicas": 5}, "status": {"replicas": 2}})).unwrap();
        assert_eq!(status["status"]["replicas"], 2);
        assert_eq!(status["spec"]["replicas"], 1, "status update ignores spec");
        assert!(status["metadata"].get("labels").is_none());

        // A Node's status write carries its labels and annotations (upstream's
        // nodeStatusStrategy, which flanneld's lease annotations rely on), never its spec.
        let nodes = lookup("", "v1", "nodes").unwrap();
        let node = json!({"metadata": {"name": "n1", "uid": "u1", "resourceVersion": "7", "labels": {"a": "b"}},
                          "spec": {"podCIDR": "10.244.1.0/24"}, "status": {}});
        let next = prepare_update(
            nodes,
            Some(Subresource::Status),
            &node,
            json!({
            "metadata": {"name": "n1", "uid": "u2x", "labels": {"a": "b"}, "annotations": {"flannel.alpha.coreos.com/backend-type": "vxlan"}},
            "spec": {"podCIDR": "10.9.9.0/24"}, "status": {"conditions": []}}),
        );
        let next = next.unwrap_err();
        assert!(next.to_string().contains("UID"), "{next}");
        let next = prepare_update(nodes, Some(Subresource::Status), &node, json!({
            "metadata": {"name": "n1", "annotations": {"flannel.alpha.coreos.com/backend-type": "vxlan"}},
            "spec": {"podCIDR": "10.9.9.0/24"}, "status": {"conditions": []}})).unwrap();
        assert_eq!(
            next["metadata"]["annotations"]["flannel.alpha.coreos.com/backend-type"],
            "vxlan"
        );
        assert!(next["metadata"].get("labels").is_none(), "{next}");
        assert_eq!(next["metadata"]["uid"], "u1");
        assert_eq!(next["spec"]["podCIDR"], "10.244.1.0/24");

        let stale = prepare_update(
            dep,
            None,
            &cur,
            json!({"metadata": {"name": "d", "resourceVersion": "6"}}),
        )
        .unwrap_err();
        assert_eq!(stale.code(), 409);

        let scaled = prepare_update(
            dep,
            Some(Subresource::Scale),
            &cur,
            json!({"spec": {"replicas": 4}}),
        )
        .unwrap();
        assert_eq!(scaled["spec"]["replicas"], 4);
        assert_eq!(scaled["metadata"]["generation"], 4);
    }
}

//! The simpler kinds: Namespaces (phase, finalizer and name label), Nodes,
//! ConfigMaps (keys, size, immutability) and Events (names and keys), and the
//! kinds admitted only through their typed schema and object metadata
//! (ServiceAccounts, ReplicaSets, Leases, `events.k8s.io` Events).

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    ConfigMap, Event, Namespace, NamespaceSpec, NamespaceStatus, Node,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use crate::codec::{decode, encode};
use crate::error::FieldError;
use crate::syntax::{self, NameRule};

/// The label every namespace carries with its own name (upstream
/// `NamespaceDefaultLabelName`).
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

fn label_namespace(ns: &mut Namespace) {
    if let Some(name) = ns.metadata.name.clone() {
        ns.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(NAMESPACE_NAME_LABEL.into(), name);
    }
}

fn finish<T: serde::Serialize>(obj: &T, errs: Vec<FieldError>) -> Result<Value, Vec<FieldError>> {
    if errs.is_empty() {
        encode(obj)
    } else {
        Err(errs)
    }
}

pub(crate) fn admit_namespace_create(obj: Value) -> Result<Value, Vec<FieldError>> {
    let mut ns: Namespace = decode(obj)?;
    label_namespace(&mut ns);
    // A new namespace is Active and carries the `kubernetes` finalizer.
    ns.spec = Some(NamespaceSpec {
        finalizers: Some(vec!["kubernetes".into()]),
    });
    ns.status = Some(NamespaceStatus {
        phase: Some("Active".into()),
        conditions: None,
    });
    let errs = syntax::validate_object_meta(&ns.metadata, false, NameRule::Dns1123Label);
    finish(&ns, errs)
}

pub(crate) fn admit_namespace_update(old: &Value, new: Value) -> Result<Value, Vec<FieldError>> {
    let old_ns: Namespace = decode(old.clone())?;
    let mut ns: Namespace = decode(new)?;
    label_namespace(&mut ns);
    // Finalizers change through `namespaces/finalize`, status through `/status`.
    ns.spec = old_ns.spec;
    ns.status = old_ns.status;
    let errs = syntax::validate_object_meta(&ns.metadata, false, NameRule::Dns1123Label);
    finish(&ns, errs)
}

pub(crate) fn admit_node(obj: Value) -> Result<Value, Vec<FieldError>> {
    let node: Node = decode(obj)?;
    let mut errs = syntax::validate_object_meta(&node.metadata, false, NameRule::Dns1123Subdomain);
    for (i, cidr) in node
        .spec
        .as_ref()
        .and_then(|s| s.pod_cidrs.as_ref())
        .into_iter()
        .flatten()
        .enumerate()
    {
        if !syntax::is_valid_cidr(cidr) {
            errs.push(FieldError::invalid(
                format!("spec.podCIDRs[{i}]"),
                cidr,
                syntax::CIDR_MSG,
            ));
        }
    }
    finish(&node, errs)
}

const CONFIG_KEY_MSG: &str = "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')";

/// upstream's `MaxSecretSize`, the bound of a ConfigMap's `data` and `binaryData` together.
pub const MAX_CONFIGMAP_BYTES: usize = 1024 * 1024;

const IMMUTABLE_MSG: &str = "field is immutable when `immutable` is set";

/// upstream's `ValidateConfigMapUpdate`: once `immutable: true`, neither the data nor the
/// flag itself may change.
pub(crate) fn admit_configmap_update(old: &Value, new: Value) -> Result<Value, Vec<FieldError>> {
    let old_cm: ConfigMap = decode(old.clone())?;
    let cm: ConfigMap = decode(new.clone())?;
    if old_cm.immutable == Some(true) {
        let mut errs = Vec::new();
        if cm.immutable != Some(true) {
            errs.push(FieldError::forbidden("immutable", IMMUTABLE_MSG));
        }
        if cm.data != old_cm.data {
            errs.push(FieldError::forbidden("data", IMMUTABLE_MSG));
        }
        if cm.binary_data != old_cm.binary_data {
            errs.push(FieldError::forbidden("binaryData", IMMUTABLE_MSG));
        }
        if !errs.is_empty() {
            return Err(errs);
        }
    }
    admit_configmap(new)
}

pub(crate) fn admit_configmap(obj: Value) -> Result<Value, Vec<FieldError>> {
    let cm: ConfigMap = decode(obj)?;
    let data_bytes: usize = cm
        .data
        .iter()
        .flatten()
        .map(|(k, v)| k.len() + v.len())
        .sum();
    let binary_bytes: usize = cm
        .binary_data
        .iter()
        .flatten()
        .map(|(k, ByteString(v))| k.len() + v.len())
        .sum();
    if data_bytes + binary_bytes > MAX_CONFIGMAP_BYTES {
        return Err(vec![FieldError::too_long("", MAX_CONFIGMAP_BYTES)]);
    }
    let mut errs = syntax::validate_object_meta(&cm.metadata, true, NameRule::Dns1123Subdomain);
    let binary_keys: Vec<&String> = cm.binary_data.iter().flat_map(|m| m.keys()).collect();
    for key in cm
        .data
        .iter()
        .flat_map(|m| m.keys())
        .chain(binary_keys.iter().copied())
    {
        let field = format!("data[{key}]");
        if key.len() > 253 {
            errs.push(FieldError::invalid(
                &field,
                key,
                "must be no more than 253 characters",
            ));
        }
        if key.is_empty()
            || !key
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        {
            errs.push(FieldError::invalid(&field, key, CONFIG_KEY_MSG));
        }
        if key == "." || key == ".." {
            errs.push(FieldError::invalid(
                &field,
                key,
                format!("must not be '{key}'"),
            ));
        }
    }
    for key in cm.data.iter().flat_map(|m| m.keys()) {
        if binary_keys.contains(&key) {
            errs.push(FieldError::invalid(
                format!("data[{key}]"),
                key,
                "duplicate of key present in binaryData",
            ));
        }
    }
    finish(&cm, errs)
}

pub(crate) fn admit_event(obj: Value) -> Result<Value, Vec<FieldError>> {
    let ev: Event = decode(obj)?;
    let mut errs = syntax::validate_object_meta(&ev.metadata, true, NameRule::Dns1123Subdomain);
    let ns = ev.metadata.namespace.as_deref().unwrap_or("");
    if let Some(ons) = ev.involved_object.namespace.as_deref()
        && !ons.is_empty()
        && ons != ns
    {
        errs.push(FieldError::invalid(
            "involvedObject.namespace",
            ons,
            "does not match event.namespace",
        ));
    }
    finish(&ev, errs)
}

/// A kind admitted through its typed schema: the object must decode into `T` (wrong types
/// are a 400), its metadata must be valid, and it is stored as `T` encodes it, with its own
/// `apiVersion` and `kind` (a patch that blanks them cannot store a broken object).
/// upstream's `ValidateControllerRevision`: `data` is mandatory, `revision` not negative.
pub(crate) fn admit_controller_revision(obj: Value) -> Result<Value, Vec<FieldError>> {
    use k8s_openapi::api::apps::v1::ControllerRevision;
    let r: ControllerRevision = decode(obj)?;
    let mut errs = syntax::validate_object_meta(&r.metadata, true, NameRule::Dns1123Subdomain);
    if r.data.is_none() {
        errs.push(FieldError::required("data", "data is mandatory"));
    }
    if r.revision < 0 {
        errs.push(FieldError::invalid(
            "revision",
            r.revision,
            "must be greater than or equal to 0",
        ));
    }
    finish(&r, errs)
}

/// upstream's `ValidateControllerRevisionUpdate`: a revision's `data` never changes (only its
/// number does, when a rollback renumbers it).
pub(crate) fn admit_controller_revision_update(
    old: &Value,
    new: Value,
) -> Result<Value, Vec<FieldError>> {
    let out = admit_controller_revision(new)?;
    let (old_data, new_data) = (old.get("data"), out.get("data"));
    if old_data != new_data {
        let value = new_data.cloned().unwrap_or(Value::Null);
        return Err(vec![FieldError::invalid(
            "data",
            &value,
            "field is immutable",
        )]);
    }
    Ok(out)
}

pub(crate) fn admit_typed<T>(
    obj: Value,
    meta: fn(&T) -> &ObjectMeta,
) -> Result<Value, Vec<FieldError>>
where
    T: serde::de::DeserializeOwned + serde::Serialize + k8s_openapi::Resource,
{
    let typed: T = decode(obj)?;
    let errs = syntax::validate_object_meta(meta(&typed), true, NameRule::Dns1123Subdomain);
    finish(&typed, errs)
}

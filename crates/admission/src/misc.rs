//! The simpler kinds: Namespaces (phase, finalizer and name label), Nodes,
//! ConfigMaps and Events (names and keys).

use k8s_openapi::api::core::v1::{
    ConfigMap, Event, Namespace, NamespaceSpec, NamespaceStatus, Node,
};
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

pub(crate) fn admit_configmap(obj: Value) -> Result<Value, Vec<FieldError>> {
    let cm: ConfigMap = decode(obj)?;
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

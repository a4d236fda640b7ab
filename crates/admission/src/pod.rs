//! Pods and pod templates: defaulting (`SetDefaults_PodSpec`,
//! `SetDefaults_Container`, the priority and default-toleration admission
//! plugins), validation of the parts svcnet relies on, and the immutability
//! of a pod's spec on update.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    Container, Pod, PodSecurityContext, PodSpec, PodStatus, Probe, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::Value;

use crate::codec::{decode, encode};
use crate::error::FieldError;
use crate::syntax::{self, NameRule};

fn empty(s: &Option<String>) -> bool {
    s.as_deref().unwrap_or("").is_empty()
}

/// `IfNotPresent`, except `Always` for `:latest` or an untagged image (a
/// digest counts as a tag).
pub fn default_pull_policy(image: &str) -> &'static str {
    if image.contains('@') {
        return "IfNotPresent";
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.rsplit_once(':') {
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    }
}

fn default_probe(p: &mut Option<Probe>) {
    let Some(p) = p.as_mut() else { return };
    p.timeout_seconds.get_or_insert(1);
    p.period_seconds.get_or_insert(10);
    p.success_threshold.get_or_insert(1);
    p.failure_threshold.get_or_insert(3);
    if let Some(h) = p.http_get.as_mut()
        && empty(&h.scheme)
    {
        h.scheme = Some("HTTP".into());
    }
}

fn default_container(c: &mut Container) {
    if empty(&c.image_pull_policy) {
        c.image_pull_policy = Some(default_pull_policy(c.image.as_deref().unwrap_or("")).into());
    }
    if empty(&c.termination_message_path) {
        c.termination_message_path = Some("/dev/termination-log".into());
    }
    if empty(&c.termination_message_policy) {
        c.termination_message_policy = Some("File".into());
    }
    c.resources.get_or_insert_with(Default::default);
    for p in c.ports.iter_mut().flatten() {
        if empty(&p.protocol) {
            p.protocol = Some("TCP".into());
        }
    }
    for e in c.env.iter_mut().flatten() {
        if let Some(f) = e.value_from.as_mut().and_then(|v| v.field_ref.as_mut())
            && empty(&f.api_version)
        {
            f.api_version = Some("v1".into());
        }
    }
    default_probe(&mut c.liveness_probe);
    default_probe(&mut c.readiness_probe);
    default_probe(&mut c.startup_probe);
}

/// Defaults shared by pods and pod templates (`SetDefaults_PodSpec`).
pub(crate) fn default_pod_spec(spec: &mut PodSpec) {
    if empty(&spec.restart_policy) {
        spec.restart_policy = Some("Always".into());
    }
    if empty(&spec.dns_policy) {
        spec.dns_policy = Some("ClusterFirst".into());
    }
    spec.termination_grace_period_seconds.get_or_insert(30);
    if empty(&spec.scheduler_name) {
        spec.scheduler_name = Some("default-scheduler".into());
    }
    spec.security_context
        .get_or_insert_with(PodSecurityContext::default);
    for c in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        default_container(c);
    }
    for v in spec.volumes.iter_mut().flatten() {
        if let Some(cm) = v.config_map.as_mut() {
            cm.default_mode.get_or_insert(0o644);
        }
        if let Some(s) = v.secret.as_mut() {
            s.default_mode.get_or_insert(0o644);
        }
    }
}

/// Defaults only a Pod (not a template) gets: `SetDefaults_Pod` and the
/// Priority and DefaultTolerationSeconds admission plugins.
/// Where the ServiceAccount admission mounts a pod's API credentials.
pub const SERVICE_ACCOUNT_MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The ConfigMap of the cluster CA every namespace holds (upstream's root-ca-cert-publisher).
pub const ROOT_CA_CONFIGMAP: &str = "kube-root-ca.crt";

/// Upstream's ServiceAccount admission for a new pod: `serviceAccountName` defaults to
/// `default`, and unless `automountServiceAccountToken: false` the pod gets the projected
/// volume `kube-api-access-<suffix>` (a bound token of 3607 s, the cluster CA from
/// `kube-root-ca.crt`, the namespace) mounted read-only at [`SERVICE_ACCOUNT_MOUNT`] in every
/// container that does not mount something there already. Creation only: on an update the
/// spec is the stored one.
fn admit_service_account(pod: &mut Pod) {
    let spec = pod.spec.get_or_insert_with(Default::default);
    if empty(&spec.service_account_name) {
        spec.service_account_name = Some("default".into());
    }
    if spec.automount_service_account_token == Some(false) {
        return;
    }
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    if volumes
        .iter()
        .any(|v| v.name.starts_with("kube-api-access-"))
    {
        return;
    }
    // Upstream draws the suffix at random; any 5 characters of the safe alphabet will do.
    let suffix = {
        let seed = format!(
            "{}/{}/{:?}",
            pod.metadata.namespace.as_deref().unwrap_or(""),
            pod.metadata.name.as_deref().unwrap_or(""),
            std::time::SystemTime::now()
        );
        let mut h: u32 = 0x811c_9dc5;
        for b in seed.bytes() {
            h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
        }
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        (0..5)
            .map(|i| ALPHABET[((h >> (i * 6)) as usize) % ALPHABET.len()] as char)
            .collect::<String>()
    };
    let name = format!("kube-api-access-{suffix}");
    let Ok(volume) = serde_json::from_value::<k8s_openapi::api::core::v1::Volume>(
        serde_json::json!({
            "name": name,
            "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": ROOT_CA_CONFIGMAP, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
            ]},
        }),
    ) else {
        return;
    };
    volumes.push(volume);
    for c in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        let mounts = c.volume_mounts.get_or_insert_with(Vec::new);
        if !mounts.iter().any(|m| m.mount_path == SERVICE_ACCOUNT_MOUNT) {
            mounts.push(k8s_openapi::api::core::v1::VolumeMount {
                name: name.clone(),
                mount_path: SERVICE_ACCOUNT_MOUNT.into(),
                read_only: Some(true),
                ..Default::default()
            });
        }
    }
}

fn default_pod(pod: &mut Pod) {
    let spec = pod.spec.get_or_insert_with(Default::default);
    default_pod_spec(spec);
    spec.enable_service_links.get_or_insert(true);
    spec.priority.get_or_insert(0);
    if empty(&spec.preemption_policy) {
        spec.preemption_policy = Some("PreemptLowerPriority".into());
    }
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    for key in [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ] {
        if !tolerations.iter().any(|t| t.key.as_deref() == Some(key)) {
            tolerations.push(Toleration {
                effect: Some("NoExecute".into()),
                key: Some(key.into()),
                operator: Some("Exists".into()),
                toleration_seconds: Some(300),
                value: None,
            });
        }
    }
}

/// `BestEffort` without requests or limits, `Guaranteed` when every
/// container's CPU and memory limits equal its requests, else `Burstable`.
pub fn qos_class(spec: &PodSpec) -> &'static str {
    let mut any = false;
    let mut guaranteed = true;
    for c in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        let empty_map = BTreeMap::new();
        let r = c.resources.as_ref();
        let requests: &BTreeMap<String, Quantity> =
            r.and_then(|r| r.requests.as_ref()).unwrap_or(&empty_map);
        let limits: &BTreeMap<String, Quantity> =
            r.and_then(|r| r.limits.as_ref()).unwrap_or(&empty_map);
        let relevant =
            |m: &BTreeMap<String, Quantity>| m.keys().any(|k| k == "cpu" || k == "memory");
        if relevant(requests) || relevant(limits) {
            any = true;
        }
        for res in ["cpu", "memory"] {
            // A missing request defaults to the limit.
            let limit = limits.get(res);
            let request = requests.get(res).or(limit);
            if limit.is_none() || request != limit {
                guaranteed = false;
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

const RESTART_POLICIES: &[&str] = &["Always", "Never", "OnFailure"];
const DNS_POLICIES: &[&str] = &["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"];
const PROTOCOLS: &[&str] = &["SCTP", "TCP", "UDP"];

fn validate_container(
    c: &Container,
    path: &str,
    names: &mut BTreeSet<String>,
    template: bool,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if c.name.is_empty() {
        errs.push(FieldError::required(format!("{path}.name"), ""));
    } else {
        errs.extend(
            syntax::is_dns1123_label(&c.name)
                .into_iter()
                .map(|m| FieldError::invalid(format!("{path}.name"), &c.name, m)),
        );
        if !names.insert(c.name.clone()) {
            errs.push(FieldError::duplicate(format!("{path}.name"), &c.name));
        }
    }
    // Templates may leave the image to a later mutation; pods may not.
    if !template && c.image.as_deref().unwrap_or("").trim().is_empty() {
        errs.push(FieldError::required(format!("{path}.image"), ""));
    }
    let mut port_names = BTreeSet::new();
    for (i, p) in c.ports.iter().flatten().enumerate() {
        let pp = format!("{path}.ports[{i}]");
        if let Some(name) = p.name.as_deref().filter(|n| !n.is_empty()) {
            errs.extend(
                syntax::is_valid_port_name(name)
                    .into_iter()
                    .map(|m| FieldError::invalid(format!("{pp}.name"), name, m)),
            );
            if !port_names.insert(name.to_string()) {
                errs.push(FieldError::duplicate(format!("{pp}.name"), name));
            }
        }
        errs.extend(
            syntax::is_valid_port_num(p.container_port)
                .into_iter()
                .map(|m| FieldError::invalid(format!("{pp}.containerPort"), p.container_port, m)),
        );
        if let Some(hp) = p.host_port.filter(|h| *h != 0) {
            errs.extend(
                syntax::is_valid_port_num(hp)
                    .into_iter()
                    .map(|m| FieldError::invalid(format!("{pp}.hostPort"), hp, m)),
            );
        }
        match p.protocol.as_deref().unwrap_or("") {
            "" => errs.push(FieldError::required(format!("{pp}.protocol"), "")),
            proto if !PROTOCOLS.contains(&proto) => errs.push(FieldError::not_supported(
                format!("{pp}.protocol"),
                proto,
                PROTOCOLS,
            )),
            _ => {}
        }
    }
    errs
}

/// Validation shared by pods and pod templates, with `path` the spec's path.
pub(crate) fn validate_pod_spec(spec: &PodSpec, path: &str, template: bool) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if spec.containers.is_empty() {
        errs.push(FieldError::required(format!("{path}.containers"), ""));
    }
    let mut names = BTreeSet::new();
    for (i, c) in spec.containers.iter().enumerate() {
        errs.extend(validate_container(
            c,
            &format!("{path}.containers[{i}]"),
            &mut names,
            template,
        ));
    }
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        errs.extend(validate_container(
            c,
            &format!("{path}.initContainers[{i}]"),
            &mut names,
            template,
        ));
    }
    if let Some(rp) = spec.restart_policy.as_deref()
        && !RESTART_POLICIES.contains(&rp)
    {
        errs.push(FieldError::not_supported(
            format!("{path}.restartPolicy"),
            rp,
            RESTART_POLICIES,
        ));
    }
    if let Some(dp) = spec.dns_policy.as_deref()
        && !DNS_POLICIES.contains(&dp)
    {
        errs.push(FieldError::not_supported(
            format!("{path}.dnsPolicy"),
            dp,
            DNS_POLICIES,
        ));
    }
    for (field, value) in [("hostname", &spec.hostname), ("subdomain", &spec.subdomain)] {
        if let Some(v) = value.as_deref().filter(|v| !v.is_empty()) {
            errs.extend(
                syntax::is_dns1123_label(v)
                    .into_iter()
                    .map(|m| FieldError::invalid(format!("{path}.{field}"), v, m)),
            );
        }
    }
    if let Some(n) = spec.node_name.as_deref().filter(|v| !v.is_empty()) {
        errs.extend(
            syntax::is_dns1123_subdomain(n)
                .into_iter()
                .map(|m| FieldError::invalid(format!("{path}.nodeName"), n, m)),
        );
    }
    if let Some(t) = spec.termination_grace_period_seconds
        && t < 0
    {
        errs.push(FieldError::invalid(
            format!("{path}.terminationGracePeriodSeconds"),
            t,
            "must be greater than or equal to 0",
        ));
    }
    errs
}

pub(crate) fn admit_create(obj: Value) -> Result<Value, Vec<FieldError>> {
    let mut pod: Pod = decode(obj)?;
    admit_service_account(&mut pod);
    default_pod(&mut pod);
    let spec = pod.spec.get_or_insert_with(Default::default);
    let qos = qos_class(spec);
    let status = pod.status.get_or_insert_with(PodStatus::default);
    if empty(&status.phase) {
        status.phase = Some("Pending".into());
    }
    if empty(&status.qos_class) {
        status.qos_class = Some(qos.into());
    }
    let mut errs = syntax::validate_object_meta(&pod.metadata, true, NameRule::Dns1123Subdomain);
    errs.extend(validate_pod_spec(
        pod.spec.as_ref().unwrap_or(&PodSpec::default()),
        "spec",
        false,
    ));
    if !errs.is_empty() {
        return Err(errs);
    }
    encode(&pod)
}

const POD_UPDATE_MSG: &str = "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)";

pub(crate) fn admit_update(old: &Value, new: Value) -> Result<Value, Vec<FieldError>> {
    let old_pod: Pod = decode(old.clone())?;
    let mut pod: Pod = decode(new)?;
    default_pod(&mut pod);
    // Writes to the main resource never change the status.
    pod.status = old_pod.status.clone();
    let mut errs = syntax::validate_object_meta(&pod.metadata, true, NameRule::Dns1123Subdomain);
    let default_spec = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&default_spec);
    errs.extend(validate_pod_spec(spec, "spec", false));
    let old_spec = old_pod.spec.as_ref().unwrap_or(&default_spec);
    // Compare with the mutable fields masked out, as upstream does.
    let mut a = spec.clone();
    let mut b = old_spec.clone();
    for (x, y) in a.containers.iter_mut().zip(b.containers.iter_mut()) {
        x.image = y.image.clone();
    }
    for (x, y) in a
        .init_containers
        .iter_mut()
        .flatten()
        .zip(b.init_containers.iter_mut().flatten())
    {
        x.image = y.image.clone();
    }
    a.active_deadline_seconds = b.active_deadline_seconds;
    let old_tolerations = b.tolerations.clone().unwrap_or_default();
    let new_tolerations = a.tolerations.clone().unwrap_or_default();
    if old_tolerations.iter().all(|t| new_tolerations.contains(t)) {
        a.tolerations = b.tolerations.clone();
    }
    if b.termination_grace_period_seconds.is_some_and(|t| t < 0)
        && a.termination_grace_period_seconds == Some(1)
    {
        a.termination_grace_period_seconds = b.termination_grace_period_seconds;
    }
    // Binding: a pod without a node may be given one, once.
    if empty(&b.node_name) {
        b.node_name = a.node_name.clone();
    }
    if a != b {
        let changed = changed_fields(&a, &b);
        errs.push(FieldError::forbidden(
            "spec",
            format!("{POD_UPDATE_MSG}\n  changed: {}", changed.join(", ")),
        ));
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    encode(&pod)
}

/// The top-level spec fields that differ, for the error message.
fn changed_fields(a: &PodSpec, b: &PodSpec) -> Vec<String> {
    let (Ok(Value::Object(x)), Ok(Value::Object(y))) =
        (serde_json::to_value(a), serde_json::to_value(b))
    else {
        return Vec::new();
    };
    let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
    keys.into_iter()
        .filter(|k| x.get(*k) != y.get(*k))
        .map(|k| format!("spec.{k}"))
        .collect()
}

/// A write to `pods/status`: the stored spec stays.
pub(crate) fn admit_status_update(old: &Value, new: Value) -> Result<Value, Vec<FieldError>> {
    let old_pod: Pod = decode(old.clone())?;
    let mut pod: Pod = decode(new)?;
    pod.spec = old_pod.spec;
    let mut errs = Vec::new();
    let status = pod.status.as_ref();
    const PHASES: &[&str] = &["Failed", "Pending", "Running", "Succeeded", "Unknown"];
    if let Some(phase) = status.and_then(|s| s.phase.as_deref())
        && !PHASES.contains(&phase)
    {
        errs.push(FieldError::not_supported("status.phase", phase, PHASES));
    }
    for (i, ip) in status
        .and_then(|s| s.pod_ips.as_ref())
        .into_iter()
        .flatten()
        .enumerate()
    {
        if syntax::parse_ip(&ip.ip).is_none() {
            errs.push(FieldError::invalid(
                format!("status.podIPs[{i}].ip"),
                &ip.ip,
                syntax::IP_MSG,
            ));
        }
    }
    if let Some(ip) = status
        .and_then(|s| s.pod_ip.as_deref())
        .filter(|s| !s.is_empty())
        && syntax::parse_ip(ip).is_none()
    {
        errs.push(FieldError::invalid("status.podIP", ip, syntax::IP_MSG));
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    encode(&pod)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_policy() {
        assert_eq!(default_pull_policy("nginx"), "Always");
        assert_eq!(default_pull_policy("nginx:latest"), "Always");
        assert_eq!(default_pull_policy("nginx:1.25"), "IfNotPresent");
        assert_eq!(default_pull_policy("localhost:5000/nginx"), "Always");
        assert_eq!(
            default_pull_policy("localhost:5000/nginx:1"),
            "IfNotPresent"
        );
        assert_eq!(default_pull_policy("nginx@sha256:abc"), "IfNotPresent");
    }
}

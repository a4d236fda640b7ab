//! Row cells per kind, following upstream's `print<Kind>` functions with the server's
//! `Wide: true` (every column filled). Objects are read as JSON; absent fields read as the
//! zero value, as they would after Go decoding.

use std::collections::BTreeSet;

use jiff::Timestamp;
use serde_json::{Value, json};

use super::duration::human_duration;
use crate::selector::LabelSelector;

fn at<'a>(obj: &'a Value, ptr: &str) -> &'a Value {
    obj.pointer(ptr).unwrap_or(&Value::Null)
}

fn text<'a>(obj: &'a Value, ptr: &str) -> &'a str {
    at(obj, ptr).as_str().unwrap_or("")
}

fn int(obj: &Value, ptr: &str) -> i64 {
    at(obj, ptr).as_i64().unwrap_or(0)
}

fn list<'a>(obj: &'a Value, ptr: &str) -> &'a [Value] {
    at(obj, ptr).as_array().map(Vec::as_slice).unwrap_or(&[])
}

fn or_none(s: &str) -> String {
    if s.is_empty() {
        "<none>".to_string()
    } else {
        s.to_string()
    }
}

fn parse_time(s: &str) -> Option<Timestamp> {
    if s.is_empty() { None } else { s.parse().ok() }
}

/// upstream `translateTimestampSince`: `<unknown>` for a zero (absent) time.
fn since(ts: Option<Timestamp>, now: Timestamp) -> String {
    match ts {
        // Truncated toward zero, as Go's `int(d.Seconds())`.
        Some(ts) => human_duration(now.duration_since(ts).as_secs()),
        None => "<unknown>".to_string(),
    }
}

fn age(obj: &Value, now: Timestamp) -> String {
    since(parse_time(text(obj, "/metadata/creationTimestamp")), now)
}

fn name(obj: &Value) -> Value {
    Value::from(text(obj, "/metadata/name"))
}

/// upstream `labels.FormatLabels`: sorted `k=v` pairs, `<none>` when empty.
fn format_labels(map: &Value) -> String {
    let Some(m) = map.as_object() else {
        return "<none>".to_string();
    };
    let mut pairs: Vec<String> = m
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
        .collect();
    pairs.sort();
    or_none(&pairs.join(","))
}

/// upstream `layoutContainerCells`: container names and images, comma-separated.
fn container_cells(containers: &[Value]) -> (String, String) {
    let names: Vec<&str> = containers.iter().map(|c| text(c, "/name")).collect();
    let images: Vec<&str> = containers.iter().map(|c| text(c, "/image")).collect();
    (names.join(","), images.join(","))
}

/// The cells of one row of `kind`.
pub(crate) fn cells(kind: &str, obj: &Value, now: Timestamp) -> Vec<Value> {
    match kind {
        "Pod" => pod(obj, now),
        "Service" => service(obj, now),
        "Endpoints" => vec![
            name(obj),
            format_endpoints(obj).into(),
            age(obj, now).into(),
        ],
        "EndpointSlice" => endpoint_slice(obj, now),
        "Deployment" => deployment(obj, now),
        "ReplicaSet" => replica_set(obj, now),
        "ControllerRevision" => controller_revision(obj, now),
        "DaemonSet" => daemon_set(obj, now),
        "StatefulSet" => {
            let (names, images) = container_cells(list(obj, "/spec/template/spec/containers"));
            let replicas = at(obj, "/spec/replicas").as_i64().unwrap_or(1);
            vec![
                name(obj),
                format!("{}/{replicas}", int(obj, "/status/readyReplicas")).into(),
                age(obj, now).into(),
                names.into(),
                images.into(),
            ]
        }
        "Node" => node(obj, now),
        "Namespace" => vec![
            name(obj),
            text(obj, "/status/phase").into(),
            age(obj, now).into(),
        ],
        "Event" => event(obj, now),
        "ConfigMap" => {
            let count = |p: &str| at(obj, p).as_object().map_or(0, |m| m.len());
            vec![
                name(obj),
                json!(count("/data") + count("/binaryData")),
                age(obj, now).into(),
            ]
        }
        // upstream `FormatLabelSelector`: `<none>` for an empty selector.
        "NetworkPolicy" => vec![
            name(obj),
            match at(obj, "/spec/podSelector") {
                Value::Null => "<none>".to_string(),
                sel => or_none(&selector_cell(sel)),
            }
            .into(),
            age(obj, now).into(),
        ],
        "Role" | "ClusterRole" => vec![name(obj), text(obj, "/metadata/creationTimestamp").into()],
        "RoleBinding" | "ClusterRoleBinding" => role_binding(obj, now),
        _ => vec![name(obj), age(obj, now).into()],
    }
}

/// upstream `printRoleBinding`: the role as `Kind/name`, and the subjects by kind (a
/// ServiceAccount as `namespace/name` when its namespace is given, as `SubjectsStrings`).
fn role_binding(obj: &Value, now: Timestamp) -> Vec<Value> {
    let subjects = at(obj, "/subjects").as_array().cloned().unwrap_or_default();
    let of_kind = |kind: &str| {
        let names: Vec<String> = subjects
            .iter()
            .filter(|s| s["kind"] == kind)
            .map(|s| {
                let n = s["name"].as_str().unwrap_or("");
                match s["namespace"].as_str().filter(|ns| !ns.is_empty()) {
                    Some(ns) if kind == "ServiceAccount" => format!("{ns}/{n}"),
                    _ => n.to_string(),
                }
            })
            .collect();
        Value::from(names.join(", "))
    };
    vec![
        name(obj),
        format!(
            "{}/{}",
            text(obj, "/roleRef/kind"),
            text(obj, "/roleRef/name")
        )
        .into(),
        age(obj, now).into(),
        of_kind("User"),
        of_kind("Group"),
        of_kind("ServiceAccount"),
    ]
}

/// Row conditions: completed pods are marked so clients can hide them.
pub(crate) fn row_conditions(kind: &str, obj: &Value) -> Option<Value> {
    if kind != "Pod" {
        return None;
    }
    let (reason, message) = match text(obj, "/status/phase") {
        "Succeeded" => ("Succeeded", "The pod has completed successfully."),
        "Failed" => ("Failed", "The pod failed."),
        _ => return None,
    };
    Some(json!([{"type": "Completed", "status": "True", "reason": reason, "message": message}]))
}

fn terminated_reason(prefix: &str, term: &Value) -> String {
    let reason = text(term, "/reason");
    if !reason.is_empty() {
        return format!("{prefix}{reason}");
    }
    let signal = int(term, "/signal");
    if signal != 0 {
        format!("{prefix}Signal:{signal}")
    } else {
        format!("{prefix}ExitCode:{}", int(term, "/exitCode"))
    }
}

fn has_condition(obj: &Value, ty: &str) -> bool {
    list(obj, "/status/conditions")
        .iter()
        .any(|c| text(c, "/type") == ty && text(c, "/status") == "True")
}

fn later(cur: Option<Timestamp>, status: &Value) -> Option<Timestamp> {
    let t = parse_time(text(status, "/lastState/terminated/finishedAt"));
    match (cur, t) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

fn pod(obj: &Value, now: Timestamp) -> Vec<Value> {
    let containers = list(obj, "/spec/containers");
    let init_containers = list(obj, "/spec/initContainers");
    let restartable = |name: &str| {
        init_containers
            .iter()
            .any(|c| text(c, "/name") == name && text(c, "/restartPolicy") == "Always")
    };
    let total = containers.len()
        + init_containers
            .iter()
            .filter(|c| text(c, "/restartPolicy") == "Always")
            .count();
    let phase = text(obj, "/status/phase");
    let mut reason = phase.to_string();
    if !text(obj, "/status/reason").is_empty() {
        reason = text(obj, "/status/reason").to_string();
    }
    if list(obj, "/status/conditions")
        .iter()
        .any(|c| text(c, "/type") == "PodScheduled" && text(c, "/reason") == "SchedulingGated")
    {
        reason = "SchedulingGated".to_string();
    }

    let mut ready = 0;
    let mut restarts = 0;
    let mut sidecar_restarts = 0;
    let mut last_restart = None;
    let mut last_sidecar_restart = None;
    let mut initializing = false;
    for (i, status) in list(obj, "/status/initContainerStatuses")
        .iter()
        .enumerate()
    {
        let count = int(status, "/restartCount");
        restarts += count;
        last_restart = later(last_restart, status);
        let sidecar = restartable(text(status, "/name"));
        if sidecar {
            sidecar_restarts += count;
            last_sidecar_restart = later(last_sidecar_restart, status);
        }
        let terminated = at(status, "/state/terminated");
        let waiting_reason = text(status, "/state/waiting/reason");
        if terminated.is_object() && int(terminated, "/exitCode") == 0 {
            continue;
        }
        if sidecar && at(status, "/started").as_bool() == Some(true) {
            if at(status, "/ready").as_bool() == Some(true) {
                ready += 1;
            }
            continue;
        }
        reason = if terminated.is_object() {
            terminated_reason("Init:", terminated)
        } else if !waiting_reason.is_empty() && waiting_reason != "PodInitializing" {
            format!("Init:{waiting_reason}")
        } else {
            format!("Init:{i}/{}", init_containers.len())
        };
        initializing = true;
        break;
    }
    if !initializing || has_condition(obj, "Initialized") {
        restarts = sidecar_restarts;
        last_restart = last_sidecar_restart;
        let mut has_running = false;
        for status in list(obj, "/status/containerStatuses").iter().rev() {
            restarts += int(status, "/restartCount");
            last_restart = later(last_restart, status);
            let waiting_reason = text(status, "/state/waiting/reason");
            let terminated = at(status, "/state/terminated");
            if !waiting_reason.is_empty() {
                reason = waiting_reason.to_string();
            } else if terminated.is_object() {
                reason = terminated_reason("", terminated);
            } else if at(status, "/ready").as_bool() == Some(true)
                && at(status, "/state/running").is_object()
            {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && has_running {
            reason = if has_condition(obj, "Ready") {
                "Running".to_string()
            } else {
                "NotReady".to_string()
            };
        }
    }
    let deleting = !at(obj, "/metadata/deletionTimestamp").is_null();
    if deleting && text(obj, "/status/reason") == "NodeLost" {
        reason = "Unknown".to_string();
    } else if deleting && phase != "Succeeded" && phase != "Failed" {
        reason = "Terminating".to_string();
    }
    let restarts_cell = match last_restart {
        Some(t) if restarts != 0 => format!("{restarts} ({} ago)", since(Some(t), now)),
        _ => restarts.to_string(),
    };

    let pod_ip = list(obj, "/status/podIPs")
        .first()
        .map(|ip| text(ip, "/ip"))
        .unwrap_or_else(|| text(obj, "/status/podIP"));
    let gates = list(obj, "/spec/readinessGates");
    let readiness_gates = if gates.is_empty() {
        "<none>".to_string()
    } else {
        let conditions = list(obj, "/status/conditions");
        let true_count = gates
            .iter()
            .filter(|g| {
                conditions
                    .iter()
                    .find(|c| text(c, "/type") == text(g, "/conditionType"))
                    .is_some_and(|c| text(c, "/status") == "True")
            })
            .count();
        format!("{true_count}/{}", gates.len())
    };
    vec![
        name(obj),
        format!("{ready}/{total}").into(),
        reason.into(),
        restarts_cell.into(),
        age(obj, now).into(),
        or_none(pod_ip).into(),
        or_none(text(obj, "/spec/nodeName")).into(),
        or_none(text(obj, "/status/nominatedNodeName")).into(),
        readiness_gates.into(),
    ]
}

fn service(obj: &Value, now: Timestamp) -> Vec<Value> {
    let cluster_ip = list(obj, "/spec/clusterIPs")
        .first()
        .and_then(Value::as_str)
        .unwrap_or_else(|| text(obj, "/spec/clusterIP"));
    let external_ips: Vec<&str> = list(obj, "/spec/externalIPs")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let external = match text(obj, "/spec/type") {
        "ClusterIP" | "NodePort" => or_none(&external_ips.join(",")),
        "LoadBalancer" => {
            // A sorted set of ingress IPs (or hostnames); never clipped, as the server prints wide.
            let lb: BTreeSet<&str> = list(obj, "/status/loadBalancer/ingress")
                .iter()
                .map(|i| match text(i, "/ip") {
                    "" => text(i, "/hostname"),
                    ip => ip,
                })
                .filter(|s| !s.is_empty())
                .collect();
            let all: Vec<&str> = lb.into_iter().chain(external_ips).collect();
            if all.is_empty() {
                "<pending>".to_string()
            } else {
                all.join(",")
            }
        }
        "ExternalName" => text(obj, "/spec/externalName").to_string(),
        _ => "<unknown>".to_string(),
    };
    let ports: Vec<String> = list(obj, "/spec/ports")
        .iter()
        .map(|p| {
            let protocol = match text(p, "/protocol") {
                "" => "TCP",
                proto => proto,
            };
            let node_port = int(p, "/nodePort");
            if node_port > 0 {
                format!("{}:{node_port}/{protocol}", int(p, "/port"))
            } else {
                format!("{}/{protocol}", int(p, "/port"))
            }
        })
        .collect();
    vec![
        name(obj),
        text(obj, "/spec/type").into(),
        or_none(cluster_ip).into(),
        external.into(),
        or_none(&ports.join(",")).into(),
        age(obj, now).into(),
        format_labels(at(obj, "/spec/selector")).into(),
    ]
}

/// `host:port`, with brackets around IPv6 hosts (Go's `net.JoinHostPort`).
fn join_host_port(host: &str, port: i64) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// upstream `formatEndpoints`: the first three `ip:port` pairs, then `+ N more...`.
fn format_endpoints(obj: &Value) -> String {
    const MAX: usize = 3;
    let subsets = list(obj, "/subsets");
    if subsets.is_empty() {
        return "<none>".to_string();
    }
    let mut shown = Vec::new();
    let mut more = false;
    let mut count = 0;
    for ss in subsets {
        let addresses = list(ss, "/addresses");
        let ports = list(ss, "/ports");
        if ports.is_empty() {
            count += addresses.len();
            for a in addresses {
                if shown.len() == MAX {
                    more = true;
                    break;
                }
                shown.push(text(a, "/ip").to_string());
            }
            continue;
        }
        for p in ports {
            count += addresses.len();
            for a in addresses {
                if shown.len() == MAX {
                    more = true;
                    break;
                }
                shown.push(join_host_port(text(a, "/ip"), int(p, "/port")));
            }
        }
    }
    let joined = shown.join(",");
    if more {
        format!("{joined} + {} more...", count - MAX)
    } else {
        joined
    }
}

/// upstream `listWithMoreString`.
fn list_with_more(items: Vec<String>, count: usize) -> String {
    const MAX: usize = 3;
    if count > MAX {
        let shown: Vec<String> = items.into_iter().take(MAX).collect();
        format!("{} + {} more...", shown.join(","), count - MAX)
    } else if items.is_empty() {
        "<unset>".to_string()
    } else {
        items.join(",")
    }
}

fn endpoint_slice(obj: &Value, now: Timestamp) -> Vec<Value> {
    let ports: Vec<String> = list(obj, "/ports")
        .iter()
        .map(
            |p| match (at(p, "/port").as_i64(), at(p, "/name").as_str()) {
                (Some(n), _) => n.to_string(),
                (None, Some(name)) => name.to_string(),
                (None, None) => "*".to_string(),
            },
        )
        .collect();
    let port_count = ports.len();
    let addresses: Vec<String> = list(obj, "/endpoints")
        .iter()
        .flat_map(|e| list(e, "/addresses"))
        .map(|a| a.as_str().unwrap_or("").to_string())
        .collect();
    let address_count = addresses.len();
    vec![
        name(obj),
        text(obj, "/addressType").into(),
        list_with_more(ports, port_count).into(),
        list_with_more(addresses, address_count).into(),
        age(obj, now).into(),
    ]
}

fn deployment(obj: &Value, now: Timestamp) -> Vec<Value> {
    let (names, images) = container_cells(list(obj, "/spec/template/spec/containers"));
    let replicas = at(obj, "/spec/replicas").as_i64().unwrap_or(1);
    let selector = selector_cell(at(obj, "/spec/selector"));
    vec![
        name(obj),
        format!("{}/{replicas}", int(obj, "/status/readyReplicas")).into(),
        json!(int(obj, "/status/updatedReplicas")),
        json!(int(obj, "/status/availableReplicas")),
        age(obj, now).into(),
        names.into(),
        images.into(),
        selector.into(),
    ]
}

/// upstream `printDaemonSet`: the node selector as `k=v,…` or `<none>`.
fn daemon_set(obj: &Value, now: Timestamp) -> Vec<Value> {
    let (names, images) = container_cells(list(obj, "/spec/template/spec/containers"));
    let node_selector = at(obj, "/spec/template/spec/nodeSelector")
        .as_object()
        .filter(|m| !m.is_empty())
        .map_or_else(
            || "<none>".to_string(),
            |m| {
                m.iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                    .collect::<Vec<_>>()
                    .join(",")
            },
        );
    vec![
        name(obj),
        json!(int(obj, "/status/desiredNumberScheduled")),
        json!(int(obj, "/status/currentNumberScheduled")),
        json!(int(obj, "/status/numberReady")),
        json!(int(obj, "/status/updatedNumberScheduled")),
        json!(int(obj, "/status/numberAvailable")),
        node_selector.into(),
        age(obj, now).into(),
        names.into(),
        images.into(),
        selector_cell(at(obj, "/spec/selector")).into(),
    ]
}

/// upstream `printReplicaSet`.
fn replica_set(obj: &Value, now: Timestamp) -> Vec<Value> {
    let (names, images) = container_cells(list(obj, "/spec/template/spec/containers"));
    vec![
        name(obj),
        json!(at(obj, "/spec/replicas").as_i64().unwrap_or(1)),
        json!(int(obj, "/status/replicas")),
        json!(int(obj, "/status/readyReplicas")),
        age(obj, now).into(),
        names.into(),
        images.into(),
        selector_cell(at(obj, "/spec/selector")).into(),
    ]
}

/// upstream `printControllerRevision`: the controller as `<kind>.<group>/<name>`.
fn controller_revision(obj: &Value, now: Timestamp) -> Vec<Value> {
    let controller = list(obj, "/metadata/ownerReferences")
        .iter()
        .find(|o| at(o, "/controller").as_bool() == Some(true))
        .map_or_else(
            || "<none>".to_string(),
            |o| {
                let group = text(o, "/apiVersion")
                    .rsplit_once('/')
                    .map_or("", |(g, _)| g);
                let kind = text(o, "/kind").to_lowercase();
                let kind = if group.is_empty() {
                    kind
                } else {
                    format!("{kind}.{group}")
                };
                format!("{kind}/{}", text(o, "/name"))
            },
        );
    vec![
        name(obj),
        controller.into(),
        json!(int(obj, "/revision")),
        age(obj, now).into(),
    ]
}

fn selector_cell(sel: &Value) -> String {
    match serde_json::from_value(sel.clone()) {
        Ok(sel) => LabelSelector::from_k8s(&sel)
            .map(|s| s.to_string())
            .unwrap_or_else(|_| "<invalid>".to_string()),
        Err(_) => "<invalid>".to_string(),
    }
}

fn node(obj: &Value, now: Timestamp) -> Vec<Value> {
    let mut status = Vec::new();
    if let Some(c) = list(obj, "/status/conditions")
        .iter()
        .rev()
        .find(|c| text(c, "/type") == "Ready")
    {
        status.push(if text(c, "/status") == "True" {
            "Ready"
        } else {
            "NotReady"
        });
    }
    if status.is_empty() {
        status.push("Unknown");
    }
    if at(obj, "/spec/unschedulable").as_bool() == Some(true) {
        status.push("SchedulingDisabled");
    }
    let mut roles = BTreeSet::new();
    if let Some(labels) = at(obj, "/metadata/labels").as_object() {
        for (k, v) in labels {
            if let Some(role) = k.strip_prefix("node-role.kubernetes.io/") {
                if !role.is_empty() {
                    roles.insert(role.to_string());
                }
            } else if k == "kubernetes.io/role" {
                let v = v.as_str().unwrap_or("");
                if !v.is_empty() {
                    roles.insert(v.to_string());
                }
            }
        }
    }
    let roles: Vec<String> = roles.into_iter().collect();
    let address = |ty: &str| {
        list(obj, "/status/addresses")
            .iter()
            .find(|a| text(a, "/type") == ty)
            .map(|a| text(a, "/address").to_string())
            .unwrap_or_else(|| "<none>".to_string())
    };
    let unknown = |p: &str| match text(obj, p) {
        "" => "<unknown>".to_string(),
        v => v.to_string(),
    };
    vec![
        name(obj),
        status.join(",").into(),
        or_none(&roles.join(",")).into(),
        age(obj, now).into(),
        text(obj, "/status/nodeInfo/kubeletVersion").into(),
        address("InternalIP").into(),
        address("ExternalIP").into(),
        unknown("/status/nodeInfo/osImage").into(),
        unknown("/status/nodeInfo/kernelVersion").into(),
        unknown("/status/nodeInfo/containerRuntimeVersion").into(),
    ]
}

fn event(obj: &Value, now: Timestamp) -> Vec<Value> {
    let first = match parse_time(text(obj, "/firstTimestamp")) {
        Some(t) => since(Some(t), now),
        None => since(parse_time(text(obj, "/eventTime")), now),
    };
    let mut last = match parse_time(text(obj, "/lastTimestamp")) {
        Some(t) => since(Some(t), now),
        None => first.clone(),
    };
    let mut count = int(obj, "/count");
    if at(obj, "/series").is_object() {
        last = since(parse_time(text(obj, "/series/lastObservedTime")), now);
        count = int(obj, "/series/count");
    } else if count == 0 {
        count = 1;
    }
    let kind = text(obj, "/involvedObject/kind").to_lowercase();
    let target = match text(obj, "/involvedObject/name") {
        "" => kind,
        n => format!("{kind}/{n}"),
    };
    let first_non_empty = |a: &str, b: &str| {
        if a.is_empty() {
            b.to_string()
        } else {
            a.to_string()
        }
    };
    let component = first_non_empty(
        text(obj, "/source/component"),
        text(obj, "/reportingComponent"),
    );
    let instance = first_non_empty(text(obj, "/source/host"), text(obj, "/reportingInstance"));
    let source = if instance.is_empty() {
        component
    } else {
        format!("{component}, {instance}")
    };
    vec![
        last.into(),
        text(obj, "/type").into(),
        text(obj, "/reason").into(),
        target.into(),
        text(obj, "/involvedObject/fieldPath").into(),
        source.into(),
        text(obj, "/message").trim().into(),
        first.into(),
        json!(count),
        name(obj),
    ]
}

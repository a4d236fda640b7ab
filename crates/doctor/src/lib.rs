//! `svcnet doctor`'s core: the mistakes people make with Services, found in a snapshot of API
//! objects, each explained with its fix. The seeds' hardest-to-see failures are here: a
//! selector that matches no pod (and the nearest labels that exist), pods that match but are
//! not Ready, a `targetPort` no container declares, a StatefulSet whose `serviceName` names no
//! headless Service (no `web-0.nginx` DNS names), pods that wait for each other's DNS names
//! while `publishNotReadyAddresses` is off, node ports outside the range, endpoints on nodes
//! that are not Ready, ExternalName targets that are IPs, that do not resolve, or that the
//! search path (`ndots:5`) turns into several queries, and node proxies that stopped, fail to
//! sync or whose rules are older than a service ([`proxies`]).
//!
//! Pure: objects in, [`Finding`]s out; it never talks to an API server or resolves a name
//! (the caller puts what names resolve to in the [`Snapshot`]).

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;
use svcnet_proxy::status::ProxyStatus;

mod proxies;

/// How bad a finding is; any [`Severity::Error`] makes `svcnet doctor` exit non-zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warning,
    Error,
}

/// One thing found, on one object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub severity: Severity,
    /// `svc/NS/NAME`, `sts/NS/NAME`.
    pub object: String,
    /// A stable name for the kind of mistake (`selector-matches-nothing`, ...).
    pub check: &'static str,
    pub message: String,
    pub fix: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sev = match self.severity {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Error => "error",
        };
        write!(
            f,
            "{sev:<7} {}: {}\n        fix: {}",
            self.object, self.message, self.fix
        )
    }
}

/// What the checks look at: everything of the namespaces in scope.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    pub services: Vec<Service>,
    pub pods: Vec<Pod>,
    pub statefulsets: Vec<StatefulSet>,
    pub nodes: Vec<Node>,
    pub slices: Vec<EndpointSlice>,
    /// The node proxies' own reports (their Leases, see `svcnet_proxy::status`).
    pub proxies: Vec<ProxyStatus>,
    /// When the snapshot was taken (`None`: the proxy checks do not run).
    pub now: Option<Timestamp>,
    /// What each ExternalName target resolved to when the snapshot was taken (a target
    /// missing here is not checked).
    pub external_names: BTreeMap<String, Resolution>,
}

/// The outcome of looking an ExternalName target up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// It has addresses (or, in the cluster domain, names an existing Service).
    Resolves(Vec<String>),
    /// The name does not exist or has no address: why.
    NoSuchName(String),
    /// It could not be checked (no answer, an error): why.
    Unknown(String),
}

/// Settings of the cluster the checks need.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub node_port_range: std::ops::RangeInclusive<i32>,
}

impl Default for Cluster {
    fn default() -> Self {
        Cluster {
            node_port_range: 30000..=32767,
        }
    }
}

/// Every finding on the snapshot, worst first; `only` limits them to one Service
/// (`NS/NAME`) and what governs it.
pub fn diagnose(snap: &Snapshot, cluster: &Cluster, only: Option<(&str, &str)>) -> Vec<Finding> {
    let mut out = Vec::new();
    proxies::node_proxy_checks(snap, &mut out);
    for svc in &snap.services {
        let (ns, name) = ns_name(&svc.metadata);
        if only.is_some_and(|o| o != (ns, name)) {
            continue;
        }
        service_checks(snap, cluster, svc, &mut out);
    }
    for sts in &snap.statefulsets {
        let service = sts
            .spec
            .as_ref()
            .map(|s| s.service_name.as_deref().unwrap_or(""));
        let (ns, _) = ns_name(&sts.metadata);
        if only.is_some_and(|o| o != (ns, service.unwrap_or(""))) {
            continue;
        }
        statefulset_checks(snap, sts, &mut out);
    }
    out.sort_by(|a, b| b.severity.cmp(&a.severity).then(a.object.cmp(&b.object)));
    out
}

fn ns_name(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> (&str, &str) {
    (
        m.namespace.as_deref().unwrap_or("default"),
        m.name.as_deref().unwrap_or(""),
    )
}

fn labels(p: &Pod) -> BTreeMap<String, String> {
    p.metadata.labels.clone().unwrap_or_default()
}

fn selects(selector: &BTreeMap<String, String>, pod: &Pod) -> bool {
    let l = labels(pod);
    selector.iter().all(|(k, v)| l.get(k) == Some(v))
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

fn pods_in<'a>(snap: &'a Snapshot, ns: &str) -> impl Iterator<Item = &'a Pod> {
    let ns = ns.to_string();
    snap.pods
        .iter()
        .filter(move |p| p.metadata.namespace.as_deref().unwrap_or("default") == ns)
}

fn service_checks(snap: &Snapshot, cluster: &Cluster, svc: &Service, out: &mut Vec<Finding>) {
    let (ns, name) = ns_name(&svc.metadata);
    let object = format!("svc/{ns}/{name}");
    let Some(spec) = &svc.spec else { return };
    let push = |out: &mut Vec<Finding>, severity, check, message: String, fix: String| {
        out.push(Finding {
            severity,
            object: object.clone(),
            check,
            message,
            fix,
        });
    };
    if spec.type_.as_deref() == Some("ExternalName") {
        external_name_checks(
            snap,
            spec.external_name.as_deref().unwrap_or(""),
            &object,
            out,
        );
        return;
    }
    proxies::service_rule_checks(snap, svc, &object, out);
    for p in spec.ports.iter().flatten() {
        if let Some(np) = p.node_port
            && !cluster.node_port_range.contains(&np)
        {
            push(
                out,
                Severity::Error,
                "node-port-out-of-range",
                format!(
                    "port {} has nodePort {np}, outside the node port range {}-{}",
                    p.port,
                    cluster.node_port_range.start(),
                    cluster.node_port_range.end()
                ),
                "leave nodePort empty to get one from the range, or pick one inside it".into(),
            );
        }
    }
    let Some(selector) = spec.selector.as_ref().filter(|s| !s.is_empty()) else {
        return; // Selector-less: its Endpoints are the user's own.
    };
    let candidates: Vec<&Pod> = pods_in(snap, ns).collect();
    let selected: Vec<&Pod> = candidates
        .iter()
        .copied()
        .filter(|p| selects(selector, p))
        .collect();
    let sel_text = render_labels(selector);
    if selected.is_empty() {
        let nearest = nearest(selector, &candidates);
        push(
            out,
            Severity::Error,
            "selector-matches-nothing",
            format!(
                "its selector {sel_text} matches no pod in namespace {ns}, so it has no endpoints{}",
                match &nearest {
                    Some((pod, missing)) => format!(
                        "; nearest: pod {pod} has {} but not {}",
                        render_labels(&labels_of(&candidates, pod)),
                        missing.join(", ")
                    ),
                    None => " (there are no pods in it at all)".to_string(),
                }
            ),
            "make the selector and the pod template's labels agree (kubectl get pods --show-labels)"
                .into(),
        );
        return;
    }
    let publish = spec.publish_not_ready_addresses == Some(true);
    let live: Vec<&Pod> = selected
        .iter()
        .copied()
        .filter(|p| !terminating(p))
        .collect();
    let ready = live.iter().filter(|p| is_ready(p)).count();
    if ready == 0 && !publish && !live.is_empty() {
        let why: Vec<String> = live.iter().map(|p| not_ready_reason(p)).collect();
        push(
            out,
            Severity::Error,
            "no-ready-pods",
            format!(
                "{} pod(s) match {sel_text} but none is Ready, so none receives traffic: {}",
                live.len(),
                why.join("; ")
            ),
            "fix what keeps them from Ready (kubectl describe pod, kubectl logs); a readiness probe must pass".into(),
        );
    } else if ready < live.len() && !publish {
        push(
            out,
            Severity::Warning,
            "some-pods-not-ready",
            format!(
                "{ready} of {} matching pods are Ready; the others get no traffic: {}",
                live.len(),
                live.iter()
                    .filter(|p| !is_ready(p))
                    .map(|p| not_ready_reason(p))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            "kubectl describe pod shows which probe or container is failing".into(),
        );
    }
    for port in spec.ports.iter().flatten() {
        target_port_check(port, &selected, &object, out);
    }
    node_checks(snap, &selected, &object, out);
}

fn labels_of(pods: &[&Pod], name: &str) -> BTreeMap<String, String> {
    pods.iter()
        .find(|p| p.metadata.name.as_deref() == Some(name))
        .map(|p| labels(p))
        .unwrap_or_default()
}

/// The pod sharing the most of the selector's pairs, and the pairs it lacks.
fn nearest(selector: &BTreeMap<String, String>, pods: &[&Pod]) -> Option<(String, Vec<String>)> {
    pods.iter()
        .map(|p| {
            let l = labels(p);
            let missing: Vec<String> = selector
                .iter()
                .filter(|(k, v)| l.get(*k) != Some(*v))
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            (
                missing.len(),
                p.metadata.name.clone().unwrap_or_default(),
                missing,
            )
        })
        .filter(|(n, _, _)| *n < selector.len())
        .min_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)))
        .map(|(_, name, missing)| (name, missing))
}

fn render_labels(m: &BTreeMap<String, String>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Why a pod is not Ready, from its status: a container waiting (and why), crashing, or
/// running with a readiness probe that does not pass yet.
fn not_ready_reason(pod: &Pod) -> String {
    let name = pod.metadata.name.as_deref().unwrap_or("");
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    let probes: BTreeMap<String, String> = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .filter_map(|c| Some((c.name.clone(), describe_probe(c.readiness_probe.as_ref()?))))
        .collect();
    for cs in status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
    {
        if cs.ready {
            continue;
        }
        let state = cs.state.as_ref();
        if let Some(w) = state.and_then(|s| s.waiting.as_ref()) {
            return format!(
                "pod {name}: container {} is waiting ({}{})",
                cs.name,
                w.reason.as_deref().unwrap_or("no reason"),
                w.message
                    .as_deref()
                    .map(|m| format!(": {m}"))
                    .unwrap_or_default()
            );
        }
        if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
            return format!(
                "pod {name}: container {} exited with code {} ({} restarts)",
                cs.name, t.exit_code, cs.restart_count
            );
        }
        return match probes.get(&cs.name) {
            Some(p) => format!(
                "pod {name}: container {} runs but its readiness probe ({p}) does not pass",
                cs.name
            ),
            None => format!("pod {name}: container {} runs but is not ready", cs.name),
        };
    }
    format!("pod {name} is {phase}")
}

fn describe_probe(p: &k8s_openapi::api::core::v1::Probe) -> String {
    if let Some(h) = &p.http_get {
        return format!(
            "httpGet {}{}",
            port_text(&h.port),
            h.path.as_deref().unwrap_or("/")
        );
    }
    if let Some(t) = &p.tcp_socket {
        return format!("tcpSocket {}", port_text(&t.port));
    }
    if let Some(e) = &p.exec {
        return format!("exec {}", e.command.clone().unwrap_or_default().join(" "));
    }
    "a probe".into()
}

fn port_text(p: &IntOrString) -> String {
    match p {
        IntOrString::Int(n) => format!(":{n}"),
        IntOrString::String(s) => format!(":{s}"),
    }
}

fn target_port_check(
    port: &k8s_openapi::api::core::v1::ServicePort,
    pods: &[&Pod],
    object: &str,
    out: &mut Vec<Finding>,
) {
    let target = port
        .target_port
        .clone()
        .unwrap_or(IntOrString::Int(port.port));
    let protocol = port.protocol.as_deref().unwrap_or("TCP");
    let declared = |p: &Pod| -> Vec<(Option<String>, i32, String)> {
        p.spec
            .iter()
            .flat_map(|s| &s.containers)
            .flat_map(|c| c.ports.iter().flatten())
            .map(|cp| {
                (
                    cp.name.clone(),
                    cp.container_port,
                    cp.protocol.clone().unwrap_or_else(|| "TCP".into()),
                )
            })
            .collect()
    };
    let label = port.name.clone().unwrap_or_else(|| port.port.to_string());
    match &target {
        IntOrString::String(named) => {
            let missing: Vec<&str> = pods
                .iter()
                .filter(|p| {
                    !declared(p)
                        .iter()
                        .any(|(n, _, proto)| n.as_deref() == Some(named) && proto == protocol)
                })
                .filter_map(|p| p.metadata.name.as_deref())
                .collect();
            if !missing.is_empty() {
                out.push(Finding {
                    severity: Severity::Error,
                    object: object.into(),
                    check: "target-port-not-declared",
                    message: format!(
                        "port {label} targets the named port {named:?}/{protocol}, which no container of pod(s) {} declares, so they are left out of its endpoints",
                        missing.join(", ")
                    ),
                    fix: format!(
                        "name a containerPort {named:?} in the pod template, or give targetPort as a number"
                    ),
                });
            }
        }
        IntOrString::Int(n) => {
            let any_declares = pods.iter().any(|p| !declared(p).is_empty());
            let declares_n = pods.iter().any(|p| {
                declared(p)
                    .iter()
                    .any(|(_, cp, proto)| cp == n && proto == protocol)
            });
            if any_declares && !declares_n {
                let ports: Vec<String> = pods
                    .iter()
                    .flat_map(|p| declared(p))
                    .map(|(_, cp, proto)| format!("{cp}/{proto}"))
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect();
                out.push(Finding {
                    severity: Severity::Warning,
                    object: object.into(),
                    check: "target-port-not-declared",
                    message: format!(
                        "port {label} sends traffic to port {n}/{protocol}, but the selected pods declare only {}; connections are refused unless the process also listens on {n}",
                        ports.join(", ")
                    ),
                    fix: "set targetPort to the port the container listens on".into(),
                });
            }
        }
    }
}

fn node_checks(snap: &Snapshot, pods: &[&Pod], object: &str, out: &mut Vec<Finding>) {
    for pod in pods {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else {
            continue;
        };
        let ready = snap
            .nodes
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(node))
            .and_then(|n| n.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .map(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let problem = match ready {
            None => "does not exist",
            Some(false) => "is not Ready (its proxy may not be programming the rules)",
            Some(true) => continue,
        };
        out.push(Finding {
            severity: Severity::Warning,
            object: object.into(),
            check: "endpoint-on-unready-node",
            message: format!(
                "pod {} is on node {node}, which {problem}",
                pod.metadata.name.as_deref().unwrap_or("")
            ),
            fix: "check the node (kubectl describe node); its pods are rescheduled once it is gone"
                .into(),
        });
    }
}

fn external_name_checks(snap: &Snapshot, target: &str, object: &str, out: &mut Vec<Finding>) {
    let push = |out: &mut Vec<Finding>, severity, check, message: String, fix: String| {
        out.push(Finding {
            severity,
            object: object.into(),
            check,
            message,
            fix,
        })
    };
    if target.parse::<std::net::IpAddr>().is_ok() {
        push(
            out,
            Severity::Error,
            "external-name-is-ip",
            format!(
                "externalName {target:?} is an IP address; DNS answers it as a CNAME to a name that does not exist"
            ),
            "use a Service without a selector and a hand-written Endpoints (the seeds' external database) for an IP".into(),
        );
        return;
    }
    match snap.external_names.get(target) {
        Some(Resolution::NoSuchName(why)) => push(
            out,
            Severity::Error,
            "external-name-does-not-resolve",
            format!(
                "externalName {target:?} does not resolve ({why}): clients follow the CNAME and get no address"
            ),
            "correct the name (kubectl edit), or create what it names".into(),
        ),
        Some(Resolution::Unknown(why)) => push(
            out,
            Severity::Info,
            "external-name-unchecked",
            format!("could not check whether externalName {target:?} resolves: {why}"),
            "run doctor where the cluster's upstream DNS answers, or give it --nameserver".into(),
        ),
        Some(Resolution::Resolves(_)) | None => {}
    }
    let dots = target.trim_end_matches('.').matches('.').count();
    if !target.ends_with('.') && dots < 5 {
        push(
            out,
            Severity::Info,
            "search-path",
            format!(
                "pods resolve {target:?} through their search path first (ndots:5: a name with fewer than 5 dots tries each of the namespace's search domains before itself), several extra queries per lookup"
            ),
            format!("clients that care can ask for {target}. (with the final dot)"),
        );
    }
}

fn statefulset_checks(snap: &Snapshot, sts: &StatefulSet, out: &mut Vec<Finding>) {
    let (ns, name) = ns_name(&sts.metadata);
    let object = format!("sts/{ns}/{name}");
    let Some(spec) = &sts.spec else { return };
    let service_name = spec.service_name.as_deref().unwrap_or("");
    let push = |out: &mut Vec<Finding>, severity, check, message: String, fix: String| {
        out.push(Finding {
            severity,
            object: object.clone(),
            check,
            message,
            fix,
        })
    };
    if service_name.is_empty() {
        push(
            out,
            Severity::Warning,
            "statefulset-without-service",
            "serviceName is empty, so its pods get no stable DNS names".into(),
            "create a headless Service (clusterIP: None) selecting the pods and name it in serviceName".into(),
        );
        return;
    }
    let service = snap.services.iter().find(|s| {
        s.metadata.namespace.as_deref().unwrap_or("default") == ns
            && s.metadata.name.as_deref() == Some(service_name)
    });
    let Some(service) = service else {
        push(
            out,
            Severity::Error,
            "statefulset-service-missing",
            format!(
                "serviceName {service_name:?} names no Service in namespace {ns}, so {name}-0.{service_name}.{ns}.svc does not resolve"
            ),
            format!(
                "create a headless Service {service_name:?} (clusterIP: None) selecting the StatefulSet's pods"
            ),
        );
        return;
    };
    let svc_spec = service.spec.clone().unwrap_or_default();
    if svc_spec.cluster_ip.as_deref() != Some("None") {
        push(
            out,
            Severity::Error,
            "statefulset-service-not-headless",
            format!(
                "serviceName {service_name:?} is not headless (clusterIP {}), so its pods get no per-pod DNS names like {name}-0.{service_name}.{ns}.svc",
                svc_spec.cluster_ip.as_deref().unwrap_or("unset")
            ),
            "give the Service clusterIP: None (a new Service: clusterIP cannot change)".into(),
        );
        return;
    }
    // Pods that are not Ready have no DNS names unless the service publishes them: peers
    // that find each other by name before they become Ready (databases forming a cluster)
    // wait forever.
    let template: BTreeMap<String, String> = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let pods: Vec<&Pod> = pods_in(snap, ns)
        .filter(|p| !template.is_empty() && selects(&template, p))
        .collect();
    let waiting = pods.iter().filter(|p| !is_ready(p)).count();
    if waiting > 0 && svc_spec.publish_not_ready_addresses != Some(true) {
        push(
            out,
            Severity::Warning,
            "publish-not-ready-addresses",
            format!(
                "{waiting} of its pods are not Ready and Service {service_name:?} does not publish not-ready addresses, so they have no DNS names yet; pods that look each other up by name before they are Ready never will be"
            ),
            format!(
                "set publishNotReadyAddresses: true on Service {service_name:?} if the pods find each other by name while starting"
            ),
        );
    }
}

#[cfg(test)]
mod tests;

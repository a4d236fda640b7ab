#![allow(clippy::unwrap_used)]

use super::*;

/// A snapshot from a multi-document YAML manifest (objects with their status).
fn snap(yaml: &str) -> Snapshot {
    let mut s = Snapshot::default();
    for doc in yaml.split("\n---\n") {
        if doc.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_saphyr::from_str(doc).unwrap();
        match v["kind"].as_str().unwrap() {
            "Service" => s.services.push(serde_json::from_value(v).unwrap()),
            "Pod" => s.pods.push(serde_json::from_value(v).unwrap()),
            "StatefulSet" => s.statefulsets.push(serde_json::from_value(v).unwrap()),
            "Node" => s.nodes.push(serde_json::from_value(v).unwrap()),
            other => panic!("no {other} in a snapshot"),
        }
    }
    s
}

fn checks(yaml: &str) -> Vec<(Severity, &'static str, String)> {
    diagnose(&snap(yaml), &Cluster::default(), None)
        .into_iter()
        .map(|f| (f.severity, f.check, f.message))
        .collect()
}

const READY_NODE: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: n1}
status: {conditions: [{type: Ready, status: "True"}]}
"#;

fn pod(name: &str, labels: &str, ready: bool, extra: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default, labels: {labels}}}
spec:
  nodeName: n1
  containers:
  - name: web
    image: nginx
    ports: [{{name: http, containerPort: 80}}]
{extra}
status:
  phase: Running
  conditions: [{{type: Ready, status: "{}"}}]
  containerStatuses: [{{name: web, ready: {ready}, restartCount: 0, image: nginx, imageID: "", state: {{running: {{}}}}}}]
"#,
        if ready { "True" } else { "False" }
    )
}

fn svc(name: &str, spec: &str) -> String {
    format!(
        "\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec:\n{spec}\n"
    )
}

fn join(parts: &[String]) -> String {
    parts.join("\n---\n")
}

#[test]
fn a_healthy_service_has_no_finding() {
    let y = join(&[
        READY_NODE.into(),
        pod("a", "{app: web}", true, ""),
        svc(
            "web",
            "  selector: {app: web}\n  ports: [{port: 80, targetPort: http}]",
        ),
    ]);
    assert_eq!(checks(&y), vec![]);
}

#[test]
fn a_selector_that_matches_nothing_names_the_nearest_pod() {
    let y = join(&[
        READY_NODE.into(),
        pod("a", "{app: myapp, release: stable}", true, ""),
        svc(
            "myapp",
            "  selector: {app: myapp, release: stabel}\n  ports: [{port: 80}]",
        ),
    ]);
    let found = checks(&y);
    assert_eq!(found.len(), 1, "{found:?}");
    let (sev, check, msg) = &found[0];
    assert_eq!(
        (*sev, *check),
        (Severity::Error, "selector-matches-nothing")
    );
    assert!(
        msg.contains("nearest: pod a has app=myapp,release=stable but not release=stabel"),
        "{msg}"
    );
}

#[test]
fn matching_pods_that_are_not_ready_say_why() {
    let probe = "    readinessProbe: {httpGet: {path: /healthz, port: 8080}}";
    let y = join(&[
        READY_NODE.into(),
        pod("a", "{app: web}", false, probe),
        svc(
            "web",
            "  selector: {app: web}\n  ports: [{port: 80, targetPort: 80}]",
        ),
    ]);
    let found = checks(&y);
    assert_eq!(found[0].1, "no-ready-pods", "{found:?}");
    assert!(
        found[0]
            .2
            .contains("readiness probe (httpGet :8080/healthz) does not pass"),
        "{found:?}"
    );
    // One of two ready: a warning.
    let y = join(&[
        READY_NODE.into(),
        pod("a", "{app: web}", false, probe),
        pod("b", "{app: web}", true, ""),
        svc(
            "web",
            "  selector: {app: web}\n  ports: [{port: 80, targetPort: 80}]",
        ),
    ]);
    assert_eq!(checks(&y)[0].0, Severity::Warning);
    // publishNotReadyAddresses: not-ready pods are endpoints on purpose.
    let y = join(&[
        READY_NODE.into(),
        pod("a", "{app: web}", false, probe),
        svc(
            "web",
            "  selector: {app: web}\n  publishNotReadyAddresses: true\n  ports: [{port: 80, targetPort: 80}]",
        ),
    ]);
    assert_eq!(checks(&y), vec![]);
}

#[test]
fn a_target_port_no_container_declares() {
    let y = join(&[
        READY_NODE.into(),
        pod("a", "{app: web}", true, ""),
        svc(
            "web",
            "  selector: {app: web}\n  ports: [{name: a, port: 80, targetPort: htpp}, {name: b, port: 81, targetPort: 8080}]",
        ),
    ]);
    let found = checks(&y);
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(
        (found[0].0, found[0].1),
        (Severity::Error, "target-port-not-declared")
    );
    assert!(found[0].2.contains("\"htpp\""), "{found:?}");
    assert_eq!(
        (found[1].0, found[1].1),
        (Severity::Warning, "target-port-not-declared")
    );
    assert!(
        found[1].2.contains("8080/TCP") && found[1].2.contains("80/TCP"),
        "{found:?}"
    );
}

fn sts(service: &str) -> String {
    format!(
        r#"
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: web, namespace: default}}
spec:
  serviceName: {service}
  selector: {{matchLabels: {{app: nginx}}}}
  template:
    metadata: {{labels: {{app: nginx}}}}
    spec: {{containers: [{{name: nginx, image: nginx}}]}}
"#
    )
}

#[test]
fn a_statefulset_needs_its_headless_service() {
    let found = checks(&sts("nginx"));
    assert_eq!(found[0].1, "statefulset-service-missing", "{found:?}");
    assert!(found[0].2.contains("web-0.nginx.default.svc"), "{found:?}");
    let y = join(&[
        sts("nginx"),
        svc(
            "nginx",
            "  clusterIP: 10.96.3.3\n  selector: {app: nginx}\n  ports: [{port: 80}]",
        ),
    ]);
    let found = checks(&y);
    assert!(
        found
            .iter()
            .any(|f| f.1 == "statefulset-service-not-headless"),
        "{found:?}"
    );
    let y = join(&[
        READY_NODE.into(),
        sts("nginx"),
        svc(
            "nginx",
            "  clusterIP: None\n  selector: {app: nginx}\n  ports: [{port: 80}]",
        ),
        pod("web-0", "{app: nginx}", false, ""),
    ]);
    let found = checks(&y);
    assert!(
        found.iter().any(|f| f.1 == "publish-not-ready-addresses"),
        "{found:?}"
    );
}

#[test]
fn node_ports_nodes_and_external_names() {
    let y = svc(
        "np",
        "  type: NodePort\n  ports: [{port: 80, nodePort: 29999}]",
    );
    assert_eq!(checks(&y)[0].1, "node-port-out-of-range");
    let y = join(&[
        pod("a", "{app: web}", true, ""),
        svc(
            "web",
            "  selector: {app: web}\n  ports: [{port: 80, targetPort: 80}]",
        ),
    ]);
    let found = checks(&y);
    assert_eq!(found[0].1, "endpoint-on-unready-node", "{found:?}");
    assert!(
        found[0].2.contains("node n1, which does not exist"),
        "{found:?}"
    );
    let y = svc("db", "  type: ExternalName\n  externalName: 192.168.1.5");
    assert_eq!(checks(&y)[0].1, "external-name-is-ip");
    let y = svc("ext", "  type: ExternalName\n  externalName: www.baidu.com");
    assert_eq!(
        checks(&y)[0],
        (Severity::Info, "search-path", checks(&y)[0].2.clone())
    );
    assert_eq!(
        checks(&svc(
            "ext",
            "  type: ExternalName\n  externalName: www.baidu.com."
        )),
        vec![]
    );
}

#[test]
fn one_service_at_a_time() {
    let y = join(&[
        sts("nginx"),
        svc(
            "other",
            "  type: NodePort\n  ports: [{port: 80, nodePort: 1}]",
        ),
    ]);
    let all = diagnose(&snap(&y), &Cluster::default(), None);
    assert_eq!(all.len(), 2);
    let one = diagnose(&snap(&y), &Cluster::default(), Some(("default", "nginx")));
    assert_eq!(one.len(), 1, "{one:?}");
    assert_eq!(one[0].object, "sts/default/web");
}

fn at(s: &str) -> Timestamp {
    s.parse().unwrap()
}

/// A proxy on `node` that renewed its lease at 10:00:00 and applied up to revision 100.
fn proxy(node: &str) -> ProxyStatus {
    ProxyStatus {
        node: node.into(),
        mode: "nftables".into(),
        services_revision: Some(100),
        slices_revision: Some(100),
        last_sync: Some(at("2026-12-02T09:59:59Z")),
        renewed: Some(at("2026-12-02T10:00:00Z")),
        duration_seconds: 40,
        ..Default::default()
    }
}

/// The healthy service of `a_healthy_service_has_no_finding`, at revision 90, with an
/// EndpointSlice at `slice_rev`, and node proxies seen at `now`.
fn with_proxies(
    proxies: Vec<ProxyStatus>,
    slice_rev: u64,
    now: &str,
) -> Vec<(Severity, &'static str, String)> {
    let y = join(&[
        READY_NODE.into(),
        pod("a", "{app: web}", true, ""),
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default, resourceVersion: \"90\"}\nspec: {selector: {app: web}, ports: [{port: 80, targetPort: http}]}".into(),
    ]);
    let mut s = snap(&y);
    s.slices.push(
        serde_json::from_value(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-abc", "namespace": "default", "resourceVersion": slice_rev.to_string(),
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4", "endpoints": []
        }))
        .unwrap(),
    );
    s.proxies = proxies;
    s.now = Some(at(now));
    diagnose(&s, &Cluster::default(), None)
        .into_iter()
        .map(|f| (f.severity, f.check, f.message))
        .collect()
}

#[test]
fn running_proxies_with_current_rules_have_no_finding() {
    assert_eq!(
        with_proxies(vec![proxy("n1")], 95, "2026-12-02T10:00:05Z"),
        vec![]
    );
    // No svcnet proxy at all (another proxy may run): nothing is compared.
    assert_eq!(with_proxies(vec![], 95, "2026-12-02T10:00:05Z"), vec![]);
}

#[test]
fn a_proxy_that_stopped_or_went_silent_is_not_running() {
    let found = with_proxies(vec![proxy("n1")], 95, "2026-12-02T10:00:41Z");
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        (found[0].0, found[0].1),
        (Severity::Error, "proxy-not-running")
    );
    assert!(
        found[0].2.contains("last reported 41 s ago"),
        "{}",
        found[0].2
    );
    let stopped = ProxyStatus {
        stopped: Some(at("2026-12-02T10:00:01Z")),
        ..proxy("n1")
    };
    let found = with_proxies(vec![stopped], 95, "2026-12-02T10:00:05Z");
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].1, "proxy-not-running");
    assert!(found[0].2.contains("stopped 4 s ago"), "{}", found[0].2);
}

#[test]
fn a_proxy_that_cannot_sync_says_why_and_its_rules_are_stale() {
    let failing = ProxyStatus {
        sync_error: Some("nftables ipv4: libnftables.so.1: cannot open".into()),
        ..proxy("n1")
    };
    let found = with_proxies(vec![failing], 120, "2026-12-02T10:00:05Z");
    let checks: Vec<&str> = found.iter().map(|f| f.1).collect();
    assert_eq!(
        checks,
        vec!["proxy-sync-failing", "proxy-rules-stale"],
        "{found:?}"
    );
    assert!(found[0].2.contains("libnftables.so.1"), "{}", found[0].2);
    assert!(
        found[1].2.contains("endpoints up to 100") && found[1].2.contains("EndpointSlices at 120"),
        "{}",
        found[1].2
    );
}

#[test]
fn rules_older_than_the_service_or_its_endpoints_are_stale() {
    // The slice is newer than what the running proxy applied.
    let found = with_proxies(vec![proxy("n1")], 101, "2026-12-02T10:00:05Z");
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        (found[0].0, found[0].1),
        (Severity::Warning, "proxy-rules-stale")
    );
    assert!(
        found[0].2.contains("older than its endpoints"),
        "{}",
        found[0].2
    );
    // The Service itself is newer.
    let behind = ProxyStatus {
        services_revision: Some(80),
        ..proxy("n1")
    };
    let found = with_proxies(vec![behind], 95, "2026-12-02T10:00:05Z");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].2.contains("older than the Service"),
        "{}",
        found[0].2
    );
    // A proxy that has not synced yet has applied nothing.
    let fresh = ProxyStatus {
        services_revision: None,
        slices_revision: None,
        last_sync: None,
        ..proxy("n1")
    };
    let found = with_proxies(vec![fresh], 95, "2026-12-02T10:00:05Z");
    assert!(
        found[0].2.contains("last successful sync never"),
        "{found:?}"
    );
}

#[test]
fn a_node_without_a_proxy_while_others_have_one() {
    let found = with_proxies(vec![proxy("n2")], 95, "2026-12-02T10:00:05Z");
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        (found[0].0, found[0].1),
        (Severity::Warning, "proxy-missing")
    );
    assert!(found[0].2.contains("node n1"), "{}", found[0].2);
}

#[test]
fn external_names_that_do_not_resolve() {
    let y = join(&[
        svc("db", "  type: ExternalName\n  externalName: db.example.org"),
        svc(
            "gone",
            "  type: ExternalName\n  externalName: nothere.example.org",
        ),
        svc(
            "far",
            "  type: ExternalName\n  externalName: slow.example.org",
        ),
    ]);
    let mut s = snap(&y);
    s.external_names.insert(
        "db.example.org".into(),
        Resolution::Resolves(vec!["192.0.2.10".into()]),
    );
    s.external_names.insert(
        "nothere.example.org".into(),
        Resolution::NoSuchName("NXDOMAIN".into()),
    );
    s.external_names.insert(
        "slow.example.org".into(),
        Resolution::Unknown("timed out".into()),
    );
    let found: Vec<(Severity, &str, String)> = diagnose(&s, &Cluster::default(), None)
        .into_iter()
        .filter(|f| f.check != "search-path")
        .map(|f| (f.severity, f.check, f.object))
        .collect();
    assert_eq!(
        found,
        vec![
            (
                Severity::Error,
                "external-name-does-not-resolve",
                "svc/default/gone".to_string()
            ),
            (
                Severity::Info,
                "external-name-unchecked",
                "svc/default/far".to_string()
            ),
        ]
    );
}

//! `networking.k8s.io/v1` NetworkPolicy: upstream's API e2e "should support creating
//! NetworkPolicy API operations" (`test/e2e/network/netpol/network_policy_api.go`, with and
//! without `endPort`) through the real kubectl 1.33 and through kube-rs, plus Table output,
//! `kubectl explain`, validation messages and the namespace name label.
#![allow(clippy::unwrap_used)]

mod common;

use common::kubectl::Kubectl;

use std::io::BufReader;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use serde_json::{Value, json};

use common::kubectl::KUBECTL_1_33 as KUBECTL;

/// upstream's policy template: pods `pod-name=test-pod`, ingress from `pod-name=client-a` in
/// namespaces `ns-name=pod-b`, optionally on TCP 8000–9000.
fn template(ns: &str, label: &str, end_port: bool) -> Value {
    let mut rule = json!({"from": [{
        "namespaceSelector": {"matchLabels": {"ns-name": "pod-b"}},
        "podSelector": {"matchLabels": {"pod-name": "client-a"}},
    }]});
    if end_port {
        rule["ports"] = json!([{"protocol": "TCP", "port": 8000, "endPort": 9000}]);
    }
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"generateName": "e2e-example-netpol", "namespace": ns, "labels": {"special-label": label}},
        "spec": {"podSelector": {"matchLabels": {"pod-name": "test-pod"}}, "ingress": [rule]},
    })
}

/// The upstream API e2e, driven by kubectl: discovery, create ×3, get, list (namespace and
/// all), watch, patch, update, delete, deletecollection.
fn api_operations_with_kubectl(k: &Kubectl, ns: &str, end_port: bool) {
    let label = format!("{ns}-label");
    k.ok(&["create", "namespace", ns]);
    // Discovery.
    let groups = k.ok(&["api-versions"]);
    assert!(
        groups.lines().any(|l| l == "networking.k8s.io/v1"),
        "{groups}"
    );
    let resources = k.ok(&[
        "api-resources",
        "--api-group=networking.k8s.io",
        "-o",
        "wide",
    ]);
    let row = resources
        .lines()
        .find(|l| l.starts_with("networkpolicies"))
        .unwrap_or_else(|| panic!("{resources}"));
    for want in [
        "netpol",
        "networking.k8s.io/v1",
        "true",
        "NetworkPolicy",
        "deletecollection",
        "watch",
    ] {
        assert!(row.contains(want), "{want}: {row}");
    }
    // Watch from before the creates, as the e2e does, in the background.
    let mut watch = k
        .cmd(&[
            "-n",
            ns,
            "get",
            "networkpolicies",
            "-l",
            &format!("special-label={label}"),
            "--watch-only",
            "--output-watch-events",
            "-o",
            "json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, events) = mpsc::channel::<Value>();
    let stdout = watch.stdout.take().unwrap();
    std::thread::spawn(move || {
        for ev in serde_json::Deserializer::from_reader(BufReader::new(stdout)).into_iter::<Value>()
        {
            let Ok(ev) = ev else { break };
            if tx.send(ev).is_err() {
                break;
            }
        }
    });
    // kubectl's watch has to be established before the first create to see it.
    std::thread::sleep(Duration::from_millis(1500));

    // Create three from the template (generateName gives each its name).
    let body = template(ns, &label, end_port).to_string();
    let mut names = Vec::new();
    for _ in 0..3 {
        let out = k.ok_in(&["create", "-f", "-", "-o", "name"], Some(&body));
        let name = out
            .trim()
            .strip_prefix("networkpolicy.networking.k8s.io/")
            .unwrap_or_else(|| panic!("{out}"));
        assert!(name.starts_with("e2e-example-netpol"), "{name}");
        names.push(name.to_string());
    }
    // Get: defaulted as upstream (policyTypes, port protocol).
    let got = k.json(&["-n", ns, "get", "netpol", &names[0]]);
    assert_eq!(got["spec"]["policyTypes"], json!(["Ingress"]));
    if end_port {
        assert_eq!(
            got["spec"]["ingress"][0]["ports"],
            json!([{"protocol": "TCP", "port": 8000, "endPort": 9000}])
        );
    }
    // List in the namespace and across namespaces.
    let sel = format!("special-label={label}");
    let list = k.json(&["-n", ns, "get", "networkpolicies", "-l", &sel]);
    assert_eq!(list["items"].as_array().unwrap().len(), 3, "{list}");
    let all = k.json(&["get", "networkpolicies", "-A", "-l", &sel]);
    assert_eq!(all["items"].as_array().unwrap().len(), 3, "{all}");
    // Table output with upstream's columns.
    let table = k.ok(&["-n", ns, "get", "netpol"]);
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "POD-SELECTOR", "AGE"], "{table}");
    assert!(lines.all(|l| l.contains("pod-name=test-pod")), "{table}");

    // Patch, then update.
    let patched = k.json(&[
        "-n",
        ns,
        "patch",
        "netpol",
        &names[0],
        "--type=merge",
        "-p",
        r#"{"metadata":{"annotations":{"patched":"true"}}}"#,
    ]);
    assert_eq!(patched["metadata"]["annotations"]["patched"], "true");
    let mut obj = k.json(&["-n", ns, "get", "netpol", &names[0]]);
    obj["metadata"]["annotations"]["updated"] = json!("true");
    let out = k.ok_in(
        &["replace", "-f", "-", "-o", "json"],
        Some(&obj.to_string()),
    );
    let updated: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(updated["metadata"]["annotations"]["updated"], "true");

    // The watch saw the three creates, then the patch and the update of the first.
    let mut seen = Vec::new();
    while !seen.iter().any(|(t, n, a): &(String, String, Value)| {
        t == "MODIFIED" && n == &names[0] && a["updated"] == "true"
    }) {
        let ev = events
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("watch events so far: {seen:?}"));
        seen.push((
            ev["type"].as_str().unwrap_or("").to_string(),
            ev["object"]["metadata"]["name"]
                .as_str()
                .unwrap_or("")
                .to_string(),
            ev["object"]["metadata"]["annotations"].clone(),
        ));
    }
    let added: Vec<&String> = seen
        .iter()
        .filter(|e| e.0 == "ADDED")
        .map(|e| &e.1)
        .collect();
    assert_eq!(added, names.iter().collect::<Vec<_>>(), "{seen:?}");
    assert!(
        seen.iter()
            .any(|e| e.0 == "MODIFIED" && e.2["patched"] == "true" && e.2.get("updated").is_none()),
        "{seen:?}"
    );
    watch.kill().unwrap();
    watch.wait().unwrap();

    // Delete one; then the collection (kubectl sends DELETE on the collection with --raw).
    k.ok(&["-n", ns, "delete", "netpol", &names[2]]);
    let common::kubectl::Out {
        ok, stderr: err, ..
    } = k.run(&["-n", ns, "get", "netpol", &names[2]], None);
    assert!(!ok && err.contains("not found"), "{err}");
    let list = k.json(&["-n", ns, "get", "networkpolicies", "-l", &sel]);
    assert_eq!(list["items"].as_array().unwrap().len(), 2, "{list}");
    let path = format!(
        "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies?labelSelector=special-label%3D{label}"
    );
    k.ok(&["delete", "--raw", &path]);
    let list = k.json(&["-n", ns, "get", "networkpolicies", "-l", &sel]);
    assert_eq!(list["items"].as_array().unwrap().len(), 0, "{list}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn networkpolicy_api_operations_through_kubectl() {
    let ts = common::TestServer::start().await;
    let kubeconfig = ts.server().kubeconfig_path().to_path_buf();
    tokio::task::spawn_blocking(move || {
        let k = Kubectl::new(KUBECTL, &kubeconfig);
        api_operations_with_kubectl(&k, "netpol-api", false);
        api_operations_with_kubectl(&k, "netpol-api-endport", true);

        // kubectl explain reads the served OpenAPI v3 schema.
        let out = k.ok(&["explain", "networkpolicy.spec"]);
        for want in ["GROUP:      networking.k8s.io", "KIND:       NetworkPolicy", "podSelector", "policyTypes", "ingress", "egress"] {
            assert!(out.contains(want), "{want}: {out}");
        }
        let out = k.ok(&["explain", "netpol.spec.ingress.ports.endPort"]);
        assert!(out.contains("endPort") && out.contains("<integer>"), "{out}");

        // A legacy-valid but non-standard CIDR is stored, with upstream's warnings, which
        // kubectl prints.
        let ambiguous = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "ambiguous", "namespace": "default"},
            "spec": {"podSelector": {}, "egress": [{"to": [{"ipBlock": {"cidr": "192.168.1.1/24", "except": ["192.168.1.128/25"]}}]}]}});
        let out = k.run(&["create", "-f", "-"], Some(&ambiguous.to_string()));
        assert!(out.ok, "{}", out.stderr);
        assert!(
            out.stderr.contains(r#"Warning: spec.egress[0].to[0].ipBlock.cidr: CIDR value "192.168.1.1/24" is ambiguous in this context (should be "192.168.1.0/24" or "192.168.1.1/32"?)"#),
            "{}",
            out.stderr
        );
        assert!(!out.stderr.contains("except[0]"), "a standard except has none: {}", out.stderr);
        k.ok(&["delete", "networkpolicy", "ambiguous"]);

        // Refused policies carry upstream's messages; strict decoding names unknown fields.
        let bad = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "bad", "namespace": "default"},
            "spec": {"podSelector": {}, "ingress": [{"from": [{}, {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.0.0.0/8"]}}]}]}});
        let err = k.fails_in(&["create", "-f", "-"], &bad.to_string());
        assert!(err.contains(r#"The NetworkPolicy "bad" is invalid"#), "{err}");
        assert!(err.contains("spec.ingress[0].from[0]: Required value: must specify a peer"), "{err}");
        assert!(err.contains("spec.ingress[0].from[1].ipBlock.except[0]: Invalid value: \"10.0.0.0/8\": must be a strict subset of `cidr`"), "{err}");
        let unknown = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "odd", "namespace": "default"}, "spec": {"podSelector": {}, "bogus": 1}});
        let err = k.fails_in(&["create", "-f", "-"], &unknown.to_string());
        assert!(err.contains(r#"unknown field "spec.bogus""#), "{err}");
        // An empty selector prints as `<none>`, as kubectl prints it.
        let deny = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "default-deny", "namespace": "default"}, "spec": {"podSelector": {}}});
        // kubectl has no typed `create networkpolicy`: manifests go as JSON (-v=8 shows the
        // request headers), so NetworkPolicy needs no protobuf decoding.
        let common::kubectl::Out {
            ok, stderr: log, ..
        } = k.run(&["create", "-f", "-", "-v=8"], Some(&deny.to_string()));
        assert!(ok, "{log}");
        assert!(log.contains("Content-Type: application/json"), "{log}");
        assert!(!log.contains("Content-Type: application/vnd.kubernetes.protobuf"), "{log}");
        let out = k.ok(&["get", "netpol", "default-deny", "--no-headers"]);
        assert_eq!(out.split_whitespace().nth(1), Some("<none>"), "{out}");
        // kubectl's describer reads the defaulted policy through its typed client.
        let out = k.ok(&["describe", "netpol", "default-deny"]);
        for want in ["Selected pods are isolated for ingress connectivity", "Not affecting egress traffic", "Policy Types: Ingress"] {
            assert!(out.contains(want), "{want}: {out}");
        }

        // Every namespace carries its name label, and it cannot be changed.
        let ns = k.json(&["get", "ns", "netpol-api"]);
        assert_eq!(ns["metadata"]["labels"]["kubernetes.io/metadata.name"], "netpol-api");
        k.ok(&["label", "ns", "netpol-api", "kubernetes.io/metadata.name=other", "--overwrite"]);
        let ns = k.json(&["get", "ns", "netpol-api"]);
        assert_eq!(ns["metadata"]["labels"]["kubernetes.io/metadata.name"], "netpol-api");
        let out = k.ok_in(
            &["create", "-f", "-", "-o", "json"],
            Some(r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"generateName":"gen-"}}"#),
        );
        let ns: Value = serde_json::from_str(&out).unwrap();
        let name = ns["metadata"]["name"].as_str().unwrap();
        assert!(name.starts_with("gen-") && name.len() > 4, "{name}");
        assert_eq!(ns["metadata"]["labels"]["kubernetes.io/metadata.name"], name);
    })
    .await
    .unwrap();
    ts.stop().await;
}

/// The same e2e through kube-rs (client-go's operations, typed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn networkpolicy_api_operations_through_kube_rs() {
    let ts = common::TestServer::start().await;
    let client = ts.client().await;
    for (ns, end_port) in [("default", false), ("kube-system", true)] {
        let label = format!("kube-rs-{end_port}");
        let sel = format!("special-label={label}");
        let api: Api<NetworkPolicy> = Api::namespaced(client.clone(), ns);
        let list = api.list(&ListParams::default().labels(&sel)).await.unwrap();
        let rv = list.metadata.resource_version.unwrap();
        let mut watch = api
            .watch(&WatchParams::default().labels(&sel), &rv)
            .await
            .unwrap()
            .boxed();
        let np: NetworkPolicy = serde_json::from_value(template(ns, &label, end_port)).unwrap();
        let mut names = Vec::new();
        for _ in 0..3 {
            let created = api.create(&PostParams::default(), &np).await.unwrap();
            names.push(created.metadata.name.unwrap());
        }
        let got = api.get(&names[0]).await.unwrap();
        let spec = got.spec.unwrap();
        assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
        if end_port {
            let port = &spec.ingress.unwrap()[0].ports.clone().unwrap()[0];
            assert_eq!(
                (port.protocol.as_deref(), port.end_port),
                (Some("TCP"), Some(9000))
            );
        }
        let list = api.list(&ListParams::default().labels(&sel)).await.unwrap();
        assert_eq!(list.items.len(), 3);
        let all: Api<NetworkPolicy> = Api::all(client.clone());
        assert_eq!(
            all.list(&ListParams::default().labels(&sel))
                .await
                .unwrap()
                .items
                .len(),
            3
        );
        let patched = api
            .patch(
                &names[0],
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"patched": "true"}}})),
            )
            .await
            .unwrap();
        assert_eq!(
            patched.metadata.annotations.as_ref().unwrap()["patched"],
            "true"
        );
        let mut obj = api.get(&names[0]).await.unwrap();
        obj.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert("updated".into(), "true".into());
        let updated = api
            .replace(&names[0], &PostParams::default(), &obj)
            .await
            .unwrap();
        assert_eq!(
            updated.metadata.annotations.as_ref().unwrap()["updated"],
            "true"
        );
        // Watch: three ADDED, then MODIFIED (patched), MODIFIED (updated).
        let mut seen = Vec::new();
        while seen.len() < 5 {
            let ev = tokio::time::timeout(Duration::from_secs(10), watch.next())
                .await
                .unwrap_or_else(|_| panic!("watch events so far: {seen:?}"))
                .unwrap()
                .unwrap();
            seen.push(match ev {
                WatchEvent::Added(o) => ("ADDED", o.metadata.name.unwrap()),
                WatchEvent::Modified(o) => ("MODIFIED", o.metadata.name.unwrap()),
                WatchEvent::Deleted(o) => ("DELETED", o.metadata.name.unwrap()),
                WatchEvent::Bookmark(_) => continue,
                WatchEvent::Error(e) => panic!("{e:?}"),
            });
        }
        let want: Vec<(&str, String)> = names
            .iter()
            .map(|n| ("ADDED", n.clone()))
            .chain([
                ("MODIFIED", names[0].clone()),
                ("MODIFIED", names[0].clone()),
            ])
            .collect();
        assert_eq!(seen, want);
        api.delete(&names[2], &DeleteParams::default())
            .await
            .unwrap();
        assert!(api.get_opt(&names[2]).await.unwrap().is_none());
        assert_eq!(
            api.list(&ListParams::default().labels(&sel))
                .await
                .unwrap()
                .items
                .len(),
            2
        );
        api.delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&sel),
        )
        .await
        .unwrap();
        assert_eq!(
            api.list(&ListParams::default().labels(&sel))
                .await
                .unwrap()
                .items
                .len(),
            0
        );
    }
    ts.stop().await;
}

/// A protobuf field: `(number, bytes)` as a length-delimited value, or a varint.
enum Pb {
    Len(u64, Vec<u8>),
    Var(u64, u64),
}

fn pb(fields: &[Pb]) -> Vec<u8> {
    fn varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    let mut out = Vec::new();
    for f in fields {
        match f {
            Pb::Len(n, b) => {
                varint(n << 3 | 2, &mut out);
                varint(b.len() as u64, &mut out);
                out.extend_from_slice(b);
            }
            Pb::Var(n, v) => {
                varint(n << 3, &mut out);
                varint(*v, &mut out);
            }
        }
    }
    out
}

/// Typed client-go writers send NetworkPolicies as protobuf (`k8s\0` + Unknown): the server
/// decodes them, defaults and validates them as JSON bodies (no 415).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn networkpolicy_protobuf_bodies_are_accepted() {
    use Pb::{Len, Var};
    let ts = common::TestServer::start().await;
    let raw = common::raw::Raw {
        client: ts.client().await,
    };
    let s = |v: &str| v.as_bytes().to_vec();
    let port = pb(&[Len(1, s("TCP")), Len(2, pb(&[Var(1, 0), Var(2, 8080)]))]);
    let peer = pb(&[Len(
        2,
        pb(&[Len(1, pb(&[Len(1, s("team")), Len(2, s("a"))]))]),
    )]);
    let rule = pb(&[Len(1, port), Len(2, peer)]);
    let spec = pb(&[Len(1, Vec::new()), Len(2, rule)]);
    let object = pb(&[Len(1, pb(&[Len(1, s("from-protobuf"))])), Len(2, spec)]);
    let type_meta = pb(&[
        Len(1, s("networking.k8s.io/v1")),
        Len(2, s("NetworkPolicy")),
    ]);
    let mut body = b"k8s\0".to_vec();
    body.extend(pb(&[Len(1, type_meta), Len(2, object)]));
    let reply = raw
        .send(
            "POST",
            "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies",
            "application/vnd.kubernetes.protobuf",
            &body,
        )
        .await;
    assert_eq!(reply.code, 201, "{}", reply.body);
    let spec = &reply.body["spec"];
    assert_eq!(spec["podSelector"], json!({}), "{spec}");
    assert_eq!(spec["policyTypes"], json!(["Ingress"]), "defaulted: {spec}");
    assert_eq!(
        spec["ingress"][0],
        json!({"ports": [{"protocol": "TCP", "port": 8080}],
               "from": [{"namespaceSelector": {"matchLabels": {"team": "a"}}}]})
    );
    ts.stop().await;
}

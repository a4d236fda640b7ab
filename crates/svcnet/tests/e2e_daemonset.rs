//! End to end (needs root): a DaemonSet through the real kubectl on `svcnet up --nodes 2`. One
//! pod per node, `hostNetwork: true` (the node's address), a configMap volume it reads through
//! its mount; `kubectl get ds` columns; a rolling update with `maxUnavailable: 1` replaces both
//! pods and `kubectl rollout status` follows it; a node that no longer matches the
//! `nodeSelector` loses its pod; deleting the DaemonSet removes its pods. Ranges and prefix are
//! this test's own; nothing leaves the machine.
#![allow(clippy::unwrap_used)]

mod common;

use common::{Net, free_udp_port, is_root, wait_for};

const MANIFEST: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: agent-cfg, namespace: kube-system}
data: {mode: nftables}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent, namespace: kube-system}
spec:
  selector: {matchLabels: {app: agent}}
  updateStrategy: {type: RollingUpdate, rollingUpdate: {maxUnavailable: 1}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      hostNetwork: true
      nodeSelector: {kubernetes.io/os: linux}
      containers:
      - name: web
        image: test-server
        ports: [{containerPort: 19090}]
        readinessProbe: {tcpSocket: {port: 19090}, periodSeconds: 1}
        volumeMounts: [{name: cfg, mountPath: /run/svcnet-e2eds/cfg, readOnly: true}]
      volumes: [{name: cfg, configMap: {name: agent-cfg}}]
"#;

/// `node ip name` of the DaemonSet's pods, sorted.
fn placements(up: &common::Up) -> Vec<String> {
    let out = up.ok(&[
        "get",
        "pods",
        "-n",
        "kube-system",
        "-l",
        "app=agent",
        "-o",
        r#"jsonpath={range .items[*]}{.spec.nodeName} {.status.podIP} {.metadata.name}{"\n"}{end}"#,
    ]);
    let mut lines: Vec<String> = out.lines().map(str::to_string).collect();
    lines.sort();
    lines
}

#[test]
fn a_daemonset_runs_one_host_network_pod_per_node_and_rolls() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let net = Net {
        prefix: "e2eds",
        underlay: "172.29.45.0/24",
        pods: "10.176.0.0/16",
        services: "10.177.0.0/16",
        lb: "10.178.0.0/24",
    };
    let mut up = net.up_with("2", free_udp_port(), &["--disable", "dns"]);
    let manifest = up.data_dir.path().join("ds.yaml");
    std::fs::write(&manifest, MANIFEST).unwrap();
    // Nodes carry kubernetes.io/os as a kubelet's do (the nodeSelector needs it).
    wait_for("both nodes registered", || {
        let out = up.ok(&["get", "nodes", "-o", "name"]);
        (out.lines().count() == 2).then_some(out)
    });
    up.ok(&[
        "label",
        "node",
        "--all",
        "--overwrite",
        "kubernetes.io/os=linux",
    ]);
    up.ok(&["apply", "-f", manifest.to_str().unwrap()]);
    up.ok(&[
        "rollout",
        "status",
        "ds/agent",
        "-n",
        "kube-system",
        "--timeout=60s",
    ]);
    let first = placements(&up);
    assert_eq!(first.len(), 2, "{first:?}");
    assert!(
        first[0].starts_with("e2eds-node1 172.29.45.2 agent-"),
        "{first:?}"
    );
    assert!(
        first[1].starts_with("e2eds-node2 172.29.45.3 agent-"),
        "{first:?}"
    );
    let table = up.ok(&["get", "ds", "-n", "kube-system"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "DESIRED",
            "CURRENT",
            "READY",
            "UP-TO-DATE",
            "AVAILABLE",
            "NODE",
            "SELECTOR",
            "AGE"
        ],
        "{table}"
    );
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        &row[..7],
        ["agent", "2", "2", "2", "2", "2", "kubernetes.io/os=linux"],
        "{table}"
    );

    // The pod reads its ConfigMap through the mount, and answers on the node's address.
    let pod = first[0].split_whitespace().nth(2).unwrap().to_string();
    let out = up.exec_sh_in("kube-system", &pod, "cat /run/svcnet-e2eds/cfg/mode");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "nftables", "{out:?}");
    let out = up.exec_sh_in(
        "kube-system",
        &pod,
        "curl -s -m 3 http://172.29.45.3:19090/",
    );
    let body = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(body.contains("ip=172.29.45.3"), "{body}");

    // The API answers in-cluster clients at the `kubernetes` Service's cluster IP, whose
    // endpoint is the host's underlay address, under a certificate that names that IP: from a
    // host-network pod and from a pod on the pod network.
    let pki = up.data_dir.path().join("pki");
    let ask = format!(
        "curl -s -m 5 --cacert {0}/ca.crt --cert {0}/admin.crt --key {0}/admin.key https://10.177.0.1/version",
        pki.display()
    );
    let out = up.exec_sh_in("kube-system", &pod, &ask);
    let body = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(body.contains("gitVersion"), "{out:?}");
    let client = up.data_dir.path().join("client.yaml");
    std::fs::write(
        &client,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: client}\nspec:\n  nodeName: e2eds-node2\n  containers: [{name: c, image: busybox, command: [sleep, '1000']}]\n",
    )
    .unwrap();
    up.ok(&["apply", "-f", client.to_str().unwrap()]);
    up.ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/client",
        "--timeout=60s",
    ]);
    // The pod's own credentials, as an in-cluster client finds them: the ServiceAccount token,
    // the CA and the namespace the API server's admission mounted.
    let sa = "/var/run/secrets/kubernetes.io/serviceaccount";
    let ns = up.exec_sh("client", &format!("cat {sa}/namespace"));
    assert_eq!(String::from_utf8_lossy(&ns.stdout), "default", "{ns:?}");
    let in_cluster = format!(
        "curl -s -m 5 --cacert {sa}/ca.crt -H \"Authorization: Bearer $(cat {sa}/token)\" https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/version"
    );
    let body = wait_for("the API with the pod's own token", || {
        let out = up.exec_sh("client", &in_cluster);
        let body = String::from_utf8_lossy(&out.stdout).into_owned();
        body.contains("gitVersion").then_some(body)
    });
    assert!(body.contains("\"major\""), "{body}");
    let body = wait_for("the API through the kubernetes Service from a pod", || {
        let out = up.exec_sh("client", &ask);
        let body = String::from_utf8_lossy(&out.stdout).into_owned();
        body.contains("gitVersion").then_some(body)
    });
    assert!(body.contains("\"major\""), "{body}");
    up.ok(&["delete", "pod", "client", "--wait=false"]);

    // A template change rolls both pods, one node at a time.
    up.ok(&["set", "env", "ds/agent", "-n", "kube-system", "ROLL=2"]);
    up.ok(&[
        "rollout",
        "status",
        "ds/agent",
        "-n",
        "kube-system",
        "--timeout=90s",
    ]);
    let rolled = wait_for("both pods replaced", || {
        let now = placements(&up);
        (now.len() == 2 && now.iter().all(|l| !first.contains(l))).then_some(now.join("\n"))
    });
    let rolled: Vec<&str> = rolled.lines().collect();
    assert!(rolled[0].starts_with("e2eds-node1 ") && rolled[1].starts_with("e2eds-node2 "));
    let env = up.exec_sh_in(
        "kube-system",
        rolled[1].split_whitespace().nth(2).unwrap(),
        "echo $ROLL",
    );
    assert_eq!(String::from_utf8_lossy(&env.stdout).trim(), "2");

    // The DaemonSet's history (ControllerRevisions): `kubectl rollout history` lists both
    // templates and `kubectl rollout undo` goes back to the first, renumbered as revision 3.
    let revisions = |up: &common::Up| -> Vec<String> {
        let out = up.ok(&["rollout", "history", "ds/agent", "-n", "kube-system"]);
        out.lines()
            .skip_while(|l| !l.starts_with("REVISION"))
            .skip(1)
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .collect()
    };
    assert_eq!(revisions(&up), ["1", "2"]);
    let undo = up.ok(&["rollout", "undo", "ds/agent", "-n", "kube-system"]);
    assert_eq!(undo.trim(), "daemonset.apps/agent rolled back", "{undo}");
    up.ok(&[
        "rollout",
        "status",
        "ds/agent",
        "-n",
        "kube-system",
        "--timeout=90s",
    ]);
    let undone = wait_for("both pods back on the first template", || {
        let now = placements(&up);
        (now.len() == 2 && now.iter().all(|l| !rolled.contains(&l.as_str())))
            .then_some(now.join("\n"))
    });
    let pod = undone
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .nth(2)
        .unwrap();
    let env = up.exec_sh_in("kube-system", pod, "echo ${ROLL:-unset}");
    assert_eq!(String::from_utf8_lossy(&env.stdout).trim(), "unset");
    wait_for("revision 1 renumbered as 3", || {
        (revisions(&up) == ["2", "3"]).then(String::new)
    });

    // A node that stops matching the nodeSelector loses its pod.
    up.ok(&[
        "label",
        "node",
        "e2eds-node2",
        "--overwrite",
        "kubernetes.io/os=other",
    ]);
    wait_for("node2's pod gone, node1's kept", || {
        let now = placements(&up);
        (now.len() == 1 && now[0].starts_with("e2eds-node1 ")).then_some(now.join("\n"))
    });
    let desired = up.ok(&[
        "get",
        "ds",
        "agent",
        "-n",
        "kube-system",
        "-o",
        "jsonpath={.status.desiredNumberScheduled}",
    ]);
    assert_eq!(desired, "1");
    // Matching again, as a node that joins: it gets a pod.
    up.ok(&[
        "label",
        "node",
        "e2eds-node2",
        "--overwrite",
        "kubernetes.io/os=linux",
    ]);
    wait_for("node2's pod back", || {
        let now = placements(&up);
        (now.len() == 2 && now[1].starts_with("e2eds-node2 ")).then_some(now.join("\n"))
    });

    // Deleting the DaemonSet deletes its pods.
    up.ok(&["delete", "ds", "agent", "-n", "kube-system"]);
    wait_for("the DaemonSet's pods gone", || {
        placements(&up).is_empty().then_some(String::new())
    });
    net.stop(&mut up);
    // The mount point the pods' runtime made on this (shared) file system.
    let _ = std::fs::remove_dir_all("/run/svcnet-e2eds");
}

//! End to end (needs root): NetworkPolicy between pods on different nodes, on each pod network
//! of `svcnet up` (host-gw, flannel's VXLAN and UDP, Calico's BGP; Calico's IPIP in the QEMU
//! tier), through the real kubectl. The server
//! is on node 1, both clients on node 2: an ingress policy on the server's node lets one client
//! in and keeps the other out, by pod IP and through the Service IP (DNAT'd on the client's
//! node, judged on the server's); an egress policy on the clients' node stops the allowed one
//! at its own node, unless it allows the server; deleting them opens everything again. Also
//! under the userspace proxy (VXLAN). Ranges and prefixes are this test's
//! own; nothing leaves the machine.
#![allow(clippy::unwrap_used)]

mod common;

use common::{Net, Up, free_udp_port, is_root, wait_for};

fn manifest(prefix: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: server, labels: {{app: server}}}}
spec:
  nodeName: {prefix}-node1
  containers: [{{name: web, image: test-server, ports: [{{name: http, containerPort: 80}}]}}]
---
apiVersion: v1
kind: Service
metadata: {{name: server}}
spec:
  selector: {{app: server}}
  ports: [{{port: 8080, targetPort: http}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: client, labels: {{app: client}}}}
spec:
  nodeName: {prefix}-node2
  containers: [{{name: c, image: test-server}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: other, labels: {{app: other}}}}
spec:
  nodeName: {prefix}-node2
  containers: [{{name: c, image: test-server}}]
"#
    )
}

const INGRESS: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: server-from-client}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: http}]
"#;

const EGRESS_TO_SERVER: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: client-to-server}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress:
  - to: [{podSelector: {matchLabels: {app: server}}}]
    ports: [{port: 80}]
"#;

const EGRESS: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: client-nowhere}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
"#;

fn apply(up: &Up, name: &str, manifest: &str) {
    let path = up.data_dir.path().join(name);
    std::fs::write(&path, manifest).unwrap();
    up.ok(&["apply", "-f", path.to_str().unwrap()]);
}

fn reaches(up: &Up, pod: &str, url: &str) -> bool {
    let out = up.exec_sh(pod, &format!("curl -s -m 2 {url}"));
    out.status.success() && String::from_utf8_lossy(&out.stdout).contains("pod=server")
}

fn across_nodes(net: &Net, pod_network: &str) {
    across_nodes_with(net, &["--pod-network", pod_network]);
}

fn across_nodes_with(net: &Net, flags: &[&str]) {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let mut up = net.up_with("2", free_udp_port(), flags);
    apply(&up, "pods.yaml", &manifest(net.prefix));
    up.ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/server",
        "pod/client",
        "pod/other",
        "--timeout=60s",
    ]);
    let pod_ip = up.ok(&["get", "pod", "server", "-o", "jsonpath={.status.podIP}"]);
    let svc_ip = up.ok(&["get", "svc", "server", "-o", "jsonpath={.spec.clusterIP}"]);
    let urls = [
        format!("http://{pod_ip}/"),
        format!("http://{svc_ip}:8080/"),
    ];
    let matrix = |up: &Up| -> [bool; 4] {
        [
            reaches(up, "client", &urls[0]),
            reaches(up, "client", &urls[1]),
            reaches(up, "other", &urls[0]),
            reaches(up, "other", &urls[1]),
        ]
    };
    let settle = |up: &Up, what: &str, want: [bool; 4]| {
        wait_for(what, || (matrix(up) == want).then_some(String::new()));
        // It stays so: the table's verdict, not a transient.
        assert_eq!(matrix(up), want, "{what}, checked again");
    };
    settle(&up, "both clients reach the server across nodes", [true; 4]);
    apply(&up, "ingress.yaml", INGRESS);
    settle(
        &up,
        "only the client gets in (ingress, on the server's node)",
        [true, true, false, false],
    );
    // Egress allowed to the server only: through the Service too (judged after the proxy, by
    // the endpoint it chose).
    apply(&up, "egress-to-server.yaml", EGRESS_TO_SERVER);
    settle(
        &up,
        "the client's egress to the server is allowed, by pod IP and through the Service",
        [true, true, false, false],
    );
    up.ok(&["delete", "networkpolicy", "client-to-server"]);
    apply(&up, "egress.yaml", EGRESS);
    settle(
        &up,
        "the client is stopped on its own node (egress)",
        [false, false, false, false],
    );
    up.ok(&[
        "delete",
        "networkpolicy",
        "server-from-client",
        "client-nowhere",
    ]);
    settle(&up, "everything open again", [true; 4]);
    net.stop(&mut up);
}

#[test]
fn policy_across_nodes_on_host_gw() {
    across_nodes(
        &Net {
            prefix: "e2enph",
            underlay: "172.29.91.0/24",
            pods: "10.191.0.0/16",
            services: "10.192.0.0/16",
            lb: "10.193.0.0/24",
        },
        "host-gw",
    );
}

#[test]
fn policy_across_nodes_on_vxlan() {
    across_nodes(
        &Net {
            prefix: "e2enpv",
            underlay: "172.29.92.0/24",
            pods: "10.194.0.0/16",
            services: "10.195.0.0/16",
            lb: "10.196.0.0/24",
        },
        "vxlan",
    );
}

#[test]
fn policy_across_nodes_on_bgp() {
    across_nodes(
        &Net {
            prefix: "e2enpb",
            underlay: "172.29.93.0/24",
            pods: "10.204.0.0/16",
            services: "10.205.0.0/16",
            lb: "10.206.0.0/24",
        },
        "bgp",
    );
}

#[test]
fn policy_across_nodes_on_udp() {
    across_nodes(
        &Net {
            prefix: "e2enpu",
            underlay: "172.29.94.0/24",
            pods: "10.207.0.0/16",
            services: "10.208.0.0/16",
            lb: "10.209.0.0/24",
        },
        "udp",
    );
}

/// The same under the userspace proxy, which relays each Service connection from its own
/// socket on the client's node: it judges the client against the endpoint it chose, its
/// connection leaves from the node's cni0 address, which the server's node trusts as a proxy's;
/// over VXLAN, where the node's own traffic would leave from `flannel.1`'s address.
#[test]
fn policy_across_nodes_with_the_userspace_proxy() {
    across_nodes_with(
        &Net {
            prefix: "e2enpx",
            underlay: "172.29.96.0/24",
            pods: "10.213.0.0/16",
            services: "10.214.0.0/16",
            lb: "10.215.0.0/24",
        },
        &["--pod-network", "vxlan", "--proxy-mode", "userspace"],
    );
}

/// The same over Calico's IPIP (`tunl0`), in the QEMU tier (this host's kernel has no
/// `ipip`; user-mode Linux has no nf_tables for ip); skipped elsewhere. It runs with
/// `SVCNET_VM_E2E=1 ./scripts/test.sh` (minutes in the emulated VM).
#[test]
fn ipip_policy_across_nodes_on_ipip() {
    if !svcnet_netns::test_support::vm_guest() {
        return;
    }
    across_nodes(
        &Net {
            prefix: "e2enpi",
            underlay: "172.29.95.0/24",
            pods: "10.210.0.0/16",
            services: "10.211.0.0/16",
            lb: "10.212.0.0/24",
        },
        "ipip",
    );
}

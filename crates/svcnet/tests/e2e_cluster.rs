//! End to end, whole system (needs root): `svcnet up --nodes 2` with its node namespaces, proxies,
//! agents and DNS, driven by the real `kubectl`, `curl` and `dig` through the seeds' walkthrough.
//! Address ranges and the name prefix are this test's own, so it never meets a running
//! `svcnet up` or another test; traffic goes only to svcnet's own namespaces.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::process::Command;

use common::{Net, Up, curl, dig_sorted, example, free_udp_port, is_root, wait_for};

/// The `pod=` field of the built-in test server's answer.
fn answered_by(reply: &str) -> Option<String> {
    reply
        .split_whitespace()
        .find_map(|f| f.strip_prefix("pod="))
        .map(str::to_string)
}

#[test]
fn seeds_walkthrough_on_two_nodes() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let net = Net {
        prefix: "e2ecl",
        underlay: "172.29.7.0/24",
        pods: "10.150.0.0/16",
        services: "10.140.0.0/16",
        lb: "10.141.0.0/24",
    };
    let dns = free_udp_port();
    let mut up = net.up("2", dns);
    // Each node is created, then its status (Ready, InternalIP) written: wait for both.
    let nodes = wait_for("two ready nodes with their InternalIPs", || {
        let nodes = up.ok(&["get", "nodes", "-o", "wide", "--no-headers"]);
        let ready = nodes.lines().filter(|l| l.contains(" Ready ")).count();
        (ready == 2 && nodes.contains("172.29.7.2") && nodes.contains("172.29.7.3"))
            .then_some(nodes)
    });
    assert_eq!(nodes.lines().count(), 2, "{nodes}");

    up.ok(&["apply", "-f", &example("myapp.yaml")]);
    up.ok(&["apply", "-f", &example("statefulset-web.yaml")]);
    let cluster_ip = up.ok(&["get", "svc", "myapp", "-o", "jsonpath={.spec.clusterIP}"]);
    assert!(cluster_ip.starts_with("10.140."), "{cluster_ip}");

    // Three ready pods with their own IPs, published as endpoints.
    wait_for("3 ready myapp endpoints", || {
        let ep = up.ok(&[
            "get",
            "endpoints",
            "myapp",
            "-o",
            "jsonpath={.subsets[*].addresses[*].ip}",
        ]);
        (ep.split_whitespace().count() == 3).then_some(ep)
    });
    let pods = up.ok(&[
        "get",
        "pods",
        "-l",
        "app=myapp",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.status.podIP}{\"\\n\"}{end}",
    ]);
    let pod_names: BTreeSet<String> = pods
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    assert_eq!(pod_names.len(), 3, "{pods}");
    for line in pods.lines() {
        let ip = line.split_whitespace().nth(1).unwrap();
        assert!(
            ip.starts_with("10.150."),
            "pod IP from the pod CIDR: {line}"
        );
    }

    // From the host, repeated curl to the cluster IP reaches all three pods.
    let mut seen = BTreeSet::new();
    for _ in 0..60 {
        if let Some(pod) = curl(&format!("http://{cluster_ip}/"))
            .as_deref()
            .and_then(answered_by)
        {
            seen.insert(pod);
        }
        if seen == pod_names {
            break;
        }
    }
    assert_eq!(
        seen, pod_names,
        "curl to the cluster IP reached only {seen:?}"
    );

    // NodePort on every node, and the load balancer's IP.
    up.ok(&["apply", "-f", &example("myapp-nodeport.yaml")]);
    let node_port = up.ok(&[
        "get",
        "svc",
        "myapp",
        "-o",
        "jsonpath={.spec.ports[0].nodePort}",
    ]);
    for node_ip in ["172.29.7.2", "172.29.7.3"] {
        let url = format!("http://{node_ip}:{node_port}/");
        let reply = wait_for(&format!("node port on {node_ip}"), || {
            curl(&url).filter(|r| answered_by(r).is_some())
        });
        assert!(pod_names.contains(&answered_by(&reply).unwrap()), "{reply}");
    }
    let lb_ip = up.ok(&[
        "get",
        "svc",
        "myapp-loadbalance",
        "-o",
        "jsonpath={.status.loadBalancer.ingress[0].ip}",
    ]);
    assert!(lb_ip.starts_with("10.141.0."), "{lb_ip}");
    let reply = wait_for("load balancer IP", || {
        curl(&format!("http://{lb_ip}:8765/")).filter(|r| answered_by(r).is_some())
    });
    assert!(pod_names.contains(&answered_by(&reply).unwrap()), "{reply}");

    // Cluster DNS from the host: the headless service has the three pod IPs; StatefulSet names.
    let dig = |name: &str| dig_sorted(dns, name);
    let mut pod_ips: Vec<String> = pods
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(str::to_string)
        .collect();
    pod_ips.sort();
    // DNS follows the EndpointSlices, which may trail the Endpoints checked above.
    wait_for("the headless name has the three pod IPs", || {
        (dig("myapp-headless.default.svc.cluster.local") == pod_ips).then_some(String::new())
    });
    let web0 = wait_for("web-0.nginx resolves", || {
        let ips = dig("web-0.nginx.default.svc.cluster.local");
        (ips.len() == 1).then(|| ips[0].clone())
    });
    assert!(web0.starts_with("10.150."), "{web0}");

    // Inside a pod: the environment, DNS through the kube-dns service, the search path.
    let pod = pod_names.iter().next().unwrap().clone();
    let exec_in = |pod: &str, cmd: &str| -> String {
        let out = up.exec_sh(pod, cmd);
        assert!(
            out.status.success(),
            "exec {cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let exec = |cmd: &str| exec_in(&pod, cmd);
    // Service links reach pods created after the service (the seeds' caveat): web-0 was
    // applied after myapp.
    assert_eq!(exec_in("web-0", "echo $MYAPP_SERVICE_HOST"), cluster_ip);
    assert_eq!(
        exec("dig +short +time=2 +tries=2 myapp.default.svc.cluster.local"),
        cluster_ip
    );
    // Each node's proxy programs the service on its own schedule: retry until it answers.
    let serves = |pod: &str, url: &str| {
        wait_for(&format!("{url} from {pod}"), || {
            let reply = exec_in(pod, &format!("curl -s -m 5 {url} || true"));
            answered_by(&reply)
                .filter(|p| pod_names.contains(p))
                .map(|_| reply)
        })
    };
    serves(&pod, "http://myapp/");

    // Pods spread over both nodes, and a pod reaches a pod on the other node directly (host-gw).
    let placement = up.ok(&[
        "get",
        "pods",
        "-l",
        "app=myapp",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.podIP}{\"\\n\"}{end}",
    ]);
    let placement: Vec<Vec<String>> = placement
        .lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect();
    let here = placement.iter().find(|p| p[0] == pod).unwrap().clone();
    let there = placement
        .iter()
        .find(|p| p[1] != here[1])
        .unwrap_or_else(|| panic!("all pods on one node: {placement:?}"))
        .clone();
    let direct = exec(&format!("curl -s -m 3 http://{}/", there[2]));
    assert_eq!(
        answered_by(&direct).as_deref(),
        Some(there[0].as_str()),
        "{direct}"
    );
    assert!(
        direct.contains(&format!("client={}:", here[2])),
        "pod-to-pod keeps the source IP: {direct}"
    );
    // Services work from pods on the other node too (its own proxy, DNS through kube-dns).
    serves(&there[0], "http://myapp.default.svc.cluster.local/");

    // Scaling is reflected in endpoints and DNS.
    up.ok(&["scale", "deployment", "myapp-deploy", "--replicas=5"]);
    wait_for("5 headless answers", || {
        let ips = dig("myapp-headless.default.svc.cluster.local");
        (ips.len() == 5).then(|| ips.join(","))
    });
    up.ok(&["scale", "deployment", "myapp-deploy", "--replicas=0"]);
    wait_for("no headless answers", || {
        dig("myapp-headless.default.svc.cluster.local")
            .is_empty()
            .then_some(String::new())
    });
    // Terminating pods still serve while they drain (upstream's terminating fallback); once
    // they are gone, a service without endpoints refuses.
    wait_for("the service refuses without endpoints", || {
        curl(&format!("http://{cluster_ip}/"))
            .is_none()
            .then_some(String::new())
    });

    // Stopping removes every namespace, link and route.
    net.stop(&mut up);
}

/// A readiness probe drives the endpoints (and so the traffic) both ways, and
/// `publishNotReadyAddresses` publishes the unready pod in DNS all along.
#[test]
fn readiness_drives_endpoints_and_publish_not_ready_addresses() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let net = Net {
        prefix: "e2erd",
        underlay: "172.29.8.0/24",
        pods: "10.152.0.0/16",
        services: "10.142.0.0/16",
        lb: "10.143.0.0/24",
    };
    let dns = free_udp_port();
    let mut up = net.up("1", dns);
    // The probe reads a file the test controls (pods share the host's /tmp).
    let flag_dir = tempfile::tempdir().unwrap();
    let flag = flag_dir.path().join("ready");
    let manifest = format!(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: probed
  labels: {{app: probed}}
spec:
  containers:
  - name: server
    image: nginx
    ports: [{{containerPort: 8080}}]
    readinessProbe:
      exec: {{command: [cat, "{flag}"]}}
      periodSeconds: 1
      failureThreshold: 1
---
apiVersion: v1
kind: Service
metadata: {{name: probed}}
spec:
  selector: {{app: probed}}
  ports: [{{port: 80, targetPort: 8080}}]
---
apiVersion: v1
kind: Service
metadata: {{name: probed-peers}}
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector: {{app: probed}}
  ports: [{{port: 8080}}]
"#,
        flag = flag.display()
    );
    let file = up.data_dir.path().join("probed.yaml");
    std::fs::write(&file, manifest).unwrap();
    up.ok(&["apply", "-f", file.to_str().unwrap()]);
    let cluster_ip = up.ok(&["get", "svc", "probed", "-o", "jsonpath={.spec.clusterIP}"]);
    let pod_ip = wait_for("the pod runs, unready", || {
        let ip = up.ok(&["get", "pod", "probed", "-o", "jsonpath={.status.podIP}"]);
        let ep = up.ok(&[
            "get",
            "endpoints",
            "probed",
            "-o",
            "jsonpath={.subsets[*].notReadyAddresses[*].ip}",
        ]);
        (!ip.is_empty() && ep == ip).then_some(ip)
    });
    let ready = || {
        up.ok(&[
            "get",
            "endpoints",
            "probed",
            "-o",
            "jsonpath={.subsets[*].addresses[*].ip}",
        ])
    };
    assert_eq!(ready(), "", "an unready pod is not a ready endpoint");
    assert!(
        curl(&format!("http://{cluster_ip}/")).is_none(),
        "no ready endpoint: refused"
    );
    let dig = |name: &str| dig_sorted(dns, name).join(",");
    wait_for("publishNotReadyAddresses publishes the unready pod", || {
        (dig("probed-peers.default.svc.cluster.local") == pod_ip).then_some(String::new())
    });

    // The probe passes: the pod becomes a ready endpoint and takes traffic.
    std::fs::write(&flag, "ok").unwrap();
    wait_for("ready endpoint", || {
        (ready() == pod_ip).then_some(String::new())
    });
    let reply = wait_for("traffic through the service", || {
        curl(&format!("http://{cluster_ip}/"))
    });
    assert!(reply.contains("pod=probed"), "{reply}");
    // `kubectl logs` serves what the agent captured from the container.
    let logs = up.ok(&["logs", "probed"]);
    assert!(logs.contains("svcnet test server: pod=probed"), "{logs}");

    // The probe fails again: the endpoint leaves, the service refuses.
    std::fs::remove_file(&flag).unwrap();
    wait_for("endpoint leaves", || {
        ready().is_empty().then_some(String::new())
    });
    wait_for("service refuses again", || {
        curl(&format!("http://{cluster_ip}/"))
            .is_none()
            .then_some(String::new())
    });
    assert_eq!(dig("probed-peers.default.svc.cluster.local"), pod_ip);

    // Deleting a pod while a client loops over the service loses no request: the endpoint turns
    // terminating at once and the pod drains before it exits.
    up.ok(&["apply", "-f", &example("myapp.yaml")]);
    let myapp_ip = up.ok(&["get", "svc", "myapp", "-o", "jsonpath={.spec.clusterIP}"]);
    wait_for("3 ready myapp endpoints", || {
        let ep = up.ok(&[
            "get",
            "endpoints",
            "myapp",
            "-o",
            "jsonpath={.subsets[*].addresses[*].ip}",
        ]);
        (ep.split_whitespace().count() == 3).then_some(ep)
    });
    let victim = up.ok(&[
        "get",
        "pods",
        "-l",
        "app=myapp",
        "-o",
        "jsonpath={.items[0].metadata.name}",
    ]);
    let url = format!("http://{myapp_ip}/");
    // The proxies program the service a moment after its endpoints are published.
    wait_for("the proxy serves myapp", || {
        curl(&url).filter(|r| answered_by(r).is_some())
    });
    let client = std::thread::spawn(move || {
        let (mut ok, mut failed) = (0, Vec::new());
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_secs(8) {
            let out = Command::new("curl")
                .args(["-s", "-S", "-m", "3", &url])
                .output()
                .unwrap();
            let reply = String::from_utf8_lossy(&out.stdout);
            if out.status.success() && answered_by(&reply).is_some() {
                ok += 1;
            } else {
                failed.push(format!(
                    "at {:?}: {} {}",
                    start.elapsed(),
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        }
        (ok, failed)
    });
    std::thread::sleep(std::time::Duration::from_millis(500));
    let deleted = up.kubectl(&["delete", "pod", &victim, "--wait=false"]);
    assert!(
        deleted.status.success(),
        "{}",
        String::from_utf8_lossy(&deleted.stderr)
    );
    let (ok, failed) = client.join().unwrap();
    assert!(
        ok > 20,
        "the client made too few requests to mean anything: {ok}"
    );
    assert!(
        failed.is_empty(),
        "{} of {} requests failed: {failed:?}",
        failed.len(),
        ok + failed.len()
    );
    wait_for("the deleted pod is gone and replaced", || {
        let pods = up.ok(&["get", "pods", "-l", "app=myapp", "-o", "name"]);
        (!pods.contains(&victim) && pods.lines().count() == 3).then_some(pods)
    });

    // `svcnet up` again on the same data dir brings the same pods back (same names, new
    // sandboxes), and the endpoints and traffic follow.
    let names = |up: &Up| {
        let mut pods: Vec<String> = up
            .ok(&["get", "pods", "-o", "name"])
            .lines()
            .map(str::to_string)
            .collect();
        pods.sort();
        pods
    };
    let before = names(&up);
    up.restart();
    wait_for("all pods running again", || {
        let phases = up.ok(&["get", "pods", "-o", "jsonpath={.items[*].status.phase}"]);
        let running = phases
            .split_whitespace()
            .filter(|p| *p == "Running")
            .count();
        (running == before.len()).then_some(phases)
    });
    assert_eq!(names(&up), before, "the same pods come back");
    wait_for("3 ready myapp endpoints after the restart", || {
        let ep = up.ok(&[
            "get",
            "endpoints",
            "myapp",
            "-o",
            "jsonpath={.subsets[*].addresses[*].ip}",
        ]);
        (ep.split_whitespace().count() == 3).then_some(ep)
    });
    wait_for("traffic after the restart", || {
        curl(&format!("http://{myapp_ip}/")).filter(|r| answered_by(r).is_some())
    });

    net.stop(&mut up);
}

/// SIGTERM while `svcnet up` is still starting (its node namespaces exist, nothing serves yet)
/// stops it the graceful way once it is up: it exits 0 and leaves no namespace, link or route.
/// Before, the signal's default action killed it there and left the nodes behind.
#[test]
fn sigterm_during_start_stops_it_cleanly() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let net = Net {
        prefix: "e2esig",
        underlay: "172.29.121.0/24",
        pods: "10.121.0.0/16",
        services: "10.122.0.0/16",
        lb: "10.123.0.0/24",
    };
    let mut up = net.spawn_with("2", free_udp_port(), &[]);
    wait_for("the first node's namespace", || {
        std::path::Path::new("/run/netns/e2esig-node1")
            .exists()
            .then(String::new)
    });
    net.stop(&mut up);
}

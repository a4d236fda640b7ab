//! End to end: the real `svcnet up` binary driven by the real `kubectl`, through the seeds' manifests.
#![allow(clippy::unwrap_used)] // test helpers: a failure here is a test failure

mod common;

use std::process::Command;

use common::{Up, curl, dig_sorted, example, free_udp_port, wait_for};

/// A pod on a node no agent runs (kwok style), so the test sets its status by hand.
fn kwok_pod(name: &str) -> String {
    format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","namespace":"default",
        "labels":{{"app":"myapp","release":"stabel"}}}},
        "spec":{{"nodeName":"kwok-node","containers":[{{"name":"myapp","image":"nginx:1.7.9",
        "ports":[{{"name":"http","containerPort":80}}]}}]}}}}"#
    )
    .replace('\n', "")
}

fn ready_status(ip: &str) -> String {
    format!(
        r#"{{"status":{{"phase":"Running","podIP":"{ip}","podIPs":[{{"ip":"{ip}"}}],
        "conditions":[{{"type":"Ready","status":"True"}}]}}}}"#
    )
    .replace('\n', "")
}

#[test]
fn up_serves_the_seed_walkthrough_to_kubectl() {
    let dns = free_udp_port();
    // The upstream is a closed loopback port: no test query ever leaves the machine.
    let upstream = free_udp_port();
    let up = Up::start(&[
        "--disable",
        "proxy,agent",
        "--dns-listen",
        &dns.to_string(),
        "--dns-upstream",
        &upstream.to_string(),
    ]);
    let out = up.ok(&["apply", "-f", &example("myapp.yaml")]);
    for line in [
        "deployment.apps/myapp-deploy created",
        "service/myapp created",
        "service/myapp-headless created",
        "service/myapp-loadbalance created",
        "service/my-service-1 created",
    ] {
        assert!(out.contains(line), "apply output lacks {line:?}: {out}");
    }

    let svc = up.ok(&["get", "svc"]);
    let row = |name: &str| -> Vec<String> {
        svc.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no row for {name} in:\n{svc}"))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    assert_eq!(
        row("kubernetes")[..5],
        ["kubernetes", "ClusterIP", "10.96.0.1", "<none>", "443/TCP"]
    );
    let myapp = row("myapp");
    assert_eq!(myapp[1], "ClusterIP");
    assert!(
        myapp[2].starts_with("10.9") && myapp[2] != "10.96.0.1",
        "cluster IP {myapp:?}"
    );
    assert_eq!(myapp[4], "80/TCP");
    assert_eq!(row("myapp-headless")[1..3], ["ClusterIP", "None"]);
    let lb = row("myapp-loadbalance");
    assert_eq!(lb[1], "LoadBalancer");
    assert!(
        lb[3].starts_with("10.200.0."),
        "LB ingress IP from the pool: {lb:?}"
    );
    assert!(
        lb[4].starts_with("8765:3") && lb[4].ends_with("/TCP"),
        "node port: {lb:?}"
    );
    assert_eq!(
        row("my-service-1")[1..4],
        ["ExternalName", "<none>", "www.baidu.com"]
    );

    // Cluster DNS follows: the seeds' names resolve through `dig`.
    let dig = |name: &str| dig_sorted(dns, name).join("\n");
    assert_eq!(dig("myapp.default.svc.cluster.local"), myapp[2]);
    assert_eq!(dig("kube-dns.kube-system.svc.cluster.local"), "10.96.0.10");
    assert_eq!(dig("kubernetes.default.svc.cluster.local"), "10.96.0.1");
    let cname = Command::new("dig")
        .args([
            "+noall",
            "+answer",
            "+time=2",
            "+tries=1",
            "-p",
            &dns.port().to_string(),
            "@127.0.0.1",
        ])
        .arg("my-service-1.default.svc.cluster.local")
        .output()
        .unwrap();
    let cname: Vec<String> = String::from_utf8_lossy(&cname.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    assert_eq!(
        cname[..5],
        [
            "my-service-1.default.svc.cluster.local.",
            "30",
            "IN",
            "CNAME",
            "www.baidu.com."
        ],
        "the CNAME comes first; the upstream is closed, so nothing follows it"
    );

    // The Deployment's pods are bound to the local node; endpoints come from pods with IPs.
    wait_for("3 deployment pods", || {
        let pods = up.ok(&["get", "pods", "-l", "app=myapp", "-o", "name"]);
        (pods.lines().count() == 3).then_some(pods)
    });
    // As with kwok, the pods live on a node that exists but runs no agent.
    let node = up.data_dir.path().join("kwok-node.json");
    std::fs::write(
        &node,
        r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"kwok-node"}}"#,
    )
    .unwrap();
    up.ok(&["create", "-f", node.to_str().unwrap()]);
    for (name, ip) in [("kwok-a", "10.244.9.11"), ("kwok-b", "10.244.9.12")] {
        let manifest = kwok_pod(name);
        let file = up.data_dir.path().join(format!("{name}.json"));
        std::fs::write(&file, manifest).unwrap();
        up.ok(&["create", "-f", file.to_str().unwrap()]);
        up.ok(&[
            "patch",
            "pod",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &ready_status(ip),
        ]);
    }
    let endpoints = wait_for("ready endpoints of myapp", || {
        let ep = up.ok(&["get", "endpoints", "myapp"]);
        (ep.contains("10.244.9.11:80") && ep.contains("10.244.9.12:80")).then_some(ep)
    });
    assert!(endpoints.starts_with("NAME"), "{endpoints}");
    wait_for("ready endpoint slice of myapp", || {
        let slices = up.ok(&[
            "get",
            "endpointslices",
            "-l",
            "kubernetes.io/service-name=myapp",
        ]);
        (slices.contains("IPv4") && slices.contains("10.244.9.11,10.244.9.12")).then_some(slices)
    });
    // DNS follows the pods marked ready by hand: the headless name has exactly their IPs, and
    // a deleted service's name is gone (NXDOMAIN).
    wait_for("headless answers with the ready pods", || {
        let mut ips: Vec<String> = dig("myapp-headless.default.svc.cluster.local")
            .lines()
            .map(str::to_string)
            .collect();
        ips.sort();
        (ips == ["10.244.9.11", "10.244.9.12"]).then(|| ips.join(","))
    });
    up.ok(&["delete", "svc", "myapp-headless"]);
    wait_for("the deleted headless service is NXDOMAIN", || {
        let out = Command::new("dig")
            .args([
                "+time=2",
                "+tries=1",
                "-p",
                &dns.port().to_string(),
                "@127.0.0.1",
            ])
            .arg("myapp-headless.default.svc.cluster.local")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.contains("status: NXDOMAIN").then_some(text)
    });

    // The seeds re-apply myapp as a NodePort service: the cluster IP stays, a node port appears.
    up.ok(&["apply", "-f", &example("myapp-nodeport.yaml")]);
    let svc = up.ok(&["get", "svc", "myapp", "--no-headers"]);
    let cols: Vec<&str> = svc.split_whitespace().collect();
    assert_eq!(cols[1], "NodePort");
    assert_eq!(cols[2], myapp[2], "cluster IP kept across apply");
    assert!(
        cols[4].starts_with("80:3") && cols[4].ends_with("/TCP"),
        "{svc}"
    );

    // A bad manifest is refused with upstream's field messages, and nothing is created.
    let bad = up.kubectl(&["apply", "-f", &example("bad-service.yaml")]);
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains(r#"The Service "broken" is invalid"#), "{err}");
    assert!(
        err.contains(
            "spec.ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive"
        ),
        "{err}"
    );
    assert!(
        err.contains(r#"spec.ports[1].name: Duplicate value: "http""#),
        "{err}"
    );
    assert!(!up.kubectl(&["get", "svc", "broken"]).status.success());

    // Deleting the service removes its endpoints and slices.
    up.ok(&["delete", "svc", "myapp"]);
    wait_for("myapp slices removed", || {
        let slices = up.ok(&[
            "get",
            "endpointslices",
            "-l",
            "kubernetes.io/service-name=myapp",
            "-o",
            "name",
        ]);
        slices.trim().is_empty().then_some(slices)
    });
}

#[test]
fn up_keeps_objects_and_allocations_across_restarts() {
    let mut up = Up::start(&["--disable", "proxy,dns,agent"]);
    up.ok(&["apply", "-f", &example("myapp.yaml")]);
    let before = up.ok(&["get", "svc", "-o", "custom-columns=NAME:.metadata.name,IP:.spec.clusterIP,NP:.spec.ports[*].nodePort,LB:.status.loadBalancer.ingress[*].ip"]);
    up.restart();
    let after = up.ok(&["get", "svc", "-o", "custom-columns=NAME:.metadata.name,IP:.spec.clusterIP,NP:.spec.ports[*].nodePort,LB:.status.loadBalancer.ingress[*].ip"]);
    assert_eq!(before, after);
    // A new service never reuses an allocated IP.
    let fresh = up.data_dir.path().join("fresh.json");
    std::fs::write(
        &fresh,
        r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"fresh"},"spec":{"ports":[{"port":80}]}}"#,
    )
    .unwrap();
    up.ok(&["apply", "-f", fresh.to_str().unwrap()]);
    let fresh = up.ok(&["get", "svc", "fresh", "-o", "jsonpath={.spec.clusterIP}"]);
    assert!(
        !before.contains(&format!(" {fresh} ")),
        "{fresh} reused in\n{before}"
    );
}

/// Development without root: `--disable agent --proxy-mode userspace` with a loopback service
/// CIDR binds each cluster IP directly, and hand-written Endpoints on loopback take traffic.
#[test]
fn unprivileged_userspace_proxy_serves_loopback_cluster_ips() {
    // A backend on loopback answering every request with a fixed line.
    let backend = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let backend_port = backend.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for mut conn in backend.incoming().flatten() {
            let mut buf = [0u8; 1024];
            let _ = conn.read(&mut buf);
            let _ = conn.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 14\r\nConnection: close\r\n\r\nhello from dev",
            );
        }
    });
    let up = Up::start(&[
        "--disable",
        "agent,dns",
        "--proxy-mode",
        "userspace",
        "--service-cidr",
        "127.97.0.0/16",
    ]);
    let manifest = format!(
        r#"
apiVersion: v1
kind: Service
metadata: {{name: dev}}
spec:
  ports: [{{port: 8080}}]
---
apiVersion: v1
kind: Endpoints
metadata: {{name: dev}}
subsets:
- addresses: [{{ip: 127.0.0.1}}]
  ports: [{{port: {backend_port}}}]
"#
    );
    let file = up.data_dir.path().join("dev.yaml");
    std::fs::write(&file, manifest).unwrap();
    up.ok(&["apply", "-f", file.to_str().unwrap()]);
    let ip = up.ok(&["get", "svc", "dev", "-o", "jsonpath={.spec.clusterIP}"]);
    assert!(ip.starts_with("127.97."), "{ip}");
    let url = format!("http://{ip}:8080/");
    let reply = wait_for("the cluster IP answers", || curl(&url));
    assert_eq!(reply, "hello from dev");
    // Without endpoints the service refuses at once.
    up.ok(&["delete", "endpoints", "dev"]);
    wait_for("refused without endpoints", || {
        curl(&url).is_none().then_some(String::new())
    });
}

/// A process this test started, killed (by its id) and reaped on drop, also on failure.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn http_get(addr: std::net::SocketAddr, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s =
        std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(1)).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// Without root, for real: the unprivileged userspace proxy (`svcnet proxy --unprivileged`,
/// run as `nobody` with no capability through `setpriv`) cannot bind the `default/kubernetes`
/// service's 127.98.0.1:443. It says so once, with what to do, keeps serving the rest and
/// retrying with back-off, and shows the port on `/healthz` and `/metrics`.
#[test]
fn unprivileged_proxy_reports_an_unbindable_port_once_in_health_and_metrics() {
    if !common::is_root() {
        eprintln!("skipped: needs root to become nobody (CI runs as root)");
        return;
    }
    let start: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1024);
    if start <= 443 {
        eprintln!("skipped: net.ipv4.ip_unprivileged_port_start is {start}");
        return;
    }
    let up = Up::start(&[
        "--disable",
        "agent,dns,proxy",
        "--service-cidr",
        "127.98.0.0/16",
    ]);
    let ip = up.ok(&[
        "get",
        "svc",
        "kubernetes",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ]);
    assert!(ip.starts_with("127.98."), "{ip}");
    // What nobody may read and write: a copy of the kubeconfig and the proxy's log.
    let dir = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let kc = dir.path().join("kubeconfig");
    std::fs::copy(up.kubeconfig(), &kc).unwrap();
    std::fs::set_permissions(&kc, std::fs::Permissions::from_mode(0o644)).unwrap();
    let log_path = dir.path().join("proxy.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let healthz = common::free_port();
    let metrics = common::free_port();
    let child = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--",
        ])
        .arg(env!("CARGO_BIN_EXE_svcnet"))
        .args(["proxy", "--kubeconfig"])
        .arg(&kc)
        .args([
            "--node-name",
            "dev",
            "--mode",
            "userspace",
            "--unprivileged",
            "--service-cidr",
            "127.98.0.0/16",
            "--healthz-bind-address",
            &healthz.to_string(),
            "--metrics-bind-address",
            &metrics.to_string(),
        ])
        .env("SVCNET_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .expect("setpriv (util-linux) runs the proxy as nobody");
    let _proxy = Killed(child);
    let addr = format!("{ip}:443");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let health = loop {
        if let Some(h) = http_get(healthz, "/healthz").filter(|h| h.contains(&addr)) {
            break h;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no unbound {addr} on /healthz; the proxy's log:\n{}",
            std::fs::read_to_string(&log_path).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let body = health.split("\r\n\r\n").nth(1).unwrap();
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    let u = &v["unboundFrontends"][0];
    assert_eq!(u["address"], addr.as_str(), "{v:#}");
    assert_eq!(u["protocol"], "TCP", "{v:#}");
    assert!(
        u["error"].as_str().unwrap().contains("Permission denied"),
        "{v:#}"
    );
    assert!(
        u["hint"].as_str().unwrap().contains("CAP_NET_BIND_SERVICE"),
        "{v:#}"
    );
    let m = http_get(metrics, "/metrics").unwrap();
    let line = format!(
        "kubeproxy_userspace_frontend_unbound{{address=\"{addr}\",protocol=\"TCP\",reason=\"permission_denied\"}} 1"
    );
    assert!(m.lines().any(|l| l == line), "{line} not in\n{m}");
    // Several syncs and retries later the failure is still reported once, with the fix.
    std::thread::sleep(std::time::Duration::from_secs(4));
    let m = http_get(metrics, "/metrics").unwrap();
    let attempts: u64 = m
        .lines()
        .find(|l| l.starts_with("kubeproxy_userspace_frontend_bind_failures_total{"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no bind failure counter in\n{m}"));
    // Back-off from 1 s: about 3 or 4 attempts in 5 s, never one per sync tick.
    assert!((2..=5).contains(&attempts), "{attempts} attempts");
    let text = std::fs::read_to_string(&log_path).unwrap();
    let said = format!("cannot bind TCP {addr}: Permission denied");
    assert_eq!(text.matches(&said).count(), 1, "{text}");
    assert!(
        text.contains("net.ipv4.ip_unprivileged_port_start=443"),
        "{text}"
    );
}

/// Every node `svcnet up` registers heartbeats as a kubelet does: a Lease named after it in
/// `kube-node-lease`, held by it for 40 s, owned by the Node, renewed every 10 s; `kubectl
/// describe node` shows it.
#[test]
fn nodes_heartbeat_through_their_leases() {
    let up = Up::start(&["--disable", "proxy,dns,agent,controllers"]);
    let node = up.ok(&["get", "nodes", "-o", "jsonpath={.items[0].metadata.name}"]);
    let uid = up.ok(&["get", "node", &node, "-o", "jsonpath={.metadata.uid}"]);
    let lease = |field: &str| {
        up.ok(&[
            "get",
            "lease",
            "-n",
            "kube-node-lease",
            &node,
            "-o",
            &format!("jsonpath={field}"),
        ])
    };
    wait_for("the node's lease", || {
        let out = up.kubectl(&["get", "lease", "-n", "kube-node-lease", &node]);
        out.status.success().then(String::new)
    });
    assert_eq!(lease("{.spec.holderIdentity}"), node);
    assert_eq!(lease("{.spec.leaseDurationSeconds}"), "40");
    assert_eq!(
        lease(
            "{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}/{.metadata.ownerReferences[0].uid}"
        ),
        format!("Node/{node}/{uid}")
    );
    let first = lease("{.spec.renewTime}");
    let describe = up.ok(&["describe", "node", &node]);
    assert!(
        describe.contains(&format!("HolderIdentity:  {node}"))
            && !describe.contains("RenewTime:       <unset>"),
        "{describe}"
    );
    // Renewed within the kubelet's interval (10 s), with some slack for a loaded machine.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(25);
    while lease("{.spec.renewTime}") == first {
        assert!(
            std::time::Instant::now() < deadline,
            "the lease was not renewed: {first}"
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}

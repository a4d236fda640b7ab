//! The CNI plugin against the real kernel (root): ADD/DEL/CHECK through the CNI calling
//! convention, the result and error formats, IPAM persistence, and real traffic pod ↔ pod,
//! host → pod and across nodes.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use svcnet_agent::cni::{self, Invocation, NetConf};
use svcnet_agent::test_support::Slot;
use svcnet_agent::topology::{NodeTopology, Topology};
use svcnet_netns::NetNs;
use svcnet_netns::test_support::{serve_tcp, tcp_ask};

fn netconf(node: &NodeTopology, data: &Path) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "svcnet",
        "type": "svcnet-bridge",
        "bridge": "cni0",
        "nodeNetns": node.netns,
        "dataDir": data,
        "ipam": {"type": "svcnet-host-local", "subnet": node.pod_cidr, "gateway": node.gateway},
    })
}

/// The plugin called for container `id` in the named namespace `netns`, as a runtime calls it.
fn call(command: &str, id: &str, netns: &str, conf: &Value) -> (Value, i32) {
    let netns = format!("/run/netns/{netns}");
    call_env(
        &[
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", id),
            ("CNI_NETNS", &netns),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin"),
        ],
        conf,
    )
}

fn ip_of(result: &Value) -> Ipv4Addr {
    result["ips"][0]["address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn add_check_del_with_real_traffic_and_persistent_ipam() {
    let slot = Slot::acquire().unwrap();
    let data = tempfile::tempdir().unwrap();
    let config = slot.config(1, data.path().to_path_buf());
    let prefix = config.prefix.clone();
    let topo = Topology::create(config).unwrap();
    let node = topo.nodes()[0].clone();
    let conf = netconf(&node, data.path());
    let pod_a = NetNs::create(&format!("{prefix}-pod-a")).unwrap();
    let pod_b = NetNs::create(&format!("{prefix}-pod-b")).unwrap();

    let (a, code) = call("ADD", "ctr-a", pod_a.name(), &conf);
    assert_eq!(code, 0, "{a}");
    // The SPEC's result shape.
    assert_eq!(a["cniVersion"], "1.0.0");
    assert_eq!(
        a["interfaces"][0]["name"],
        cni::host_veth_name("ctr-a", "eth0")
    );
    assert!(a["interfaces"][0].get("sandbox").is_none());
    assert_eq!(a["interfaces"][1]["name"], "eth0");
    assert_eq!(
        a["interfaces"][1]["sandbox"],
        format!("/run/netns/{}", pod_a.name())
    );
    assert_eq!(a["interfaces"][1]["mac"].as_str().unwrap().len(), 17);
    assert_eq!(a["ips"][0]["interface"], 1);
    assert_eq!(a["ips"][0]["gateway"], node.gateway.to_string());
    assert_eq!(
        a["routes"],
        json!([{"dst": "0.0.0.0/0", "gw": node.gateway.to_string()}])
    );
    let ip_a = ip_of(&a);
    assert!(node.pod_cidr.contains(&ip_a) && ip_a != node.gateway);
    let lo = pod_a.exec(&["ip", "-br", "link", "show", "lo"]).unwrap();
    assert!(lo.contains("UP") || lo.contains("UNKNOWN"), "{lo}");
    // The pod's bridge port hairpins (a pod reaching itself through a service).
    let port = svcnet_netns::command(Some(&node.netns), "ip")
        .args(["-d", "link", "show", &cni::host_veth_name("ctr-a", "eth0")])
        .output()
        .unwrap();
    let port = String::from_utf8_lossy(&port.stdout);
    assert!(port.contains("hairpin on"), "{port}");

    let (b, code) = call("ADD", "ctr-b", pod_b.name(), &conf);
    assert_eq!(code, 0, "{b}");
    let ip_b = ip_of(&b);
    assert_ne!(ip_a, ip_b);

    // CHECK passes, with and without prevResult.
    assert_eq!(
        call("CHECK", "ctr-a", pod_a.name(), &conf),
        (Value::Null, 0)
    );
    let mut with_prev = conf.clone();
    with_prev["prevResult"] = a.clone();
    assert_eq!(
        call("CHECK", "ctr-a", pod_a.name(), &with_prev),
        (Value::Null, 0)
    );

    // Pod a ↔ pod b on one bridge, the client address preserved; host → pod through the node.
    let _srv = serve_tcp(&pod_b, 8080, "b").unwrap();
    let to_b = SocketAddr::new(IpAddr::V4(ip_b), 8080);
    let reply = pod_a
        .run(move || tcp_ask(to_b, Duration::from_secs(2)))
        .unwrap()
        .unwrap();
    assert_eq!(
        (reply.identity.as_str(), reply.client),
        ("b", IpAddr::V4(ip_a))
    );
    let reply = tcp_ask(to_b, Duration::from_secs(2)).unwrap();
    assert_eq!(
        (reply.identity.as_str(), reply.client),
        ("b", IpAddr::V4(topo.host_ip()))
    );

    // CHECK notices a missing default route.
    pod_a.exec(&["ip", "route", "del", "default"]).unwrap();
    let (err, code) = call("CHECK", "ctr-a", pod_a.name(), &conf);
    assert_eq!(code, 1);
    assert_eq!(err["code"], 101, "{err}");
    assert_eq!(err["cniVersion"], "1.0.0");
    assert!(
        err["msg"].as_str().unwrap().contains("default route"),
        "{err}"
    );

    // DEL is idempotent and releases the address; the veth is gone from the node.
    assert_eq!(call("DEL", "ctr-a", pod_a.name(), &conf), (Value::Null, 0));
    assert_eq!(call("DEL", "ctr-a", pod_a.name(), &conf), (Value::Null, 0));
    assert_eq!(
        call("DEL", "never-added", "", &conf),
        (Value::Null, 0),
        "DEL without a namespace"
    );
    let node_links = svcnet_agent::ip::link_names(Some(&node.netns)).unwrap();
    assert!(
        !node_links.contains(&cni::host_veth_name("ctr-a", "eth0")),
        "{node_links:?}"
    );
    let (err, _) = call("CHECK", "ctr-a", pod_a.name(), &conf);
    assert_eq!(err["code"], 101);

    // A "restart": a fresh IPAM over the same data dir keeps b's address and never reuses it;
    // ADD again for b (same container) returns the same address.
    let conf_typed: NetConf = serde_json::from_value(conf.clone()).unwrap();
    let ipam = cni::Ipam::open(data.path(), "svcnet", &conf_typed.ipam).unwrap();
    assert_eq!(ipam.find("ctr-b", "eth0").unwrap(), Some(ip_b));
    let pod_c = NetNs::create(&format!("{prefix}-pod-c")).unwrap();
    let (c, code) = call("ADD", "ctr-c", pod_c.name(), &conf);
    assert_eq!(code, 0, "{c}");
    assert_ne!(ip_of(&c), ip_b);
    let again = cni::add(&conf_typed, &Invocation::new("ctr-b", pod_b.name())).unwrap();
    assert_eq!(again.pod_ip(), Some(ip_b));
    assert_eq!(ipam.allocations().unwrap().len(), 2);
    drop(_srv);
    topo.destroy().unwrap();
}

#[test]
fn errors_use_the_cni_error_format() {
    let data = tempfile::tempdir().unwrap();
    let conf = json!({"cniVersion": "9.9.9", "name": "svcnet", "type": "x", "dataDir": data.path(),
                      "ipam": {"subnet": "10.1.0.0/24", "gateway": "10.1.0.1"}});
    let (err, code) = call("ADD", "c", "nope", &conf);
    assert_eq!(code, 1);
    assert_eq!(err["code"], 1, "{err}");
    assert_eq!(err["cniVersion"], "9.9.9");
    let mut conf = conf;
    conf["cniVersion"] = json!("1.0.0");
    let (err, _) = call("ADD", "c", "svcnet-no-such-netns", &conf);
    assert_eq!(err["code"], 3, "{err}");
    let env: BTreeMap<String, String> = [("CNI_COMMAND".to_string(), "ADD".to_string())].into();
    let (out, code) = cni::invoke(&env, b"{not json");
    let err: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((err["code"].as_u64(), code), (Some(6), 1), "{err}");
    let env: BTreeMap<String, String> = [("CNI_COMMAND".to_string(), "VERSION".to_string())].into();
    let (out, code) = cni::invoke(&env, b"{}");
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert!(
        v["supportedVersions"]
            .as_array()
            .unwrap()
            .contains(&json!("1.0.0"))
    );
}

#[test]
fn pods_on_two_nodes_reach_each_other_via_host_gw() {
    let slot = Slot::acquire().unwrap();
    let data = tempfile::tempdir().unwrap();
    let config = slot.config(2, data.path().to_path_buf());
    let prefix = config.prefix.clone();
    let topo = Topology::create(config).unwrap();
    let (n1, n2) = (topo.nodes()[0].clone(), topo.nodes()[1].clone());
    let p1 = NetNs::create(&format!("{prefix}-pod-1")).unwrap();
    let p2 = NetNs::create(&format!("{prefix}-pod-2")).unwrap();
    let c1: NetConf = serde_json::from_value(netconf(&n1, data.path())).unwrap();
    let c2: NetConf = serde_json::from_value(netconf(&n2, data.path())).unwrap();
    let r1 = cni::add(&c1, &Invocation::new("one", p1.name())).unwrap();
    let r2 = cni::add(&c2, &Invocation::new("two", p2.name())).unwrap();
    let (ip1, ip2) = (r1.pod_ip().unwrap(), r2.pod_ip().unwrap());
    assert!(n1.pod_cidr.contains(&ip1) && n2.pod_cidr.contains(&ip2));
    let _srv = serve_tcp(&p2, 9000, "two").unwrap();
    let to2 = SocketAddr::new(IpAddr::V4(ip2), 9000);
    let reply = p1
        .run(move || tcp_ask(to2, Duration::from_secs(2)))
        .unwrap()
        .unwrap();
    assert_eq!(
        (reply.identity.as_str(), reply.client),
        ("two", IpAddr::V4(ip1)),
        "no NAT between nodes"
    );
    cni::del(&c1, &Invocation::new("one", p1.name())).unwrap();
    cni::del(&c2, &Invocation::new("two", p2.name())).unwrap();
    drop(_srv);
    topo.destroy().unwrap();
}

/// The plugin called with exactly this environment: its output (JSON, or null when empty) and
/// exit code.
fn call_env(env: &[(&str, &str)], conf: &Value) -> (Value, i32) {
    let env: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let (out, code) = cni::invoke(&env, conf.to_string().as_bytes());
    let v = if out.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&out).unwrap()
    };
    (v, code)
}

/// SPEC 1.1's STATUS and GC, and a `CNI_NETNS` that is a namespace file's path outside
/// `/run/netns` (`/proc/<pid>/ns/net`, as runtimes that do not name their namespaces pass it).
#[test]
fn status_gc_and_a_namespace_given_by_path() {
    let slot = Slot::acquire().unwrap();
    let data = tempfile::tempdir().unwrap();
    let config = slot.config(1, data.path().to_path_buf());
    let prefix = config.prefix.clone();
    let topo = Topology::create(config).unwrap();
    let node = topo.nodes()[0].clone();
    let mut conf = netconf(&node, data.path());
    conf["cniVersion"] = json!("1.1.0");

    // STATUS: ready; 50 while the node's namespace is missing.
    assert_eq!(
        call_env(&[("CNI_COMMAND", "STATUS")], &conf),
        (Value::Null, 0)
    );
    let mut no_node = conf.clone();
    no_node["nodeNetns"] = json!(format!("{prefix}-nonode"));
    let (err, code) = call_env(&[("CNI_COMMAND", "STATUS")], &no_node);
    assert_eq!((err["code"].as_u64(), code), (Some(50), 1), "{err}");
    assert!(err["msg"].as_str().unwrap().contains("nonode"), "{err}");
    // A /30 holds one address besides its gateway: STATUS turns 50 once it is taken.
    let mut tiny = conf.clone();
    tiny["name"] = json!("tiny");
    tiny["ipam"]["subnet"] = json!("10.255.255.252/30");
    tiny["ipam"]["gateway"] = json!("10.255.255.253");
    assert_eq!(
        call_env(&[("CNI_COMMAND", "STATUS")], &tiny),
        (Value::Null, 0)
    );
    let tiny_typed: NetConf = serde_json::from_value(tiny.clone()).unwrap();
    cni::Ipam::open(data.path(), "tiny", &tiny_typed.ipam)
        .unwrap()
        .allocate("someone", "eth0")
        .unwrap();
    let (err, _) = call_env(&[("CNI_COMMAND", "STATUS")], &tiny);
    assert_eq!(err["code"], 50, "{err}");

    // ADD into a namespace known only by a process's /proc path.
    let pod = NetNs::create(&format!("{prefix}-pod-p")).unwrap();
    let mut holder = svcnet_netns::command(Some(pod.name()), "sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let path = format!("/proc/{}/ns/net", holder.id());
    let add = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "by-path"),
        ("CNI_NETNS", path.as_str()),
        ("CNI_IFNAME", "eth0"),
    ];
    let (res, code) = call_env(&add, &conf);
    assert_eq!(code, 0, "{res}");
    assert_eq!(res["cniVersion"], "1.1.0");
    assert_eq!(res["interfaces"][1]["sandbox"], path);
    let ip_p = ip_of(&res);
    // The interface is in the pod's namespace (the same one, seen by its name) with the address.
    let shown = pod.exec(&["ip", "-br", "addr", "show", "eth0"]).unwrap();
    assert!(shown.contains(&ip_p.to_string()), "{shown}");
    let check = [
        ("CNI_COMMAND", "CHECK"),
        ("CNI_CONTAINERID", "by-path"),
        ("CNI_NETNS", path.as_str()),
        ("CNI_IFNAME", "eth0"),
    ];
    assert_eq!(call_env(&check, &conf), (Value::Null, 0));
    // A relative or empty CNI_NETNS on ADD is the environment's error (4).
    let bad = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "x"),
        ("CNI_NETNS", "relative/ns"),
        ("CNI_IFNAME", "eth0"),
    ];
    assert_eq!(call_env(&bad, &conf).0["code"], 4);

    // GC releases what the runtime no longer lists, and keeps what it does.
    let pod_q = NetNs::create(&format!("{prefix}-pod-q")).unwrap();
    let (q, code) = call("ADD", "gc-me", pod_q.name(), &conf);
    assert_eq!(code, 0, "{q}");
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "by-path", "ifname": "eth0"}]);
    assert_eq!(call_env(&[("CNI_COMMAND", "GC")], &gc), (Value::Null, 0));
    let conf_typed: NetConf = serde_json::from_value(conf.clone()).unwrap();
    let ipam = cni::Ipam::open(data.path(), "svcnet", &conf_typed.ipam).unwrap();
    assert_eq!(ipam.find("by-path", "eth0").unwrap(), Some(ip_p));
    assert_eq!(ipam.find("gc-me", "eth0").unwrap(), None);
    let node_links = svcnet_agent::ip::link_names(Some(&node.netns)).unwrap();
    assert!(!node_links.contains(&cni::host_veth_name("gc-me", "eth0")));
    assert!(node_links.contains(&cni::host_veth_name("by-path", "eth0")));

    // DEL by path, twice (idempotent), then with the holder gone and no CNI_NETNS at all.
    let del = [
        ("CNI_COMMAND", "DEL"),
        ("CNI_CONTAINERID", "by-path"),
        ("CNI_NETNS", path.as_str()),
        ("CNI_IFNAME", "eth0"),
    ];
    assert_eq!(call_env(&del, &conf), (Value::Null, 0));
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert_eq!(call_env(&del, &conf), (Value::Null, 0));
    assert_eq!(ipam.allocations().unwrap(), Vec::new());
    topo.destroy().unwrap();
}

/// The runtime's side: a network list run through the plugin, the result cached for CHECK and
/// DEL, and a failing plugin program's error object read back.
#[test]
fn network_list_runs_the_plugin_as_a_runtime_does() {
    use svcnet_agent::cni::exec::{NetworkList, Plugin};
    let slot = Slot::acquire().unwrap();
    let data = tempfile::tempdir().unwrap();
    let config = slot.config(1, data.path().to_path_buf());
    let prefix = config.prefix.clone();
    let topo = Topology::create(config).unwrap();
    let node = topo.nodes()[0].clone();
    let conf: NetConf = serde_json::from_value(netconf(&node, data.path())).unwrap();
    let cache = data.path().join("results");
    let list = NetworkList::single(&conf, cache.clone()).unwrap();
    assert_eq!(list.to_json()["plugins"][0]["type"], "svcnet-bridge");
    assert!(list.to_json()["plugins"][0].get("cniVersion").is_none());
    let pod = NetNs::create(&format!("{prefix}-pod-l")).unwrap();
    let inv = Invocation::new("listed", pod.name());
    let result = list.add(&Plugin::InProcess, &inv).unwrap();
    let cached: Value =
        serde_json::from_slice(&std::fs::read(cache.join("svcnet-listed-eth0")).unwrap()).unwrap();
    assert_eq!(cached["ips"][0]["address"], result.ips[0].address);
    list.check(&Plugin::InProcess, &inv).unwrap();
    // CHECK compares against the cached result: a cache naming another address fails it.
    let mut wrong = cached.clone();
    wrong["ips"][0]["address"] = json!("10.255.0.9/24");
    std::fs::write(cache.join("svcnet-listed-eth0"), wrong.to_string()).unwrap();
    let err = list.check(&Plugin::InProcess, &inv).unwrap_err();
    assert_eq!(err.code, cni::ErrorCode::CheckFailed, "{err}");
    list.del(&Plugin::InProcess, &inv).unwrap();
    assert!(!cache.join("svcnet-listed-eth0").exists());
    list.del(&Plugin::InProcess, &inv).unwrap();
    let err = list.check(&Plugin::InProcess, &inv).unwrap_err();
    assert_eq!(err.code, cni::ErrorCode::CheckFailed);

    // A plugin program that prints an error object: its code and message come back; one that
    // prints nothing is reported with its exit code.
    let script = data.path().join("failing-plugin");
    std::fs::write(
        &script,
        "#!/bin/sh\ncat >/dev/null\necho '{\"cniVersion\":\"1.0.0\",\"code\":7,\"msg\":\"bad conf\",\"details\":\"d\"}'\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let err = list
        .add(
            &Plugin::Binary(script.clone()),
            &Invocation::new("f", pod.name()),
        )
        .unwrap_err();
    assert_eq!(
        (err.code, err.msg.as_str(), err.details.as_str()),
        (cni::ErrorCode::InvalidConfig, "bad conf", "d")
    );
    let err = list
        .add(
            &Plugin::Binary("/bin/false".into()),
            &Invocation::new("f", pod.name()),
        )
        .unwrap_err();
    assert!(err.msg.contains("exit code 1"), "{err}");
    topo.destroy().unwrap();
}

/// On a node without the bridge (a kubelet's node before its first pod), ADD creates it with
/// the gateway address, as the reference plugin's `isGateway` does; the pod then reaches the
/// node through it.
#[test]
fn add_creates_a_missing_bridge_with_the_gateway() {
    let data = tempfile::tempdir().unwrap();
    let prefix = svcnet_agent::test_support::unique_prefix();
    let node = NetNs::create(&format!("{prefix}-bare")).unwrap();
    let pod = NetNs::create(&format!("{prefix}-pod")).unwrap();
    let conf = json!({
        "cniVersion": "1.0.0", "name": "svcnet", "type": "svcnet",
        "bridge": "cni0", "nodeNetns": node.name(), "dataDir": data.path(), "mtu": 1450,
        "ipam": {"subnet": "10.250.7.0/24", "gateway": "10.250.7.1"},
    });
    assert!(
        !svcnet_agent::ip::link_names(Some(node.name()))
            .unwrap()
            .contains(&"cni0".to_string())
    );
    let (res, code) = call("ADD", "first", pod.name(), &conf);
    assert_eq!(code, 0, "{res}");
    let bridge = node
        .exec(&["ip", "-o", "addr", "show", "dev", "cni0"])
        .unwrap();
    assert!(bridge.contains("10.250.7.1/24"), "{bridge}");
    let link = node
        .exec(&["ip", "-o", "link", "show", "dev", "cni0"])
        .unwrap();
    assert!(link.contains("mtu 1450") && link.contains("UP"), "{link}");
    // The pod and the node talk over it.
    let ip = ip_of(&res);
    let _srv = serve_tcp(&pod, 8080, "p").unwrap();
    let to = SocketAddr::new(IpAddr::V4(ip), 8080);
    let reply = node
        .run(move || tcp_ask(to, Duration::from_secs(2)))
        .unwrap()
        .unwrap();
    assert_eq!(reply.client, IpAddr::V4(Ipv4Addr::new(10, 250, 7, 1)));
    // A second ADD finds it in place.
    let pod2 = NetNs::create(&format!("{prefix}-pod2")).unwrap();
    assert_eq!(call("ADD", "second", pod2.name(), &conf).1, 0);
    assert_eq!(call("DEL", "first", pod.name(), &conf).1, 0);
    assert_eq!(call("DEL", "second", pod2.name(), &conf).1, 0);
}

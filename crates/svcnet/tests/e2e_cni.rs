//! The `svcnet` binary as a CNI plugin (needs root), executed the way a kubelet's runtime
//! executes `/opt/cni/bin/svcnet`: no arguments, `CNI_*` in the environment, the configuration
//! on stdin. Through the agent's network-list runner (the runtime side): ADD, CHECK, DEL; the
//! explicit `svcnet cni` form; VERSION and STATUS. Namespaces are this test's own.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use svcnet_agent::cni::exec::{NetworkList, Plugin};
use svcnet_agent::cni::{Invocation, NetConf};
use svcnet_agent::test_support::Slot;
use svcnet_agent::topology::Topology;
use svcnet_netns::NetNs;

use common::is_root;

fn run_plugin(args: &[&str], env: &[(&str, &str)], stdin: &Value) -> (Value, i32) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_svcnet"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap())
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v = if stdout.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {stdout:?}"))
    };
    (v, out.status.code().unwrap())
}

#[test]
fn svcnet_binary_is_a_cni_plugin() {
    if !is_root() {
        eprintln!("skipped: needs root (network namespaces)");
        return;
    }
    let slot = Slot::acquire().unwrap();
    let data = tempfile::tempdir().unwrap();
    let config = slot.config(1, data.path().to_path_buf());
    let prefix = config.prefix.clone();
    let topo = Topology::create(config).unwrap();
    let node = topo.nodes()[0].clone();
    let conf = json!({
        "cniVersion": "1.1.0", "name": "svcnet", "type": "svcnet",
        "nodeNetns": node.netns, "dataDir": data.path(),
        "ipam": {"subnet": node.pod_cidr, "gateway": node.gateway},
    });

    // VERSION and STATUS, both invocation forms.
    let (v, code) = run_plugin(
        &[],
        &[("CNI_COMMAND", "VERSION")],
        &json!({"cniVersion": "1.1.0"}),
    );
    assert_eq!((v["cniVersion"].as_str(), code), (Some("1.1.0"), 0), "{v}");
    assert!(
        v["supportedVersions"]
            .as_array()
            .unwrap()
            .contains(&json!("1.0.0"))
    );
    assert_eq!(
        run_plugin(&["cni"], &[("CNI_COMMAND", "STATUS")], &conf),
        (Value::Null, 0)
    );
    // Without CNI_COMMAND the subcommand answers with the SPEC's error object, not help text.
    let (err, code) = run_plugin(&["cni"], &[], &conf);
    assert_eq!((err["code"].as_u64(), code), (Some(4), 1), "{err}");

    // ADD/CHECK/DEL through the runtime side, executing the binary.
    let typed: NetConf = serde_json::from_value(conf.clone()).unwrap();
    let list = NetworkList::single(&typed, data.path().join("results")).unwrap();
    let plugin = Plugin::Binary(env!("CARGO_BIN_EXE_svcnet").into());
    let pod = NetNs::create(&format!("{prefix}-pod-c")).unwrap();
    let inv = Invocation::new("bin-pod", pod.name());
    let result = list.add(&plugin, &inv).unwrap();
    let ip = result.pod_ip().unwrap();
    assert!(node.pod_cidr.contains(&ip) && ip != node.gateway);
    let shown = pod.exec(&["ip", "-br", "addr", "show", "eth0"]).unwrap();
    assert!(shown.contains(&ip.to_string()), "{shown}");
    // The pod answers over the bridge (the host reaches it through the node).
    let _srv = svcnet_netns::test_support::serve_tcp(&pod, 8080, "c").unwrap();
    let to = std::net::SocketAddr::new(ip.into(), 8080);
    let reply = svcnet_netns::test_support::tcp_ask(to, std::time::Duration::from_secs(2)).unwrap();
    assert_eq!(reply.identity, "c");
    list.check(&plugin, &inv).unwrap();
    // A second ADD for another container under the same list gets another address.
    let pod2 = NetNs::create(&format!("{prefix}-pod-d")).unwrap();
    let inv2 = Invocation::new("bin-pod-2", pod2.name());
    assert_ne!(list.add(&plugin, &inv2).unwrap().pod_ip(), Some(ip));
    drop(_srv);
    list.del(&plugin, &inv).unwrap();
    list.del(&plugin, &inv).unwrap();
    list.del(&plugin, &inv2).unwrap();
    let err = list.check(&plugin, &inv).unwrap_err();
    assert_eq!(err.code, svcnet_agent::cni::ErrorCode::CheckFailed);
    let links = svcnet_agent::ip::link_names(Some(&node.netns)).unwrap();
    assert!(!links.iter().any(|l| l.starts_with("veth")), "{links:?}");
    topo.destroy().unwrap();
}

/// `svcnet cni install` (the CNI DaemonSet's job): the binary and a network list with the
/// node's pod CIDR, each written whole (temporary file and rename), and the installed binary
/// answers as a plugin.
#[test]
fn cni_install_writes_the_plugin_and_its_network_list() {
    let dir = tempfile::tempdir().unwrap();
    let (bin, conf, data) = (
        dir.path().join("bin"),
        dir.path().join("net.d"),
        dir.path().join("data"),
    );
    let out = Command::new(env!("CARGO_BIN_EXE_svcnet"))
        .args([
            "cni",
            "install",
            "--once",
            "--pod-cidr",
            "10.251.3.0/24",
            "--mtu",
            "1450",
            "--bin-dir",
        ])
        .arg(&bin)
        .arg("--conf-dir")
        .arg(&conf)
        .arg("--data-dir")
        .arg(&data)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let list: Value =
        serde_json::from_slice(&std::fs::read(conf.join("10-svcnet.conflist")).unwrap()).unwrap();
    assert_eq!(list["name"], "svcnet");
    let plugin = &list["plugins"][0];
    assert_eq!(plugin["type"], "svcnet");
    assert_eq!(plugin["bridge"], "cni0");
    assert_eq!(plugin["mtu"], 1450);
    assert_eq!(plugin["ipam"]["subnet"], "10.251.3.0/24");
    assert_eq!(plugin["ipam"]["gateway"], "10.251.3.1");
    assert!(
        plugin.get("nodeNetns").is_none(),
        "the node's own namespace: {plugin}"
    );
    let leftovers: Vec<_> = std::fs::read_dir(&bin)
        .unwrap()
        .chain(std::fs::read_dir(&conf).unwrap())
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().contains("svcnet-tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let installed = bin.join("svcnet");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&installed).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o755);
    // The installed copy is the plugin: VERSION from the runtime's environment.
    let mut child = Command::new(&installed)
        .env_clear()
        .env("CNI_COMMAND", "VERSION")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(br#"{"cniVersion":"1.0.0"}"#)
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["cniVersion"], "1.0.0");
    // Without a pod CIDR or a node name, it says what it needs.
    let out = Command::new(env!("CARGO_BIN_EXE_svcnet"))
        .args(["cni", "install", "--once", "--bin-dir"])
        .arg(&bin)
        .env_remove("NODE_NAME")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--pod-cidr or --node-name"),
        "{out:?}"
    );
}

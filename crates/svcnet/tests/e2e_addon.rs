//! End to end (needs root): svcnet's add-on manifests, `deploy/svcnet.yaml` applied unchanged
//! with the real kubectl on `svcnet up --nodes 2 --disable proxy,dns,pod-network`, run the
//! cluster's Services, DNS and pod network from their own pods: the proxy DaemonSet programs
//! each node, the DNS Deployment answers at 10.96.0.10 through it, the CNI DaemonSet installs
//! the plugin and runs the VXLAN backend between the nodes (`e2e_addon_podnet` checks that
//! backend's kernel state and traffic in detail).
//! Then:
//! - the README's worked example passes exactly as with the built-in proxy (its `dig`s ask
//!   the `kube-dns` Service at 10.96.0.10, since there is no host-side DNS listener);
//! - a rolling update of the proxy DaemonSet under two client loops (the cluster IP through
//!   the first node, a NodePort of the second) fails no request;
//! - deleting the add-on (`kubectl delete -f`) leaves the nodes clean: no proxy rules or VTEP
//!   in either node, no CNI plugin or network list on the machine.
//!
//! The only substitution is svcnet up's own: the image `ghcr.io/svcnet/svcnet` runs this
//! test's svcnet binary. The API server's direct address reaches the add-on's pods through the
//! `kube-system/kubernetes-services-endpoint` ConfigMap, which `svcnet up --disable proxy`
//! writes (Calico's convention for clusters without kube-proxy). The CNI DaemonSet writes
//! `/opt/cni/bin/svcnet` and `/etc/cni/net.d/10-svcnet.conflist` on this machine, as it would
//! on a node; the test requires them absent before and checks them gone after.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::is_root;
use common::walkthrough::{leftovers, run_worked_example};

use common::{CNI_CONFLIST as CONFLIST, CNI_PLUGIN as PLUGIN};

/// The walkthrough with the add-on in place of the built-in proxy and DNS.
fn with_addon(i: usize, commands: &str) -> String {
    let mut out = commands.to_string();
    if i == 0 {
        let start = "./scripts/up.sh --nodes 2 &";
        assert!(
            out.contains(start),
            "the README's first block changed: {out}"
        );
        out = out.replace(
            start,
            "./scripts/up.sh --nodes 2 --disable proxy,dns,pod-network &",
        );
        let ready = "until kubectl get --raw /readyz >/dev/null 2>&1; do sleep 1; done\n";
        assert!(
            out.contains(ready),
            "the README's first block changed: {out}"
        );
        out = out.replace(
            ready,
            &format!(
                "{ready}kubectl apply -f deploy/svcnet.yaml >/dev/null\n\
                 kubectl -n kube-system rollout status ds/svcnet-proxy --timeout=120s >/dev/null\n\
                 kubectl -n kube-system rollout status ds/svcnet-cni --timeout=120s >/dev/null\n\
                 kubectl -n kube-system rollout status deploy/svcnet-dns --timeout=120s >/dev/null\n"
            ),
        );
    }
    out.replace("@127.0.0.1 -p 1053", "@10.96.0.10")
}

/// A client loop in the background: `curl` to `url` until `stop` exists, counting answers and
/// failures into `file`.
fn client_loop(url: &str, stop: &str, file: &str) -> String {
    format!(
        "( ok=0; fail=0; end=$((SECONDS+120)); \
         while [ ! -e {stop} ] && [ $SECONDS -lt $end ]; do \
           if curl -s -m 2 -o /dev/null {url}; then ok=$((ok+1)); else fail=$((fail+1)); fi; \
         done; echo \"$ok $fail\" > {file} ) &\n"
    )
}

fn counts(text: &str) -> (u64, u64) {
    let mut it = text.split_whitespace().map(|n| n.parse::<u64>().unwrap());
    (it.next().unwrap(), it.next().unwrap())
}

/// The svcnet tables and chains a proxy left in node `n`'s namespace.
fn proxy_rules(n: usize) -> Vec<String> {
    let ns = format!("svcnet-node{n}");
    let mut found = Vec::new();
    let nft = std::process::Command::new("ip")
        .args(["netns", "exec", &ns, "nft", "list", "tables"])
        .output()
        .unwrap();
    for line in String::from_utf8_lossy(&nft.stdout).lines() {
        // The built-in NetworkPolicy enforcer's table belongs to `svcnet up`, not the add-on.
        if line.contains("svcnet") && !line.contains("svcnet-netpol") {
            found.push(format!("{ns}: {line}"));
        }
    }
    for tool in ["iptables-save", "iptables-legacy-save"] {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &ns, tool])
            .output()
            .unwrap();
        let n = String::from_utf8_lossy(&out.stdout)
            .matches("SVCNET")
            .count();
        if n > 0 {
            found.push(format!("{ns}: {n} SVCNET lines in {tool}"));
        }
    }
    found
}

#[test]
fn the_addon_manifests_run_the_cluster_network_from_pods() {
    if !is_root() {
        eprintln!("skipped: needs root (CI runs as root)");
        return;
    }
    let _installed = common::CniFiles::claim();
    let ran = run_worked_example(with_addon);

    // The add-on's parts are what serves: no built-in proxy or DNS ran.
    let pods = ran.ok("kubectl -n kube-system get pods -o wide --no-headers");
    for (prefix, count) in [("svcnet-proxy-", 2), ("svcnet-cni-", 2), ("svcnet-dns-", 2)] {
        let running = pods
            .lines()
            .filter(|l| l.starts_with(prefix) && l.contains(" 1/1 ") && l.contains("Running"))
            .count();
        assert_eq!(running, count, "{prefix}: {pods}");
        // None crashed on the way (two CNI installers once raced for one temporary file).
        let restarted: Vec<&str> = pods
            .lines()
            .filter(|l| l.starts_with(prefix) && l.split_whitespace().nth(3) != Some("0"))
            .collect();
        assert!(restarted.is_empty(), "restarted: {restarted:?}\n{pods}");
    }
    assert!(
        !ran.log().contains("node proxy starting"),
        "the built-in proxy ran:\n{}",
        ran.log()
    );
    // The CNI DaemonSet installed the plugin binary and the network list.
    let conflist = std::fs::read_to_string(CONFLIST).unwrap();
    assert!(conflist.contains("\"type\": \"svcnet\""), "{conflist}");
    let plugin = std::process::Command::new(PLUGIN)
        .env("CNI_COMMAND", "VERSION")
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&plugin.stdout).contains("supportedVersions"),
        "{plugin:?}"
    );

    // A rolling update of the proxy under load: no request fails on either node.
    let _ = std::fs::remove_file(ran.root().join("stop"));
    let node_port = ran
        .ok("kubectl get svc myapp-loadbalance -o jsonpath='{.spec.ports[0].nodePort}'")
        .trim()
        .to_string();
    ran.ok(&format!(
        "{}{}sleep 2\n\
         kubectl -n kube-system rollout restart ds/svcnet-proxy\n\
         kubectl -n kube-system rollout status ds/svcnet-proxy --timeout=120s\n\
         sleep 2; touch stop; wait",
        client_loop("10.96.1.0", "stop", "cluster-ip.txt"),
        client_loop(&format!("172.30.0.3:{node_port}"), "stop", "node-port.txt"),
    ));
    let pods_after = ran.ok("kubectl -n kube-system get pods -l k8s-app=svcnet-proxy --no-headers");
    assert!(
        !pods
            .lines()
            .filter(|l| l.starts_with("svcnet-proxy-"))
            .any(|l| {
                let name = l.split_whitespace().next().unwrap();
                pods_after.contains(name)
            }),
        "the rolling update did not replace the proxy pods:\nbefore:\n{pods}\nafter:\n{pods_after}"
    );
    for file in ["cluster-ip.txt", "node-port.txt"] {
        let (ok, fail) = counts(&std::fs::read_to_string(ran.root().join(file)).unwrap());
        assert!(ok > 20, "{file}: only {ok} answers during the update");
        assert_eq!(
            fail,
            0,
            "{file}: {fail} of {} requests failed during the update",
            ok + fail
        );
    }

    // Deleting the add-on leaves the nodes clean.
    ran.ok("kubectl delete -f deploy/svcnet.yaml --wait=true >/dev/null");
    common::wait_for("the add-on's pods gone", || {
        let out = ran.ok("kubectl -n kube-system get pods --no-headers -o name");
        (!out.contains("svcnet-")).then_some(out)
    });
    common::wait_for(
        "the proxies' rules, the VTEPs and the CNI files removed",
        || {
            let mut left: Vec<String> = (1..=2).flat_map(proxy_rules).collect();
            for n in 1..=2 {
                let ns = format!("svcnet-node{n}");
                if common::ip_in(&ns, &["link", "show"]).contains("flannel.1") {
                    left.push(format!("{ns}: flannel.1"));
                }
            }
            left.extend(
                [PLUGIN, CONFLIST]
                    .iter()
                    .filter(|p| Path::new(p).exists())
                    .map(|p| p.to_string()),
            );
            left.is_empty().then(String::new)
        },
    );
    assert_eq!(
        ran.teardown.stop(),
        Some(true),
        "svcnet up did not stop on SIGINT"
    );
    let after = leftovers();
    assert!(after.is_empty(), "left behind: {after:?}");
}

//! S2: one-service changes, from the change handed to the dataplane (the core's changed
//! services) to the rules live in the kernel, side by side with `nft -f` of the same change in
//! kube-proxy's shape. Five kinds, `runs` of each, each on a different service:
//!
//! * endpoint replaced (one endpoint of a service swapped for a new address);
//! * service added (a new service with the row's endpoint count);
//! * service deleted;
//! * endpoint count changed (one endpoint more);
//! * affinity changed (ClientIP affinity switched on);
//! * affinity endpoint replaced (an endpoint of a service with affinity swapped: its record
//!   chain names the endpoints).
//!
//! svcnet-nft: `plan_partial` + `NftExecutor::apply` (through the long-lived libnftables
//! context; it returns once the kernel has committed the batch) + `commit`. kube-proxy:
//! `nft -f -` (a process per sync, as upstream runs it) of the changed service's chains,
//! rules and elements as upstream's partial sync writes them (`kube_proxy::service_text`;
//! stale chains flushed, their deletion deferred as upstream does), in its own namespace
//! holding the model's full ruleset, run after svcnet's changes of the same kind (not
//! interleaved: the model's commits leave the kernel deferred work that would otherwise land in
//! the next svcnet change's time).

use std::time::{Duration, Instant};

use svcnet_netns::{NetNs, unique_name};
use svcnet_nft::{Family, FullMode, NftExecutor, Renderer};
use svcnet_proxy::fixtures::{service, slice};
use svcnet_proxy::{IpFamily, NamespacedName, ProxyState};

use crate::kube_proxy::{self, ServicePort};
use crate::{CLUSTER_CIDR, NAMESPACE, SERVICE_CIDR, ep_ip, kp_services, ms, nft_f, pct, svc_ip};

const KINDS: [&str; 6] = [
    "endpoint_replaced",
    "service_added",
    "service_deleted",
    "endpoint_count_changed",
    "affinity_changed",
    "affinity_endpoint_replaced",
];

/// One service's endpoints in svcnet's state.
fn set_endpoints(st: &mut ProxyState, name: &str, ips: &[String]) {
    st.update_slice(&slice(NAMESPACE, &format!("{name}-1"), name, |b| {
        b.port("http", "TCP", 8080);
        for (j, ip) in ips.iter().enumerate() {
            b.endpoint(ip, &format!("n{}", 1 + j % 5), |_| {});
        }
    }));
}

fn put_service(st: &mut ProxyState, name: &str, ip: &str, affinity: bool) {
    st.update_service(&service(NAMESPACE, name, |b| {
        b.cluster_ip(&[ip]).port("http", "TCP", 80);
        if affinity {
            b.affinity(Some(10800));
        }
    }))
    .unwrap();
}

/// Runs S2 for one row; `kube`: also measure the kube-proxy model (its full load can take
/// minutes: quadratic in anonymous vmaps).
pub fn run(st: &mut ProxyState, n: usize, eps: usize, runs: usize, kube: bool, cap: Duration) {
    let ns = NetNs::create(&unique_name("s2a")).expect("needs root");
    let exec = NftExecutor::new(Some(ns.name().to_string()));
    let mut r = Renderer::new(Family::Ip);
    let t = Instant::now();
    let plan = r.plan_full(&st.desired(IpFamily::V4), FullMode::Recreate);
    exec.apply(&plan.tx).unwrap();
    r.commit(plan);
    eprintln!("S2 N={n}: svcnet table loaded in {:.0} ms", ms(t.elapsed()));
    let mut kp: Vec<ServicePort> = kp_services(n, eps);
    let kns = kube.then(|| NetNs::create(&unique_name("s2b")).expect("needs root"));
    let mut kube_ok = kube;
    if let Some(kns) = &kns {
        let text = kube_proxy::ruleset(&kp, CLUSTER_CIDR, SERVICE_CIDR);
        let run = nft_f(kns.name(), &text, cap);
        eprintln!(
            "S2 N={n}: kube-proxy model loaded in {:.0} ms{}",
            ms(run.wall),
            if run.capped {
                " (CAPPED: not measured)"
            } else {
                ""
            }
        );
        kube_ok = !run.capped;
    }
    // Returns the whole time and the planning part of it.
    let sync = |st: &mut ProxyState, r: &mut Renderer| -> (Duration, Duration) {
        let t = Instant::now();
        let changes = st.take_changes();
        let d = st.desired_for(IpFamily::V4, changes.services.keys());
        let plan = r.plan_partial(&st.node_state(IpFamily::V4), &d).unwrap();
        let planned = t.elapsed();
        if let Err(e) = exec.apply(&plan.tx) {
            panic!("nft rejected:\n{}\n{e}", plan.tx);
        }
        r.commit(plan);
        (t.elapsed(), planned)
    };
    let kube_apply = |text: &str| -> Duration {
        let kns = kns.as_ref().unwrap();
        let run = nft_f(kns.name(), text, cap);
        assert!(!run.capped, "kube-proxy change capped");
        run.wall
    };
    for (k, kind) in KINDS.iter().enumerate() {
        let (mut a, mut b, mut p) = (Vec::new(), Vec::new(), Vec::new());
        let mut kube_texts = Vec::new();
        for round in 0..runs {
            // A different existing service per round and kind (for an affinity service's
            // endpoint, one the previous kind switched affinity on for).
            let pick = if *kind == "affinity_endpoint_replaced" {
                k - 1
            } else {
                k
            };
            let i = (round * 7919 + pick * 1543 + 17) % n;
            let name = format!("svc{i}");
            let mut ips: Vec<String> = (0..eps).map(|j| ep_ip(i, j, eps)).collect();
            let mut kube_text = String::new();
            match *kind {
                "endpoint_replaced" | "affinity_endpoint_replaced" => {
                    ips[eps - 1] = format!("10.250.{}.{}", k * 50 + round / 250, round % 250 + 1);
                    set_endpoints(st, &name, &ips);
                    let old = kp[i].clone();
                    kp[i].endpoints[eps - 1].0 = ips[eps - 1].clone();
                    kube_proxy::service_text(&mut kube_text, &kp[i], CLUSTER_CIDR);
                    kube_proxy::flush_stale_endpoints(&mut kube_text, &old, &kp[i]);
                }
                "service_added" => {
                    let name = format!("new{round}");
                    let ip = svc_ip(n + round);
                    put_service(st, &name, &ip, false);
                    let ips: Vec<String> = (0..eps)
                        .map(|j| format!("10.251.{}.{}", round, j + 1))
                        .collect();
                    set_endpoints(st, &name, &ips);
                    let sp = ServicePort {
                        namespace: NAMESPACE.into(),
                        name,
                        port_name: "http".into(),
                        cluster_ip: ip,
                        port: 80,
                        endpoints: ips.into_iter().map(|ip| (ip, 8080)).collect(),
                        affinity: false,
                    };
                    kube_proxy::service_text(&mut kube_text, &sp, CLUSTER_CIDR);
                }
                "service_deleted" => {
                    st.delete_service(&NamespacedName::new(NAMESPACE, &name));
                    st.delete_slice(NAMESPACE, &format!("{name}-1"));
                    kube_text = kube_proxy::remove_service(&kp[i]);
                }
                "endpoint_count_changed" => {
                    ips.push(format!("10.252.{}.{}", round / 250, round % 250 + 1));
                    set_endpoints(st, &name, &ips);
                    kp[i].endpoints.push((ips[eps].clone(), 8080));
                    kube_proxy::service_text(&mut kube_text, &kp[i], CLUSTER_CIDR);
                }
                "affinity_changed" => {
                    put_service(st, &name, &svc_ip(i), true);
                    kp[i].affinity = true;
                    kube_proxy::service_text(&mut kube_text, &kp[i], CLUSTER_CIDR);
                }
                other => unreachable!("no change kind {other}"),
            }
            let (whole, planned) = sync(st, &mut r);
            a.push(whole);
            p.push(planned);
            kube_texts.push(kube_text);
        }
        // The model's changes after svcnet's, not interleaved: each leaves the kernel
        // deferred work (freeing the replaced chains and rules) that would land in the
        // next svcnet change's time.
        if kube_ok {
            b.extend(kube_texts.iter().map(|t| kube_apply(t)));
        }
        let (a50, a99) = (ms(pct(&mut a, 0.5)), ms(pct(&mut a, 0.99)));
        let p50 = ms(pct(&mut p, 0.5));
        let kube_cols = if kube_ok {
            let (b50, b99) = (ms(pct(&mut b, 0.5)), ms(pct(&mut b, 0.99)));
            format!(
                "kube_proxy_p50_ms={b50:.1} kube_proxy_p99_ms={b99:.1} ratio_p50={:.0} ratio_p99={:.0}",
                b50 / a50,
                b99 / a99
            )
        } else {
            "kube_proxy=n/a".into()
        };
        println!(
            "S2 N={n} endpoints={eps} change={kind} runs={runs} svcnet_p50_ms={a50:.2} svcnet_p99_ms={a99:.2} plan_p50_ms={p50:.2} {kube_cols}"
        );
    }
}

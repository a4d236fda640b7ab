//! Fault injection into the nftables dataplane under the generic syncer, against the real
//! kernel in a fresh network namespace (root): the long-lived libnftables context dies in the
//! middle of a sync, or the kernel refuses a transaction. Either way the failed sync changes
//! nothing (the previous rules stay), the next sync is full on a newly opened context, and the
//! kernel then holds exactly what a fresh proxy's first sync would write.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use svcnet_netns::{NetNs, unique_name};
use svcnet_nft::{NftDataplane, NftExecutor};
use svcnet_proxy::fixtures::{service, slice};
use svcnet_proxy::{CoreConfig, ProxyState};
use svcnet_proxyd::syncer::Syncer;

const TABLE: &str = "svcnet";

fn state() -> ProxyState {
    let mut s = ProxyState::new(CoreConfig {
        node_name: "n1".into(),
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        ..Default::default()
    });
    s.update_service(&service("default", "a", |b| {
        b.cluster_ip(&["10.96.0.1"]).port("http", "TCP", 80);
    }))
    .unwrap();
    set_endpoint(&mut s, "a", "10.244.1.2");
    s
}

fn set_endpoint(s: &mut ProxyState, svc: &str, ip: &str) {
    s.update_slice(&slice("default", &format!("{svc}-1"), svc, |b| {
        b.port("http", "TCP", 8080).endpoint(ip, "n1", |_| {});
    }));
}

fn listing(ns: &NetNs) -> String {
    ns.exec(&["nft", "list", "table", "ip", TABLE]).unwrap()
}

fn syncer(ns: &NetNs) -> Syncer<NftDataplane> {
    Syncer::new(NftDataplane::new(
        NftExecutor::new(Some(ns.name().to_string())),
        TABLE,
    ))
}

fn executor(s: &Syncer<NftDataplane>) -> &NftExecutor {
    s.dataplane().expect("dataplane present").executor()
}

/// What a fresh proxy writes for `state`, in a namespace of its own.
async fn fresh_listing(state: &ProxyState) -> String {
    let ns = NetNs::create(&unique_name("nftf")).unwrap();
    let mut s = syncer(&ns);
    let out = s.sync(state, &Default::default(), false).await;
    assert!(out.ok && out.full);
    listing(&ns)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_context_that_dies_mid_sync_is_reopened_and_the_next_sync_is_full() {
    let ns = NetNs::create(&unique_name("nftf")).unwrap();
    let mut st = state();
    let mut s = syncer(&ns);
    let changes = st.take_changes();
    let out = s.sync(&st, &changes, false).await;
    assert!(out.ok && out.full);
    assert!(listing(&ns).contains("10.244.1.2"));

    // The context dies between two syncs, unknown to the dataplane: the next apply fails.
    executor(&s).kill_context();
    set_endpoint(&mut st, "a", "10.244.1.3");
    let changes = st.take_changes();
    let out = s.sync(&st, &changes, false).await;
    assert!(!out.ok && out.retryable, "{out:?}");
    let before = listing(&ns);
    assert!(
        before.contains("10.244.1.2") && !before.contains("10.244.1.3"),
        "the previous rules stay after the failed sync:\n{before}"
    );

    // The retry is full, on a new context, and carries the change that failed.
    let out = s.sync(&st, &Default::default(), false).await;
    assert!(out.ok && out.full, "{out:?}");
    let after = listing(&ns);
    assert!(
        after.contains("10.244.1.3") && !after.contains("10.244.1.2"),
        "{after}"
    );
    assert_eq!(after, fresh_listing(&st).await);

    // And partial syncs go on through that context.
    set_endpoint(&mut st, "a", "10.244.1.4");
    let changes = st.take_changes();
    let out = s.sync(&st, &changes, false).await;
    assert!(out.ok && !out.full, "{out:?}");
    assert!(listing(&ns).contains("10.244.1.4"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_transaction_the_kernel_refuses_leaves_the_previous_rules_then_a_full_sync_repairs() {
    let ns = NetNs::create(&unique_name("nftf")).unwrap();
    let mut st = state();
    let mut s = syncer(&ns);
    let changes = st.take_changes();
    assert!(s.sync(&st, &changes, false).await.ok);
    let first = listing(&ns);

    // Another program puts an element in svcnet's backends map under the key of a service
    // about to be added, with another endpoint: the kernel refuses the partial sync that adds
    // that service (same key, different data), so the whole transaction is refused.
    ns.exec(&[
        "nft",
        "add element ip svcnet backends-tcp { 10.96.0.2 . tcp . 80 . 0 : 10.9.9.9 . 9 }",
    ])
    .unwrap();
    let tampered = listing(&ns);
    st.update_service(&service("default", "b", |b| {
        b.cluster_ip(&["10.96.0.2"]).port("http", "TCP", 80);
    }))
    .unwrap();
    set_endpoint(&mut st, "b", "10.244.1.9");
    let changes = st.take_changes();
    let out = s.sync(&st, &changes, false).await;
    assert!(!out.ok && out.retryable, "{out:?}");
    assert_eq!(
        listing(&ns),
        tampered,
        "a refused transaction changes nothing"
    );
    assert!(first.contains("10.244.1.2"));

    // The next sync is full (the table is recreated), and the kernel ends where a fresh
    // proxy's first sync would put it: the foreign element is gone, b is programmed.
    let out = s.sync(&st, &Default::default(), false).await;
    assert!(out.ok && out.full, "{out:?}");
    let after = listing(&ns);
    assert!(
        after.contains("10.244.1.9") && !after.contains("10.9.9.9"),
        "{after}"
    );
    assert_eq!(after, fresh_listing(&st).await);
}

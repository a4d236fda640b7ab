//! Helpers shared by the nft test files: the proxy configuration, and full and partial syncs
//! applied to `FakeNft` (and, when given, to a real kernel namespace).
#![allow(dead_code, clippy::unwrap_used)] // each test file uses some of them

pub mod tracer;

use svcnet_nft::{FakeNft, Family, FullMode, NftExecutor, Renderer, Transaction};
use svcnet_proxy::{CoreConfig, IpFamily, ProxyState};

pub fn config() -> CoreConfig {
    CoreConfig {
        node_name: "n1".into(),
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        ..Default::default()
    }
}

/// A full sync of `state` applied to a fresh renderer and fake (and to `kernel`, when given);
/// returns them and the transaction text.
pub fn full(state: &ProxyState, kernel: Option<&NftExecutor>) -> (Renderer, FakeNft, String) {
    let mut r = Renderer::new(Family::Ip);
    let mut fake = FakeNft::new();
    let plan = r.plan_full(&state.desired(IpFamily::V4), FullMode::Recreate);
    let text = plan.tx.to_string();
    fake.apply(&plan.tx).unwrap();
    if let Some(k) = kernel {
        k.apply(&plan.tx).unwrap();
    }
    r.commit(plan);
    (r, fake, text)
}

/// Takes the state's changes and applies a partial sync of them to `fake` (and to `kernel`,
/// when given); returns its transaction.
pub fn partial(
    state: &mut ProxyState,
    r: &mut Renderer,
    fake: &mut FakeNft,
    kernel: Option<&NftExecutor>,
) -> Transaction {
    let changes = state.take_changes();
    let desired = state.desired_for(IpFamily::V4, changes.services.keys());
    let plan = r
        .plan_partial(&state.node_state(IpFamily::V4), &desired)
        .unwrap();
    assert!(!plan.is_full());
    fake.apply(&plan.tx).unwrap();
    if let Some(Err(e)) = kernel.map(|k| k.apply(&plan.tx)) {
        panic!("nft rejected:\n{}\n{e}", plan.tx);
    }
    let tx = plan.tx.clone();
    r.commit(plan);
    tx
}

/// Checks that `fake` holds exactly what a fresh full sync of `state` produces (the
/// canonical dump: every set with its elements, every chain with its rules).
pub fn assert_converged(state: &ProxyState, _r: &mut Renderer, fake: &mut FakeNft) {
    let (_, fresh, _) = full(state, None);
    assert_eq!(
        fake.dump(),
        fresh.dump(),
        "partial sync did not converge to the full ruleset"
    );
}

//! The nftables mode's start-up count of other software's chains, against the real kernel in
//! a fresh network namespace (root): chains of foreign tables are counted through the proxy's
//! own libnftables context, svcnet's tables are not.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use svcnet_netns::{NetNs, unique_name};
use svcnet_nft::NftExecutor;
use svcnet_proxyd::foreign;

#[test]
fn counts_the_chains_of_foreign_tables_in_the_namespace() {
    let ns = NetNs::create(&unique_name("fch")).unwrap();
    let mut text = String::from("add table inet other\nadd table ip svcnet\n");
    for i in 0..120 {
        text.push_str(&format!("add chain inet other c{i}\n"));
    }
    text.push_str(
        "add chain ip svcnet mine\nadd table ip6 kube-proxy\nadd chain ip6 kube-proxy a\n",
    );
    let exec = NftExecutor::new(Some(ns.name().to_string()));
    exec.command(&text).unwrap();
    let found = foreign::check(&exec, &foreign::own_tables("svcnet")).unwrap();
    assert_eq!(found.total, 121, "{found:?}");
    assert_eq!(found.tables[0], ("inet other".to_string(), 120));
    let warning = foreign::warning(&found, 100).unwrap();
    assert!(warning.contains("121 nftables chains"), "{warning}");
    assert_eq!(foreign::warning(&found, foreign::WARN_ABOVE), None);
}

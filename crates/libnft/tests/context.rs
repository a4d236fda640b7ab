//! A real libnftables context in a fresh network namespace (root): it programs that namespace
//! only, applies a batch atomically or not at all with nft's own error text, and a context
//! whose thread died says so.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use svcnet_libnft::{Error, Nft};
use svcnet_netns::{NetNs, unique_name};

fn lab() -> NetNs {
    NetNs::create(&unique_name("lnft")).unwrap()
}

#[test]
fn a_context_programs_its_namespace_only() {
    let ns = lab();
    let table = unique_name("lnft");
    let nft = Nft::open(Some(ns.name())).unwrap();
    nft.run(&format!(
        "add table ip {table}\nadd set ip {table} s {{ type ipv4_addr ; }}\n"
    ))
    .unwrap();
    nft.run(&format!("add element ip {table} s {{ 10.0.0.1 }}"))
        .unwrap();
    let listed = nft.run(&format!("list set ip {table} s")).unwrap();
    assert!(listed.contains("10.0.0.1"), "{listed}");
    // The kernel of that namespace has it, as `nft` sees it there.
    let seen = ns.exec(&["nft", "list", "tables"]).unwrap();
    assert!(seen.contains(&table), "{seen}");
    // The process's own namespace does not.
    let host = Nft::open(None).unwrap();
    let tables = host.run("list tables").unwrap();
    assert!(!tables.contains(&table), "{tables}");
}

#[test]
fn a_refused_batch_changes_nothing_and_says_what_nft_says() {
    let ns = lab();
    let nft = Nft::open(Some(ns.name())).unwrap();
    // The second command refers to a set that does not exist: the whole batch is refused,
    // the table of the first command included.
    let err = nft
        .run("add table ip t1\ndelete element ip t1 nosuch { 10.0.0.1 }\n")
        .unwrap_err();
    let Error::Rejected(text) = &err else {
        panic!("{err:?}")
    };
    // As `nft -f` prints it: the location, and the offending command under it.
    assert!(text.contains(":2:22-27: Error:"), "{text}");
    assert!(text.contains("delete element ip t1 nosuch"), "{text}");
    assert!(err.is_retryable());
    let tables = nft.run("list tables").unwrap();
    assert!(!tables.contains("t1"), "{tables}");
    // The context is still usable after a refusal.
    nft.run("add table ip t2").unwrap();
    assert!(nft.run("list tables").unwrap().contains("t2"));
}

#[test]
fn a_dead_context_is_reported_as_gone() {
    let ns = lab();
    let nft = Nft::open(Some(ns.name())).unwrap();
    nft.kill();
    let err = nft.run("list tables").unwrap_err();
    assert!(matches!(err, Error::Gone), "{err:?}");
    assert!(err.is_retryable());
}

#[test]
fn a_missing_namespace_is_an_error_not_a_context_elsewhere() {
    let err = Nft::open(Some(&unique_name("lnft-missing"))).unwrap_err();
    assert!(matches!(err, Error::Netns(_)), "{err:?}");
    assert!(!err.is_retryable());
}

#[test]
fn after_a_full_sized_batch_the_fresh_context_goes_on_in_the_same_namespace() {
    let ns = lab();
    let nft = Nft::open(Some(ns.name())).unwrap();
    // Over 1 MiB of text: afterwards the context is replaced (its cache freed).
    let elements: Vec<String> = (0..120_000u32)
        .map(|i| std::net::Ipv4Addr::from(0x0a00_0000 + i).to_string())
        .collect();
    let text = format!(
        "add table ip big\nadd set ip big s {{ type ipv4_addr ; elements = {{ {} }} ; }}\n",
        elements.join(", ")
    );
    assert!(text.len() > 1 << 20);
    nft.run(&text).unwrap();
    nft.run("delete element ip big s { 10.0.0.1 }").unwrap();
    nft.run("add element ip big s { 10.200.0.1 }").unwrap();
    // Looked up one by one, not read from a listing: a dump of a set this size taken while
    // the kernel is still growing its hash table after the bulk insert may repeat elements
    // and miss others (seen: 1 run in ~35).
    let has = |addr: &str| {
        let element = format!("{{ {addr} }}");
        ns.exec(&["nft", "get", "element", "ip", "big", "s", &element])
            .is_ok()
    };
    assert!(
        has("10.200.0.1"),
        "the fresh context's add is in the namespace"
    );
    assert!(
        !has("10.0.0.1"),
        "the fresh context's delete is in the namespace"
    );
    assert!(has("10.1.212.191"), "the full-sized batch's last element");
}

/// The Service-neutral half on its own (no Service renderer): a `Transaction` value applied
/// through the shared executor, read back from the kernel, and the table removed; absent
/// objects read as `None` / `false`, a refused batch as `Rejected`.
#[test]
fn the_executor_applies_transaction_values_and_reads_them_back() {
    use svcnet_libnft::{
        ApplyError, BaseChain, Family, NftExecutor, Op, SetDef, SetKind, Transaction,
    };
    let ns = lab();
    let table = unique_name("lnftx");
    let exec = NftExecutor::new(Some(ns.name().to_string()));
    assert_eq!(exec.list_table(Family::Ip, &table).unwrap(), None);
    let mut tx = Transaction::new(Family::Ip, table.clone());
    tx.push(Op::AddTable { comment: None });
    tx.push(Op::AddSet(SetDef {
        name: "ports".into(),
        kind: SetKind::Set,
        type_: "inet_service".into(),
        flags: vec![],
        timeout_seconds: None,
        size: None,
        comment: None,
    }));
    tx.push(Op::AddElement {
        set: "ports".into(),
        key: "8080".into(),
        value: None,
    });
    tx.push(Op::AddChain {
        name: "pre".into(),
        base: Some(BaseChain {
            kind: "nat",
            hook: "prerouting",
            priority: -100,
        }),
    });
    tx.push(Op::AddRule {
        chain: "pre".into(),
        rule: "tcp dport @ports redirect to :9090".into(),
    });
    exec.apply(&tx).unwrap();
    let listed = exec.list_table(Family::Ip, &table).unwrap().unwrap();
    assert!(listed.contains("8080"), "{listed}");
    assert!(listed.contains("redirect to :9090"), "{listed}");
    assert_eq!(exec.list_map(Family::Ip, &table, "nothing").unwrap(), None);
    let mut bad = Transaction::new(Family::Ip, table.clone());
    bad.push(Op::AddRule {
        chain: "pre".into(),
        rule: "jump nowhere".into(),
    });
    assert!(matches!(exec.apply(&bad), Err(ApplyError::Rejected { .. })));
    assert!(exec.delete_table(Family::Ip, &table).unwrap());
    assert!(!exec.delete_table(Family::Ip, &table).unwrap());
}

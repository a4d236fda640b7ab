//! Transactions that delete, sent as one nf_tables netlink batch (root, fresh network
//! namespaces): the kernel ends up holding exactly what libnftables makes of the same
//! transaction's text, in one committed transaction (the namespace's generation moves by
//! one), and a refused batch changes nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use svcnet_libnft::{ApplyError, Family, NftExecutor, Op, SetDef, SetKind, Transaction, Transport};
use svcnet_netns::{NetNs, unique_name};

fn set(name: &str, kind: SetKind, type_: &str) -> SetDef {
    SetDef::new(name, kind, type_)
}

/// The sets of the table [`table`] creates.
fn sets(f: Family) -> Vec<SetDef> {
    let a = f.addr_type();
    vec![
        set("pods-a", SetKind::Set, a),
        set("pods-c", SetKind::Set, a),
        set("unused", SetKind::Set, a),
        set("iso", SetKind::Map, &format!("{a} : verdict")),
        set(
            "ports",
            SetKind::Set,
            &format!("{a} . inet_proto . inet_service"),
        ),
    ]
}

fn addr(f: Family, n: u8) -> String {
    match f {
        Family::Ip => format!("10.0.0.{n}"),
        Family::Ip6 => format!("fd00::{n}"),
    }
}

/// A table with element-holding sets of each kind svcnet deletes from, a dispatch-like chain
/// and a chain to delete.
fn table(f: Family) -> Transaction {
    let mut tx = Transaction::new(f, "t");
    tx.push(Op::AddTable { comment: None });
    for c in ["c1", "c2", "d", "gone"] {
        tx.push(Op::AddChain {
            name: c.into(),
            base: None,
        });
    }
    for s in sets(f) {
        tx.push(Op::AddSet(s));
    }
    let element = |set: &str, key: String, value: Option<&str>| Op::AddElement {
        set: set.into(),
        key,
        value: value.map(str::to_string),
    };
    tx.push(element("pods-a", addr(f, 1), None));
    tx.push(element("pods-a", addr(f, 2), None));
    tx.push(element("iso", addr(f, 1), Some("jump c1")));
    tx.push(element(
        "ports",
        format!("{} . tcp . 8080", addr(f, 1)),
        None,
    ));
    let rule = |chain: &str, rule: String| Op::AddRule {
        chain: chain.into(),
        rule,
    };
    let fam = f.as_str();
    tx.push(rule(
        "d",
        format!("{fam} daddr @pods-a jump c1 comment \"x/old\""),
    ));
    tx.push(rule("d", "drop".into()));
    tx.push(rule("gone", "accept".into()));
    tx
}

/// Pod 1 moves from `pods-a` to `pods-c`, loses its isolation and its named port; pod 2 is
/// isolated elsewhere and gains a port; the dispatch chain is rewritten; a chain and a set
/// go.
fn change(f: Family) -> Transaction {
    let mut tx = Transaction::new(f, "t");
    let del = |set: &str, key: String| Op::DeleteElement {
        set: set.into(),
        key,
    };
    let add = |set: &str, key: String, value: Option<&str>| Op::AddElement {
        set: set.into(),
        key,
        value: value.map(str::to_string),
    };
    let rule = |rule: String| Op::AddRule {
        chain: "d".into(),
        rule,
    };
    let defs = sets(f);
    let def = |name: &str| defs.iter().find(|d| d.name == name).unwrap().clone();
    tx.push(del("pods-a", addr(f, 1)));
    tx.push(del("iso", addr(f, 1)));
    tx.push(del("ports", format!("{} . tcp . 8080", addr(f, 1))));
    tx.push(Op::AddSet(def("pods-c")));
    tx.push(add("pods-c", addr(f, 1), None));
    tx.push(Op::AddSet(def("iso")));
    tx.push(add("iso", addr(f, 2), Some("jump c2")));
    tx.push(Op::AddSet(def("ports")));
    tx.push(add("ports", format!("{} . udp . 53", addr(f, 2)), None));
    tx.push(add("ports", format!("{} . sctp . 9", addr(f, 2)), None));
    tx.push(Op::FlushChain("d".into()));
    let fam = f.as_str();
    tx.push(rule(format!(
        "{fam} saddr @pods-c jump c2 comment \"x/new\""
    )));
    tx.push(rule(format!("{fam} daddr @pods-a jump c1")));
    tx.push(rule(match f {
        Family::Ip => "reject with icmp type admin-prohibited".into(),
        Family::Ip6 => "reject with icmpv6 type admin-prohibited".into(),
    }));
    tx.push(Op::FlushChain("gone".into()));
    tx.push(Op::DeleteChain("gone".into()));
    tx.push(Op::DeleteSet {
        name: "unused".into(),
        kind: SetKind::Set,
    });
    tx
}

fn lab() -> (NetNs, NftExecutor) {
    let ns = NetNs::create(&unique_name("lnftnl")).unwrap();
    let exec = NftExecutor::new(Some(ns.name().to_string()));
    (ns, exec)
}

fn known(f: Family) -> impl Fn(&str) -> Option<SetDef> {
    move |name| sets(f).into_iter().find(|d| d.name == name)
}

fn a_batch_is_what_libnftables_makes_of_the_text(f: Family) {
    let (_a, by_netlink) = lab();
    let (_b, by_text) = lab();
    for exec in [&by_netlink, &by_text] {
        exec.apply(&table(f)).unwrap();
    }
    let before = by_netlink.list_table(f, "t").unwrap().unwrap();
    let generation = by_netlink.generation().unwrap();
    let tx = change(f);
    assert_eq!(
        by_netlink.apply_known(&tx, &known(f)).unwrap(),
        Transport::Netlink
    );
    // One transaction: the generation moved by one.
    assert_eq!(by_netlink.generation().unwrap(), generation.wrapping_add(1));
    by_text.apply(&tx).unwrap();
    let after = by_netlink.list_table(f, "t").unwrap().unwrap();
    assert_ne!(before, after);
    assert_eq!(after, by_text.list_table(f, "t").unwrap().unwrap());
    // What moved, spelled out.
    let (one, two) = (addr(f, 1), addr(f, 2));
    for (what, listing) in [
        ("pods-c", format!("elements = {{ {one} }}")),
        ("pods-a", format!("elements = {{ {two} }}")),
        ("iso", format!("elements = {{ {two} : jump c2 }}")),
        ("ports", format!("{two} . udp . 53")),
    ] {
        let block = after.split(&format!(" {what} {{")).nth(1).unwrap();
        let block = block.split('}').take(2).collect::<Vec<_>>().join("}");
        assert!(block.contains(&listing), "{what}: {block}");
    }
    assert!(!after.contains(&format!("{one} . tcp . 8080")), "{after}");
    assert!(
        !after.contains("chain gone") && !after.contains("set unused"),
        "{after}"
    );
    assert!(after.contains("comment \"x/new\""), "{after}");
}

#[test]
fn an_ipv4_batch_is_what_libnftables_makes_of_the_text() {
    a_batch_is_what_libnftables_makes_of_the_text(Family::Ip);
}

#[test]
fn an_ipv6_batch_is_what_libnftables_makes_of_the_text() {
    a_batch_is_what_libnftables_makes_of_the_text(Family::Ip6);
}

#[test]
fn a_refused_batch_changes_nothing_and_names_the_message() {
    let (_ns, exec) = lab();
    exec.apply(&table(Family::Ip)).unwrap();
    let before = exec.list_table(Family::Ip, "t").unwrap().unwrap();
    let generation = exec.generation().unwrap();
    let mut tx = Transaction::new(Family::Ip, "t");
    tx.push(Op::DeleteElement {
        set: "pods-a".into(),
        key: "10.0.0.2".into(),
    });
    tx.push(Op::FlushChain("gone".into()));
    tx.push(Op::DeleteChain("gone".into()));
    // Not in the set: the kernel refuses this message, and so the whole batch.
    tx.push(Op::DeleteElement {
        set: "iso".into(),
        key: "10.9.9.9".into(),
    });
    let err = exec.apply_known(&tx, &known(Family::Ip)).unwrap_err();
    let ApplyError::Rejected { stderr } = &err else {
        panic!("{err:?}")
    };
    assert!(stderr.contains("DELSETELEM ip t iso (1)"), "{stderr}");
    assert!(stderr.contains("No such file or directory"), "{stderr}");
    assert!(err.is_retryable());
    assert_eq!(exec.list_table(Family::Ip, "t").unwrap().unwrap(), before);
    assert_eq!(exec.generation().unwrap(), generation);
    // Refused in the middle (only the last request is acknowledged when all goes well):
    // reported all the same, nothing applied.
    let mut middle = tx.clone();
    middle.ops.rotate_right(1);
    let err = exec.apply_known(&middle, &known(Family::Ip)).unwrap_err();
    assert!(
        err.to_string()
            .contains("DELSETELEM ip t iso (1): No such file"),
        "{err}"
    );
    assert_eq!(exec.list_table(Family::Ip, "t").unwrap().unwrap(), before);
    assert_eq!(exec.generation().unwrap(), generation);
    // The socket goes on: the same change without the bad element is applied.
    tx.ops.pop();
    assert_eq!(
        exec.apply_known(&tx, &known(Family::Ip)).unwrap(),
        Transport::Netlink
    );
    assert_eq!(exec.generation().unwrap(), generation.wrapping_add(1));
    let after = exec.list_table(Family::Ip, "t").unwrap().unwrap();
    assert!(
        !after.contains("10.0.0.2") && !after.contains("chain gone"),
        "{after}"
    );
}

#[test]
fn what_the_encoder_does_not_know_goes_through_libnftables() {
    let (_ns, exec) = lab();
    exec.apply(&table(Family::Ip)).unwrap();
    let mut tx = Transaction::new(Family::Ip, "t");
    tx.push(Op::DeleteSet {
        name: "unused".into(),
        kind: SetKind::Set,
    });
    // A rule outside the encoder's vocabulary.
    tx.push(Op::AddRule {
        chain: "c1".into(),
        rule: "ip saddr @pods-a tcp dport 80 accept".into(),
    });
    assert_eq!(
        exec.apply_known(&tx, &known(Family::Ip)).unwrap(),
        Transport::Libnftables
    );
    let after = exec.list_table(Family::Ip, "t").unwrap().unwrap();
    assert!(
        after.contains("tcp dport 80 accept") && !after.contains("unused"),
        "{after}"
    );
    // Without a deletion, libnftables is as fast as a batch: the text path.
    let mut tx = Transaction::new(Family::Ip, "t");
    tx.push(Op::AddElement {
        set: "pods-c".into(),
        key: "10.0.0.9".into(),
        value: None,
    });
    assert_eq!(
        exec.apply_known(&tx, &known(Family::Ip)).unwrap(),
        Transport::Libnftables
    );
}

//! Changes that delete (a pod relabelled out of a selector, a policy deleted) reach the
//! kernel as one nf_tables netlink batch rather than through libnftables, which would first
//! dump every chain and set of the namespace: each is one committed transaction (the
//! namespace's generation moves by one), touches only elements, rules, chains and sets (no
//! request that reads), and leaves the table a full sync of the same model makes (root,
//! fresh network namespaces).
#![allow(clippy::unwrap_used)]

mod common;

use common::{blocks, fixed, model, policy};
use serde_json::json;
use svcnet_libnft::{NftExecutor, Op, SetDef, SetKind, Transport, netlink};
use svcnet_netns::{NetNs, unique_name};
use svcnet_netpol::Cluster;
use svcnet_netpol_nft::{Enforcer, Options, Renderer, names, plan_changes, render};

struct Node {
    _ns: NetNs,
    exec: NftExecutor,
    enforcer: Enforcer,
    renderer: Renderer,
}

impl Node {
    fn new(c: &Cluster) -> Node {
        let ns = NetNs::create(&unique_name("npnl")).unwrap();
        let exec = NftExecutor::new(Some(ns.name().to_string()));
        let mut node = Node {
            _ns: ns,
            enforcer: Enforcer::new(exec.clone()),
            exec,
            renderer: Renderer::new("node1", Options::default()),
        };
        node.renderer.update(c);
        let changes = node.renderer.take_changes();
        let report = (node.enforcer)
            .sync_changes(node.renderer.ruleset(), &changes)
            .unwrap();
        assert!(report.full);
        node
    }

    fn listing(&self) -> String {
        (self.exec)
            .list_table(names::FAMILY, names::TABLE)
            .unwrap()
            .unwrap()
    }

    fn elements(&self, set: &str) -> String {
        let kind = if set.ends_with("-isolated") {
            "map"
        } else {
            "set"
        };
        let listing = (self.exec)
            .command(&format!("list {kind} ip {} {set}", names::TABLE))
            .unwrap();
        match listing.split_once("elements = {") {
            Some((_, rest)) => rest.split('}').next().unwrap().trim().to_string(),
            None => String::new(),
        }
    }

    /// Applies what the renderer recorded since the last sync: it must go as one netlink
    /// transaction made of `allowed` operations only; returns the operations.
    fn sync_by_netlink(&mut self, allowed: fn(&Op) -> bool) -> Vec<Op> {
        let changes = self.renderer.take_changes();
        let applied = self.enforcer.applied().unwrap();
        let tx = plan_changes(applied, self.renderer.ruleset(), &changes);
        assert!(tx.ops.iter().all(allowed), "{tx}");
        // What goes to the kernel: writes only, not one request that reads (no dump).
        let known = |name: &str| {
            applied.sets.get(name).map(|s| SetDef {
                name: name.to_string(),
                kind: match s.type_.contains(" : ") {
                    true => SetKind::Map,
                    false => SetKind::Set,
                },
                type_: s.type_.to_string(),
                flags: if s.interval { vec!["interval"] } else { vec![] },
                timeout_seconds: None,
                size: None,
                comment: None,
            })
        };
        let batch = netlink::encode(&tx, &known).unwrap();
        let writes = [
            "BATCH_BEGIN",
            "BATCH_END",
            "NEWSETELEM",
            "DELSETELEM",
            "DELRULE",
            "NEWRULE",
            "DELCHAIN",
            "DELSET",
        ];
        for m in batch.messages() {
            let kind = m.split_whitespace().next().unwrap();
            assert!(writes.contains(&kind), "{m}");
        }
        let generation = self.exec.generation().unwrap();
        let report = (self.enforcer)
            .sync_changes(self.renderer.ruleset(), &changes)
            .unwrap();
        assert_eq!(report.transport, Transport::Netlink, "{tx}");
        assert!(!report.full);
        assert_eq!(report.ops, tx.len());
        assert_eq!(self.exec.generation().unwrap(), generation.wrapping_add(1));
        tx.ops
    }

    /// The table equals what a full sync of `c` makes in a fresh namespace.
    fn assert_as_full(&self, c: &Cluster) {
        let ns = NetNs::create(&unique_name("npnl-ref")).unwrap();
        let exec = NftExecutor::new(Some(ns.name().to_string()));
        let mut reference = Enforcer::new(exec.clone());
        reference
            .sync(render(c, "node1", &Options::default()))
            .unwrap();
        let full = exec
            .list_table(names::FAMILY, names::TABLE)
            .unwrap()
            .unwrap();
        assert_eq!(blocks(&self.listing()), blocks(&full));
    }
}

fn from(ns: &str, name: &str, target: &str, peer: &str) -> svcnet_netpol::Policy {
    policy(
        ns,
        name,
        json!({
            "podSelector": {"matchLabels": {"pod": target}},
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": peer}}}]}],
        }),
    )
}

fn cluster() -> Cluster {
    let mut c = model(fixed);
    c.policies = vec![
        from("x", "isolate-a", "a", "b"),
        from("x", "from-a", "b", "a"),
        from("x", "from-c", "b", "c"),
    ];
    c
}

/// `x/a` (10.244.0.10, on node1): the sets of `pod=a` and `pod=c` in namespace x.
const X_A: &str = "10.244.0.10";

fn pods(selected: &str) -> String {
    names::pods_set(&format!("namespace x, pods pod={selected}"))
}

#[test]
fn a_pods_label_change_moves_it_between_sets_in_one_transaction() {
    let mut c = cluster();
    let mut node = Node::new(&c);
    assert!(node.elements(&pods("a")).contains(X_A));
    assert!(!node.elements(&pods("c")).contains(X_A));
    assert!(node.elements(names::INGRESS_ISOLATED).contains(X_A));
    let before = node.listing();

    let pod = (c.pods.iter_mut())
        .find(|p| p.namespace == "x" && p.name == "a")
        .unwrap();
    pod.labels.insert("pod".into(), "c".into());
    node.renderer.set_pod(pod.clone());
    let ops = node.sync_by_netlink(|op| {
        matches!(
            op,
            Op::DeleteElement { .. } | Op::AddElement { .. } | Op::AddSet(_)
        )
    });
    // Out of pod=a's set and of the isolation map, into pod=c's: in the same transaction.
    let deleted = |set: &str| {
        (ops.iter())
            .any(|op| matches!(op, Op::DeleteElement { set: s, key } if s == set && key == X_A))
    };
    assert!(
        deleted(&pods("a")) && deleted(names::INGRESS_ISOLATED),
        "{ops:?}"
    );
    assert!(!node.elements(&pods("a")).contains(X_A));
    assert!(node.elements(&pods("c")).contains(X_A));
    assert!(!node.elements(names::INGRESS_ISOLATED).contains(X_A));
    assert_ne!(node.listing(), before);
    node.assert_as_full(&c);
}

#[test]
fn a_deleted_policy_goes_in_one_transaction() {
    let mut c = cluster();
    let mut node = Node::new(&c);
    let chain = names::policy_chain(true, "x/isolate-a");
    let dispatch = names::namespace_chain(true, "x");
    assert!(node.listing().contains(&format!("chain {chain} {{")));

    // x/a was isolated by this policy alone: its isolation element goes with the policy's
    // chain and its jump in the namespace's dispatch.
    c.policies.retain(|p| p.name != "isolate-a");
    node.renderer.remove_policy("x", "isolate-a");
    let ops = node.sync_by_netlink(|op| {
        matches!(
            op,
            Op::DeleteElement { .. }
                | Op::AddSet(_)
                | Op::FlushChain(_)
                | Op::AddRule { .. }
                | Op::DeleteChain(_)
        )
    });
    assert!(ops.contains(&Op::DeleteChain(chain.clone())), "{ops:?}");
    assert!(ops.contains(&Op::FlushChain(dispatch.clone())), "{ops:?}");
    let listing = node.listing();
    assert!(!listing.contains(&format!("chain {chain} {{")), "{listing}");
    assert!(!listing.contains("x/isolate-a"), "{listing}");
    assert!(!node.elements(names::INGRESS_ISOLATED).contains(X_A));
    node.assert_as_full(&c);

    // The last user of pod=a's set goes: the set goes too.
    c.policies.retain(|p| p.name != "from-a");
    node.renderer.remove_policy("x", "from-a");
    let ops = node.sync_by_netlink(|op| !matches!(op, Op::AddChain { .. } | Op::AddTable { .. }));
    assert!(
        ops.iter()
            .any(|op| matches!(op, Op::DeleteSet { name, .. } if *name == pods("a")))
    );
    assert!(!node.listing().contains(&pods("a")));
    node.assert_as_full(&c);
}

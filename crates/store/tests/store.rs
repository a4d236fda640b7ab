//! Behaviour of the redb store through the public `Store` trait.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::{assert_quiet, next, rv};
use svcnet_store::{EventType, Mutation, Outcome, RedbStore, Store, StoreError, StoreOptions};

fn open(dir: &tempfile::TempDir, history: u64) -> RedbStore {
    RedbStore::open(
        dir.path().join("store.redb"),
        StoreOptions {
            history,
            durable: true,
            ..Default::default()
        },
    )
    .unwrap()
}

fn obj(name: &str, v: i64) -> Value {
    json!({"metadata": {"name": name}, "spec": {"v": v}})
}

#[tokio::test]
async fn create_get_update_delete() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir, 100);
    assert_eq!(s.current_revision().await.unwrap(), 0);
    let created = s.create("/core/services/ns/a", obj("a", 1)).await.unwrap();
    assert_eq!(created["metadata"]["resourceVersion"], "1");
    assert_eq!(
        s.get("/core/services/ns/a").await.unwrap(),
        Some(created.clone())
    );
    assert_eq!(s.get("/core/services/ns/b").await.unwrap(), None);

    let err = s
        .create("/core/services/ns/a", obj("a", 2))
        .await
        .unwrap_err();
    assert!(err.is_already_exists(), "{err}");

    let updated = s
        .update("/core/services/ns/a", obj("a", 2), Some(1))
        .await
        .unwrap();
    assert_eq!(rv(&updated), 2);
    assert_eq!(updated["spec"]["v"], 2);

    let err = s
        .update("/core/services/ns/a", obj("a", 3), Some(1))
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err}");
    assert!(matches!(
        err,
        StoreError::Conflict {
            expected: 1,
            actual: 2,
            ..
        }
    ));
    // Unconditional update ignores the revision.
    let updated = s
        .update("/core/services/ns/a", obj("a", 3), None)
        .await
        .unwrap();
    assert_eq!(rv(&updated), 3);

    let err = s
        .update("/core/services/ns/missing", obj("m", 1), None)
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");

    let err = s.delete("/core/services/ns/a", Some(2)).await.unwrap_err();
    assert!(err.is_conflict());
    let deleted = s.delete("/core/services/ns/a", Some(3)).await.unwrap();
    assert_eq!(
        rv(&deleted),
        4,
        "a deleted object carries the deletion revision"
    );
    assert_eq!(deleted["spec"]["v"], 3);
    assert!(
        s.delete("/core/services/ns/a", None)
            .await
            .unwrap_err()
            .is_not_found()
    );
    assert_eq!(s.get("/core/services/ns/a").await.unwrap(), None);
    assert_eq!(s.current_revision().await.unwrap(), 4);
}

#[tokio::test]
async fn rejects_bad_keys_and_values() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir, 100);
    assert!(
        s.create("no-slash", obj("a", 1))
            .await
            .unwrap_err()
            .is_invalid()
    );
    assert!(s.create("/x/", obj("a", 1)).await.unwrap_err().is_invalid());
    assert!(
        s.create("/x/y", json!([1, 2]))
            .await
            .unwrap_err()
            .is_invalid()
    );
    assert!(
        s.create("/x/y", json!({"metadata": 5}))
            .await
            .unwrap_err()
            .is_invalid()
    );
    // Failed writes consume no revision.
    assert_eq!(s.current_revision().await.unwrap(), 0);
}

#[tokio::test]
async fn list_by_prefix_at_one_revision() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir, 100);
    s.create("/core/pods/a/p1", obj("p1", 1)).await.unwrap();
    s.create("/core/pods/b/p2", obj("p2", 1)).await.unwrap();
    s.create("/core/pods/a/p3", obj("p3", 1)).await.unwrap();
    s.create("/core/podsx/a/q", obj("q", 1)).await.unwrap();
    s.create("/core/services/a/s", obj("s", 1)).await.unwrap();

    let all = s.list("/core/pods/").await.unwrap();
    assert_eq!(all.revision, 5);
    let names: Vec<_> = all
        .items
        .iter()
        .map(|o| o["metadata"]["name"].clone())
        .collect();
    assert_eq!(names, vec!["p1", "p3", "p2"]);
    let a = s.list("/core/pods/a/").await.unwrap();
    assert_eq!(a.items.len(), 2);
    assert!(s.list("/apps/").await.unwrap().items.is_empty());

    // Counted without decoding, the same as the list: each object's stored bytes.
    let stats = s.stats("/core/pods/").await.unwrap();
    let bytes: u64 = all
        .items
        .iter()
        .map(|o| serde_json::to_vec(o).unwrap().len() as u64)
        .sum();
    assert_eq!(stats, svcnet_store::PrefixStats { objects: 3, bytes });
    assert_eq!(s.stats("/apps/").await.unwrap().objects, 0);
    assert!(s.size_bytes().unwrap() > 0);
}

#[tokio::test]
async fn guaranteed_update_reads_modifies_writes() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir, 100);
    // Put on an absent key creates.
    let out = s
        .guaranteed_update(
            "/k/a",
            Box::new(|cur| {
                assert!(cur.is_none());
                Ok(Mutation::Put(obj("a", 1)))
            }),
        )
        .await
        .unwrap();
    assert!(matches!(out, Outcome::Written(ref v) if rv(v) == 1));

    let out = s
        .guaranteed_update(
            "/k/a",
            Box::new(|cur| {
                let mut next = cur.unwrap().clone();
                next["spec"]["v"] = json!(next["spec"]["v"].as_i64().unwrap() + 10);
                Ok(Mutation::Put(next))
            }),
        )
        .await
        .unwrap();
    let Outcome::Written(v) = out else { panic!() };
    assert_eq!(v["spec"]["v"], 11);

    let out = s
        .guaranteed_update("/k/a", Box::new(|_| Ok(Mutation::Keep)))
        .await
        .unwrap();
    assert!(matches!(out, Outcome::Unchanged(Some(_))));
    assert_eq!(
        s.current_revision().await.unwrap(),
        2,
        "Keep consumes no revision"
    );

    #[derive(Debug, thiserror::Error)]
    #[error("nope")]
    struct Nope;
    let err = s
        .guaranteed_update("/k/a", Box::new(|_| Err(StoreError::aborted(Nope))))
        .await
        .unwrap_err();
    assert!(err.downcast_aborted::<Nope>().is_some());

    let out = s
        .guaranteed_update("/k/a", Box::new(|_| Ok(Mutation::Delete)))
        .await
        .unwrap();
    assert!(matches!(out, Outcome::Deleted(ref v) if rv(v) == 3));
    let err = s
        .guaranteed_update("/k/a", Box::new(|_| Ok(Mutation::Delete)))
        .await
        .unwrap_err();
    assert!(err.is_not_found());
}

#[tokio::test]
async fn watch_replays_exactly_then_follows() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir, 100);
    for i in 0..5 {
        s.create(&format!("/core/pods/ns/p{i}"), obj("p", i))
            .await
            .unwrap();
    }
    s.create("/core/services/ns/s", obj("s", 0)).await.unwrap(); // rev 6, other prefix
    s.update("/core/pods/ns/p1", obj("p1", 9), None)
        .await
        .unwrap(); // rev 7
    s.delete("/core/pods/ns/p2", None).await.unwrap(); // rev 8

    let mut w = s.watch("/core/pods/", 3).await.unwrap();
    let got: Vec<_> = [
        next(&mut w).await,
        next(&mut w).await,
        next(&mut w).await,
        next(&mut w).await,
    ]
    .into_iter()
    .map(|e| (e.revision, e.kind, e.key))
    .collect();
    let mut w_prev = s.watch("/core/pods/ns/p1", 6).await.unwrap();
    let modified = next(&mut w_prev).await;
    assert_eq!(
        modified.prev_object.unwrap()["spec"]["v"],
        1,
        "MODIFIED carries the previous state"
    );
    assert_eq!(modified.object["spec"]["v"], 9);
    assert_eq!(
        got,
        vec![
            (4, EventType::Added, "/core/pods/ns/p3".to_string()),
            (5, EventType::Added, "/core/pods/ns/p4".to_string()),
            (7, EventType::Modified, "/core/pods/ns/p1".to_string()),
            (8, EventType::Deleted, "/core/pods/ns/p2".to_string()),
        ]
    );
    assert_quiet(&mut w).await;
    s.create("/core/services/ns/t", obj("t", 0)).await.unwrap(); // filtered
    s.create("/core/pods/ns/live", obj("live", 0))
        .await
        .unwrap(); // rev 10
    let e = next(&mut w).await;
    assert_eq!((e.revision, e.kind), (10, EventType::Added));
    assert_eq!(e.prev_object, None);
    assert_eq!(rv(&e.object), 10);
    assert_quiet(&mut w).await;

    // Watching from the head sees only new events.
    let mut w2 = s
        .watch("/core/pods/", s.current_revision().await.unwrap())
        .await
        .unwrap();
    assert_quiet(&mut w2).await;
    s.delete("/core/pods/ns/live", None).await.unwrap();
    assert_eq!(next(&mut w2).await.kind, EventType::Deleted);
    assert_eq!(next(&mut w).await.kind, EventType::Deleted);
}

#[tokio::test]
async fn watch_has_no_gap_or_duplicate_under_concurrent_writes() {
    let dir = tempfile::tempdir().unwrap();
    let s = RedbStore::open(
        dir.path().join("s.redb"),
        StoreOptions {
            history: 100_000,
            durable: false,
            ..Default::default()
        },
    )
    .unwrap();
    for i in 0..50 {
        s.create(&format!("/x/pre{i}"), obj("p", i)).await.unwrap();
    }
    let writer = {
        let s = s.clone();
        tokio::spawn(async move {
            for i in 0..2000 {
                s.create(&format!("/x/k{i}"), obj("k", i)).await.unwrap();
            }
        })
    };
    // Start watching while writes are in flight, from an old revision.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut w = s.watch("/x/", 10).await.unwrap();
    let mut expected = 11;
    while expected <= 2050 {
        let e = next(&mut w).await;
        assert_eq!(e.revision, expected, "events arrive in order, once each");
        expected += 1;
    }
    writer.await.unwrap();
    assert_quiet(&mut w).await;
}

#[tokio::test]
async fn slow_watcher_that_lags_the_broadcast_misses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = RedbStore::open(
        dir.path().join("s.redb"),
        StoreOptions {
            history: 100_000,
            durable: false,
            ..Default::default()
        },
    )
    .unwrap();
    let mut w = s.watch("/x/", 0).await.unwrap();
    // More writes than the broadcast buffers, while the watcher reads nothing.
    for i in 0..3000 {
        s.create(&format!("/x/k{i}"), obj("k", i)).await.unwrap();
    }
    for expected in 1..=3000 {
        assert_eq!(next(&mut w).await.revision, expected);
    }
    assert_quiet(&mut w).await;
}

#[tokio::test]
async fn watch_from_compacted_revision_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir, 20);
    for i in 0..100 {
        s.create(&format!("/x/k{i}"), obj("k", i)).await.unwrap();
    }
    let compacted = s.compacted_revision().unwrap();
    assert!(
        (70..=80).contains(&compacted),
        "automatic compaction keeps ~20: {compacted}"
    );
    let err = s.watch("/x/", 5).await.err().unwrap();
    assert!(err.is_gone(), "{err}");
    assert!(matches!(err, StoreError::Gone { requested: 5, .. }));
    // Within the window replay still works.
    let mut w = s.watch("/x/", 90).await.unwrap();
    assert_eq!(next(&mut w).await.revision, 91);

    assert_eq!(s.compact(5).unwrap(), 95);
    assert!(s.watch("/x/", 94).await.err().unwrap().is_gone());
    let mut w = s.watch("/x/", 95).await.unwrap();
    assert_eq!(next(&mut w).await.revision, 96);
    // Objects are not affected by compaction.
    assert_eq!(s.list("/x/").await.unwrap().items.len(), 100);
}

#[tokio::test]
async fn data_and_revision_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = open(&dir, 100);
        s.create("/a/1", obj("1", 1)).await.unwrap();
        s.create("/a/2", obj("2", 2)).await.unwrap();
        s.delete("/a/1", None).await.unwrap();
        // An open watch must not keep the database open after the store is dropped.
        let _w = s.watch("/a/", 0).await.unwrap();
    }
    let s = open(&dir, 100);
    assert_eq!(s.current_revision().await.unwrap(), 3);
    assert_eq!(s.get("/a/1").await.unwrap(), None);
    assert_eq!(s.get("/a/2").await.unwrap().unwrap()["spec"]["v"], 2);
    let v = s.create("/a/3", obj("3", 3)).await.unwrap();
    assert_eq!(rv(&v), 4, "revisions continue after reopen");
    let mut w = s.watch("/a/", 0).await.unwrap();
    let kinds: Vec<_> = [
        next(&mut w).await,
        next(&mut w).await,
        next(&mut w).await,
        next(&mut w).await,
    ]
    .iter()
    .map(|e| e.kind)
    .collect();
    assert_eq!(
        kinds,
        vec![
            EventType::Added,
            EventType::Added,
            EventType::Deleted,
            EventType::Added
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_get_distinct_increasing_revisions() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir, 10_000);
    s.create("/counter/c", json!({"metadata": {}, "n": 0}))
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for t in 0..8 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut revs = Vec::new();
            for i in 0..10 {
                let v = s.create(&format!("/w/{t}-{i}"), obj("w", i)).await.unwrap();
                revs.push(rv(&v));
                // A read-modify-write counter: no lost updates.
                s.guaranteed_update(
                    "/counter/c",
                    Box::new(|cur| {
                        let mut c = cur.unwrap().clone();
                        c["n"] = json!(c["n"].as_i64().unwrap() + 1);
                        Ok(Mutation::Put(c))
                    }),
                )
                .await
                .unwrap();
            }
            revs
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        let revs = t.await.unwrap();
        assert!(revs.windows(2).all(|w| w[0] < w[1]));
        all.extend(revs);
    }
    let n = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), n, "no revision handed out twice");
    assert_eq!(s.get("/counter/c").await.unwrap().unwrap()["n"], 80);
    assert_eq!(s.current_revision().await.unwrap(), 161);
}

/// A large object written again and again (create/delete loops of a 1 MiB ConfigMap) must not
/// grow the watch history without bound: history is bounded by bytes as well as by count, the
/// latest events stay watchable and the compacted ones are Gone, and the file stops growing.
#[tokio::test]
async fn history_is_bounded_by_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let budget = 8u64 << 20;
    let s = RedbStore::open(
        &path,
        StoreOptions {
            history: 10_000,
            history_bytes: budget,
            durable: false,
            ..Default::default()
        },
    )
    .unwrap();
    let big = "x".repeat(900 * 1024);
    let mut file_sizes = Vec::new();
    let mut last = 0;
    for round in 0..60 {
        let created = s
            .create(
                "/core/configmaps/default/big",
                json!({"metadata": {"name": "big"}, "data": {"k": big}}),
            )
            .await
            .unwrap();
        assert!(rv(&created) > last);
        last = s
            .delete("/core/configmaps/default/big", None)
            .await
            .map(|o| rv(&o))
            .unwrap();
        let bytes = s.history_bytes().unwrap();
        assert!(
            bytes <= budget,
            "round {round}: history holds {bytes} bytes > {budget}"
        );
        if round >= 20 {
            file_sizes.push(std::fs::metadata(&path).unwrap().len());
        }
    }
    // The latest event is still in history; the early ones were compacted away.
    let compacted = s.compacted_revision().unwrap();
    assert!(
        compacted > 10,
        "byte bound compacted nothing (compacted at {compacted})"
    );
    let mut w = s.watch("/core/configmaps/", last - 1).await.unwrap();
    let e = next(&mut w).await;
    assert_eq!((e.revision, e.kind), (last, EventType::Deleted));
    assert!(matches!(
        s.watch("/core/configmaps/", 1).await,
        Err(StoreError::Gone { .. })
    ));
    // Freed pages are reused: the file does not keep growing with the rounds.
    let (first, end) = (file_sizes[0], *file_sizes.last().unwrap());
    assert!(
        end <= first + (budget * 2),
        "store file grew from {first} to {end} bytes over 40 rounds"
    );
    drop(s);
    // Reopening keeps the count of history bytes.
    let s = RedbStore::open(&path, StoreOptions::default()).unwrap();
    assert!(s.history_bytes().unwrap() <= budget);
}

/// A list at a revision is the state as it was then: later additions gone, later changes and
/// deletions undone, other prefixes untouched; Gone once compacted, refused in the future.
#[tokio::test]
async fn list_at_a_revision_is_the_state_then() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir, 10_000);
    let a = s
        .create("/core/configmaps/ns/a", obj("a", 1))
        .await
        .unwrap();
    s.create("/core/configmaps/ns/b", obj("b", 1))
        .await
        .unwrap();
    let then = rv(&s.create("/core/pods/ns/p", obj("p", 1)).await.unwrap());
    s.update("/core/configmaps/ns/a", obj("a", 2), None)
        .await
        .unwrap();
    s.delete("/core/configmaps/ns/b", None).await.unwrap();
    s.create("/core/configmaps/ns/c", obj("c", 1))
        .await
        .unwrap();
    let at = s.list_at("/core/configmaps/", then).await.unwrap();
    assert_eq!(at.revision, then);
    let names: Vec<(&str, i64)> = at
        .items
        .iter()
        .map(|o| {
            (
                o["metadata"]["name"].as_str().unwrap(),
                o["spec"]["v"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(names, vec![("a", 1), ("b", 1)]);
    assert_eq!(
        at.items[0]["metadata"]["resourceVersion"],
        a["metadata"]["resourceVersion"]
    );
    // At the head it is today's list.
    let head = s.current_revision().await.unwrap();
    let now = s.list("/core/configmaps/").await.unwrap();
    assert_eq!(
        s.list_at("/core/configmaps/", head).await.unwrap().items,
        now.items
    );
    assert!(matches!(
        s.list_at("/core/configmaps/", head + 1).await,
        Err(StoreError::FutureRevision { .. })
    ));
    s.compact(1).unwrap();
    assert!(matches!(
        s.list_at("/core/configmaps/", then).await,
        Err(StoreError::Gone { .. })
    ));
}

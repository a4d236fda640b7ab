//! The conformance suite's watch cases: replay then live events, no gap or duplicate under
//! concurrent writers, 410 after compaction, and a watch's progress.

use super::support::{assert_quiet, next};
use super::*;
use svcnet_store::EventType;

pub(crate) async fn watch_replays_then_follows(b: &mut Backend) {
    let s = b.s();
    let base = s.current_revision().await.unwrap();
    let a1 = s.create("/core/pods/ns/a", obj("a", 1)).await.unwrap();
    s.create("/core/configmaps/ns/x", obj("x", 1))
        .await
        .unwrap();
    let a2 = s
        .update("/core/pods/ns/a", obj("a", 2), None)
        .await
        .unwrap();
    let del = s.delete("/core/pods/ns/a", None).await.unwrap();

    let mut w = s.watch("/core/pods/", base).await.unwrap();
    let e = next(&mut w).await;
    assert_eq!(
        (e.kind, e.revision, &e.key),
        (EventType::Added, rv(&a1), &"/core/pods/ns/a".to_string())
    );
    assert_eq!(e.object, a1);
    assert_eq!(e.prev_object, None);
    let e = next(&mut w).await;
    assert_eq!((e.kind, e.revision), (EventType::Modified, rv(&a2)));
    assert_eq!(e.object, a2);
    assert_eq!(e.prev_object.as_ref(), Some(&a1));
    let e = next(&mut w).await;
    assert_eq!((e.kind, e.revision), (EventType::Deleted, rv(&del)));
    assert_eq!(
        e.object, del,
        "the last state, stamped with the deletion revision"
    );
    assert_eq!(e.prev_object.as_ref(), Some(&a2));
    assert_quiet(&mut w).await;

    // Live events follow, for this prefix only; a recreated key is ADDED again.
    s.create("/core/configmaps/ns/y", obj("y", 1))
        .await
        .unwrap();
    let again = s.create("/core/pods/ns/a", obj("a", 3)).await.unwrap();
    let e = next(&mut w).await;
    assert_eq!((e.kind, e.revision), (EventType::Added, rv(&again)));
    // A namespace prefix and a cluster-scoped prefix.
    let mut wn = s.watch("/core/pods/other/", rv(&again)).await.unwrap();
    let mut wc = s.watch("/core/namespaces/", rv(&again)).await.unwrap();
    s.create("/core/pods/ns/b", obj("b", 1)).await.unwrap();
    let o = s.create("/core/pods/other/c", obj("c", 1)).await.unwrap();
    let n = s
        .create("/core/namespaces//other", obj("other", 1))
        .await
        .unwrap();
    assert_eq!(next(&mut wn).await.revision, rv(&o));
    assert_quiet(&mut wn).await;
    let e = next(&mut wc).await;
    assert_eq!(
        (e.revision, e.key.as_str()),
        (rv(&n), "/core/namespaces//other")
    );
    // Watching from the head sees only what comes next.
    let head = s.current_revision().await.unwrap();
    let mut wh = s.watch("/core/pods/", head).await.unwrap();
    assert_quiet(&mut wh).await;
    let up = s
        .update("/core/pods/ns/b", obj("b", 2), None)
        .await
        .unwrap();
    assert_eq!(next(&mut wh).await.revision, rv(&up));
}

pub(crate) async fn watch_has_no_gap_or_duplicate_under_concurrent_writers(b: &mut Backend) {
    const WRITERS: usize = 4;
    const EACH: usize = 40;
    let s = b.arc();
    let base = s.current_revision().await.unwrap();
    let mut w = s.watch("/core/configmaps/", base).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..WRITERS {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for n in 0..EACH {
                let key = format!("/core/configmaps/w{i}/k{}", n % 10);
                let o = obj(&format!("k{n}"), n as i64);
                let written = if n < 10 {
                    s.create(&key, o).await.unwrap()
                } else if n % 7 == 0 {
                    s.delete(&key, None).await.unwrap()
                } else {
                    match s.update(&key, o.clone(), None).await {
                        Ok(v) => v,
                        Err(e) if e.is_not_found() => s.create(&key, o).await.unwrap(),
                        Err(e) => panic!("{e}"),
                    }
                };
                // Unrelated writes interleave too.
                s.create(&format!("/core/secrets/w{i}/s{n}"), obj("s", 0))
                    .await
                    .unwrap();
                acked.push(rv(&written));
            }
            acked
        }));
    }
    let mut acked = Vec::new();
    for t in tasks {
        acked.extend(t.await.unwrap());
    }
    acked.sort_unstable();
    let mut seen = Vec::new();
    while seen.len() < acked.len() {
        let e = next(&mut w).await;
        if let Some(&last) = seen.last() {
            assert!(
                e.revision > last,
                "out of order or repeated: {} after {last}",
                e.revision
            );
        }
        assert!(e.key.starts_with("/core/configmaps/"));
        seen.push(e.revision);
    }
    assert_eq!(seen, acked, "the watch saw exactly the acknowledged writes");
    assert_quiet(&mut w).await;
}

/// Secrets, which no watch cache follows before the test: a cache serves a watch from a
/// compacted revision its window still covers (watch_cache.rs), so here the cache starts after
/// the writes and the old revisions are below it, where the store itself decides.
pub(crate) async fn compaction_answers_gone(b: &mut Backend) {
    let mut revs = Vec::new();
    for n in 0..6 {
        let o = b
            .s()
            .create(&format!("/core/secrets/ns/c{n}"), obj("c", n))
            .await
            .unwrap();
        revs.push(rv(&o));
    }
    let keep_from = revs[3];
    b.forget_before(keep_from).await;
    let s = b.s();
    match s.watch("/core/secrets/", revs[0]).await {
        Err(StoreError::Gone { requested, .. }) => assert_eq!(requested, revs[0]),
        Err(e) => panic!("expected Gone, got {e}"),
        Ok(_) => panic!("expected Gone, got a watch"),
    }
    assert!(
        s.list_at("/core/secrets/", revs[0])
            .await
            .unwrap_err()
            .is_gone()
    );
    // What is retained still serves: watches from just before it, reads at it.
    let mut w = s.watch("/core/secrets/", keep_from - 1).await.unwrap();
    for &r in &revs[3..] {
        assert_eq!(next(&mut w).await.revision, r);
    }
    let at = s.list_at("/core/secrets/", revs[4]).await.unwrap();
    assert_eq!(at.items.len(), 5);
    // A watch that is open keeps following after the compaction.
    let o = s
        .create("/core/secrets/ns/late", obj("late", 1))
        .await
        .unwrap();
    assert_eq!(next(&mut w).await.revision, rv(&o));
}

/// A watch's progress (what a bookmark carries): never past one of its own events not yet
/// yielded; past other keys' writes once its own are out, where the store watches them too
/// (redb, and etcd's cache, which follows the whole resource); a watch resumed from it goes on
/// with the next event, no repeat.
pub(crate) async fn progress_passes_other_keys_only_after_its_own(b: &mut Backend) {
    let s = b.s();
    let from = s.current_revision().await.unwrap();
    let mut w = s.watch("/core/configmaps/quiet/", from).await.unwrap();
    assert_eq!(w.progress(), from);
    let mut revs = Vec::new();
    for key in ["quiet/q1", "busy/b1", "quiet/q2", "busy/b2", "busy/b3"] {
        let o = s.create(&format!("/core/configmaps/{key}"), obj("x", 1));
        revs.push(rv(&o.await.unwrap()));
    }
    assert_eq!(next(&mut w).await.revision, revs[0]);
    let p = w.progress();
    assert!(
        p >= revs[0] && p < revs[2],
        "{p} claims q2 ({}) unsent",
        revs[2]
    );
    assert_eq!(next(&mut w).await.revision, revs[2]);
    assert_quiet(&mut w).await;
    let p = w.progress();
    if matches!(b.kind, Kind::Etcd { cached: false, .. }) {
        assert_eq!(p, revs[2], "a direct etcd watch sees its own keys only");
    } else {
        assert_eq!(p, revs[4], "past the other keys' writes");
    }
    let mut resumed = s.watch("/core/configmaps/quiet/", p).await.unwrap();
    let late = s.create("/core/configmaps/quiet/q3", obj("x", 1)).await;
    assert_eq!(next(&mut resumed).await.revision, rv(&late.unwrap()));
}

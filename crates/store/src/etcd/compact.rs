//! Compaction of etcd's history, coordinated between API servers as kube-apiserver does it
//! (`staging/src/k8s.io/apiserver/pkg/storage/etcd3/compact.go`).
//!
//! The key `compact_rev_key` (outside any prefix, so svcnet and kube-apiserver sharing a
//! cluster coordinate too) holds the last compacted revision; its etcd *version* is a logical
//! clock. Every interval each server tries `Txn(Version(compact_rev_key) = its clock ?
//! Put(compact_rev_key, rev) : Get(compact_rev_key))`, where `rev` is the revision it saw one
//! interval earlier. The winner compacts to `rev`; a loser adopts the clock it read and the
//! current revision, and wins next time if the winner went away. So one compaction happens per
//! interval whatever the number of servers, and 1–2 intervals of history stay available.

use std::future::Future;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};

use super::{EtcdStore, backend, header_revision, to_i64};
use crate::StoreError;

/// kube-apiserver's coordination key.
pub const COMPACT_REV_KEY: &str = "compact_rev_key";

/// One compactor's memory between rounds: the clock it last saw and the revision to compact
/// to next.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompactorState {
    pub clock: i64,
    pub revision: u64,
}

impl EtcdStore {
    /// Drops etcd's history before `revision` at once (reads and watches from older revisions
    /// answer [`StoreError::Gone`] afterwards); waits until etcd has applied it.
    pub async fn compact(&self, revision: u64) -> Result<(), StoreError> {
        self.kv()
            .compact(
                to_i64(revision),
                Some(etcd_client::CompactionOptions::new().with_physical()),
            )
            .await
            .map_err(backend)?;
        Ok(())
    }

    /// One round of the coordinated compaction; returns the state for the next round.
    pub async fn compact_round(&self, state: CompactorState) -> Result<CompactorState, StoreError> {
        let txn = Txn::new()
            .when([Compare::version(
                COMPACT_REV_KEY,
                CompareOp::Equal,
                state.clock,
            )])
            .and_then([TxnOp::put(
                COMPACT_REV_KEY,
                state.revision.to_string(),
                None,
            )])
            .or_else([TxnOp::get(COMPACT_REV_KEY, None)]);
        let resp = self.kv().txn(txn).await.map_err(backend)?;
        let current = header_revision(resp.header());
        if !resp.succeeded() {
            let clock = resp
                .op_responses()
                .into_iter()
                .find_map(|r| match r {
                    TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.version()),
                    _ => None,
                })
                .unwrap_or(0);
            return Ok(CompactorState {
                clock,
                revision: current,
            });
        }
        // No compaction on the very first round (nothing was seen an interval ago).
        if state.revision > 0 {
            self.kv()
                .compact(to_i64(state.revision), None)
                .await
                .map_err(backend)?;
            tracing::debug!("etcd: compacted to revision {}", state.revision);
        }
        Ok(CompactorState {
            clock: state.clock + 1,
            revision: current,
        })
    }

    /// Runs the coordinated compactor every `interval` until `stop` completes (kube-apiserver's
    /// `--etcd-compaction-interval`, default 5 minutes).
    pub async fn run_compactor(self, interval: Duration, stop: impl Future<Output = ()>) {
        let mut state = CompactorState::default();
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => return,
                () = tokio::time::sleep(interval) => {}
            }
            match self.compact_round(state).await {
                Ok(next) => state = next,
                Err(e) => tracing::warn!("etcd compaction failed (retried next interval): {e}"),
            }
        }
    }
}

/// The oldest revision a watch may start from when a read at `probe` found it compacted
/// (`probe` itself when etcd does not say).
pub(super) async fn compacted_floor(store: &EtcdStore, probe: u64) -> u64 {
    super::watch::probe_compacted(store, probe)
        .await
        .unwrap_or(probe)
}

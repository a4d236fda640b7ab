//! Helpers shared by the store's test binaries.
#![allow(dead_code, clippy::unwrap_used)] // not every binary uses every helper

use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;
use svcnet_store::EventStream;

/// An object's resourceVersion as a revision.
pub fn rv(v: &Value) -> u64 {
    svcnet_store::object_revision(v).expect("resourceVersion")
}

/// The next watch event, within 10 s.
pub async fn next(stream: &mut EventStream) -> svcnet_store::Event {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("watch event within 10 s")
        .expect("stream open")
        .expect("event")
}

/// No event for 300 ms.
pub async fn assert_quiet(stream: &mut EventStream) {
    let r = tokio::time::timeout(Duration::from_millis(300), stream.next()).await;
    assert!(r.is_err(), "unexpected event: {r:?}");
}

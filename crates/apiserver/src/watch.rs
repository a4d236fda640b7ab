//! Watch: newline-delimited JSON events, one flushed chunk per event.
//!
//! resourceVersion "" or "0" starts with synthetic ADDED events for the current state (read at
//! one revision) and continues from that revision; "N" continues after N. A version older
//! than the store's history gets a single ERROR event carrying a 410 `Expired` Status, which
//! makes clients re-list. Selectors are applied per event against both the new and the previous
//! object, so an object leaving the selection is sent as DELETED and one entering it as ADDED.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;
use serde_json::{Value, json};
use svcnet_store::{EventType, StoreError};
use tokio::sync::mpsc;

use crate::handlers::{format, render_one, selectors};
use crate::machinery::Selectors;
use crate::registry::ResourceInfo;
use crate::request::ResourceRequest;
use crate::state::SharedState;
use crate::status::ApiError;

/// Default watch duration when the client gives no `timeoutSeconds`.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

fn line(kind: &str, object: Value) -> Bytes {
    let mut s = json!({"type": kind, "object": object}).to_string();
    s.push('\n');
    Bytes::from(s)
}

fn bookmark(res: &ResourceInfo, rv: u64, initial_end: bool) -> Value {
    let mut b = json!({
        "kind": res.kind,
        "apiVersion": res.api_version(),
        "metadata": {"resourceVersion": rv.to_string()},
    });
    if initial_end {
        b["metadata"]["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    b
}

/// Decides what, if anything, a filtered watcher sees of one store event.
fn translate(sel: &Selectors, event: &svcnet_store::Event) -> Option<&'static str> {
    if sel.is_empty() {
        return Some(event.kind.as_str());
    }
    let now = sel.matches(&event.object);
    let before = event.prev_object.as_ref().is_some_and(|p| sel.matches(p));
    match event.kind {
        EventType::Added => now.then_some("ADDED"),
        EventType::Deleted => (now || before).then_some("DELETED"),
        EventType::Modified => match (before, now) {
            (true, true) => Some("MODIFIED"),
            (false, true) => Some("ADDED"),
            (true, false) => Some("DELETED"),
            (false, false) => None,
        },
    }
}

fn streaming(rx: mpsc::Receiver<Bytes>) -> Response {
    let stream =
        tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<Bytes, std::convert::Infallible>);
    let mut resp = Response::new(Body::from_stream(stream));
    *resp.status_mut() = StatusCode::OK;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    resp
}

pub async fn serve(
    state: SharedState,
    req: ResourceRequest,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let res = req.resource;
    let sel = selectors(&req)?;
    let fmt = format(headers, req.query.include_object);
    let prefix = res.ns_prefix(req.namespace.as_deref());
    let rv = req.query.resource_version.clone().unwrap_or_default();
    let (initial, from) = if rv.is_empty() || rv == "0" || req.query.send_initial_events {
        let list = state.store.list(&prefix).await?;
        (Some(list.items), list.revision)
    } else {
        let n = svcnet_store::parse_revision(&rv)
            .ok_or_else(|| ApiError::BadRequest(format!("invalid resource version {rv:?}")))?;
        (None, n)
    };
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let stream = match state.store.watch(&prefix, from).await {
        Ok(s) => s,
        Err(e @ StoreError::Gone { .. }) => {
            let status = ApiError::from(e).status();
            let _ = tx.try_send(line("ERROR", status));
            return Ok(streaming(rx));
        }
        Err(e) => return Err(e.into()),
    };
    let timeout = req
        .query
        .timeout_seconds
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_TIMEOUT);
    let bookmarks = req.query.allow_watch_bookmarks;
    let initial_end = req.query.send_initial_events && bookmarks;
    let interval = state.cfg.bookmark_interval;
    let shutdown = state.shutdown.clone();
    tokio::spawn(async move {
        let mut stream = stream;
        let mut last = from;
        if let Some(items) = initial {
            for obj in items.into_iter().filter(|o| sel.matches(o)) {
                if tx
                    .send(line("ADDED", render_one(res, obj, fmt)))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
        if initial_end
            && tx
                .send(line("BOOKMARK", bookmark(res, last, true)))
                .await
                .is_err()
        {
            return;
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        loop {
            tokio::select! {
                ev = stream.next() => match ev {
                    Some(Ok(event)) => {
                        last = event.revision;
                        if let Some(kind) = translate(&sel, &event) {
                            let obj = render_one(res, event.object, fmt);
                            if tx.send(line(kind, obj)).await.is_err() {
                                return;
                            }
                        }
                    }
                    Some(Err(e)) => {
                        let status = ApiError::from(e).status();
                        let _ = tx.send(line("ERROR", status)).await;
                        return;
                    }
                    None => return,
                },
                _ = ticker.tick(), if bookmarks => {
                    if tx.send(line("BOOKMARK", bookmark(res, last, false))).await.is_err() {
                        return;
                    }
                }
                _ = &mut deadline => return,
                _ = shutdown.cancelled() => return,
                _ = tx.closed() => return,
            }
        }
    });
    Ok(streaming(rx))
}

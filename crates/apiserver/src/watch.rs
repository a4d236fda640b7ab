//! Watch: newline-delimited JSON events, one flushed chunk per event.
//!
//! resourceVersion "" or "0" starts with synthetic ADDED events for the current state (read at
//! one revision) and continues from that revision; "N" continues after N. A version older
//! than the store's history gets a single ERROR event carrying a 410 `Expired` Status, which
//! makes clients re-list. Selectors are applied per event against both the new and the previous
//! object, so an object leaving the selection is sent as DELETED and one entering it as ADDED.
//!
//! An event's line is rendered and encoded once for every watcher that sends it the same way
//! ([`EncodedLines`]), as kube-apiserver's watch cache serializes an event once for all its
//! watchers: with a thousand node proxies watching Services, each change is one encoding, not
//! a thousand.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;
use serde_json::{Value, json};
use svcnet_store::{EventType, StoreError};
use tokio::sync::mpsc;

use crate::handlers::{Format, format, render_one, selectors};
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

/// What makes two watchers' lines for one event the same bytes: the event (its revision and
/// key), the resource it is served as, the event type the watcher's selectors gave it, and the
/// output format.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct LineKey {
    revision: u64,
    key: String,
    /// Group, version and plural of the resource.
    resource: (&'static str, &'static str, &'static str),
    kind: &'static str,
    format: Format,
}

/// How many encoded lines are kept: events stay while the watchers of a burst send them; a
/// watcher further behind encodes its own.
const ENCODED_LINES: usize = 2048;

/// Watch lines shared between the watchers of one API server (see the module's notes).
#[derive(Debug, Default)]
pub struct EncodedLines {
    inner: Mutex<LinesInner>,
}

#[derive(Debug, Default)]
struct LinesInner {
    lines: HashMap<LineKey, Bytes>,
    order: VecDeque<LineKey>,
}

impl EncodedLines {
    /// The line for `key`, encoded by `encode` if no watcher has yet (outside the lock: two
    /// watchers may both encode a line, and the bytes are the same).
    fn get_or_encode(&self, key: LineKey, encode: impl FnOnce() -> Bytes) -> Bytes {
        if let Some(line) = self
            .inner
            .lock()
            .ok()
            .and_then(|inner| inner.lines.get(&key).cloned())
        {
            return line;
        }
        let line = encode();
        if let Ok(mut inner) = self.inner.lock()
            && !inner.lines.contains_key(&key)
        {
            inner.lines.insert(key.clone(), line.clone());
            inner.order.push_back(key);
            while inner.order.len() > ENCODED_LINES {
                if let Some(old) = inner.order.pop_front() {
                    inner.lines.remove(&old);
                }
            }
        }
        line
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().map(|i| i.lines.len()).unwrap_or(0)
    }
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
    let state = state.clone();
    tokio::spawn(async move {
        let mut stream = stream;
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
                .send(line("BOOKMARK", bookmark(res, from, true)))
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
                        if let Some(kind) = translate(&sel, &event) {
                            let key = LineKey {
                                revision: event.revision,
                                key: event.key,
                                resource: (res.group, res.version, res.plural),
                                kind,
                                format: fmt,
                            };
                            let object = event.object;
                            let encoded = state
                                .watch_lines
                                .get_or_encode(key, || line(kind, render_one(res, object, fmt)));
                            if tx.send(encoded).await.is_err() {
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
                    // How far the watch got through the store's history, past events of
                    // other keys and other resources too (or a selector's), so that a client
                    // resuming from it is still within what the store keeps.
                    let rv = stream.progress();
                    if tx.send(line("BOOKMARK", bookmark(res, rv, false))).await.is_err() {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn key(revision: u64, kind: &'static str, format: Format) -> LineKey {
        LineKey {
            revision,
            key: "/services/default/web".into(),
            resource: ("", "v1", "services"),
            kind,
            format,
        }
    }

    #[test]
    fn a_line_is_encoded_once_per_event_type_and_format() {
        let lines = EncodedLines::default();
        let mut encoded = 0;
        for _ in 0..1000 {
            lines.get_or_encode(key(7, "MODIFIED", Format::Object), || {
                encoded += 1;
                line("MODIFIED", json!({"kind": "Service"}))
            });
        }
        assert_eq!(encoded, 1, "a thousand watchers, one encoding");
        // Another type (a selector made it DELETED for this watcher), format or event: its own.
        for k in [
            key(7, "DELETED", Format::Object),
            key(7, "MODIFIED", Format::Metadata),
            key(8, "MODIFIED", Format::Object),
        ] {
            lines.get_or_encode(k, || {
                encoded += 1;
                line("X", json!({}))
            });
        }
        assert_eq!(encoded, 4);
        let got = lines.get_or_encode(key(7, "MODIFIED", Format::Object), || unreachable!());
        assert_eq!(
            &got[..],
            b"{\"object\":{\"kind\":\"Service\"},\"type\":\"MODIFIED\"}\n"
        );
        // Bounded: the oldest lines go.
        for r in 100..100 + ENCODED_LINES as u64 {
            lines.get_or_encode(key(r, "ADDED", Format::Object), || line("ADDED", json!({})));
        }
        assert_eq!(lines.len(), ENCODED_LINES);
        let mut again = false;
        lines.get_or_encode(key(7, "MODIFIED", Format::Object), || {
            again = true;
            line("MODIFIED", json!({}))
        });
        assert!(again, "evicted lines are encoded afresh");
    }
}

//! `limit` and `continue` on lists: pages of one consistent snapshot.
//!
//! A list asked with `limit` returns at most that many items. When more remain, the snapshot is
//! kept in a cursor, and `metadata.continue` names the cursor and the offset of the next page.
//! `metadata.remainingItemCount` is set only when no selector filtered the list, as upstream
//! does. A request with `continue` reads its page from the cursor, at the first page's
//! resourceVersion, as an etcd-backed server reads from its MVCC history. The same token always
//! gives the same page.
//!
//! Cursors live five minutes, etcd's default compaction interval, or until their last page is
//! served. At most [`MAX_CURSORS`] cursors holding at most [`MAX_ITEMS`] objects are kept; the
//! oldest goes first. A token whose cursor is gone gets 410 Expired, as a compacted revision
//! does upstream; the client starts a new list. A token is opaque base64
//! JSON, bound to the resource, namespace and selectors of the list that made it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

use crate::status::ApiError;

/// How long a cursor is kept (etcd compacts every five minutes by default).
const TTL: Duration = Duration::from_secs(300);
/// Cursors kept at once; a new one evicts the oldest.
pub(crate) const MAX_CURSORS: usize = 256;
/// Objects all cursors hold together; a new cursor evicts the oldest until it fits.
pub(crate) const MAX_ITEMS: usize = 200_000;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// One page of a list.
#[derive(Debug)]
pub(crate) struct Page {
    pub(crate) items: Vec<Value>,
    /// The resourceVersion of the whole snapshot (the first page's).
    pub(crate) resource_version: String,
    /// Names the next page; `None` on the last.
    pub(crate) continue_token: Option<String>,
    /// Items after this page, when no selector filtered the list.
    pub(crate) remaining: Option<usize>,
}

impl Page {
    /// Sets `continue` and `remainingItemCount` in a list's (or table's) `metadata`.
    pub(crate) fn annotate(&self, list: &mut Value) {
        if let Some(t) = &self.continue_token {
            list["metadata"]["continue"] = json!(t);
        }
        if let Some(n) = self.remaining {
            list["metadata"]["remainingItemCount"] = json!(n);
        }
    }
}

struct Cursor {
    /// Resource, namespace and selectors of the list that made it.
    scope: String,
    resource_version: String,
    items: Arc<Vec<Value>>,
    filtered: bool,
    created: Instant,
}

#[derive(Default)]
struct State {
    next_id: u64,
    cursors: HashMap<u64, Cursor>,
    /// Ids oldest first.
    order: VecDeque<u64>,
    /// Objects held by all cursors.
    items: usize,
}

/// The cursors of paged lists.
#[derive(Default)]
pub(crate) struct Cursors {
    state: Mutex<State>,
}

/// What a token carries: the format upstream's tokens share, plus the cursor and offset.
#[derive(serde::Serialize, serde::Deserialize)]
struct Token {
    v: String,
    rv: String,
    cursor: u64,
    offset: usize,
}

fn invalid(why: impl std::fmt::Display) -> ApiError {
    ApiError::BadRequest(format!("continue key is not valid: {why}"))
}

impl Cursors {
    /// The first page of a list: all of `items` without a limit (or when they fit), otherwise
    /// the first `limit` and a cursor for the rest.
    pub(crate) fn first(
        &self,
        scope: String,
        resource_version: String,
        items: Vec<Value>,
        limit: Option<usize>,
        filtered: bool,
    ) -> Page {
        let limit = limit.filter(|l| *l > 0 && *l < items.len());
        let Some(limit) = limit else {
            return Page {
                items,
                resource_version,
                continue_token: None,
                remaining: None,
            };
        };
        let items = Arc::new(items);
        let id = {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            st.expire(Instant::now());
            while st.order.len() >= MAX_CURSORS || st.items + items.len() > MAX_ITEMS {
                let Some(old) = st.order.pop_front() else {
                    break;
                };
                st.remove(old);
            }
            st.next_id += 1;
            st.items += items.len();
            let id = st.next_id;
            st.cursors.insert(
                id,
                Cursor {
                    scope,
                    resource_version: resource_version.clone(),
                    items: items.clone(),
                    filtered,
                    created: Instant::now(),
                },
            );
            st.order.push_back(id);
            id
        };
        page(&items, id, &resource_version, 0, limit, filtered)
    }

    /// The page a `continue` token names, for a list of the same `scope`.
    pub(crate) fn next(
        &self,
        scope: &str,
        token: &str,
        limit: Option<usize>,
    ) -> Result<Page, ApiError> {
        let raw = B64.decode(token.as_bytes()).map_err(invalid)?;
        let t: Token = serde_json::from_slice(&raw).map_err(invalid)?;
        if t.v != "meta.k8s.io/v1" {
            return Err(invalid(format!("unknown version {:?}", t.v)));
        }
        let (items, rv, filtered) = {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            st.expire(Instant::now());
            let Some(c) = st.cursors.get(&t.cursor) else {
                return Err(ApiError::Gone(format!(
                    "The provided continue parameter is too old to display a consistent list \
                     result (resourceVersion {}). You can start a new list without the continue \
                     parameter.",
                    t.rv
                )));
            };
            if c.scope != scope || c.resource_version != t.rv {
                return Err(invalid(
                    "it belongs to a list of another resource, namespace or selector",
                ));
            }
            (c.items.clone(), c.resource_version.clone(), c.filtered)
        };
        if t.offset > items.len() {
            return Err(invalid("its offset is past the end of the list"));
        }
        let limit = limit.filter(|l| *l > 0).unwrap_or(items.len());
        let p = page(&items, t.cursor, &rv, t.offset, limit, filtered);
        if p.continue_token.is_none() {
            // The last page: nothing names this cursor any more.
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            st.order.retain(|id| *id != t.cursor);
            st.remove(t.cursor);
        }
        Ok(p)
    }
}

impl State {
    fn expire(&mut self, now: Instant) {
        while let Some(id) = self.order.front().copied() {
            let old = self
                .cursors
                .get(&id)
                .is_none_or(|c| now.duration_since(c.created) >= TTL);
            if !old {
                break;
            }
            self.order.pop_front();
            self.remove(id);
        }
    }

    /// Drops a cursor (its id may stay in `order`; ids without a cursor are skipped there).
    fn remove(&mut self, id: u64) {
        if let Some(c) = self.cursors.remove(&id) {
            self.items -= c.items.len();
        }
    }
}

fn page(
    items: &[Value],
    cursor: u64,
    rv: &str,
    offset: usize,
    limit: usize,
    filtered: bool,
) -> Page {
    let end = offset.saturating_add(limit).min(items.len());
    let left = items.len() - end;
    let continue_token = (left > 0).then(|| {
        let t = Token {
            v: "meta.k8s.io/v1".into(),
            rv: rv.to_string(),
            cursor,
            offset: end,
        };
        B64.encode(serde_json::to_vec(&t).unwrap_or_default())
    });
    Page {
        items: items[offset..end].to_vec(),
        resource_version: rv.to_string(),
        continue_token,
        remaining: (left > 0 && !filtered).then_some(left),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn items(n: usize) -> Vec<Value> {
        (0..n)
            .map(|i| json!({"metadata": {"name": format!("o{i:03}")}}))
            .collect()
    }

    fn names(p: &Page) -> Vec<String> {
        p.items
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    }

    #[test]
    fn pages_walk_one_snapshot_and_tokens_are_repeatable() {
        let c = Cursors::default();
        let first = c.first(
            "svc|default||".into(),
            "42".into(),
            items(5),
            Some(2),
            false,
        );
        assert_eq!(names(&first), ["o000", "o001"]);
        assert_eq!(first.remaining, Some(3));
        let t1 = first.continue_token.clone().unwrap();
        let second = c.next("svc|default||", &t1, Some(2)).unwrap();
        assert_eq!(names(&second), ["o002", "o003"]);
        assert_eq!(second.resource_version, "42");
        // The same token gives the same page again.
        assert_eq!(
            names(&c.next("svc|default||", &t1, Some(2)).unwrap()),
            ["o002", "o003"]
        );
        let t2 = second.continue_token.clone().unwrap();
        // The last page may ask for another size; it has no token.
        let last = c.next("svc|default||", &t2, Some(10)).unwrap();
        assert_eq!(names(&last), ["o004"]);
        assert!(last.continue_token.is_none() && last.remaining.is_none());
        // Once the last page is served the cursor is gone, with what it held.
        assert!(matches!(
            c.next("svc|default||", &t2, None),
            Err(ApiError::Gone(_))
        ));
        let st = c.state.lock().unwrap();
        assert!(st.cursors.is_empty() && st.order.is_empty());
        assert_eq!(st.items, 0);
    }

    #[test]
    fn no_cursor_when_everything_fits_and_no_count_when_filtered() {
        let c = Cursors::default();
        for limit in [None, Some(0), Some(3), Some(9)] {
            let p = c.first("s".into(), "1".into(), items(3), limit, false);
            assert_eq!(p.items.len(), 3);
            assert!(p.continue_token.is_none());
        }
        assert!(c.state.lock().unwrap().cursors.is_empty());
        let p = c.first("s".into(), "1".into(), items(3), Some(1), true);
        assert!(p.continue_token.is_some() && p.remaining.is_none());
    }

    #[test]
    fn bad_foreign_and_expired_tokens_are_refused() {
        let c = Cursors::default();
        let p = c.first("a".into(), "7".into(), items(4), Some(1), false);
        let t = p.continue_token.unwrap();
        for bad in [
            "",
            "!!!",
            "bm90IGpzb24",
            &B64.encode(br#"{"v":"x","rv":"7","cursor":1,"offset":1}"#),
        ] {
            let e = c.next("a", bad, None).unwrap_err();
            assert!(matches!(e, ApiError::BadRequest(_)), "{bad:?}: {e:?}");
        }
        assert!(matches!(
            c.next("b", &t, None),
            Err(ApiError::BadRequest(_))
        ));
        let past = B64.encode(br#"{"v":"meta.k8s.io/v1","rv":"7","cursor":1,"offset":99}"#);
        assert!(matches!(
            c.next("a", &past, None),
            Err(ApiError::BadRequest(_))
        ));
        // Evicted by newer cursors: 410 Expired, as a compacted revision.
        for _ in 0..MAX_CURSORS {
            c.first("a".into(), "8".into(), items(4), Some(1), false);
        }
        assert!(matches!(c.next("a", &t, None), Err(ApiError::Gone(_))));
        // Expired by age.
        let p = c.first("a".into(), "9".into(), items(4), Some(1), false);
        c.state.lock().unwrap().expire(Instant::now() + TTL);
        let e = c.next("a", &p.continue_token.unwrap(), None).unwrap_err();
        assert!(matches!(e, ApiError::Gone(_)));
    }
}

//! `limit` and `continue` on lists: pages read from the store at the first page's revision.
//!
//! A list asked with `limit` returns at most that many items. When more remain,
//! `metadata.continue` carries upstream's token (`{"v": "meta.k8s.io/v1", "rv": <revision>,
//! "start": "<key after the last item>\u0000"}`, base64url), and the next page is read with
//! [`Store::list_at`](svcnet_store::Store::list_at) at that revision from that key on, as
//! kube-apiserver reads etcd's MVCC history. Nothing is held in memory between pages, so any
//! API server on the same store serves any page, and the same token always gives the same page.
//! Once the store has compacted the revision the token gets 410 Expired with upstream's
//! message and, as upstream, a token (`rv` -1) that continues from the same key at the latest
//! revision, for a client that accepts an inconsistent list; others start a new list. `metadata.remainingItemCount` is set only when no
//! selector filtered the list, as upstream does. A token also carries a digest of the resource,
//! namespace and selectors of its list (`scope`, svcnet's own field, which upstream ignores),
//! so a token is refused by another list.

use base64::Engine;
use serde_json::{Value, json};

use crate::objects::meta_str;
use crate::status::ApiError;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// Upstream's message for a token whose revision is compacted (`inconsistentContinue`); the
/// 410 carries a token that continues at the latest revision.
pub(crate) const INCONSISTENT_CONTINUE: &str = "The provided continue parameter is too old to \
     display a consistent list result. You can start a new list without the continue \
     parameter, or use the continue token in this response to retrieve the remainder of the \
     results. Continuing with the provided token results in an inconsistent list - objects \
     that were created, modified, or deleted between the time the first chunk was returned \
     and now may show up in the list.";

/// One page of a list.
#[derive(Debug)]
pub(crate) struct Page {
    pub(crate) items: Vec<Value>,
    /// The resourceVersion of the whole list (the first page's).
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

/// What a token carries: upstream's fields plus the digest of the list it belongs to.
#[derive(serde::Serialize, serde::Deserialize)]
struct Token {
    v: String,
    /// The revision, or -1: continue at the latest (upstream's token after a compaction).
    rv: i64,
    start: String,
    #[serde(default)]
    scope: String,
}

/// A decoded continue token: where the next page starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Continue {
    /// The revision of the list; `None`: the latest.
    pub(crate) revision: Option<u64>,
    /// The first key (`namespace/name`, or `name` when cluster-scoped) the page may hold.
    pub(crate) start: String,
}

fn invalid(why: impl std::fmt::Display) -> ApiError {
    ApiError::BadRequest(format!("continue key is not valid: {why}"))
}

/// A stable digest of a list's scope (FNV-1a: the same on every server and build).
fn digest(scope: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in scope.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// An object's key relative to the list's prefix, the order the store lists in.
pub(crate) fn relative_key(obj: &Value) -> String {
    let name = meta_str(obj, "name").unwrap_or("");
    match meta_str(obj, "namespace") {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    }
}

/// Decodes the token of a list of `scope`.
pub(crate) fn decode(scope: &str, token: &str) -> Result<Continue, ApiError> {
    let raw = B64.decode(token.as_bytes()).map_err(invalid)?;
    let t: Token = serde_json::from_slice(&raw).map_err(invalid)?;
    if t.v != "meta.k8s.io/v1" {
        return Err(invalid(format!("unknown version {:?}", t.v)));
    }
    if t.start.is_empty() || t.start.contains("..") || t.start.starts_with('/') {
        return Err(invalid("its start key is not a key of this list"));
    }
    if t.scope != digest(scope) {
        return Err(invalid(
            "it belongs to a list of another resource, namespace or selector",
        ));
    }
    Ok(Continue {
        revision: u64::try_from(t.rv).ok(),
        start: t.start,
    })
}

fn encode(scope: &str, rv: i64, start: String) -> String {
    let t = Token {
        v: "meta.k8s.io/v1".into(),
        rv,
        start,
        scope: digest(scope),
    };
    B64.encode(serde_json::to_vec(&t).unwrap_or_default())
}

/// The 410 for a token whose revision is compacted: upstream's message, and a token that
/// continues from the same key at the latest revision.
pub(crate) fn expired(scope: &str, from: &Continue) -> ApiError {
    ApiError::ExpiredContinue {
        message: INCONSISTENT_CONTINUE.into(),
        token: encode(scope, -1, from.start.clone()),
    }
}

/// One page of `items` (the objects read at `revision` from the page's start on, in key order,
/// the selector applied, with `after` more objects in the store after the last one read): the
/// first `limit` and, when anything is left, a token for the rest.
pub(crate) fn page(
    scope: &str,
    revision: u64,
    mut items: Vec<Value>,
    limit: Option<usize>,
    filtered: bool,
    after: usize,
) -> Page {
    let limit = limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
    let left = items.len().saturating_sub(limit) + after;
    items.truncate(limit);
    let resource_version = revision.to_string();
    if left == 0 {
        return Page {
            items,
            resource_version,
            continue_token: None,
            remaining: None,
        };
    }
    let last = items.last().map(relative_key).unwrap_or_default();
    let rv = i64::try_from(revision).unwrap_or(i64::MAX);
    Page {
        items,
        resource_version,
        continue_token: Some(encode(scope, rv, format!("{last}\u{0}"))),
        remaining: (!filtered).then_some(left),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn items(n: usize) -> Vec<Value> {
        (0..n)
            .map(|i| json!({"metadata": {"name": format!("o{i:03}"), "namespace": "default"}}))
            .collect()
    }

    fn names(p: &Page) -> Vec<String> {
        p.items
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    }

    /// What the list handler does with a token: the items from its start on.
    fn rest(token: &str) -> (u64, Vec<Value>) {
        let c = decode("svc|default||", token).unwrap();
        let items = items(5)
            .into_iter()
            .filter(|o| relative_key(o) >= c.start)
            .collect();
        (c.revision.unwrap(), items)
    }

    #[test]
    fn pages_walk_one_revision_and_tokens_are_repeatable() {
        let first = page("svc|default||", 42, items(5), Some(2), false, 0);
        assert_eq!(names(&first), ["o000", "o001"]);
        assert_eq!(first.remaining, Some(3));
        let t1 = first.continue_token.clone().unwrap();
        let raw = String::from_utf8(B64.decode(&t1).unwrap()).unwrap();
        assert!(
            raw.starts_with(r#"{"v":"meta.k8s.io/v1","rv":42,"start":"default/o001\u0000""#),
            "{raw}"
        );
        let (rv, left) = rest(&t1);
        assert_eq!(rv, 42);
        let second = page("svc|default||", rv, left, Some(2), false, 0);
        assert_eq!(names(&second), ["o002", "o003"]);
        assert_eq!(second.resource_version, "42");
        let t2 = second.continue_token.clone().unwrap();
        // The same token gives the same page again, on any server.
        assert_eq!(rest(&t1).1.len(), 3);
        let (rv, left) = rest(&t2);
        let last = page("svc|default||", rv, left, Some(10), false, 0);
        assert_eq!(names(&last), ["o004"]);
        assert!(last.continue_token.is_none() && last.remaining.is_none());
    }

    #[test]
    fn no_token_when_everything_fits_and_no_count_when_filtered() {
        for limit in [None, Some(0), Some(3), Some(9)] {
            let p = page("s", 1, items(3), limit, false, 0);
            assert_eq!(p.items.len(), 3);
            assert!(p.continue_token.is_none());
        }
        let p = page("s", 1, items(3), Some(1), true, 0);
        assert!(p.continue_token.is_some() && p.remaining.is_none());
        // Objects the store holds after the ones read count as left, however many were read.
        let p = page("s", 1, items(2), Some(2), false, 5);
        assert_eq!((p.items.len(), p.remaining), (2, Some(5)));
        let p = page("s", 1, items(3), Some(2), false, 5);
        assert_eq!((p.items.len(), p.remaining), (2, Some(6)));
        let start = decode("s", &p.continue_token.unwrap()).unwrap().start;
        assert_eq!(start, "default/o001\u{0}");
    }

    #[test]
    fn bad_and_foreign_tokens_are_refused() {
        let t = page("a", 7, items(4), Some(1), false, 0)
            .continue_token
            .unwrap();
        let scoped = |start: &str| {
            B64.encode(format!(
                r#"{{"v":"meta.k8s.io/v1","rv":7,"start":"{start}","scope":"{}"}}"#,
                digest("a")
            ))
        };
        for bad in [
            "".to_string(),
            "!!!".into(),
            "bm90IGpzb24".into(),
            B64.encode(br#"{"v":"x","rv":7,"start":"a"}"#),
            scoped(""),
            scoped("../x"),
            scoped("/x"),
        ] {
            let e = decode("a", &bad).unwrap_err();
            assert!(matches!(e, ApiError::BadRequest(_)), "{bad:?}: {e:?}");
        }
        assert!(matches!(decode("b", &t), Err(ApiError::BadRequest(_))));
        assert_eq!(decode("a", &scoped("x")).unwrap().start, "x");
        // The 410's token continues from the same key at the latest revision.
        let from = decode("a", &t).unwrap();
        let ApiError::ExpiredContinue { token, .. } = expired("a", &from) else {
            panic!("not an expired continue");
        };
        let latest = decode("a", &token).unwrap();
        assert_eq!((latest.revision, latest.start), (None, from.start));
    }
}

//! What a node's proxy says about itself in the API, so that others can tell whether its rules
//! are current: a Lease per node proxy in `kube-system` (`svcnet-proxy-<node>`), held by the
//! node, renewed every [`RENEW_SECONDS`] like the kubelet's node lease, with the proxy's mode,
//! the time and result of its last sync and how far its rules reach: the highest
//! `resourceVersion` of the Services and of the EndpointSlices it had received when its last
//! successful sync began. A watch delivers one resource's changes in revision order, so every
//! object version at or below that revision is in the rules; a newer one is not yet.
//!
//! `svcnet doctor` reads these ("the proxy on node N is not running", "its rules are stale");
//! the proxy runtime (`svcnet-proxyd`) writes them. Pure: objects in, objects out.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;

/// Where the leases live.
pub const NAMESPACE: &str = "kube-system";
/// The label every proxy lease carries (its value: the node), to list them.
pub const NODE_LABEL: &str = "proxy.svcnet.io/node";
/// Seconds after its last renewal that a lease counts as expired (the kubelet's 40 s).
pub const DURATION_SECONDS: i32 = 40;
/// How often a running proxy renews its lease, changed or not (a quarter of the duration).
pub const RENEW_SECONDS: u64 = 10;

const MODE: &str = "proxy.svcnet.io/mode";
const SERVICES_REVISION: &str = "proxy.svcnet.io/services-revision";
const SLICES_REVISION: &str = "proxy.svcnet.io/endpointslices-revision";
const LAST_SYNC: &str = "proxy.svcnet.io/last-sync";
const SYNC_ERROR: &str = "proxy.svcnet.io/sync-error";
const STOPPED: &str = "proxy.svcnet.io/stopped";

/// The lease name of `node`'s proxy.
pub fn lease_name(node: &str) -> String {
    format!("svcnet-proxy-{node}")
}

/// A proxy's account of itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyStatus {
    pub node: String,
    /// `nftables`, `iptables`, `userspace`.
    pub mode: String,
    /// The highest Service `resourceVersion` received before the last successful sync.
    pub services_revision: Option<u64>,
    /// The highest EndpointSlice `resourceVersion` received before the last successful sync.
    pub slices_revision: Option<u64>,
    /// When the last successful sync finished.
    pub last_sync: Option<Timestamp>,
    /// Why the last sync failed (`None`: it succeeded, or none ran yet).
    pub sync_error: Option<String>,
    /// When the proxy stopped gracefully (its rules stay, but nothing updates them).
    pub stopped: Option<Timestamp>,
    /// When the lease was last renewed (read back; set by [`ProxyStatus::lease`]'s `now`).
    pub renewed: Option<Timestamp>,
    pub duration_seconds: i32,
}

impl ProxyStatus {
    /// The Lease that says this, renewed at `now`. Absent facts are written as `null`
    /// annotations, so a merge patch of it removes what no longer holds.
    pub fn lease(&self, now: Timestamp) -> Lease {
        let mut annotations = BTreeMap::new();
        annotations.insert(MODE.to_string(), self.mode.clone());
        let mut put = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                annotations.insert(k.to_string(), v);
            }
        };
        put(
            SERVICES_REVISION,
            self.services_revision.map(|r| r.to_string()),
        );
        put(SLICES_REVISION, self.slices_revision.map(|r| r.to_string()));
        put(LAST_SYNC, self.last_sync.map(|t| t.to_string()));
        put(SYNC_ERROR, self.sync_error.clone());
        put(STOPPED, self.stopped.map(|t| t.to_string()));
        Lease {
            metadata: ObjectMeta {
                name: Some(lease_name(&self.node)),
                namespace: Some(NAMESPACE.into()),
                labels: Some(BTreeMap::from([(NODE_LABEL.into(), self.node.clone())])),
                annotations: Some(annotations),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.node.clone()),
                lease_duration_seconds: Some(DURATION_SECONDS),
                renew_time: Some(MicroTime(now)),
                ..Default::default()
            }),
        }
    }

    /// The merge patch that turns any earlier lease of this proxy into [`ProxyStatus::lease`]
    /// (annotations it no longer has are removed).
    pub fn merge_patch(&self, now: Timestamp) -> serde_json::Value {
        let lease = self.lease(now);
        let mut value = serde_json::to_value(&lease).unwrap_or_default();
        if let Some(ann) = value
            .pointer_mut("/metadata/annotations")
            .and_then(|a| a.as_object_mut())
        {
            for key in [
                SERVICES_REVISION,
                SLICES_REVISION,
                LAST_SYNC,
                SYNC_ERROR,
                STOPPED,
            ] {
                ann.entry(key).or_insert(serde_json::Value::Null);
            }
        }
        value
    }

    /// Reads a proxy lease back; `None` when it is not one (no node label).
    pub fn from_lease(lease: &Lease) -> Option<ProxyStatus> {
        let node = lease.metadata.labels.as_ref()?.get(NODE_LABEL)?.clone();
        let ann = lease.metadata.annotations.clone().unwrap_or_default();
        let spec = lease.spec.clone().unwrap_or_default();
        Some(ProxyStatus {
            node,
            mode: ann.get(MODE).cloned().unwrap_or_default(),
            services_revision: ann.get(SERVICES_REVISION).and_then(|v| v.parse().ok()),
            slices_revision: ann.get(SLICES_REVISION).and_then(|v| v.parse().ok()),
            last_sync: ann.get(LAST_SYNC).and_then(|v| v.parse().ok()),
            sync_error: ann.get(SYNC_ERROR).cloned(),
            stopped: ann.get(STOPPED).and_then(|v| v.parse().ok()),
            renewed: spec.renew_time.map(|t| t.0),
            duration_seconds: spec.lease_duration_seconds.unwrap_or(DURATION_SECONDS),
        })
    }

    /// Whether the lease has not been renewed within its duration at `now` (the proxy is not
    /// running, or cannot reach the API server).
    pub fn expired(&self, now: Timestamp) -> bool {
        match self.renewed {
            None => true,
            Some(t) => now.as_second() - t.as_second() > i64::from(self.duration_seconds.max(1)),
        }
    }
}

/// The revision a `resourceVersion` names, when it is one (svcnet's and etcd's are integers;
/// anything else is opaque and not compared).
pub fn revision(resource_version: Option<&str>) -> Option<u64> {
    resource_version?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn a_lease_reads_back_as_what_was_written() {
        let s = ProxyStatus {
            node: "node-1".into(),
            mode: "nftables".into(),
            services_revision: Some(41),
            slices_revision: Some(57),
            last_sync: Some(at("2026-12-02T10:00:00Z")),
            sync_error: None,
            stopped: Some(at("2026-12-02T10:00:02Z")),
            renewed: None,
            duration_seconds: DURATION_SECONDS,
        };
        let now = at("2026-12-02T10:00:01Z");
        let lease = s.lease(now);
        assert_eq!(lease.metadata.name.as_deref(), Some("svcnet-proxy-node-1"));
        let back = ProxyStatus::from_lease(&lease).unwrap();
        assert_eq!(
            back,
            ProxyStatus {
                renewed: Some(now),
                ..s
            }
        );
        assert!(!back.expired(at("2026-12-02T10:00:40Z")));
        assert!(back.expired(at("2026-12-02T10:00:42Z")));
    }

    #[test]
    fn the_merge_patch_removes_what_no_longer_holds() {
        let s = ProxyStatus {
            node: "n".into(),
            mode: "iptables".into(),
            sync_error: None,
            ..Default::default()
        };
        let p = s.merge_patch(at("2026-12-02T10:00:00Z"));
        let ann = &p["metadata"]["annotations"];
        assert!(ann[SYNC_ERROR].is_null() && ann.get(SYNC_ERROR).is_some());
        assert_eq!(ann[MODE], "iptables");
        let failing = ProxyStatus {
            sync_error: Some("nft: no such file".into()),
            ..s
        };
        let p = failing.merge_patch(at("2026-12-02T10:00:00Z"));
        assert_eq!(
            p["metadata"]["annotations"][SYNC_ERROR],
            "nft: no such file"
        );
    }

    #[test]
    fn leases_of_others_are_not_proxies() {
        let lease = Lease::default();
        assert!(ProxyStatus::from_lease(&lease).is_none());
        assert_eq!(revision(Some("123")), Some(123));
        assert_eq!(revision(Some("abc")), None);
        assert_eq!(revision(None), None);
    }
}

//! kube-rs watchers for Services, EndpointSlices and this Node, turned into [`Input`]s for the
//! sync loop. Re-lists (after a watch expired or failed) are reconciled: objects missing from
//! the new list are reported deleted.

use std::collections::BTreeSet;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::mpsc;

/// One observed change.
#[derive(Debug)]
pub enum Input {
    Service(Change<Service>),
    Slice(Change<EndpointSlice>),
    Node(Change<Node>),
    /// The named resource finished its (re)list.
    Synced(&'static str),
    /// Every change of the named resource up to this revision (`resourceVersion`) has been
    /// sent before this input: what a sync after it has in its rules (see
    /// `svcnet_proxy::status`).
    Seen(&'static str, u64),
}

/// An upsert or a deletion by `namespace/name`.
#[derive(Debug)]
pub enum Change<K> {
    Upsert(Box<K>),
    Delete { namespace: String, name: String },
}

/// The objects a watcher has reported, so that a re-list can report as deleted those it no
/// longer has. Keys are `namespace/name` in one string (neither part can hold a `/`): a node's
/// proxy knows every Service and slice of the cluster, and this is held once per object.
#[derive(Debug, Default)]
struct Known {
    held: BTreeSet<Box<str>>,
    /// During a (re)list: what it has listed so far.
    listing: Option<BTreeSet<Box<str>>>,
}

impl Known {
    fn key(namespace: &str, name: &str) -> Box<str> {
        format!("{namespace}/{name}").into()
    }

    fn applied(&mut self, key: Box<str>) {
        self.held.insert(key);
    }

    fn deleted(&mut self, key: &str) {
        self.held.remove(key);
    }

    fn list_started(&mut self) {
        self.listing = Some(BTreeSet::new());
    }

    fn listed(&mut self, key: Box<str>) {
        self.listing.get_or_insert_with(BTreeSet::new).insert(key);
    }

    /// The list is whole: what was held and is not listed is gone (returned); what is held is
    /// what was listed.
    fn list_done(&mut self) -> Vec<Box<str>> {
        let listed = self.listing.take().unwrap_or_default();
        let gone = self.held.difference(&listed).cloned().collect();
        self.held = listed;
        gone
    }
}

/// The deletion of `namespace/name`.
fn deletion<K>(key: &str) -> Change<K> {
    let (namespace, name) = key.split_once('/').unwrap_or(("", key));
    Change::Delete {
        namespace: namespace.to_string(),
        name: name.to_string(),
    }
}

/// Watches one resource and forwards its changes until the receiver is gone.
async fn pump<K>(
    api: Api<K>,
    config: watcher::Config,
    kind: &'static str,
    wrap: fn(Change<K>) -> Input,
    tx: mpsc::Sender<Input>,
) where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    let mut stream = std::pin::pin!(watcher(api, config).default_backoff());
    let mut known = Known::default();
    let key = |o: &K| Known::key(&o.namespace().unwrap_or_default(), &o.name_any());
    let rev = |o: &K| svcnet_proxy::status::revision(o.resource_version().as_deref());
    let seen = |o: &K| rev(o).map(|r| Input::Seen(kind, r));
    // A list comes in no revision order: its revision counts once it is whole.
    let mut relist_max = None;
    while let Some(event) = stream.next().await {
        let mut out = Vec::new();
        match event {
            Ok(watcher::Event::Apply(o)) => {
                known.applied(key(&o));
                let seen = seen(&o);
                out.push(wrap(Change::Upsert(Box::new(o))));
                out.extend(seen);
            }
            Ok(watcher::Event::Delete(o)) => {
                let key = key(&o);
                known.deleted(&key);
                out.push(wrap(deletion(&key)));
                out.extend(seen(&o));
            }
            Ok(watcher::Event::Init) => known.list_started(),
            Ok(watcher::Event::InitApply(o)) => {
                known.listed(key(&o));
                relist_max = relist_max.max(rev(&o));
                out.push(wrap(Change::Upsert(Box::new(o))));
            }
            Ok(watcher::Event::InitDone) => {
                out.extend(known.list_done().iter().map(|k| wrap(deletion(k))));
                out.extend(relist_max.take().map(|r| Input::Seen(kind, r)));
                out.push(Input::Synced(kind));
            }
            Err(e) => tracing::warn!("watching {kind}: {e}"),
        }
        for input in out {
            if tx.send(input).await.is_err() {
                return;
            }
        }
    }
}

/// Starts the three watchers; they stop when the receiver is dropped or `tasks` is aborted.
pub fn spawn_watchers(
    client: Client,
    node_name: &str,
    tx: mpsc::Sender<Input>,
    tasks: &mut tokio::task::JoinSet<()>,
) {
    tasks.spawn(pump(
        Api::<Service>::all(client.clone()),
        watcher::Config::default(),
        "services",
        Input::Service,
        tx.clone(),
    ));
    tasks.spawn(pump(
        Api::<EndpointSlice>::all(client.clone()),
        watcher::Config::default(),
        "endpointslices",
        Input::Slice,
        tx.clone(),
    ));
    let node = watcher::Config::default().fields(&format!("metadata.name={node_name}"));
    tasks.spawn(pump(
        Api::<Node>::all(client),
        node,
        "nodes",
        Input::Node,
        tx,
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The deletions of `gone`, as `namespace|name`.
    fn names(gone: Vec<Box<str>>) -> Vec<String> {
        gone.iter()
            .map(|k| match deletion::<()>(k) {
                Change::Delete { namespace, name } => format!("{namespace}|{name}"),
                Change::Upsert(_) => unreachable!("a deletion"),
            })
            .collect()
    }

    #[test]
    fn a_relist_reports_what_it_no_longer_has_as_deleted() {
        let mut known = Known::default();
        known.list_started();
        for key in ["default/a", "default/b", "kube-system/dns"] {
            known.listed(key.into());
        }
        assert!(known.list_done().is_empty(), "a first list deletes nothing");
        known.applied("default/c".into());
        known.deleted("default/a");
        // The watch expired; the re-list no longer has b or c, and has d.
        known.list_started();
        known.listed("kube-system/dns".into());
        known.listed("default/d".into());
        assert_eq!(names(known.list_done()), ["default|b", "default|c"]);
        // A cluster-scoped object's key has an empty namespace.
        known.applied(Known::key("", "node-1"));
        known.list_started();
        assert_eq!(
            names(known.list_done()),
            ["|node-1", "default|d", "kube-system|dns"]
        );
    }
}

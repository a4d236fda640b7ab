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
    let mut known: BTreeSet<(String, String)> = BTreeSet::new();
    let mut relist: Option<BTreeSet<(String, String)>> = None;
    let key = |o: &K| (o.namespace().unwrap_or_default(), o.name_any());
    let rev = |o: &K| svcnet_proxy::status::revision(o.resource_version().as_deref());
    let seen = |o: &K| rev(o).map(|r| Input::Seen(kind, r));
    // A list comes in no revision order: its revision counts once it is whole.
    let mut relist_max = None;
    while let Some(event) = stream.next().await {
        let mut out = Vec::new();
        match event {
            Ok(watcher::Event::Apply(o)) => {
                known.insert(key(&o));
                let seen = seen(&o);
                out.push(wrap(Change::Upsert(Box::new(o))));
                out.extend(seen);
            }
            Ok(watcher::Event::Delete(o)) => {
                let (namespace, name) = key(&o);
                known.remove(&(namespace.clone(), name.clone()));
                out.push(wrap(Change::Delete { namespace, name }));
                out.extend(seen(&o));
            }
            Ok(watcher::Event::Init) => relist = Some(BTreeSet::new()),
            Ok(watcher::Event::InitApply(o)) => {
                relist.get_or_insert_with(BTreeSet::new).insert(key(&o));
                known.insert(key(&o));
                relist_max = relist_max.max(rev(&o));
                out.push(wrap(Change::Upsert(Box::new(o))));
            }
            Ok(watcher::Event::InitDone) => {
                let listed = relist.take().unwrap_or_default();
                for (namespace, name) in known.difference(&listed).cloned().collect::<Vec<_>>() {
                    known.remove(&(namespace.clone(), name.clone()));
                    out.push(wrap(Change::Delete { namespace, name }));
                }
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

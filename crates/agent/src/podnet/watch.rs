//! The Node watch every pod network backend that learns its peers from the API shares: a
//! kube-rs watcher folded into the current set of Nodes by name, handed out after each change
//! (a relist counts as one change, once it is complete).

use std::collections::BTreeMap;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};

/// The Nodes as last seen. [`NodeWatch::changed`] is cancel-safe, so it can sit in a
/// `tokio::select!` beside a shutdown future.
pub struct NodeWatch {
    who: String,
    events: BoxStream<'static, Result<Event<Node>, watcher::Error>>,
    nodes: BTreeMap<String, Node>,
    relist: Option<BTreeMap<String, Node>>,
}

impl NodeWatch {
    /// Watches every Node; `who` labels its log lines (the node this backend runs for).
    pub fn new(client: Client, who: &str) -> Self {
        let api: Api<Node> = Api::all(client);
        Self {
            who: who.to_string(),
            events: watcher::watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed(),
            nodes: BTreeMap::new(),
            relist: None,
        }
    }

    /// The Nodes as last seen.
    pub fn nodes(&self) -> &BTreeMap<String, Node> {
        &self.nodes
    }

    /// The Nodes after the next change, `None` once the watch has ended.
    pub async fn changed(&mut self) -> Option<&BTreeMap<String, Node>> {
        loop {
            match self.events.next().await? {
                Err(e) => tracing::warn!(node = %self.who, "node watch: {e}"),
                Ok(Event::Init) => self.relist = Some(BTreeMap::new()),
                Ok(Event::InitApply(n)) => {
                    if let (Some(seen), Some(name)) =
                        (self.relist.as_mut(), n.metadata.name.clone())
                    {
                        seen.insert(name, n);
                    }
                }
                Ok(Event::InitDone) => {
                    self.nodes = self.relist.take().unwrap_or_default();
                    return Some(&self.nodes);
                }
                Ok(Event::Apply(n)) => {
                    if let Some(name) = n.metadata.name.clone() {
                        self.nodes.insert(name, n);
                    }
                    return Some(&self.nodes);
                }
                Ok(Event::Delete(n)) => {
                    if let Some(name) = &n.metadata.name {
                        self.nodes.remove(name);
                    }
                    return Some(&self.nodes);
                }
            }
        }
    }
}

//! Events the controllers record, as upstream's do, so `kubectl describe` and `kubectl events`
//! show them: the Deployment controller's `ScalingReplicaSet`, the ReplicaSet and StatefulSet
//! controllers' `SuccessfulCreate`/`SuccessfulDelete`, the scheduler's `Scheduled`.
//!
//! They are core/v1 Events, as client-go's event recorder writes them (kubectl reads that
//! API), with upstream's reasons, messages and components. A repeat of the same event on the
//! same object within ten minutes is counted on the first (`count`, `lastTimestamp`), as
//! client-go's correlator does. Recording is best effort: a failure is logged and never fails
//! the reconcile that caused it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::Patch;
use kube::{Api, Resource, ResourceExt};
use tracing::debug;

/// Upstream's components (`source.component`, `reportingComponent`).
pub(crate) const DEPLOYMENT_CONTROLLER: &str = "deployment-controller";
pub(crate) const REPLICASET_CONTROLLER: &str = "replicaset-controller";
pub(crate) const STATEFULSET_CONTROLLER: &str = "statefulset-controller";
pub(crate) const DAEMONSET_CONTROLLER: &str = "daemonset-controller";
pub(crate) const SCHEDULER: &str = "default-scheduler";

/// How long a repeat is counted on the event already written.
const AGGREGATE: Duration = Duration::from_secs(600);

/// `Scaled up replica set web-5d4f from 0 to 3` (upstream's deployment controller).
pub(crate) fn scaled_message(rs: &str, from: i32, to: i32) -> String {
    let how = if to > from { "up" } else { "down" };
    format!("Scaled {how} replica set {rs} from {from} to {to}")
}

/// The ReplicaSet controller's `Created pod: NAME` / `Deleted pod: NAME`.
pub(crate) fn replicaset_pod_message(created: bool, pod: &str) -> String {
    if created {
        format!("Created pod: {pod}")
    } else {
        format!("Deleted pod: {pod}")
    }
}

/// The StatefulSet controller's `create Pod web-0 in StatefulSet web successful`.
pub(crate) fn statefulset_pod_message(created: bool, pod: &str, set: &str) -> String {
    let verb = if created { "create" } else { "delete" };
    format!("{verb} Pod {pod} in StatefulSet {set} successful")
}

/// The scheduler's `Successfully assigned NS/POD to NODE`.
pub(crate) fn scheduled_message(namespace: &str, pod: &str, node: &str) -> String {
    format!("Successfully assigned {namespace}/{pod} to {node}")
}

/// What an event is about.
#[derive(Debug, Clone, Default)]
pub(crate) struct Regarding {
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl Regarding {
    pub(crate) fn of<K: Resource<DynamicType = ()>>(obj: &K) -> Self {
        Regarding {
            api_version: K::api_version(&()).into_owned(),
            kind: K::kind(&()).into_owned(),
            namespace: obj.namespace().unwrap_or_default(),
            name: obj.name_any(),
            uid: obj.uid().unwrap_or_default(),
        }
    }
}

/// An event already written: by (object uid, component, reason, message).
type EventKey = (String, &'static str, &'static str, String);
/// Its name, its count, and when it was last counted.
type Written = (String, i32, Instant);

/// Writes Events; one per controller process.
pub(crate) struct Recorder {
    client: kube::Client,
    seen: Mutex<HashMap<EventKey, Written>>,
}

fn now() -> Timestamp {
    Timestamp::now()
}

impl Recorder {
    pub(crate) fn new(client: kube::Client) -> Self {
        Recorder {
            client,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Records a Normal event on `regarding`.
    pub(crate) async fn normal(
        &self,
        component: &'static str,
        regarding: &Regarding,
        reason: &'static str,
        message: String,
    ) {
        let api: Api<Event> = Api::namespaced(self.client.clone(), &regarding.namespace);
        let key = (regarding.uid.clone(), component, reason, message.clone());
        let repeat = {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            seen.retain(|_, (_, _, at)| at.elapsed() < AGGREGATE);
            seen.get_mut(&key).map(|(name, count, at)| {
                *count += 1;
                *at = Instant::now();
                (name.clone(), *count)
            })
        };
        let stamp = now().to_string();
        if let Some((name, count)) = repeat {
            let patch = serde_json::json!({"count": count, "lastTimestamp": stamp});
            match api
                .patch(
                    &name,
                    &super::patch_params(super::CONTROLLER_MANAGER),
                    &Patch::Merge(&patch),
                )
                .await
            {
                Ok(_) => return,
                // Gone (deleted or expired): write a new one.
                Err(e) => debug!("counting event {name} again: {e}"),
            }
        }
        // Upstream's names: the object's name and the time in hex nanoseconds.
        let name = format!("{}.{:x}", regarding.name, now().as_nanosecond());
        let event: Event = match serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": regarding.namespace},
            "involvedObject": {
                "apiVersion": regarding.api_version,
                "kind": regarding.kind,
                "namespace": regarding.namespace,
                "name": regarding.name,
                "uid": regarding.uid,
            },
            "reason": reason,
            "message": message,
            "type": "Normal",
            "source": {"component": component},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "reportingComponent": component,
            "reportingInstance": component,
        })) {
            Ok(e) => e,
            Err(e) => {
                debug!("building the {reason} event: {e}");
                return;
            }
        };
        match api
            .create(&super::post_params(super::CONTROLLER_MANAGER), &event)
            .await
        {
            Ok(_) => {
                let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
                seen.insert(key, (name, 1, Instant::now()));
            }
            Err(e) => debug!(
                "recording {reason} on {} {}/{}: {e}",
                regarding.kind, regarding.namespace, regarding.name
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_as_upstream_words_them() {
        assert_eq!(
            scaled_message("web-5d4f", 0, 3),
            "Scaled up replica set web-5d4f from 0 to 3"
        );
        assert_eq!(
            scaled_message("web-5d4f", 3, 1),
            "Scaled down replica set web-5d4f from 3 to 1"
        );
        assert_eq!(
            replicaset_pod_message(true, "web-5d4f-abcde"),
            "Created pod: web-5d4f-abcde"
        );
        assert_eq!(
            replicaset_pod_message(false, "web-5d4f-abcde"),
            "Deleted pod: web-5d4f-abcde"
        );
        assert_eq!(
            statefulset_pod_message(true, "web-0", "web"),
            "create Pod web-0 in StatefulSet web successful"
        );
        assert_eq!(
            scheduled_message("default", "web-0", "node-1"),
            "Successfully assigned default/web-0 to node-1"
        );
    }
}

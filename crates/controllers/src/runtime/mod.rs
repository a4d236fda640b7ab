//! The controllers' I/O: shared reflectors, per-controller work queues, and the apply step.
//!
//! One watch per resource kind feeds a reflector store that every controller reads (the
//! informer model of kube-controller-manager). Each watch event is mapped to the keys of the
//! controllers it concerns (a pod change queues the services selecting it, now or before, its
//! owning workload, and the scheduler if it is unbound). Each controller has one worker that
//! takes keys from its coalescing queue, reads a snapshot from the stores, asks its pure module
//! for a plan, and applies the plan through the API. Conflicts (409) and unmet expectations
//! requeue the key shortly; other errors requeue with a longer delay. Every key is requeued
//! every `resync_period`.

mod events;
mod informers;
mod queue;
mod reconcile;

pub use reconcile::Kind;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

pub use queue::Key;

use crate::workloads::WorkloadError;
use informers::Informers;
use reconcile::Controllers;

/// The field managers the controllers write as (their `managedFields` entries): upstream's
/// names, which its managers take from the User-Agent of kube-controller-manager and
/// kube-scheduler, so tools that look for them (a `--force-conflicts` hint naming
/// `kube-controller-manager`) see the same.
pub(crate) const CONTROLLER_MANAGER: &str = "kube-controller-manager";
pub(crate) const SCHEDULER_MANAGER: &str = "kube-scheduler";

/// Create/replace options of a write by `manager`.
pub(crate) fn post_params(manager: &str) -> kube::api::PostParams {
    kube::api::PostParams {
        field_manager: Some(manager.to_string()),
        ..Default::default()
    }
}

/// Patch options of a (non-apply) patch by `manager`.
pub(crate) fn patch_params(manager: &str) -> kube::api::PatchParams {
    kube::api::PatchParams {
        field_manager: Some(manager.to_string()),
        ..Default::default()
    }
}

/// How the controllers run.
#[derive(Debug, Clone)]
pub struct ControllerOptions {
    /// The node the scheduler binds unscheduled pods to.
    pub node_name: String,
    /// When not empty, the scheduler spreads unscheduled pods over these nodes in turn
    /// (round-robin) instead of binding them all to `node_name`.
    pub schedulable_nodes: Vec<String>,
    /// Upstream's `--max-endpoints-per-slice`.
    pub max_endpoints_per_slice: usize,
    /// Every key is reconciled again this often, whatever the watches say.
    pub resync_period: Duration,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        Self {
            node_name: "svcnet-node".into(),
            schedulable_nodes: Vec::new(),
            max_endpoints_per_slice: crate::endpointslice::DEFAULT_MAX_ENDPOINTS_PER_SLICE,
            resync_period: Duration::from_secs(60),
        }
    }
}

/// Errors of the controllers' I/O boundary.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// An API call failed.
    #[error("{action}: {source}")]
    Api {
        action: String,
        #[source]
        source: kube::Error,
    },
    /// A workload's spec cannot be acted on (fix the object; retried on its next change).
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    /// A watch or store failed for good.
    #[error("{0}")]
    Watch(String),
}

impl ControllerError {
    pub(crate) fn api(action: impl Into<String>, source: kube::Error) -> Self {
        Self::Api {
            action: action.into(),
            source,
        }
    }

    /// The API answered 409 Conflict (a stale resourceVersion or a name taken).
    pub fn is_conflict(&self) -> bool {
        self.status_code() == Some(409)
    }

    fn status_code(&self) -> Option<u16> {
        match self {
            Self::Api {
                source: kube::Error::Api(s),
                ..
            } => Some(s.code),
            _ => None,
        }
    }

    /// Worth retrying without any change to the objects involved.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Api { .. } => !matches!(self.status_code(), Some(400 | 403 | 422)),
            Self::Workload(_) => false,
            Self::Watch(_) => true,
        }
    }
}

/// Runs every controller until `shutdown` completes.
pub async fn run(
    client: kube::Client,
    opts: ControllerOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ControllerError> {
    run_kinds(client, opts, Kind::ALL, shutdown).await
}

/// Runs only the EndpointSlice controller.
pub async fn run_endpointslices(
    client: kube::Client,
    opts: ControllerOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ControllerError> {
    run_kinds(client, opts, &[Kind::EndpointSlices], shutdown).await
}

/// Runs only the Endpoints controller.
pub async fn run_endpoints(
    client: kube::Client,
    opts: ControllerOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ControllerError> {
    run_kinds(client, opts, &[Kind::Endpoints], shutdown).await
}

/// Runs only the EndpointSlice mirroring controller.
pub async fn run_mirroring(
    client: kube::Client,
    opts: ControllerOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ControllerError> {
    run_kinds(client, opts, &[Kind::Mirroring], shutdown).await
}

/// Runs only the Deployment and ReplicaSet controllers (a Deployment's pods are made by its
/// ReplicaSets).
pub async fn run_deployments(
    client: kube::Client,
    opts: ControllerOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ControllerError> {
    run_kinds(
        client,
        opts,
        &[Kind::Deployments, Kind::ReplicaSets],
        shutdown,
    )
    .await
}

/// Runs only the StatefulSet controller.
pub async fn run_statefulsets(
    client: kube::Client,
    opts: ControllerOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ControllerError> {
    run_kinds(client, opts, &[Kind::StatefulSets], shutdown).await
}

/// Runs only the scheduler.
pub async fn run_scheduler(
    client: kube::Client,
    opts: ControllerOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ControllerError> {
    run_kinds(client, opts, &[Kind::Scheduler], shutdown).await
}

/// Runs the given controllers, sharing one set of watches, until `shutdown` completes.
pub async fn run_kinds(
    client: kube::Client,
    opts: ControllerOptions,
    kinds: &[Kind],
    shutdown: impl Future<Output = ()>,
) -> Result<(), ControllerError> {
    let mut shutdown = std::pin::pin!(shutdown);
    let controllers = Arc::new(Controllers::new(client.clone(), opts.clone(), kinds));
    let (informers, watch_tasks) = Informers::start(client, Arc::clone(&controllers));
    // Dropping this future (a leader elector does when its lease is lost) stops every task
    // at once, as a shutdown does.
    let mut tasks = AbortOnDrop(watch_tasks);
    let needed = controllers.needed_kinds();
    let synced = tokio::select! {
        r = informers.wait_ready(&needed) => Some(r),
        () = &mut shutdown => None,
    };
    if !matches!(synced, Some(Ok(()))) {
        return match synced {
            Some(Err(e)) => Err(ControllerError::Watch(e)),
            _ => Ok(()),
        };
    }
    for kind in kinds {
        let c = Arc::clone(&controllers);
        let inf = Arc::clone(&informers);
        let kind = *kind;
        tasks
            .0
            .push(tokio::spawn(async move { c.worker(kind, inf).await }));
    }
    {
        let c = Arc::clone(&controllers);
        let inf = Arc::clone(&informers);
        let period = opts.resync_period;
        tasks.0.push(tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                c.resync_all(&inf);
            }
        }));
    }
    info!(controllers = ?kinds, node = %opts.node_name, "controllers started");
    shutdown.as_mut().await;
    let tasks = std::mem::take(&mut tasks.0);
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        if let Err(e) = t.await
            && !e.is_cancelled()
        {
            warn!(error = %e, "controller task failed");
        }
    }
    info!("controllers stopped");
    Ok(())
}

/// Spawned tasks that are aborted when this is dropped.
struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

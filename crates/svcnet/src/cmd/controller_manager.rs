//! `svcnet controller-manager`: the controllers `svcnet up` runs in process (EndpointSlice,
//! Endpoints, mirroring, Deployments, ReplicaSets, StatefulSets, the scheduler) as a process
//! of their own against any API server, acting only while holding a Lease, with
//! kube-controller-manager's leader-election flags and defaults. Run several for
//! availability: one leads, the others wait; when the leader is gone, one of them takes over
//! after the lease duration. Losing the lease stops the controllers at once and exits the
//! process with a failure, as upstream does; a restart makes it a candidate again.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use svcnet_controllers::ControllerOptions;
use svcnet_controllers::leader::{ElectionConfig, Ended, KubeLeaseLock, LeaderElector};
use svcnet_controllers::runtime::{Kind, run_kinds};

use super::kubeconfig::client_from_kubeconfig;
use super::proxy::parse_duration;

/// Flags of `svcnet controller-manager`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Kubeconfig of the API server.
    #[arg(long)]
    pub kubeconfig: PathBuf,
    /// Nodes the scheduler binds unscheduled pods to, in turn (comma-separated). Without
    /// any, the scheduler does not run, and pods must name their node or be bound by another
    /// scheduler.
    #[arg(long, value_delimiter = ',')]
    pub scheduler_nodes: Vec<String>,
    /// Leader election.
    #[command(flatten)]
    pub leader_election: LeaderElectionFlags,
}

/// kube-controller-manager's leader-election flags (component-base's), with its defaults.
#[derive(Debug, clap::Args)]
pub struct LeaderElectionFlags {
    /// Hold a Lease before acting, so that of several instances only one acts;
    /// `--leader-elect=false` acts at once (one instance only).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true")]
    pub leader_elect: bool,
    /// How long the others wait, from the last change of the Lease they saw, before taking
    /// it over (whole seconds).
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,
    /// How long the leader keeps trying to renew before it stops leading (and exits).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// How often candidates try to acquire the Lease and the leader renews it.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,
    /// The kind of lock: `leases` (coordination.k8s.io/v1), upstream's default since 1.20
    /// and the only one here.
    #[arg(long, default_value = "leases", value_parser = ["leases"])]
    pub leader_elect_resource_lock: String,
    /// The Lease's name.
    #[arg(long, default_value = "svcnet-controller-manager")]
    pub leader_elect_resource_name: String,
    /// The Lease's namespace.
    #[arg(long, default_value = "kube-system")]
    pub leader_elect_resource_namespace: String,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let le = &args.leader_election;
    let config = ElectionConfig {
        lease_duration: le.leader_elect_lease_duration,
        renew_deadline: le.leader_elect_renew_deadline,
        retry_period: le.leader_elect_retry_period,
        release_on_cancel: true,
        ..ElectionConfig::new(svcnet_controllers::leader::default_identity())
    };
    if le.leader_elect {
        config.validate()?;
    }
    let client = client_from_kubeconfig(&args.kubeconfig).await?;
    let kinds: Vec<Kind> = Kind::ALL
        .iter()
        .copied()
        .filter(|k| *k != Kind::Scheduler || !args.scheduler_nodes.is_empty())
        .collect();
    if args.scheduler_nodes.is_empty() {
        tracing::info!("no --scheduler-nodes: the scheduler does not run");
    }
    let opts = ControllerOptions {
        node_name: args.scheduler_nodes.first().cloned().unwrap_or_default(),
        schedulable_nodes: args.scheduler_nodes.clone(),
        ..ControllerOptions::default()
    };
    let shutdown = async {
        if let Err(e) = super::shutdown_signal().await {
            tracing::warn!("{e:#}; stopping");
        }
    };
    if !le.leader_elect {
        return run_kinds(client, opts, &kinds, shutdown)
            .await
            .context("controllers");
    }
    let lease = format!(
        "{}/{}",
        le.leader_elect_resource_namespace, le.leader_elect_resource_name
    );
    let identity = config.identity.clone();
    let lock = KubeLeaseLock::new(
        client.clone(),
        &le.leader_elect_resource_namespace,
        &le.leader_elect_resource_name,
    );
    let elector = LeaderElector::new(config, lock)?;
    tracing::info!(%lease, %identity, "candidate for the controller-manager lease");
    let ended = elector
        .run(shutdown, |stop| run_kinds(client, opts, &kinds, stop))
        .await;
    match ended {
        Ended::Cancelled => Ok(()),
        Ended::Finished(result) => result.context("controllers"),
        Ended::LostLease => {
            tracing::error!(%lease, %identity, "leader election lost: the controllers stopped; exiting");
            anyhow::bail!(
                "lost the leader lease {lease} (identity {identity}); the controllers stopped"
            )
        }
    }
}

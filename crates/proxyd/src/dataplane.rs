//! The four dataplanes, each behind the dataplane contract ([`svcnet_proxy::Dataplane`]) and
//! driven by the one generic [`Syncer`] (the full-or-partial decision, retries with a full
//! sync, fallbacks): nftables ([`NftDataplane`]), iptables ([`IptablesDataplane`], whose
//! canary asks for a full sync after a flush), userspace ([`UserspaceDataplane`], a
//! privileged or unprivileged [`UserspaceProxy`]) and IPVS ([`IpvsDataplane`]). Each sync
//! returns an [`Outcome`]. Also the cleanup of the other modes' leftovers when a mode starts,
//! and `--cleanup` of all four.

use std::collections::BTreeSet;
use std::sync::Arc;

use svcnet_iptables::IptablesDataplane;
use svcnet_ipvs::IpvsDataplane;
use svcnet_lb::Fallback;
use svcnet_nft::{Family, NftDataplane, NftExecutor};
use svcnet_proxy::{ChangeSet, NamespacedName, ProxyState, ServicePortName};
use svcnet_userspace::{UserspaceDataplane, UserspaceProxy};

use crate::syncer::Syncer;
use crate::{ProxyConfig, ProxyError, ProxyMode};

/// Which services an outcome's fallback list speaks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every service (a full sync): services not listed have no fallback.
    All,
    /// Only these services were re-rendered; others keep what was reported before.
    Services(BTreeSet<NamespacedName>),
}

/// What one sync of the dataplane did.
#[derive(Debug)]
pub struct Outcome {
    pub full: bool,
    pub ok: bool,
    /// Whether a failure may go away by retrying (false: reported, retried only with the next
    /// change or periodic resync).
    pub retryable: bool,
    /// Algorithms the dataplane could not express (it chose at random instead).
    pub fallbacks: Vec<(ServicePortName, Fallback)>,
    pub scope: Scope,
    /// Service ports programmed, summed over families (`None`: unknown, keep the last count).
    pub service_ports: Option<usize>,
    /// What failed, by family (`None` when `ok`).
    pub error: Option<String>,
}

/// How long a stopping userspace proxy keeps relaying its established connections.
pub const USERSPACE_DRAIN: std::time::Duration = std::time::Duration::from_secs(15);

/// The dataplane of the configured mode, under the generic syncer.
pub enum Plane {
    Nft(Syncer<NftDataplane>),
    Iptables(Syncer<IptablesDataplane>),
    /// The proxy is also kept apart, for its metrics.
    Userspace(Syncer<UserspaceDataplane>, Arc<UserspaceProxy>),
    Ipvs(Syncer<IpvsDataplane>),
}

impl Plane {
    pub fn nft(cfg: &ProxyConfig) -> Self {
        let exec = NftExecutor::new(cfg.netns.clone());
        Self::Nft(Syncer::new(NftDataplane::new(exec, &cfg.table)))
    }

    /// The dataplane for `cfg.mode`, after checking its tools are there.
    pub async fn new(cfg: &ProxyConfig) -> Result<Self, ProxyError> {
        match cfg.mode {
            ProxyMode::Nftables => {
                NftExecutor::new(cfg.netns.clone()).check()?;
                Ok(Self::nft(cfg))
            }
            ProxyMode::Iptables => {
                let netns = cfg.netns.clone();
                let exec = tokio::task::spawn_blocking(move || {
                    svcnet_iptables::IptablesExecutor::detect(netns)
                })
                .await
                .map_err(|e| ProxyError::Task(e.to_string()))??;
                tracing::info!(
                    backend = exec.backend().as_str(),
                    why = exec.why().unwrap_or_default(),
                    "iptables back end"
                );
                Ok(Self::Iptables(Syncer::new(IptablesDataplane::new(exec))))
            }
            ProxyMode::Ipvs => {
                // Opening it resolves IPVS in the node's namespace: a kernel without ip_vs
                // fails here, at start, naming the module.
                let (netns, options) = (cfg.netns.clone(), cfg.ipvs.clone());
                let dp = tokio::task::spawn_blocking(move || {
                    IpvsDataplane::new(netns, &svcnet_proxy::IpFamily::ALL)?.with_options(options)
                })
                .await
                .map_err(|e| ProxyError::Task(e.to_string()))??;
                Ok(Self::Ipvs(Syncer::new(dp)))
            }
            ProxyMode::Userspace => {
                let mode = if cfg.unprivileged {
                    let mut addresses: Vec<std::net::IpAddr> = cfg
                        .nodeport_addresses
                        .iter()
                        .map(|net| net.addr())
                        .collect();
                    if addresses.is_empty() {
                        addresses.push(std::net::Ipv4Addr::LOCALHOST.into());
                    }
                    svcnet_userspace::Mode::Unprivileged {
                        node_port_addresses: addresses,
                    }
                } else {
                    svcnet_userspace::Mode::Privileged
                };
                let mut config = svcnet_userspace::Config::new(mode);
                config.netns = cfg.netns.clone();
                config.admission = cfg.admission.clone();
                config.upstream_source = cfg.upstream_source;
                let proxy = Arc::new(UserspaceProxy::new(config)?);
                let dp = UserspaceDataplane::new(proxy.clone(), tokio::runtime::Handle::current());
                Ok(Self::Userspace(Syncer::new(dp), proxy))
            }
        }
    }

    /// The nftables dataplane's executor (shares its context).
    pub fn nft_executor(&self) -> Option<NftExecutor> {
        match self {
            Self::Nft(s) => s.dataplane().map(|d| d.executor().clone()),
            _ => None,
        }
    }

    /// The userspace proxy, for its metrics.
    pub fn userspace(&self) -> Option<Arc<UserspaceProxy>> {
        match self {
            Self::Userspace(_, p) => Some(p.clone()),
            _ => None,
        }
    }

    /// Syncs the dataplane with `state`; `changes` were just taken from it.
    pub async fn sync(
        &mut self,
        state: &ProxyState,
        changes: &ChangeSet,
        periodic_full: bool,
    ) -> Outcome {
        match self {
            Self::Nft(s) => s.sync(state, changes, periodic_full).await,
            Self::Iptables(s) => s.sync(state, changes, periodic_full).await,
            Self::Userspace(s, _) => s.sync(state, changes, periodic_full).await,
            Self::Ipvs(s) => s.sync(state, changes, periodic_full).await,
        }
    }

    /// Stops the dataplane. Kernel rules stay (a restarted proxy, of this mode or another,
    /// takes them over). The userspace proxy stops accepting and removes its redirects, which
    /// would lead to closed ports otherwise, then drains: the connections it relays end
    /// with it, so it keeps relaying them until they close or [`USERSPACE_DRAIN`] passes (a
    /// mode switch from userspace starts the new proxy first, so new connections already go
    /// to the new mode's rules).
    pub async fn shutdown(&self) {
        let Self::Userspace(_, p) = self else {
            return;
        };
        if let Err(e) = p.shutdown().await {
            tracing::warn!("stopping the userspace proxy: {e}");
        }
        let deadline = tokio::time::Instant::now() + USERSPACE_DRAIN;
        let active = p.active_connections();
        if active > 0 {
            tracing::info!(active, "draining the userspace proxy's relayed connections");
        }
        while p.active_connections() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

/// What a cleanup removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Cleaned {
    /// nft `svcnet` tables (per family).
    pub nft_tables: usize,
    /// (back end, family) pairs of iptables that held SVCNET- chains or hooks.
    pub iptables: usize,
    /// Whether the userspace proxy's tables were removed (absent ones count as done).
    pub userspace: bool,
    /// Whether the IPVS dataplane's state was removed (absent pieces count as done).
    pub ipvs: bool,
}

fn cleanup_nft(netns: Option<&str>, table: &str) -> Result<usize, ProxyError> {
    let exec = NftExecutor::new(netns.map(str::to_string));
    let mut removed = 0;
    for family in [Family::Ip, Family::Ip6] {
        if exec.delete_table(family, table)? {
            removed += 1;
        }
    }
    Ok(removed)
}

/// Removes the rules of every mode but `keep` (`None`: all four, as `--cleanup`), in the
/// current or the named network namespace. Blocking (runs the tools). With `strict` the first
/// error is returned; otherwise (a mode starting) errors are logged and the other modes are
/// still cleaned: a host whose kernel lacks, say, the legacy x_tables modules must still be
/// able to run the nftables mode.
pub fn cleanup_modes(
    netns: Option<&str>,
    table: &str,
    keep: Option<ProxyMode>,
    strict: bool,
) -> Result<Cleaned, ProxyError> {
    let mut cleaned = Cleaned::default();
    let check = |mode: &str, r: Result<(), ProxyError>| -> Result<(), ProxyError> {
        match r {
            Err(e) if !strict => {
                tracing::warn!("removing the {mode} mode's rules: {e}");
                Ok(())
            }
            other => other,
        }
    };
    if keep != Some(ProxyMode::Nftables) {
        let r = cleanup_nft(netns, table).map(|n| cleaned.nft_tables = n);
        check("nftables", r)?;
    }
    if keep != Some(ProxyMode::Iptables) {
        let r = svcnet_iptables::cleanup_all(netns)
            .map(|c| cleaned.iptables = c.len())
            .map_err(ProxyError::from);
        check("iptables", r)?;
    }
    if keep != Some(ProxyMode::Userspace) {
        svcnet_userspace::cleanup(netns);
        cleaned.userspace = true;
    }
    if keep != Some(ProxyMode::Ipvs) {
        let r = svcnet_ipvs::cleanup(netns, None)
            .map(|()| cleaned.ipvs = true)
            .map_err(ProxyError::from);
        check("ipvs", r)?;
    }
    Ok(cleaned)
}

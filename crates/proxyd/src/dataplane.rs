//! The three dataplanes behind one sync call: nftables (per-family renderers, full syncs that
//! recreate or re-assert the table, partial syncs of the changed services), iptables
//! (`svcnet_iptables::IptablesDataplane`, which makes kube-proxy's full-or-partial decision
//! itself, canary included) and userspace (`svcnet_userspace::UserspaceProxy` in privileged
//! mode, synced from every family's full desired state; it diffs internally). Each sync
//! returns an [`Outcome`]: whether it was full, which families failed, and the algorithm
//! fallbacks to report. Also the cleanup of the other modes' leftovers when a mode starts,
//! and `--cleanup` of all three.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use svcnet_iptables::IptablesDataplane;
use svcnet_lb::Fallback;
use svcnet_nft::{Family, FullMode, NftExecutor, Renderer};
use svcnet_proxy::{ChangeSet, IpFamily, NamespacedName, ProxyState, ServicePortName};
use svcnet_userspace::UserspaceProxy;

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
    /// Algorithms the dataplane could not express (it chose at random instead).
    pub fallbacks: Vec<(ServicePortName, Fallback)>,
    pub scope: Scope,
    /// Service ports programmed, summed over families (`None`: unknown, keep the last count).
    pub service_ports: Option<usize>,
}

/// Per-family nft state.
pub struct NftFamily {
    renderer: Renderer,
    /// Next full sync must recreate the table (first sync, after a failure).
    recreate: bool,
    /// Services changed since the last successful sync of this family.
    dirty: BTreeSet<NamespacedName>,
}

/// A dataplane as the sync loop drives it.
pub enum Plane {
    Nft {
        exec: NftExecutor,
        families: BTreeMap<IpFamily, NftFamily>,
    },
    /// `None` only while a sync runs on a blocking thread.
    Iptables(Option<Box<IptablesDataplane>>),
    Userspace(Arc<UserspaceProxy>),
}

impl Plane {
    pub fn nft(cfg: &ProxyConfig) -> Self {
        let families = IpFamily::ALL
            .into_iter()
            .map(|f| {
                (
                    f,
                    NftFamily {
                        renderer: Renderer::with_table(Family::from(f), &cfg.table),
                        recreate: true,
                        dirty: BTreeSet::new(),
                    },
                )
            })
            .collect();
        Self::Nft {
            exec: NftExecutor::new(cfg.netns.clone()),
            families,
        }
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
                tracing::info!(backend = exec.backend().as_str(), "iptables back end");
                Ok(Self::Iptables(Some(Box::new(IptablesDataplane::new(exec)))))
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
                Ok(Self::Userspace(Arc::new(UserspaceProxy::new(config)?)))
            }
        }
    }

    /// The userspace proxy, for its metrics.
    pub fn userspace(&self) -> Option<Arc<UserspaceProxy>> {
        match self {
            Self::Userspace(p) => Some(p.clone()),
            _ => None,
        }
    }

    /// Syncs the dataplane with `state`; `changes` were just taken from it.
    pub async fn sync(
        &mut self,
        state: &mut ProxyState,
        changes: &ChangeSet,
        periodic_full: bool,
    ) -> Outcome {
        match self {
            Self::Nft { exec, families } => {
                sync_nft(exec, families, state, changes, periodic_full).await
            }
            Self::Iptables(slot) => sync_iptables(slot, state, changes, periodic_full).await,
            Self::Userspace(proxy) => sync_userspace(proxy, state).await,
        }
    }

    /// Stops the dataplane. Kernel rules stay (a restarted proxy takes them over); the
    /// userspace proxy removes its redirects, which would lead to closed ports otherwise.
    pub async fn shutdown(&self) {
        if let Self::Userspace(p) = self
            && let Err(e) = p.shutdown().await
        {
            tracing::warn!("stopping the userspace proxy: {e}");
        }
    }
}

async fn sync_nft(
    exec: &NftExecutor,
    families: &mut BTreeMap<IpFamily, NftFamily>,
    state: &ProxyState,
    changes: &ChangeSet,
    periodic_full: bool,
) -> Outcome {
    let mut out = Outcome {
        full: false,
        ok: true,
        fallbacks: Vec::new(),
        scope: Scope::Services(BTreeSet::new()),
        service_ports: None,
    };
    for (family, plane) in families.iter_mut() {
        let family = *family;
        plane.dirty.extend(changes.services.keys().cloned());
        let node = state.node_state(family);
        let partial = if plane.recreate || periodic_full || changes.node_changed {
            None
        } else {
            plane
                .renderer
                .plan_partial(&node, &state.desired_for(family, plane.dirty.iter()))
        };
        let plan = match partial {
            Some(p) => p,
            None => {
                let mode = if plane.recreate {
                    FullMode::Recreate
                } else {
                    FullMode::Reassert
                };
                plane.renderer.plan_full(&state.desired(family), mode)
            }
        };
        let is_full = plan.is_full();
        out.full |= is_full;
        let exec = exec.clone();
        let (plan, result) = match tokio::task::spawn_blocking(move || {
            let r = exec.apply(&plan.tx);
            (plan, r)
        })
        .await
        {
            Ok(x) => x,
            Err(e) => {
                tracing::error!("sync task failed: {e}");
                out.ok = false;
                continue;
            }
        };
        match result {
            Ok(()) => {
                tracing::debug!(%family, full = is_full, ops = plan.tx.len(), "synced");
                out.fallbacks.extend(plan.fallbacks.iter().cloned());
                if is_full {
                    out.scope = Scope::All;
                } else if let Scope::Services(s) = &mut out.scope {
                    s.extend(plane.dirty.iter().cloned());
                }
                plane.renderer.commit(plan);
                plane.recreate = false;
                plane.dirty.clear();
            }
            Err(e) => {
                tracing::warn!(%family, full = is_full, "nft sync failed, will retry with a full sync: {e}");
                plane.renderer.invalidate();
                // A reassert that failed (drift: something deleted) is retried by recreating.
                plane.recreate = true;
                out.ok = false;
            }
        }
    }
    out.service_ports = Some(families.values().map(|p| p.renderer.service_ports()).sum());
    out
}

async fn sync_iptables(
    slot: &mut Option<Box<IptablesDataplane>>,
    state: &mut ProxyState,
    changes: &ChangeSet,
    periodic_full: bool,
) -> Outcome {
    let mut out = Outcome {
        full: false,
        ok: false,
        fallbacks: Vec::new(),
        scope: Scope::Services(changes.services.keys().cloned().collect()),
        service_ports: None,
    };
    let Some(mut dp) = slot.take() else {
        tracing::error!("iptables dataplane lost after a failed sync task");
        return out;
    };
    // The blocking sync borrows the state: move it to the thread and back.
    let config = state.config().clone();
    let moved = std::mem::replace(state, ProxyState::new(config));
    let changes_owned = changes.clone();
    let joined = tokio::task::spawn_blocking(move || {
        let results = dp.sync(&moved, &changes_owned, periodic_full);
        (dp, moved, results)
    })
    .await;
    let (dp, moved, results) = match joined {
        Ok(x) => x,
        Err(e) => {
            // The state is lost with the thread: nothing sensible to continue with.
            tracing::error!("iptables sync task failed: {e}");
            return out;
        }
    };
    *state = moved;
    *slot = Some(dp);
    out.ok = true;
    let mut all_full = true;
    let mut ports = 0;
    for r in results {
        match r {
            Ok(report) => {
                tracing::debug!(family = %report.family, full = report.full, reason = ?report.full_reason, rules = ?report.rules, "iptables synced");
                out.full |= report.full;
                all_full &= report.full;
                ports += report.service_ports;
                // What this sync rendered: everything after a full sync, else the changes.
                out.fallbacks.extend(report.fallbacks);
            }
            Err(e) => {
                tracing::warn!("{e}; the next sync of that family is full");
                out.ok = false;
                all_full = false;
            }
        }
    }
    // Every family synced in full: the fallbacks speak for every service.
    if out.ok && all_full {
        out.scope = Scope::All;
    }
    if out.ok {
        out.service_ports = Some(ports);
    }
    out
}

async fn sync_userspace(proxy: &Arc<UserspaceProxy>, state: &ProxyState) -> Outcome {
    let families: Vec<_> = IpFamily::ALL
        .into_iter()
        .map(|f| state.desired(f))
        .collect();
    let service_ports = Some(families.iter().map(|f| f.services.len()).sum());
    let mut out = Outcome {
        full: true,
        ok: true,
        fallbacks: Vec::new(),
        scope: Scope::All,
        service_ports,
    };
    match proxy.sync(&families).await {
        Ok(report) => {
            // Frontends that could not be bound were logged by the proxy; the rest applied.
            for e in &report.bind_errors {
                tracing::warn!("userspace proxy: {e}");
            }
            out.fallbacks = report.fallbacks;
        }
        Err(e) => {
            tracing::warn!("userspace sync failed, will retry: {e}");
            out.ok = false;
        }
    }
    out
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

/// Removes the rules of every mode but `keep` (`None`: all three, as `--cleanup`), in the
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
    Ok(cleaned)
}

//! The `default/kubernetes` Endpoints and EndpointSlice name every live API server, as
//! upstream's lease endpoint reconciler (`--endpoint-reconciler-type=lease`) keeps them: each
//! server renews its own record under `/registry/masterleases/<ip>:<port>` (an Endpoints-shaped
//! object) every [`ServerConfig::endpoint_lease_ttl`](crate::ServerConfig) × 2/3, rewrites the
//! `kubernetes` endpoints from the records that are alive, and removes its own on shutdown.
//!
//! On redb, which only one process can open, the endpoints are this server, written at start.
//!
//! etcd would expire upstream's records with a lease TTL; the store has no TTLs (redb has no
//! such thing), so a record is judged expired the way client-go judges a leader-election
//! Lease: by this server's own clock, when the record's resourceVersion has not changed for a
//! TTL since this server first saw it at that version. Clock skew between servers does not
//! matter; an expired record is deleted with compare-and-swap on the version seen, so a
//! record renewed meanwhile survives. A killed server's address goes within TTL + one period.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use svcnet_store::{Mutation, StoreError, object_revision};

use crate::bootstrap;
use crate::objects::meta_str;
use crate::registry;
use crate::state::{AppState, SharedState};
use crate::status::ApiError;

/// The prefix of the records (`/registry/masterleases/` on etcd).
const PREFIX: &str = "/core/masterleases//";

/// When this server first saw each other server's record at its current version.
#[derive(Default)]
pub(crate) struct Observed(Mutex<HashMap<String, (u64, Instant)>>);

fn own_name(state: &AppState) -> String {
    std::net::SocketAddr::new(state.cfg.advertise_ip(), state.addr.port()).to_string()
}

/// Whether other API servers can share this store (etcd; redb is one process's file).
fn shared(state: &AppState) -> bool {
    !matches!(state.cfg.storage, crate::Storage::Embedded)
}

/// This server's record.
fn own_record(state: &AppState) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {
            "name": own_name(state),
            "annotations": {"svcnet.io/renewed": crate::objects::now()},
        },
        "subsets": [{
            "addresses": [{"ip": state.cfg.advertise_ip().to_string()}],
            "ports": [{"name": "https", "port": state.addr.port(), "protocol": "TCP"}],
        }],
    })
}

/// Renews this server's record (a write every time: its version is what others watch).
async fn renew(state: &SharedState) -> Result<(), ApiError> {
    let name = own_name(state);
    let record = own_record(state);
    state
        .store
        .guaranteed_update(
            &format!("{PREFIX}{name}"),
            Box::new(move |_| Ok(Mutation::Put(record.clone()))),
        )
        .await?;
    Ok(())
}

/// One reconcile: renew (or, when `leaving`, remove) this server's record, expire others
/// that stopped renewing, and write the `kubernetes` endpoints from what is alive.
pub(crate) async fn reconcile(state: &SharedState, leaving: bool) -> Result<(), ApiError> {
    if !shared(state) {
        // Alone on its store: the endpoints are this server, written once at start and kept
        // (as before a restart), with no records and no periodic writes.
        return match leaving {
            true => Ok(()),
            false => write_endpoints(state, &[own_record(state)]).await,
        };
    }
    let own = own_name(state);
    if leaving {
        match state.store.delete(&format!("{PREFIX}{own}"), None).await {
            Ok(_) | Err(StoreError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    } else {
        renew(state).await?;
    }
    let records = state.store.list(PREFIX).await?.items;
    let now = Instant::now();
    let ttl = state.cfg.endpoint_lease_ttl;
    let mut expired = Vec::new();
    let mut alive = Vec::new();
    {
        let mut seen = state
            .masterleases
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        seen.retain(|name, _| records.iter().any(|r| meta_str(r, "name") == Some(name)));
        for r in records {
            let (Some(name), Some(rv)) = (meta_str(&r, "name"), object_revision(&r)) else {
                continue;
            };
            if name == own {
                if !leaving {
                    alive.push(r);
                }
                continue;
            }
            let entry = seen.entry(name.to_string()).or_insert((rv, now));
            if entry.0 != rv {
                *entry = (rv, now);
            }
            if now.duration_since(entry.1) >= ttl {
                expired.push((name.to_string(), rv));
            } else {
                alive.push(r);
            }
        }
    }
    for (name, rv) in expired {
        match state
            .store
            .delete(&format!("{PREFIX}{name}"), Some(rv))
            .await
        {
            Ok(_) => tracing::info!("API server {name} stopped renewing; removed"),
            Err(StoreError::NotFound { .. } | StoreError::Conflict { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    write_endpoints(state, &alive).await
}

/// The `kubernetes` Endpoints (one subset per port) and EndpointSlice (the addresses of the
/// lowest port: upstream's servers share one port; servers on one loopback may not).
async fn write_endpoints(state: &SharedState, alive: &[Value]) -> Result<(), ApiError> {
    let mut by_port: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for r in alive {
        let port = r.pointer("/subsets/0/ports/0/port").and_then(Value::as_i64);
        let ip = r
            .pointer("/subsets/0/addresses/0/ip")
            .and_then(Value::as_str);
        if let (Some(port), Some(ip)) = (port, ip) {
            by_port.entry(port).or_default().push(ip.to_string());
        }
    }
    for ips in by_port.values_mut() {
        ips.sort();
        ips.dedup();
    }
    let subsets: Vec<Value> = by_port
        .iter()
        .map(|(port, ips)| {
            json!({
                "addresses": ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>(),
                "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
            })
        })
        .collect();
    let endpoints = registry::lookup("", "v1", "endpoints")
        .ok_or_else(|| ApiError::Internal("endpoints are not registered".into()))?;
    let slices = registry::lookup("discovery.k8s.io", "v1", "endpointslices")
        .ok_or_else(|| ApiError::Internal("endpointslices are not registered".into()))?;
    bootstrap::ensure(
        state,
        endpoints,
        json!({
            "apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": "kubernetes", "namespace": "default",
                         "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
            "subsets": subsets,
        }),
        &["subsets"],
        false,
    )
    .await?;
    let (port, ips) = by_port
        .iter()
        .next()
        .map(|(p, ips)| (*p, ips.clone()))
        .unwrap_or((i64::from(state.addr.port()), Vec::new()));
    let family = if state.cfg.advertise_ip().is_ipv4() {
        "IPv4"
    } else {
        "IPv6"
    };
    bootstrap::ensure(
        state,
        slices,
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "kubernetes", "namespace": "default",
                         "labels": {"kubernetes.io/service-name": "kubernetes"}},
            "addressType": family,
            "endpoints": ips.iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}})).collect::<Vec<_>>(),
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        }),
        &["endpoints", "ports", "addressType"],
        false,
    )
    .await
}

/// Reconciles every TTL × 2/3 until shutdown, then removes this server's record (on a store
/// no other server can share, there is nothing to do after the start).
pub(crate) async fn run(state: SharedState) {
    if !shared(&state) {
        return;
    }
    let period = state.cfg.endpoint_lease_ttl * 2 / 3;
    loop {
        tokio::select! {
            _ = state.shutdown.cancelled() => break,
            _ = tokio::time::sleep(period.max(Duration::from_millis(100))) => {}
        }
        if let Err(e) = reconcile(&state, false).await {
            tracing::warn!("kubernetes endpoints: {e}");
        }
    }
    if let Err(e) = reconcile(&state, true).await {
        tracing::warn!("kubernetes endpoints on shutdown: {e}");
    }
}

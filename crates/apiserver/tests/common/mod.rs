//! Shared test support: a server on a free port in a temporary data dir, and clients for it.
#![allow(dead_code, clippy::unwrap_used)]

pub mod fixtures;
pub mod kubectl;
pub mod raw;
pub mod rbac;

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};
use svcnet_apiserver::{RunningServer, ServerConfig};

pub struct TestServer {
    pub server: Option<RunningServer>,
    pub dir: tempfile::TempDir,
}

pub fn config(dir: &Path) -> ServerConfig {
    ServerConfig {
        data_dir: dir.to_path_buf(),
        listen: "127.0.0.1:0".parse().unwrap(),
        bookmark_interval: std::time::Duration::from_millis(300),
        storage: storage(dir),
        // On etcd each server renews its master lease record every TTL × 2/3, a write that
        // moves the store's revision between any two reads of a test (`Raw::refused` checks
        // that a refused request moved nothing). The tests here run one server, so the
        // renewal is pushed past any test's length; `e2e_multi_apiserver` tests the leases.
        endpoint_lease_ttl: std::time::Duration::from_secs(3600),
        ..ServerConfig::default()
    }
}

/// redb in the data dir; or, with `SVCNET_TEST_ETCD_SERVERS=http://127.0.0.1:2379,…`, that
/// etcd cluster under a prefix of the data dir's name, so the API tests run on the etcd store.
/// Run them one at a time there (`-- --test-threads=1`): etcd's revision is global to the
/// cluster, so the tests that check a request moved no revision would see each other's writes.
fn storage(dir: &Path) -> svcnet_apiserver::Storage {
    #[cfg(feature = "etcd")]
    if let Ok(servers) = std::env::var("SVCNET_TEST_ETCD_SERVERS") {
        let name = dir.file_name().unwrap().to_string_lossy();
        return svcnet_apiserver::Storage::Etcd(svcnet_apiserver::EtcdOptions {
            endpoints: servers.split(',').map(str::to_string).collect(),
            prefix: format!("/svcnet-test/{name}"),
            compaction_interval: std::time::Duration::ZERO,
            ..Default::default()
        });
    }
    let _ = dir;
    svcnet_apiserver::Storage::Embedded
}

impl TestServer {
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let server = svcnet_apiserver::start(config(dir.path())).await.unwrap();
        TestServer {
            server: Some(server),
            dir,
        }
    }

    pub async fn start_with(f: impl FnOnce(&mut ServerConfig)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(dir.path());
        f(&mut cfg);
        let server = svcnet_apiserver::start(cfg).await.unwrap();
        TestServer {
            server: Some(server),
            dir,
        }
    }

    pub fn server(&self) -> &RunningServer {
        self.server.as_ref().unwrap()
    }

    pub async fn client(&self) -> kube::Client {
        client_for(self.server().kubeconfig_path()).await
    }

    /// Stops the server and starts a new one on the same data dir.
    pub async fn restart(&mut self) {
        let old = self.server.take().unwrap();
        old.shutdown().await.unwrap();
        let server = svcnet_apiserver::start(config(self.dir.path()))
            .await
            .unwrap();
        self.server = Some(server);
    }

    pub async fn stop(mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown().await.unwrap();
        }
    }
}

pub async fn client_for(kubeconfig: &Path) -> kube::Client {
    let kc = Kubeconfig::read_from(kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

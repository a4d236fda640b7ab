//! The API server the controllers' tests run against: svcnet's own, started in-process on a
//! free loopback port with its data in a temporary directory, and a kube-rs client for it.
#![allow(dead_code)] // not every test binary uses every field

use std::path::PathBuf;

use anyhow::Result;
use kube::config::{KubeConfigOptions, Kubeconfig};

pub struct TestServer {
    pub client: kube::Client,
    pub server: svcnet_apiserver::RunningServer,
    pub kubeconfig: PathBuf,
    /// Holds the server's data; removed on drop.
    pub dir: tempfile::TempDir,
}

/// Starts the server (and test logging, from `RUST_LOG`).
pub async fn start_server() -> Result<TestServer> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let dir = tempfile::tempdir()?;
    let server = svcnet_apiserver::start(svcnet_apiserver::ServerConfig {
        data_dir: dir.path().to_path_buf(),
        listen: "127.0.0.1:0".parse()?,
        ..Default::default()
    })
    .await?;
    let kubeconfig = server.kubeconfig_path().to_path_buf();
    let config = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(&kubeconfig)?,
        &KubeConfigOptions::default(),
    )
    .await?;
    let client = kube::Client::try_from(config)?;
    Ok(TestServer {
        client,
        server,
        kubeconfig,
        dir,
    })
}

//! `svcnet apiserver`: only the Kubernetes API server, as kube-apiserver runs, typically on an
//! etcd cluster (`--etcd-servers`) that other API servers share.
//!
//! It uses the data dir's PKI (the CA, the serving certificate for its address, the admin
//! client certificate), creating it when absent, so the kubeconfig of `svcnet up` on the same
//! data dir works against it (kubectl `--server` picks the address); it writes
//! `kubeconfig` for its own address. No controllers, proxy, DNS or agent run here.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use anyhow::Context as _;
use ipnet::IpNet;

use crate::cmd::etcd_flags::EtcdFlags;

/// Flags of `svcnet apiserver`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Directory holding the certificates and the kubeconfig (and store.redb without
    /// --etcd-servers).
    #[arg(long, default_value = "svcnet-data", env = "SVCNET_DATA_DIR", long_help = crate::cmd::DATA_DIR_HELP)]
    pub data_dir: PathBuf,
    /// Address the API server listens on (HTTPS).
    #[arg(long, default_value = "127.0.0.1:6443")]
    pub listen: SocketAddr,
    /// Address clients and the `kubernetes` service use to reach this server (default: the
    /// listen address, or 127.0.0.1 when listening on every address).
    #[arg(long)]
    pub advertise_address: Option<IpAddr>,
    /// Service CIDR(s) cluster IPs are allocated from; comma-separated for dual-stack.
    #[arg(long, value_delimiter = ',', default_value = "10.96.0.0/12")]
    pub service_cidr: Vec<IpNet>,
    /// Range node ports are allocated from.
    #[arg(long, default_value = "30000-32767")]
    pub node_port_range: super::up::PortRange,
    /// How long this server's address stays in the `kubernetes` endpoints without renewal
    /// (upstream's lease endpoint reconciler: 15s, renewed every 2/3 of it); svcnet's own flag.
    #[arg(long, default_value = "15s", value_parser = super::proxy::parse_duration)]
    pub endpoint_lease_ttl: std::time::Duration,
    /// Where the objects are kept.
    #[command(flatten)]
    pub etcd: EtcdFlags,
}

pub async fn run(mut args: Args) -> anyhow::Result<()> {
    args.data_dir = crate::cmd::absolute_data_dir(&args.data_dir)?;
    let dns_service_ip = super::up::nth_address(&args.service_cidr, 10)?;
    let config = svcnet_apiserver::ServerConfig {
        data_dir: args.data_dir.clone(),
        listen: args.listen,
        advertise_address: args.advertise_address,
        service_cidrs: args.service_cidr.clone(),
        node_port_range: args.node_port_range.0.clone(),
        dns_service_ip,
        storage: args.etcd.storage()?,
        endpoint_lease_ttl: args.endpoint_lease_ttl,
        ..Default::default()
    };
    let server = svcnet_apiserver::start(config)
        .await
        .context("cannot start the API server")?;
    println!(
        "API server on https://{}; kubeconfig: {}",
        server.addr(),
        server.kubeconfig_path().display()
    );
    let stop = server.shutdown_token();
    tokio::select! {
        res = super::shutdown_signal() => res?,
        () = stop.cancelled() => {}
    }
    server.shutdown().await.context("stopping the API server")
}

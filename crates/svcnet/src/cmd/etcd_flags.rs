//! kube-apiserver's etcd flags, shared by `svcnet up` and `svcnet apiserver`.

use std::path::PathBuf;
use std::time::Duration;

/// Where the API server keeps its objects: without `--etcd-servers`, the embedded redb file in
/// the data dir; with it, an etcd cluster (kube-apiserver's flags and key layout).
#[derive(Debug, Clone, clap::Args)]
pub struct EtcdFlags {
    /// etcd client URLs (comma-separated, e.g. https://10.0.0.1:2379,https://10.0.0.2:2379):
    /// keep the API objects in this etcd cluster instead of the data dir's store.redb.
    #[arg(long, value_delimiter = ',')]
    pub etcd_servers: Vec<String>,
    /// CA bundle that verifies the etcd members' serving certificates.
    #[arg(long, requires = "etcd_servers")]
    pub etcd_cafile: Option<PathBuf>,
    /// Client certificate for etcd (PEM), with --etcd-keyfile.
    #[arg(long, requires_all = ["etcd_servers", "etcd_keyfile"])]
    pub etcd_certfile: Option<PathBuf>,
    /// Client key for etcd (PEM), with --etcd-certfile.
    #[arg(long, requires_all = ["etcd_servers", "etcd_certfile"])]
    pub etcd_keyfile: Option<PathBuf>,
    /// The prefix of every key in etcd (kube-apiserver's default).
    #[arg(long, default_value = "/registry")]
    pub etcd_prefix: String,
    /// How often the API server compacts etcd's history (coordinated between API servers
    /// through the `compact_rev_key` key, as kube-apiserver does); `0s` leaves it to others.
    #[arg(long, default_value = "5m", value_parser = super::proxy::parse_duration)]
    pub etcd_compaction_interval: Duration,
    /// Serve watches from the watch cache: one etcd watch per resource and its recent events
    /// in memory (kube-apiserver's flag); `--watch-cache=false` gives every client watch its
    /// own etcd watch.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub watch_cache: bool,
    /// Events the watch cache keeps per resource; a watch from an older revision gets its own
    /// etcd watch (0: no cache for resources not in --watch-cache-sizes).
    #[arg(long, default_value_t = svcnet_store::DEFAULT_WATCH_CACHE_SIZE)]
    pub default_watch_cache_size: usize,
    /// Per-resource watch cache sizes, kube-apiserver's format: resource[.group]#size,
    /// comma-separated (services#5000,endpointslices.discovery.k8s.io#5000; 0 turns the cache
    /// off for that resource).
    #[arg(long, value_delimiter = ',')]
    pub watch_cache_sizes: Vec<String>,
}

impl EtcdFlags {
    /// The server's storage for these flags.
    pub fn storage(&self) -> anyhow::Result<svcnet_apiserver::Storage> {
        if self.etcd_servers.is_empty() {
            return Ok(svcnet_apiserver::Storage::Embedded);
        }
        self.etcd_storage()
    }

    #[cfg(feature = "etcd")]
    fn etcd_storage(&self) -> anyhow::Result<svcnet_apiserver::Storage> {
        let tls = (self.etcd_cafile.is_some() || self.etcd_certfile.is_some()).then(|| {
            svcnet_apiserver::EtcdTls {
                ca_file: self.etcd_cafile.clone(),
                cert_file: self.etcd_certfile.clone(),
                key_file: self.etcd_keyfile.clone(),
            }
        });
        for url in &self.etcd_servers {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                anyhow::bail!("--etcd-servers: {url:?} is not an http:// or https:// URL");
            }
        }
        Ok(svcnet_apiserver::Storage::Etcd(
            svcnet_apiserver::EtcdOptions {
                endpoints: self.etcd_servers.clone(),
                prefix: self.etcd_prefix.clone(),
                tls,
                compaction_interval: self.etcd_compaction_interval,
                watch_cache: svcnet_store::WatchCacheOptions {
                    enabled: self.watch_cache,
                    default_size: self.default_watch_cache_size,
                    sizes: svcnet_store::WatchCacheOptions::parse_sizes(&self.watch_cache_sizes)
                        .map_err(anyhow::Error::msg)?,
                },
                ..Default::default()
            },
        ))
    }

    #[cfg(not(feature = "etcd"))]
    fn etcd_storage(&self) -> anyhow::Result<svcnet_apiserver::Storage> {
        anyhow::bail!(
            "--etcd-servers: this svcnet was built without the `etcd` feature (cargo build \
             --features etcd, which needs protoc)"
        )
    }
}

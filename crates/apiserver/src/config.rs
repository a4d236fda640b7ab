//! [`ServerConfig`]: everything `start` needs, with Kubernetes' own defaults.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;

/// Configuration of the embedded API server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where the store (`store.redb`, unless [`ServerConfig::storage`] is etcd), the PKI
    /// (`pki/`) and the `kubeconfig` live.
    pub data_dir: PathBuf,
    /// Address to listen on. Port 0 picks a free port (see [`crate::RunningServer::addr`]).
    pub listen: SocketAddr,
    /// Address written into the `default/kubernetes` Endpoints/EndpointSlice and the kubeconfig.
    /// `None`: the listen IP, or 127.0.0.1 when listening on an unspecified address.
    pub advertise_address: Option<IpAddr>,
    /// More addresses the serving certificate names: those [`crate::RunningServer::listen_also`]
    /// will serve on once they exist (`svcnet up`'s host address on the node underlay).
    pub extra_sans: Vec<IpAddr>,
    /// Service CIDRs (one per family). The first address of the first CIDR goes to the
    /// `kubernetes` service.
    pub service_cidrs: Vec<IpNet>,
    /// NodePort range, inclusive.
    pub node_port_range: RangeInclusive<u16>,
    /// Pool for `LoadBalancer` ingress IPs. The default, 10.200.0.0/24, is a range svcnet owns
    /// and routes only into its own namespaces; nothing outside the machine uses it.
    pub lb_pool: Option<IpNet>,
    /// Cluster DNS domain (`cluster.local`).
    pub cluster_domain: String,
    /// The cluster DNS service IP; reserved so automatic allocation never hands it out.
    pub dns_service_ip: IpAddr,
    /// How often watches that asked for bookmarks get one.
    pub bookmark_interval: Duration,
    /// How long an API server's record in the `kubernetes` endpoints lives without renewal
    /// (upstream's lease reconciler: 15 s, renewed every 10 s).
    pub endpoint_lease_ttl: Duration,
    /// Largest request body accepted (413 beyond).
    pub max_body_bytes: usize,
    /// How many store events the embedded store's watch history keeps (older resourceVersions
    /// get 410). On etcd the history is what the compactor leaves: one to two
    /// `compaction_interval`s.
    pub watch_history: u64,
    /// Where container logs are, for the `pods/log` subresource (`kubectl logs`). `None`: the
    /// server runs without a node agent and answers log requests with a 400 saying so.
    pub log_source: Option<LogSource>,
    /// What a client may hold open before it has authenticated.
    pub limits: ConnectionLimits,
    /// Starts processes in pods, for `pods/exec` (`kubectl exec`, `kubectl cp`). `None`: the
    /// server runs without a node agent and answers exec requests with a 400 saying so.
    pub exec_source: Option<ExecSource>,
    /// Opens connections to ports inside pods, for `pods/portforward` (`kubectl
    /// port-forward`). `None`: the server runs without a node agent and says so (a 400).
    pub port_forward_source: Option<PortForwardSource>,
    /// Attaches to containers' running processes, for `pods/attach` (`kubectl attach`).
    /// `None`: the server runs without a node agent and says so (a 400).
    pub attach_source: Option<AttachSource>,
    /// Where the objects are kept: the embedded redb file, or an etcd cluster.
    pub storage: Storage,
}

/// The store behind the server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Storage {
    /// `data_dir/store.redb`, in this process (the default; one API server).
    #[default]
    Embedded,
    /// An etcd cluster with kube-apiserver's key layout, which several API servers can share
    /// (`--etcd-servers`); the server also runs the coordinated compactor.
    #[cfg(feature = "etcd")]
    Etcd(svcnet_store::EtcdOptions),
}

/// The container a `pods/attach` request attaches to; the server has found the pod and
/// resolved the container from its spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachTarget {
    pub namespace: String,
    pub pod: String,
    pub uid: String,
    pub container: String,
    /// The client sends input (`-i`).
    pub stdin: bool,
}

/// A container attached to.
pub struct Attached {
    /// Its output from now on, `(1 stdout | 2 stderr, bytes)`; ends when its run ends.
    pub output: tokio::sync::mpsc::Receiver<(u8, bytes::Bytes)>,
    /// Its input (when it has one and the client asked): bytes, then `None` at the client's
    /// end of input.
    pub stdin: Option<tokio::sync::mpsc::Sender<Option<bytes::Bytes>>>,
    /// Sets its terminal's rows and columns, when it runs on one (`tty: true`).
    pub resize: Option<Box<dyn Fn(u16, u16) + Send + Sync>>,
}

/// Attaches to a running container (`svcnet up` wraps the node agent's), or says why not.
#[derive(Clone)]
pub struct AttachSource(Arc<AttachStarter>);

/// The function inside an [`AttachSource`]; called on the server's runtime.
pub type AttachStarter = dyn Fn(&AttachTarget) -> Result<Attached, String> + Send + Sync;

impl AttachSource {
    pub fn new(
        f: impl Fn(&AttachTarget) -> Result<Attached, String> + Send + Sync + 'static,
    ) -> Self {
        AttachSource(Arc::new(f))
    }

    pub fn attach(&self, target: &AttachTarget) -> Result<Attached, String> {
        (self.0)(target)
    }
}

impl std::fmt::Debug for AttachSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AttachSource(..)")
    }
}

/// A port a `pods/portforward` connection wants, in a pod the server has found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortForwardTarget {
    pub namespace: String,
    pub pod: String,
    pub uid: String,
    pub port: u16,
}

/// Connects to a port on the pod's loopback from inside its network namespace, as the kubelet
/// does (`svcnet up` wraps the node agent's pod records), or says why not: the message goes to
/// kubectl on the connection's error stream.
#[derive(Clone)]
pub struct PortForwardSource(Arc<PortDialer>);

/// The function inside a [`PortForwardSource`]; it blocks while connecting.
pub type PortDialer =
    dyn Fn(&PortForwardTarget) -> Result<std::net::TcpStream, String> + Send + Sync;

impl PortForwardSource {
    pub fn new(
        f: impl Fn(&PortForwardTarget) -> Result<std::net::TcpStream, String> + Send + Sync + 'static,
    ) -> Self {
        PortForwardSource(Arc::new(f))
    }

    pub fn dial(&self, target: &PortForwardTarget) -> Result<std::net::TcpStream, String> {
        (self.0)(target)
    }
}

impl std::fmt::Debug for PortForwardSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PortForwardSource(..)")
    }
}

/// What a `pods/exec` request runs. The server has checked the pod exists and resolved the
/// container from its spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecTarget {
    pub namespace: String,
    pub pod: String,
    pub uid: String,
    pub container: String,
    pub command: Vec<String>,
    /// The client sends stdin (`-i`); otherwise the process reads `/dev/null`.
    pub stdin: bool,
    /// The process runs on a terminal (`-t`): stdout and stderr are one stream.
    pub tty: bool,
    /// The terminal's size (rows, columns) when the client sent one before the process
    /// started (kubectl sends it first), so the process never sees a default size.
    pub size: Option<(u16, u16)>,
}

/// A process an [`ExecSource`] started.
pub struct ExecProcess {
    pub child: std::process::Child,
    /// With a terminal: its master (the child's stdio is its slave, already closed here).
    /// Without: `None`, and the child's stdout and stderr (and stdin, when asked) are pipes.
    pub terminal: Option<std::fs::File>,
    /// Sets the terminal's size in rows and columns.
    pub resize: Option<Box<dyn Fn(u16, u16) + Send + Sync>>,
}

/// Starts a process in a pod (`svcnet up` wraps the node agent's exec), or says why not (a 400).
#[derive(Clone)]
pub struct ExecSource(Arc<ExecStarter>);

/// The function inside an [`ExecSource`].
pub type ExecStarter = dyn Fn(&ExecTarget) -> Result<ExecProcess, String> + Send + Sync;

impl ExecSource {
    pub fn new(
        f: impl Fn(&ExecTarget) -> Result<ExecProcess, String> + Send + Sync + 'static,
    ) -> Self {
        ExecSource(Arc::new(f))
    }

    pub fn start(&self, target: &ExecTarget) -> Result<ExecProcess, String> {
        (self.0)(target)
    }
}

impl std::fmt::Debug for ExecSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ExecSource(..)")
    }
}

/// Bounds on connections, so that no local process can exhaust the server by opening
/// connections and never finishing a handshake or a request. A client without a certificate
/// can only ask the health probes, so its connections are both counted and short-lived.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// How long a TLS handshake may take.
    pub handshake_timeout: Duration,
    /// TLS handshakes in progress at once; past it the oldest is closed. Large, because a
    /// real client's handshake must not be evicted by a flood's (each holds a socket for at
    /// most `handshake_timeout`).
    pub max_handshakes: usize,
    /// How long an HTTP/1 client without a certificate may take to send a request's headers,
    /// also while its connection is idle between requests (kube-apiserver's is 32 s).
    pub header_timeout: Duration,
    /// Connections without a client certificate open at once; past it the oldest is closed.
    pub max_unauthenticated: usize,
    /// How long a connection without a client certificate may stay open in all.
    pub unauthenticated_lifetime: Duration,
    /// HTTP/2 keep-alive: a ping after this long without traffic, and the connection closed
    /// when it is not answered in as long again (a client that went away).
    pub http2_keepalive: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            handshake_timeout: Duration::from_secs(10),
            max_handshakes: 4096,
            header_timeout: Duration::from_secs(32),
            max_unauthenticated: 256,
            unauthenticated_lifetime: Duration::from_secs(32),
            http2_keepalive: Duration::from_secs(30),
        }
    }
}

/// The container whose log a `pods/log` request wants. The server has checked the pod exists
/// and resolved `container` from its spec (the only container when the client named none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogTarget<'a> {
    pub namespace: &'a str,
    pub pod: &'a str,
    pub uid: &'a str,
    pub container: &'a str,
    /// The previous run of the container (`kubectl logs --previous`).
    pub previous: bool,
}

/// Finds the log file of a container: the file a node agent appends the container's
/// stdout/stderr to, or a message saying why there is none (served as a 400). The API server
/// does not know the agent's layout; `svcnet up` wraps `svcnet_agent::logs::find_log`.
#[derive(Clone)]
pub struct LogSource(Arc<LogLocator>);

/// The function inside a [`LogSource`].
pub type LogLocator = dyn Fn(&LogTarget<'_>) -> Result<PathBuf, String> + Send + Sync;

impl LogSource {
    pub fn new(
        f: impl Fn(&LogTarget<'_>) -> Result<PathBuf, String> + Send + Sync + 'static,
    ) -> Self {
        LogSource(Arc::new(f))
    }

    /// The log file of `target`, or why there is none.
    pub fn locate(&self, target: &LogTarget<'_>) -> Result<PathBuf, String> {
        (self.0)(target)
    }
}

impl std::fmt::Debug for LogSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LogSource(..)")
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            data_dir: PathBuf::from("svcnet-data"),
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 6443)),
            advertise_address: None,
            extra_sans: Vec::new(),
            service_cidrs: vec![IpNet::V4(
                ipnet::Ipv4Net::new(Ipv4Addr::new(10, 96, 0, 0), 12).unwrap_or_default(),
            )],
            node_port_range: 30000..=32767,
            lb_pool: Some(IpNet::V4(
                ipnet::Ipv4Net::new(Ipv4Addr::new(10, 200, 0, 0), 24).unwrap_or_default(),
            )),
            cluster_domain: "cluster.local".into(),
            dns_service_ip: IpAddr::V4(Ipv4Addr::new(10, 96, 0, 10)),
            bookmark_interval: Duration::from_secs(30),
            endpoint_lease_ttl: Duration::from_secs(15),
            max_body_bytes: 3 * 1024 * 1024,
            watch_history: 10_000,
            log_source: None,
            limits: ConnectionLimits::default(),
            exec_source: None,
            port_forward_source: None,
            attach_source: None,
            storage: Storage::Embedded,
        }
    }
}

impl ServerConfig {
    /// The address clients and the `kubernetes` service use to reach the server.
    pub fn advertise_ip(&self) -> IpAddr {
        if let Some(ip) = self.advertise_address {
            return ip;
        }
        let ip = self.listen.ip();
        if ip.is_unspecified() {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        } else {
            ip
        }
    }

    /// The `kubernetes` service's cluster IP: the first host address of the first CIDR.
    pub fn kubernetes_service_ip(&self) -> Option<IpAddr> {
        let net = self.service_cidrs.first()?;
        match net {
            IpNet::V4(n) => Some(IpAddr::V4(Ipv4Addr::from(u32::from(n.network()) + 1))),
            IpNet::V6(n) => Some(IpAddr::V6(std::net::Ipv6Addr::from(
                u128::from(n.network()) + 1,
            ))),
        }
    }
}

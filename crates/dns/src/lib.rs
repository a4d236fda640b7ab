//! Cluster DNS per the Kubernetes DNS-based service discovery specification (schema 1.1.0), and
//! environment-variable service discovery as the kubelet injects it.
//!
//! The crate is split as hickory-dns teaches: [`zone`] is pure data (API objects in, an
//! immutable index out, question → answer with no I/O); [`envvars`] is a pure function for the
//! kubelet's service variables. It never writes to the API server.

pub mod envvars;
pub mod fake_upstream;
pub mod fixtures;
mod http;
pub mod nodelocal;
mod replay;
pub mod resolvconf;
pub mod rule_table;
pub mod server;
pub mod watch;
pub mod zone;

pub use envvars::{ServiceEnv, service_env_vars};
pub use resolvconf::{ResolvConf, pod_resolv_conf};
pub use server::{DnsError, DnsServer, Observer, ZoneHandle};
pub use watch::{DnsConfig, RunningDns, run, start};
pub use zone::{
    Addresses, ExternalZones, Objects, Outcome, PluginOptions, PodMode, Response, Zone, ZoneConfig,
    parse_ttl,
};

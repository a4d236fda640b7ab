//! `svcnet cni`: the pod network as a CNI plugin binary (cni.dev SPEC 1.0/1.1), for a kubelet's
//! container runtime or svcnet's own node agent. It reads the `CNI_*` environment and the
//! network configuration on stdin, prints the result (or the SPEC's error object) on stdout and
//! exits 0 (or 1). Installed as `/opt/cni/bin/svcnet`, the runtime starts it with no
//! arguments: `svcnet` with `CNI_COMMAND` set and no arguments is this subcommand.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::process::ExitCode;

/// The CNI plugin (no options: the SPEC passes everything in the environment and on stdin).
#[derive(Debug, clap::Args)]
#[command(
    long_about = "The pod network as a CNI plugin (SPEC 1.0 and 1.1): ADD, DEL, CHECK, STATUS, GC \
    and VERSION from CNI_COMMAND, CNI_CONTAINERID, CNI_NETNS and CNI_IFNAME, the network \
    configuration on stdin, the result or error object on stdout. A runtime that finds this \
    binary as /opt/cni/bin/svcnet starts it without arguments, which works the same."
)]
pub struct Args {}

/// True when this process was started the way a runtime starts a CNI plugin: `CNI_COMMAND`
/// set and no arguments.
pub fn started_as_plugin() -> bool {
    std::env::args_os().len() == 1 && std::env::var_os("CNI_COMMAND").is_some()
}

/// Serves one CNI call and returns the exit code. Synchronous: no runtime, no logging on
/// stdout (stdout is the result).
pub fn run() -> ExitCode {
    let env: BTreeMap<String, String> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| k.starts_with("CNI_"))
        .collect();
    let mut stdin = Vec::new();
    let (out, code) = match std::io::stdin().read_to_end(&mut stdin) {
        Ok(_) => svcnet_agent::cni::invoke(&env, &stdin),
        Err(e) => {
            let err = svcnet_agent::cni::CniError::new(
                svcnet_agent::cni::ErrorCode::Io,
                "cannot read the network configuration from stdin",
            )
            .with_details(e.to_string());
            let version = svcnet_agent::cni::types::DEFAULT_VERSION;
            (err.to_json(version).to_string(), 1)
        }
    };
    let mut stdout = std::io::stdout().lock();
    if stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
        .is_err()
    {
        return ExitCode::FAILURE;
    }
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

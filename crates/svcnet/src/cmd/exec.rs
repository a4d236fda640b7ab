//! `svcnet exec POD [-n NS] [-c CONTAINER] -- CMD...`: runs a command inside a running pod's
//! network namespace and mount namespace (its resolv.conf and hosts), with its hostname and the
//! container's environment, as `kubectl exec` would. Reads the agent's pod record from the data
//! dir; needs root (it enters namespaces). Exits with the command's exit code.

use std::path::PathBuf;

use anyhow::Context;

/// Flags of `svcnet exec`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The pod's name.
    pub pod: String,
    /// The pod's namespace.
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    /// Whose environment to use (default: the first container).
    #[arg(short = 'c', long)]
    pub container: Option<String>,
    /// The data dir of `svcnet up`.
    #[arg(long, default_value = "svcnet-data", env = "SVCNET_DATA_DIR", long_help = crate::cmd::DATA_DIR_HELP)]
    pub data_dir: PathBuf,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true, num_args = 1..)]
    pub command: Vec<String>,
}

pub async fn run(mut args: Args) -> anyhow::Result<()> {
    args.data_dir = crate::cmd::absolute_data_dir(&args.data_dir)?;
    let record = svcnet_agent::exec::find_pod(&args.data_dir, &args.namespace, &args.pod)?;
    let mut cmd =
        svcnet_agent::exec::exec_command(&record, args.container.as_deref(), &args.command, false)?;
    let program = args.command.join(" ");
    let status = tokio::task::spawn_blocking(move || cmd.status())
        .await
        .context("exec task")?
        .with_context(|| format!("running `{program}` in pod {}/{}", args.namespace, args.pod))?;
    match status.code() {
        Some(0) => Ok(()),
        Some(code) => std::process::exit(code),
        None => std::process::exit(
            128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0),
        ),
    }
}

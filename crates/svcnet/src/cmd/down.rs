//! `svcnet down`: removes every namespace, link and route `svcnet up` created (also after a
//! crash or `kill -9`: it reads `<data-dir>/topology.json` and finds `<prefix>-*` namespaces and
//! `<prefix>0`/`<prefix>n<i>` links by name), killing the processes left inside them. The
//! data dir (API objects, allocations, logs) survives; `svcnet up` again restarts the pods.

use std::path::PathBuf;

use anyhow::Context;

/// Flags of `svcnet down`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The data dir of `svcnet up`.
    #[arg(long, default_value = "svcnet-data", env = "SVCNET_DATA_DIR", long_help = crate::cmd::DATA_DIR_HELP)]
    pub data_dir: PathBuf,
    /// The name prefix `svcnet up` used for namespaces and links.
    #[arg(long, default_value = "svcnet")]
    pub prefix: String,
}

pub async fn run(mut args: Args) -> anyhow::Result<()> {
    args.data_dir = crate::cmd::absolute_data_dir(&args.data_dir)?;
    // Calico BGP's speakers first (by pid file), while their namespaces still exist.
    let speakers = svcnet_agent::podnet::bgp::cleanup_speakers(&args.data_dir)
        .context("stopping leftover BGP speakers")?;
    let (dir, prefix) = (args.data_dir.clone(), args.prefix.clone());
    let report =
        tokio::task::spawn_blocking(move || svcnet_agent::topology::cleanup(&dir, &prefix))
            .await
            .context("cleanup task")?
            .with_context(|| {
                format!(
                    "removing svcnet's namespaces and links (prefix {:?})",
                    args.prefix
                )
            })?;
    println!("svcnet down: {report}");
    if !speakers.killed.is_empty() || !speakers.routes.is_empty() {
        println!(
            "  stopped {} BGP speakers, removed {} BGP routes",
            speakers.killed.len(),
            speakers.routes.len()
        );
    }
    for ns in &report.namespaces {
        println!("  namespace {ns}");
    }
    for link in &report.links {
        println!("  link {link}");
    }
    Ok(())
}

//! `svcnet proxy`.

/// Flags of `svcnet proxy`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("svcnet proxy is not built yet")
}

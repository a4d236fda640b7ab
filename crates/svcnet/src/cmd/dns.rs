//! `svcnet dns`.

/// Flags of `svcnet dns`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("svcnet dns is not built yet")
}

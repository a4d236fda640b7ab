//! `svcnet exec`.

/// Flags of `svcnet exec`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("svcnet exec is not built yet")
}

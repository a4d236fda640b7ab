//! `svcnet env`.

/// Flags of `svcnet env`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("svcnet env is not built yet")
}

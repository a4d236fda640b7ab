//! `svcnet down`.

/// Flags of `svcnet down`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("svcnet down is not built yet")
}

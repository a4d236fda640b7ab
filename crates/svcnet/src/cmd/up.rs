//! `svcnet up`.

/// Flags of `svcnet up`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub async fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("svcnet up is not built yet")
}

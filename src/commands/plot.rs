//! `ember plot`: draw a training run's loss curves to a PNG.

use anyhow::Context as _;

use crate::Context;

/// Flags of `ember plot`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Run directory containing metrics.jsonl; loss.png is written next to it.
    pub run_dir: std::path::PathBuf,
}

/// Runs `ember plot`.
pub fn run(args: Args, ctx: &Context) -> anyhow::Result<()> {
    let path = ember_training::plot_run(&args.run_dir)
        .with_context(|| format!("plotting the run in {}", args.run_dir.display()))?;
    if !ctx.quiet {
        stderr!("wrote {}", path.display());
    }
    Ok(())
}

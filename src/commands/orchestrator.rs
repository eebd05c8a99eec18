//! `ember orchestrator`: the rendezvous of a multi-machine data-parallel run (burn-collective's global
//! orchestrator). Every machine's `ember train` registers with it through `training.nodes.orchestrator`; it
//! pairs the nodes for their gradient all-reduces and runs until Ctrl-C or SIGTERM.

use anyhow::Context as _;

use crate::Context;

/// Flags of `ember orchestrator`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// TCP port to listen on for the nodes' WebSocket connections.
    #[arg(long, default_value_t = 3000)]
    pub port: u16,
}

/// Runs `ember orchestrator` until interrupted.
pub fn run(args: Args, ctx: &Context) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the orchestrator's async runtime")?;
    if !ctx.quiet {
        stderr!(
            "orchestrator listening on port {} (nodes set training.nodes.orchestrator: \"ws://<this host>:{}\")",
            args.port,
            args.port
        );
    }
    runtime.block_on(burn_collective::start_global_orchestrator(args.port));
    Ok(())
}

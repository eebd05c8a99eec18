//! The `ember` command line: train, run, inspect and benchmark decoder-only language models.

// The doc comments of the command-line types are clap's help text, written for a terminal: `[default: none,
// required]` and `<name>` are what `--help` prints, not rustdoc links or HTML.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

mod allocator;
mod backend;
mod cli;
mod commands;
mod config;
mod logging;

use std::process::ExitCode;

use clap::Parser;

pub use cli::Context;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    if cli.command.trains() {
        allocator::keep_freed_buffers();
    }
    let ctx = cli.context();
    logging::init(cli.command.default_log_level(&ctx));
    if let Some(threads) = cli.threads
        && let Err(e) = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build_global()
    {
        eprintln!("error: --threads {threads}: {e}");
        return ExitCode::from(2);
    }
    match commands::run(cli.command, &ctx) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

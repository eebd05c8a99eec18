//! The `ember` command line: train, run, inspect and benchmark decoder-only language models.

// The doc comments of the command-line types are clap's help text, written for a terminal: `[default: none,
// required]` and `<name>` are what `--help` prints, not rustdoc links or HTML.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

/// `eprintln!` that ignores a failed write: a closed or broken stderr (`ember ... 2>&-`) must not turn a status
/// line or an error message into a panic, and there is nowhere left to report that the report failed.
macro_rules! stderr {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod allocator;
mod backend;
mod cli;
mod commands;
mod config;
mod flags;
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
        stderr!("error: --threads {threads}: {e}");
        return ExitCode::from(2);
    }
    match commands::run(cli.command, &ctx) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of stdout went away (`ember info --json | head`): what it read is what it wanted.
        Err(err) if closed_stdout(&err) => ExitCode::SUCCESS,
        Err(err) => {
            stderr!("error: {}", error_message(&err));
            ExitCode::FAILURE
        }
    }
}

/// Whether `err` is (or was caused by) writing to a stdout whose reader has closed it. Only a
/// [`commands::StdoutError`] counts: a broken pipe to another machine of a training run is a real failure.
fn closed_stdout(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<commands::StdoutError>()
            .is_some_and(commands::StdoutError::is_closed_pipe)
    })
}

/// `err` and its causes joined with `: `, each cause once. Library errors spell out their cause in their own
/// message (so `to_string()` alone says everything) and also expose it as `source()`, so printing the whole chain
/// would repeat it; a cause already contained in the text so far is skipped.
fn error_message(err: &anyhow::Error) -> String {
    let mut message = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if message.contains(&text) {
            continue;
        }
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(&text);
    }
    message
}

#[cfg(test)]
mod tests {
    use super::error_message;

    #[derive(Debug, thiserror::Error)]
    #[error("{path}: {source}")]
    struct Io {
        path: String,
        source: std::io::Error,
    }

    #[test]
    fn a_cause_already_in_the_message_is_printed_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no config.json");
        let err = anyhow::Error::new(Io {
            path: "m/config.json".into(),
            source: io,
        })
        .context("reading the model config of m");
        assert_eq!(
            error_message(&err),
            "reading the model config of m: m/config.json: no config.json"
        );
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_message(&plain), "outer: inner");
    }
}

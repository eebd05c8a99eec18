//! The binary's log output: records from ember's dependencies (burn-collective's nodes and orchestrator log
//! through `log` and `tracing`) go to stderr, filtered by `RUST_LOG` or the command's default level.
//!
//! burn-communication installs a global subscriber at `info` the first time it starts a server, which would print
//! a line for every tensor a training node sends; installing ours first (a process has one) keeps that choice
//! here.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// CubeCL logs "Task failed: Any { .. }" when a device thread panics, e.g. while the backend probe tries CUDA on a
/// machine without an NVIDIA driver. The line carries no reason (the probe reports the panic's own message) and
/// would otherwise start every `--backend auto` run of a CUDA build on such a machine.
const QUIET_TARGETS: &str = "cubecl_common::device::handle::channel=error";

/// Installs the process's subscriber: `RUST_LOG` when set and valid, else `default` (e.g. `"warn"`).
pub fn init(default: &str) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("{default},{QUIET_TARGETS}")));
    // Fails only when a subscriber is already installed, which leaves that one in place.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only where a terminal shows them, not in logs or pipes.
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

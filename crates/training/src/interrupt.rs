//! Ctrl-C handling: the first SIGINT/SIGTERM raises a flag the loop checks after each step (it then writes a
//! checkpoint and returns); a second one terminates the process at once.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use signal_hook::consts::{SIGINT, SIGTERM};

use crate::TrainError;

/// Installs the handlers and returns the flag to pass to [`train`](crate::train).
pub fn interrupt_flag() -> Result<Arc<AtomicBool>, TrainError> {
    let flag = Arc::new(AtomicBool::new(false));
    for signal in [SIGINT, SIGTERM] {
        let install = |e: std::io::Error| TrainError::External {
            context: format!("installing the handler for signal {signal}"),
            source: Box::new(e),
        };
        // Order matters: the shutdown hook sees the flag before this signal's own handler sets it, so only a
        // second signal (flag already set) exits.
        signal_hook::flag::register_conditional_shutdown(signal, 130, Arc::clone(&flag))
            .map_err(install)?;
        signal_hook::flag::register(signal, Arc::clone(&flag)).map_err(install)?;
    }
    Ok(flag)
}

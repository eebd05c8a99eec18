//! Resident memory of this process, from Linux's `/proc/self/status`.
//!
//! `VmHWM` is the peak resident set size since the process started, or since the peak was last reset by writing
//! `5` to `/proc/self/clear_refs` (Linux 4.0+). Resetting before a phase (after the model is loaded, say) makes
//! the next reading the peak of that phase alone, which still counts the weights that stay resident.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::BenchError;

const STATUS: &str = "/proc/self/status";
const CLEAR_REFS: &str = "/proc/self/clear_refs";

/// What a peak-memory figure covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PeakScope {
    /// The peak since the measured phase began (the kernel's peak counter was reset at its start).
    Phase,
    /// The peak since the process started (the reset was not available).
    Process,
}

pub use ember_training::parse_status_bytes;

fn read_status_bytes(key: &str) -> Result<Option<u64>, BenchError> {
    if !Path::new(STATUS).exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(STATUS).map_err(|source| BenchError::Io {
        path: STATUS.into(),
        source,
    })?;
    Ok(parse_status_bytes(&text, key))
}

/// Peak resident set size of this process in bytes (`VmHWM`), or `None` where `/proc` does not report it.
pub fn peak_rss_bytes() -> Result<Option<u64>, BenchError> {
    read_status_bytes("VmHWM")
}

/// Current resident set size of this process in bytes (`VmRSS`), or `None` where `/proc` does not report it.
pub fn current_rss_bytes() -> Result<Option<u64>, BenchError> {
    read_status_bytes("VmRSS")
}

/// Resets the peak resident set size to the current one, so the next [`peak_rss_bytes`] covers only what runs
/// after this call. Returns the scope later peaks will have: [`PeakScope::Process`] when the kernel refuses.
pub fn reset_peak_rss() -> PeakScope {
    match std::fs::write(CLEAR_REFS, "5") {
        Ok(()) => PeakScope::Phase,
        Err(_) => PeakScope::Process,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_is_at_least_current_on_linux() {
        // Current first: the kernel computes VmHWM as max(recorded peak, RSS at read time), so a later peak
        // reading can never be below an earlier RSS reading.
        let now = current_rss_bytes().unwrap();
        if let (Some(peak), Some(now)) = (peak_rss_bytes().unwrap(), now) {
            assert!(now > 0 && peak >= now, "VmHWM {peak} < VmRSS {now}");
        }
    }
}

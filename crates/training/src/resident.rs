//! This process's resident memory, from Linux's `/proc/self/status`: the peak (`VmHWM`) goes into the metrics
//! log, so a run says how much host memory it needed without an outside tool.

/// A value in bytes from a `/proc/<pid>/status` text: `key` names a line such as `VmHWM: 123456 kB`.
pub fn parse_status_bytes(status: &str, key: &str) -> Option<u64> {
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))?;
    let mut parts = line.split_whitespace();
    let value: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") => value.checked_mul(1024),
        None => Some(value),
        Some(_) => None,
    }
}

/// Peak resident set size of this process in bytes, or `None` where `/proc` does not report it (not Linux, or
/// unreadable): a missing figure must not stop a training run.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_status_bytes(&status, "VmHWM")
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS_SAMPLE: &str = "Name:\tember\nVmPeak:\t 2048000 kB\nVmHWM:\t  524288 kB\nVmRSS:\t  262144 kB\n\
                                 Threads:\t4\n";

    #[test]
    fn status_values_are_converted_from_kib() {
        assert_eq!(
            parse_status_bytes(STATUS_SAMPLE, "VmHWM"),
            Some(524288 * 1024)
        );
        assert_eq!(
            parse_status_bytes(STATUS_SAMPLE, "VmRSS"),
            Some(262144 * 1024)
        );
        assert_eq!(parse_status_bytes(STATUS_SAMPLE, "Threads"), Some(4));
        // `VmHWM` must not match a longer key that starts the same way.
        assert_eq!(parse_status_bytes(STATUS_SAMPLE, "Vm"), None);
        assert_eq!(parse_status_bytes(STATUS_SAMPLE, "VmSwap"), None);
    }

    #[test]
    fn the_peak_covers_a_fresh_allocation_on_linux() {
        if !std::path::Path::new("/proc/self/status").exists() {
            eprintln!("skipped: no /proc/self/status on this system");
            return;
        }
        // 64 MiB touched page by page are resident at once, so the peak is at least that.
        let block = vec![1u8; 64 << 20];
        std::hint::black_box(&block);
        let peak = peak_rss_bytes().expect("VmHWM on Linux");
        assert!(peak >= 64 << 20, "VmHWM {peak} bytes after touching 64 MiB");
    }
}

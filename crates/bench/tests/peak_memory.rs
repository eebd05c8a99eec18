//! Per-phase peak resident memory. A separate test binary (its own process), so other tests' allocations cannot
//! move this process's peak.

use ember_bench::memory::{PeakScope, current_rss_bytes, peak_rss_bytes, reset_peak_rss};

const MIB: u64 = 1 << 20;

#[test]
fn resetting_the_peak_forgets_an_earlier_larger_allocation() {
    let Some(before) = peak_rss_bytes().unwrap() else {
        eprintln!("skipping: this OS does not report VmHWM");
        return;
    };
    // Touch 256 MiB so that it is resident, then free it.
    let big = vec![1u8; 256 * MIB as usize];
    std::hint::black_box(&big);
    drop(big);
    let with_spike = peak_rss_bytes().unwrap().unwrap();
    assert!(
        with_spike >= before.max(256 * MIB),
        "peak {with_spike} did not see the 256 MiB allocation"
    );
    if reset_peak_rss() == PeakScope::Process {
        eprintln!("skipping: the kernel refused to reset the peak (/proc/self/clear_refs)");
        return;
    }
    let after = peak_rss_bytes().unwrap().unwrap();
    let now = current_rss_bytes().unwrap().unwrap();
    // After the reset the peak restarts from the current RSS; the test harness's own threads may allocate a
    // little meanwhile, so allow 64 MiB of slack, far below the 256 MiB spike it must have forgotten.
    assert!(
        after <= now + 64 * MIB,
        "peak {after} after reset, RSS {now}"
    );
    assert!(
        after + 128 * MIB <= with_spike,
        "peak {after} after reset still includes the {with_spike} spike"
    );
    // A new, smaller spike after the reset is what the next reading reports.
    let small = vec![1u8; 96 * MIB as usize];
    std::hint::black_box(&small);
    let phase = peak_rss_bytes().unwrap().unwrap();
    assert!(
        phase >= 96 * MIB && phase < with_spike,
        "phase peak {phase}, earlier spike {with_spike}"
    );
}

//! The C allocator's settings for ember's workload.
//!
//! A training step frees and allocates the same activation and gradient buffers (hundreds of kilobytes to a few
//! megabytes) every step. glibc's defaults serve them with fresh `mmap`ed pages until its adaptive threshold
//! catches up, and give the freed top of the heap back to the kernel, so each step faulted its buffers in again:
//! 5.3 million minor page faults in a 4.5-minute run of the Tiny Shakespeare config, and 20-25% of a step's time
//! (docs/BENCHMARKS.md). Buffers below 32 MiB (the largest threshold glibc documents for 64-bit systems) now come
//! from the heap, and up to 256 MiB of freed heap is kept for reuse; larger buffers are still mapped and unmapped
//! on their own.
//!
//! Only commands that train apply it: memory an inference command frees after loading (the f32 weights a
//! quantized model replaced) would stay resident (measured: 661 instead of 392 MiB peak for int8 SmolLM2-135M).

/// Applies the settings; called in `main` before the command starts any thread.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn keep_freed_buffers() {
    const MMAP_THRESHOLD: libc::c_int = 32 << 20;
    const TRIM_THRESHOLD: libc::c_int = 256 << 20;
    // SAFETY: `mallopt` only changes allocator parameters; no other thread is allocating yet. A refused setting
    // (return value 0) leaves glibc's default in place, which is correct, only slower.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
    }
}

/// Other allocators keep their defaults.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn keep_freed_buffers() {}

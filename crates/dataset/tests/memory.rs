//! A corpus larger than the memory the test allows itself: mapped shards must only load the pages read.
//!
//! Alone in its own test binary so no other test's allocations disturb the resident-set measurement.

mod common;

use std::sync::Arc;

use ember_dataset::{RandomBatches, ReaderState, Split, TokenDataset};

/// A field of `/proc/self/status` (e.g. `VmRSS`, `RssAnon`) in bytes.
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// Drops `path` from the page cache, as if it had never been read: what a corpus larger than RAM looks like.
fn evict_from_page_cache(path: &std::path::Path) {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).unwrap();
    // The shard writer fsyncs, so every page is clean and POSIX_FADV_DONTNEED can drop all of them.
    // SAFETY: plain syscall on a file descriptor we own for the duration of the call.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0);
}

#[test]
#[cfg(target_os = "linux")]
fn random_batches_from_a_256_mib_corpus_keep_resident_memory_small() {
    const TOKENS: u64 = 64 << 20; // 64 Mi u32 tokens = 256 MiB on disk, in 4 shards of 64 MiB
    let dir = tempfile::tempdir().unwrap();
    common::positional_corpus(dir.path(), TOKENS, 1_000, TOKENS / 4);
    let mut corpus_bytes = 0;
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        corpus_bytes += std::fs::metadata(&path).unwrap().len();
        evict_from_page_cache(&path);
    }
    assert!(corpus_bytes > 256 << 20);

    let (rss_before, anon_before) = (status_bytes("VmRSS"), status_bytes("RssAnon"));
    let dataset = Arc::new(TokenDataset::open(dir.path(), Split::Train).unwrap());
    assert_eq!(dataset.len(), TOKENS);
    let mut reader = RandomBatches::new(dataset, ReaderState::new(0, 16, 256)).unwrap();
    for _ in 0..100 {
        let batch = reader.next_batch().unwrap();
        // The content is checked, so the pages really are read: each row holds its own positions.
        assert_eq!(batch.targets[255], batch.inputs[0] + 256);
    }
    let rss = status_bytes("VmRSS").saturating_sub(rss_before);
    let anon = status_bytes("RssAnon").saturating_sub(anon_before);
    println!("corpus {corpus_bytes} bytes; resident grew {rss} bytes, anonymous {anon} bytes");
    // 1,600 windows of 1,028 bytes touch at most 2 pages each: 12.5 MiB of file pages at most (random advice
    // turns off read-ahead; fault-around maps only pages already cached). Loading the corpus would add 256 MiB.
    // Bound: 32 MiB, an eighth of the corpus.
    assert!(
        rss < 32 << 20,
        "resident memory grew by {rss} bytes reading a {corpus_bytes}-byte corpus"
    );
    // The heap only holds a batch at a time (2 x 16 KiB) plus allocator slack: 4 MiB is generous.
    assert!(anon < 4 << 20, "anonymous memory grew by {anon} bytes");
}

//! Shared helpers for the fixture-based tests.

#![allow(dead_code)]

use std::path::PathBuf;

/// `tests/fixtures/<name>`.
pub fn fixture(name: &str) -> PathBuf {
    std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    )
    .join("tests/fixtures")
    .join(name)
}

/// The fixture JSON `<name>` parsed.
pub fn fixture_json(name: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(name)).unwrap()).unwrap()
}

/// Tiny Shakespeare.
pub fn corpus() -> String {
    std::fs::read_to_string(
        std::path::PathBuf::from(
            std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
        )
        .join("../../data/tinyshakespeare.txt"),
    )
    .unwrap()
}

/// FNV-1a 64 over the ids as little-endian u32 bytes, formatted as the fixture script writes it.
pub fn fnv1a64(ids: &[u32]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for id in ids {
        for b in id.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// `.cache/assets/gpt2.tiktoken`, or `None` (with a message saying the test is skipped) when it is absent.
pub fn gpt2_ranks() -> Option<PathBuf> {
    let path = std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    )
    .join("../../.cache/assets/gpt2.tiktoken");
    if path.is_file() {
        Some(path)
    } else {
        eprintln!(
            "SKIPPED: {} is absent; run ./scripts/fetch_gpt2_tiktoken.sh",
            path.display()
        );
        None
    }
}

/// A fixture's id lists as vectors.
pub fn id_lists(v: &serde_json::Value) -> Vec<Vec<u32>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|ids| {
            ids.as_array()
                .unwrap()
                .iter()
                .map(|i| i.as_u64().unwrap() as u32)
                .collect()
        })
        .collect()
}

/// A fixture's string list.
pub fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

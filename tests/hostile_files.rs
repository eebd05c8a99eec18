//! The allocation bound, end to end: `ember info` on a GGUF file whose header claims huge sizes, run under a small
//! address-space limit (`RLIMIT_AS`), must exit with status 1 and an error naming the file, not abort on a failed
//! allocation or die by a signal. A valid file under the same limit is the control: it shows the limit leaves
//! room for the binary itself, so a failure of the hostile cases is the reader's allocation, not the limit.
//!
//! Linux with glibc only (`setrlimit` through `libc`, a dependency of the binary on that target).

#![cfg(all(target_os = "linux", target_env = "gnu"))]

#[path = "../crates/model/tests/gguf_writer/mod.rs"]
mod gguf_writer;

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::Command;

/// The address-space limit of the child: far above what `ember info` needs, far below what a reader believing
/// the hostile headers would reserve.
const LIMIT_BYTES: u64 = 1 << 30;

/// Runs `ember info --model path` under [`LIMIT_BYTES`] of address space; returns the exit code (`None` when a
/// signal ended it, with the signal) and stderr.
fn info_under_limit(path: &Path) -> (Option<i32>, Option<i32>, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ember"));
    cmd.args(["--quiet", "--backend", "cpu", "info", "--model"])
        .arg(path);
    // SAFETY: the closure runs in the forked child before exec and only calls `setrlimit`, which is
    // async-signal-safe; it allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: LIMIT_BYTES,
                rlim_max: LIMIT_BYTES,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().expect("ember runs");
    (
        out.status.code(),
        out.status.signal(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn u32_le(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn u64_le(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn string(out: &mut Vec<u8>, s: &str) {
    u64_le(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// A GGUF v3 header with `n_tensors` tensors and these metadata entries (already encoded as type + value).
fn gguf(n_tensors: u64, metadata: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    u32_le(&mut out, 3);
    u64_le(&mut out, n_tensors);
    u64_le(&mut out, metadata.len() as u64);
    for (key, value) in metadata {
        string(&mut out, key);
        out.extend_from_slice(value);
    }
    out
}

fn str_value(s: &str) -> Vec<u8> {
    let mut v = 8u32.to_le_bytes().to_vec();
    string(&mut v, s);
    v
}

/// Writes `header` to `dir/name`, then extends the file to `len` bytes (sparse: zeros that take no disk).
fn write_file(dir: &Path, name: &str, header: &[u8], len: u64) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, header).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(len.max(header.len() as u64)).unwrap();
    path
}

fn assert_refused(path: &Path, expect: &str) {
    let (code, signal, stderr) = info_under_limit(path);
    let name = path.file_name().unwrap().to_string_lossy();
    assert_eq!(
        (code, signal),
        (Some(1), None),
        "{name}: expected exit status 1, no signal; stderr: {stderr}"
    );
    assert!(
        stderr.contains(&*name) && stderr.contains(expect),
        "{name}: the error names the file and says {expect:?}: {stderr}"
    );
}

#[test]
fn a_metadata_array_claiming_more_elements_than_memory_is_refused_under_a_memory_limit() {
    let dir = tempfile::tempdir().unwrap();
    // 40 million one-byte elements, backed by 40 MB of (zero) file: each element fits the file, but as 32-byte
    // values they need 1.28 GB, past the limit. Before the element budget, the reader reserved them all at once
    // and the allocation failure aborted the process.
    let n: u64 = 40_000_000;
    let mut array = 9u32.to_le_bytes().to_vec();
    u32_le(&mut array, 0);
    u64_le(&mut array, n);
    let header = gguf(
        0,
        &[
            ("general.architecture", str_value("llama")),
            ("big.array", array),
        ],
    );
    let path = write_file(
        dir.path(),
        "hostile-array.gguf",
        &header,
        header.len() as u64 + n,
    );
    assert_refused(&path, "big.array");
}

#[test]
fn huge_counts_and_lengths_are_refused_under_a_memory_limit() {
    let dir = tempfile::tempdir().unwrap();
    // A tensor count of 2^60 and a metadata count of 2^60.
    let header = gguf(1 << 60, &[("general.architecture", str_value("llama"))]);
    let path = write_file(dir.path(), "hostile-tensor-count.gguf", &header, 4096);
    assert_refused(&path, "tensor and metadata counts");
    let mut header = gguf(0, &[]);
    header[16..24].copy_from_slice(&(1u64 << 60).to_le_bytes());
    let path = write_file(dir.path(), "hostile-metadata-count.gguf", &header, 4096);
    assert_refused(&path, "tensor and metadata counts");
    // A string claiming 2^62 bytes.
    let mut header = gguf(0, &[]);
    header[16..24].copy_from_slice(&1u64.to_le_bytes());
    u64_le(&mut header, 1 << 62);
    let path = write_file(dir.path(), "hostile-string.gguf", &header, 4096);
    assert_refused(&path, "metadata key #0");
    // An array of 2^40 strings (each needs at least its 8-byte length).
    let mut array = 9u32.to_le_bytes().to_vec();
    u32_le(&mut array, 8);
    u64_le(&mut array, 1 << 40);
    let header = gguf(0, &[("tokenizer.ggml.tokens", array)]);
    let path = write_file(dir.path(), "hostile-strings.gguf", &header, 1 << 20);
    assert_refused(&path, "tokenizer.ggml.tokens");
}

#[test]
fn a_valid_file_is_read_under_the_same_limit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("valid.gguf");
    std::fs::write(&path, gguf_writer::tiny_llama_file().0).unwrap();
    let (code, signal, stderr) = info_under_limit(&path);
    assert_eq!((code, signal), (Some(0), None), "{stderr}");
}

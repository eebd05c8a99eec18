//! Helpers every CLI test file shares: the binary under test, run as a user would, and the repository's fixtures.

// Each test file is its own crate and uses some of these.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// The `ember` binary cargo built for these tests, without arguments. `EMBER_BACKEND` is cleared so that a
/// developer's environment does not choose the backend of a test: a test that needs one passes `--backend`.
pub fn ember() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ember"));
    cmd.env_remove("EMBER_BACKEND");
    cmd
}

/// [`ember`] on the CPU backend, which every machine has, with progress output off.
pub fn ember_cpu() -> Command {
    let mut cmd = ember();
    cmd.args(["--quiet", "--backend", "cpu"]);
    cmd
}

/// Runs `ember args` to completion.
pub fn run(args: &[&str]) -> Output {
    ember().args(args).output().expect("the ember binary runs")
}

/// Runs `ember --quiet --backend cpu args` to completion.
pub fn run_cpu(args: &[&str]) -> Output {
    ember_cpu()
        .args(args)
        .output()
        .expect("the ember binary runs")
}

/// `out`, once asserted to be a success (the failure shows ember's stderr).
pub fn ok(out: Output) -> Output {
    assert!(
        out.status.success(),
        "ember failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The file at `path` under the repository root: a committed fixture (`crates/*/tests/fixtures`), the corpus in
/// `data/`, or an asset a script fetches into `.cache/assets` (tests that need one skip without it).
pub fn fixture(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The committed model fixture `name`: a model directory (`llama3`), a file in one
/// (`phi3/expected.safetensors`) or a bare config (`configs/llama3_8b.json`).
pub fn model_fixture(name: &str) -> PathBuf {
    fixture(&format!("crates/model/tests/fixtures/{name}"))
}

/// The tiny llama.cpp-converted GGUF file of architecture family `name` (`llama`, `qwen2`, ...), written by
/// scripts/fixtures/gguf_family_fixtures.py.
pub fn gguf_fixture(name: &str) -> PathBuf {
    model_fixture(&format!("gguf_families/{name}.gguf.bin"))
}

/// The committed tokenizer fixture `name` (`llama3_style.tokenizer.json`, ...).
pub fn tokenizer_fixture(name: &str) -> PathBuf {
    fixture(&format!("crates/tokenizer/tests/fixtures/{name}"))
}

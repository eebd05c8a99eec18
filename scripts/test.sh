#!/usr/bin/env bash
# The test command of the README: installs what the tests need (system packages, the openai client in .venv), fetches the assets the oracle tests compare
# against (GPT-2 tiktoken ranks, SmolLM2-135M GGUF), then runs every test of the workspace.
#
# The wgpu backend is compiled into the libraries' GPU tests (`ember-bench/wgpu`, which enables the model's and
# attention crate's), so crates/model/tests/wgpu_backend.rs, crates/attention/tests/cube_kernel.rs and
# crates/bench/tests/wgpu_bench.rs run the GPU code path (attention kernels forward and backward, a model forward
# in f32 and int4, the bench's device memory) on Mesa's software Vulkan and compare it with cpu on every run. The
# `ember` binary is built without wgpu: every subcommand monomorphised for a second backend cost ~8 CPU-minutes of
# every build and proved nothing the library tests do not (clippy --all-features still checks that code).
# Every other test runs on cpu (flex).
#
# Usage: bash scripts/test.sh [extra cargo test args], e.g. `bash scripts/test.sh --test wgpu_backend`
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/ember-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# lavapipe's loader wants a writable runtime dir; without one it prints a warning on every start.
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp/ember-xdg-$(id -u)}"
mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"

bash scripts/install_deps.sh
bash scripts/install_python.sh
bash scripts/fetch_assets.sh

cargo test --workspace --features ember-bench/wgpu "$@"

#!/usr/bin/env bash
# The test command of the README: installs what the tests need, fetches the assets the oracle tests compare
# against (GPT-2 tiktoken ranks, SmolLM2-135M GGUF), then runs every test of the workspace.
#
# The wgpu backend is compiled in, so tests/wgpu_backend.rs runs the GPU code path (attention kernels, a model
# forward, a training step) on Mesa's software Vulkan and compares it with cpu on every run; every other test
# runs on cpu (flex), which `--backend auto` picks because it skips software-emulated GPUs.
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
bash scripts/fetch_assets.sh

cargo test --workspace --features ember/wgpu "$@"

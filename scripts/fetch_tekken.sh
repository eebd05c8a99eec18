#!/usr/bin/env bash
# Takes Mistral's Tekken tokenizer (Mistral NeMo's `tekken_240718.json`, shipped inside the PyPI package
# `mistral-common`, pinned, which scripts/install_python.sh installs into .venv) and converts it with transformers' own converter (`convert_tekken_tokenizer`) into a
# Hugging Face `tokenizer.json`, into .cache/assets/tekken/ (git-ignored). The GGUF tokenizer test builds the
# vocabulary llama.cpp's converter would write from that file (`tokenizer.ggml.pre` = `tekken`). Idempotent.
# Without transformers and mistral-common in .venv it says so and stops; the test then skips.
#
# Usage: scripts/fetch_tekken.sh            (run from anywhere; prints the directory)
set -euo pipefail

version=1.13.1
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="$root/.cache/assets/tekken"

if [[ -s "$target/tokenizer.json" && "$(cat "$target/VERSION" 2>/dev/null)" == "$version" ]]; then
    echo "$target"
    exit 0
fi

python="${PYTHON:-$root/.venv/bin/python}"
if ! "$python" -c "import transformers, mistral_common" 2>/dev/null; then
    echo "fetch_tekken: transformers and mistral-common are not installed in $python (scripts/install_python.sh installs them); the tekken tokenizer test will skip" >&2
    exit 0
fi
installed="$("$python" -c 'import importlib.metadata as m; print(m.version("mistral-common"))')"
if [[ "$installed" != "$version" ]]; then
    echo "fetch_tekken: mistral-common $installed is installed, the tests' ids are for $version; the tekken tokenizer test will skip" >&2
    exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/out"
if ! "$python" - "$work/out" <<'PY' 2>"$work/log"
import pathlib, shutil, sys
import mistral_common
from transformers.integrations.mistral import convert_tekken_tokenizer
out = pathlib.Path(sys.argv[1])
source = pathlib.Path(mistral_common.__file__).parent / "data" / "tekken_240718.json"
shutil.copyfile(source, out / "tekken.json")
convert_tekken_tokenizer(str(out / "tekken.json"), chat_template="").backend_tokenizer.save(str(out / "tokenizer.json"))
PY
then
    # transformers' own warnings (no PyTorch) go to the log too; only a failure shows it.
    echo "fetch_tekken: converting the Tekken tokenizer failed; the tekken tokenizer test will skip:" >&2
    tail -n 5 "$work/log" >&2
    exit 0
fi
echo "$version" > "$work/out/VERSION"
rm -rf "$target"
mkdir -p "$(dirname "$target")"
mv "$work/out" "$target"
echo "$target"

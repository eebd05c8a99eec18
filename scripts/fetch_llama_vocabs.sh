#!/usr/bin/env bash
# Fetches llama.cpp's tokenizer test vocabularies (models/ggml-vocab-*.gguf with their .inp texts and .out ids, the
# ids Hugging Face `tokenizers` gives for each text) from the llama-cpp-python sdist on PyPI, which vendors
# llama.cpp, into .cache/assets/llama-vocab/ (git-ignored). Idempotent. The version is pinned so the expected ids
# do not move under the tests.
#
# Usage: scripts/fetch_llama_vocabs.sh       (run from anywhere; prints the directory)
set -euo pipefail

version=0.3.36
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="$root/.cache/assets/llama-vocab"

if [[ -s "$target/VERSION" && "$(cat "$target/VERSION")" == "$version" ]]; then
    echo "$target"
    exit 0
fi

python="${PYTHON:-$root/.venv/bin/python}"
[[ -x "$python" ]] || python="$(command -v python3)"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# pip cannot download an sdist without building its metadata (scikit-build-core), so ask PyPI's JSON API for it.
url="$("$python" -c 'import json, sys, urllib.parse, urllib.request
index = "https://pypi.org/pypi/llama-cpp-python/json"
meta = json.load(urllib.request.urlopen(index, timeout=60))
sdist = next(f["url"] for f in meta["releases"][sys.argv[1]] if f["packagetype"] == "sdist")
print(urllib.parse.urljoin(index, sdist))' "$version")"
"$python" -c 'import sys, urllib.request, shutil
with urllib.request.urlopen(sys.argv[1], timeout=300) as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)' "$url" "$work/sdist.tar.gz"

mkdir -p "$work/out"
"$python" -c 'import sys, tarfile, os
with tarfile.open(sys.argv[1]) as t:
    for m in t.getmembers():
        name = os.path.basename(m.name)
        if m.isfile() and "/vendor/llama.cpp/models/" in m.name and name.startswith("ggml-vocab-"):
            with t.extractfile(m) as src, open(os.path.join(sys.argv[2], name), "wb") as dst:
                dst.write(src.read())' "$work/sdist.tar.gz" "$work/out"
ls "$work/out"/ggml-vocab-*.gguf > /dev/null || { echo "error: no ggml-vocab-*.gguf in the llama-cpp-python $version sdist" >&2; exit 1; }
echo "$version" > "$work/out/VERSION"
rm -rf "$target.partial" && mkdir -p "$(dirname "$target")" && mv "$work/out" "$target.partial"
rm -rf "$target" && mv "$target.partial" "$target"
echo "$target"

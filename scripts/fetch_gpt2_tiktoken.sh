#!/usr/bin/env bash
# Fetches the GPT-2 BPE ranks (`gpt2.tiktoken`) that ship inside the PyPI package `openai-whisper` into
# .cache/assets/gpt2.tiktoken (git-ignored). Idempotent: does nothing when the file is already there.
# Needs python3 with pip; uses no Python package at run time (the wheel is only unzipped).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${EMBER_ASSETS:-$repo_root/.cache/assets}/gpt2.tiktoken"

if [[ -s "$dest" ]]; then
    echo "already present: $dest"
    exit 0
fi

python="${PYTHON:-python3}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

"$python" -m pip download --quiet --no-deps openai-whisper -d "$tmp"
archive="$(find "$tmp" -maxdepth 1 \( -name 'openai_whisper-*' -o -name 'openai-whisper-*' \) | head -n 1)"
if [[ -z "$archive" ]]; then
    echo "error: pip did not download openai-whisper into $tmp" >&2
    exit 1
fi

mkdir -p "$(dirname "$dest")"
# The wheel is a zip; an sdist is a tar.gz. Either holds whisper/assets/gpt2.tiktoken.
"$python" - "$archive" "$dest.part" <<'PY'
import sys, tarfile, zipfile
archive, out = sys.argv[1], sys.argv[2]
suffix = "whisper/assets/gpt2.tiktoken"
if zipfile.is_zipfile(archive):
    with zipfile.ZipFile(archive) as z:
        name = next(n for n in z.namelist() if n.endswith(suffix))
        data = z.read(name)
else:
    with tarfile.open(archive) as t:
        member = next(m for m in t.getmembers() if m.name.endswith(suffix))
        data = t.extractfile(member).read()
with open(out, "wb") as f:
    f.write(data)
PY
mv "$dest.part" "$dest"
echo "wrote $dest ($(wc -l < "$dest") ranks)"

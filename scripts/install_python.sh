#!/usr/bin/env bash
# Python packages the tests drive ember with, in the repository's ignored venv: the official `openai` client
# (tests/serve_cli.rs checks `ember serve` with it), and transformers with mistral-common (scripts/fetch_tekken.sh
# converts Mistral's Tekken tokenizer with transformers' own converter for the GGUF tokenizer test). Idempotent.
# Without network the script says so and goes on; those tests then skip with a message naming what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if .venv/bin/python -c "import openai, transformers, mistral_common" 2>/dev/null; then
  exit 0
fi
if [ ! -x .venv/bin/python ] && ! python3 -m venv .venv; then
  echo "install_python: cannot create .venv (is python3-venv installed?); the openai client and tekken tests will skip" >&2
  exit 0
fi
echo "install_python: installing the openai client, transformers and mistral-common into .venv" >&2
.venv/bin/pip install -q --disable-pip-version-check "openai>=1.40" ||
  echo "install_python: pip install openai failed; the openai client test will skip" >&2
.venv/bin/pip install -q --disable-pip-version-check "transformers>=5,<6" "mistral-common==1.13.1" ||
  echo "install_python: pip install transformers mistral-common failed; the tekken tokenizer test will skip" >&2

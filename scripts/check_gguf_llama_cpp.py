#!/usr/bin/env python3
"""Runs a GGUF file in llama.cpp and in ember side by side and compares them: the logits of every position of a
prompt, and a greedy continuation. Made for files ember writes (`ember export`, `ember quantize --quantize
q4_k_m ...`), e.g. the Tiny Shakespeare model of the README's main job:

    ember export --model runs/tinyshakespeare/best --out runs/tinyshakespeare.gguf
    .venv/bin/python scripts/check_gguf_llama_cpp.py --model runs/tinyshakespeare.gguf \
        --ember-bin ~/.cache/ember-release/release/ember --prompt "ROMEO:"

The prompt is tokenized by llama.cpp (its reading of the file's vocabulary) and by `ember tokenize` (ember's
reading of it); both must agree. llama.cpp runs on the CPU with an f32 KV cache (its default f16 cache would
add its own rounding); ember's logits come from `ember logits --tokens ...`. Prints one JSON object and exits
non-zero when the tokenization or the greedy ids differ or the logits differ by more than `--tolerance`.

Needs the repository's .venv with llama-cpp-python, numpy and safetensors (scripts/bench_compare.py's set-up).
"""

import argparse
import json
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--ember-bin", required=True)
    parser.add_argument("--prompt", default="ROMEO:")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tolerance", type=float, default=1e-3)
    args = parser.parse_args()

    import llama_cpp

    llm = llama_cpp.Llama(model_path=args.model, n_ctx=512, n_batch=512, logits_all=True, n_threads=args.threads,
                          n_gpu_layers=0, type_k=0, type_v=0, verbose=False)
    ids = llm.tokenize(args.prompt.encode(), add_bos=False, special=False)
    ember_ids = json.loads(subprocess.run([args.ember_bin, "--quiet", "tokenize", "--tokenizer", args.model],
                                          input=args.prompt.encode(), capture_output=True, check=True).stdout)
    if isinstance(ember_ids, dict):
        ember_ids = ember_ids.get("ids", ember_ids)

    llm.eval(ids)
    theirs = np.array(llm.scores[: len(ids)], dtype=np.float32)
    greedy_llama = []
    for _ in range(args.new_tokens):
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        greedy_llama.append(nxt)
        llm.eval([nxt])

    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/logits.safetensors"
        subprocess.run([args.ember_bin, "--quiet", "--threads", str(args.threads), "logits", "--model", args.model,
                        "--tokens", ",".join(map(str, ids)), "--output", out], check=True)
        ours = load_file(out)["logits"].reshape(theirs.shape)
    gen = subprocess.run([args.ember_bin, "--quiet", "--threads", str(args.threads), "generate", "--model",
                          args.model, "--tokens", ",".join(map(str, ids)), "--max-new-tokens",
                          str(args.new_tokens), "--temperature", "0", "--ignore-eos", "--format", "json"],
                         capture_output=True, text=True)
    greedy_ember = json.loads(gen.stdout.splitlines()[0])["ids"] if gen.returncode == 0 else gen.stderr

    diff = float(np.abs(ours - theirs).max())
    report = {
        "model": args.model,
        "llama-cpp-python": llama_cpp.__version__,
        "prompt_ids": ids,
        "ember_prompt_ids": ember_ids,
        "max_abs_logit_diff": diff,
        "logit_scale": float(np.abs(theirs).max()),
        "greedy_llama_cpp": greedy_llama,
        "greedy_ember": greedy_ember,
        "greedy_text_llama_cpp": llm.detokenize(greedy_llama).decode(errors="replace"),
    }
    print(json.dumps(report, indent=1))
    if ember_ids != ids or diff > args.tolerance or greedy_ember != greedy_llama:
        sys.exit(1)


if __name__ == "__main__":
    main()

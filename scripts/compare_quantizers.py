#!/usr/bin/env python3
"""ember's quantizer against llama.cpp's on one f32 GGUF: for each recipe, both quantize the same file and every
tensor's type and bytes are compared (read with the `gguf` package); prints one line per recipe with the counts
of equal types and equal bytes, the file sizes and each side's wall time.

    ember export --model .cache/assets/SmolLM2-135M-Instruct.Q4_1.gguf --out /tmp/smol.f32.gguf
    .venv/bin/python scripts/compare_quantizers.py --f32 /tmp/smol.f32.gguf \
        --ember-bin ~/.cache/ember-release/release/ember [--recipes q4_k_m,q6_k,q8_0] [--threads 2]

ember runs `quantize --quantize R` (its time includes loading the f32 file); llama.cpp runs
`llama_model_quantize` with one thread and no importance matrix. Needs llama-cpp-python and gguf in the venv.
"""

import argparse
import ctypes
import hashlib
import os
import subprocess
import sys
import tempfile
import time


def tensors(path: str) -> dict:
    import gguf

    return {t.name: (t.tensor_type.name, hashlib.sha1(t.data.tobytes()).hexdigest())
            for t in gguf.GGUFReader(path).tensors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--f32", required=True)
    parser.add_argument("--ember-bin", required=True)
    parser.add_argument("--recipes", default="q4_k_m,q6_k,q8_0")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import llama_cpp

    with tempfile.TemporaryDirectory() as tmp:
        for recipe in args.recipes.split(","):
            ours, theirs = f"{tmp}/ember.{recipe}.gguf", f"{tmp}/llama.{recipe}.gguf"
            start = time.time()
            subprocess.run([args.ember_bin, "--quiet", "--threads", str(args.threads), "quantize", "--model",
                            args.f32, "--out", ours, "--quantize", recipe], check=True)
            ember_s = time.time() - start
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{recipe.upper()}")
            params.nthread = 1
            start = time.time()
            if llama_cpp.llama_model_quantize(args.f32.encode(), theirs.encode(), ctypes.byref(params)) != 0:
                sys.exit(f"llama_model_quantize failed for {recipe}")
            llama_s = time.time() - start
            a, b = tensors(theirs), tensors(ours)
            types = {}
            for ty, _ in a.values():
                types[ty] = types.get(ty, 0) + 1
            same_type = sum(a[n][0] == b.get(n, ("",))[0] for n in a)
            same_bytes = sum(a[n] == b.get(n) for n in a)
            print(f"{recipe}: {len(a)} tensors {types}; same type {same_type}, same bytes {same_bytes}; "
                  f"bytes llama.cpp {os.path.getsize(theirs)} ember {os.path.getsize(ours)}; "
                  f"ember {ember_s:.1f} s ({args.threads} threads), llama.cpp {llama_s:.1f} s (1 thread)",
                  flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The benchmark GGUF files of issue 22, made as a user would get them: llama.cpp's own quantizer applied to an f32
GGUF of SmolLM2-135M-Instruct.

  1. `SmolLM2-135M-Instruct.f32.gguf`: every tensor of the Q4_1 file that `scripts/fetch_smollm2.sh` fetches,
     dequantized with the `gguf` package's reference dequantizer (bit-exact to ggml's) and written as F32, with
     all metadata (tokenizer, chat template) copied and `general.file_type` set to ALL_F32. This is "the exact-f32
     GGUF": the same values ember's `--quantize` none load sees.
  2. `SmolLM2-135M-Instruct.{Q4_K_M,Q6_K,Q8_0}.gguf`: `llama_cpp.llama_model_quantize` of that file (llama.cpp's
     type mix per recipe; its fallbacks for the 576-wide rows, which are not whole 256-element super-blocks).

Written next to the source file (into the ignored `.cache/assets/`); existing outputs are kept. Needs the venv's
`gguf`, `numpy` and `llama-cpp-python` (see scripts/bench_compare.py's set-up).

Usage: .venv/bin/python scripts/make_bench_ggufs.py [--source .cache/assets/SmolLM2-135M-Instruct.Q4_1.gguf]
"""

import argparse
import ctypes
import os
import sys

import numpy as np


def write_f32(source: str, target: str) -> None:
    import gguf

    reader = gguf.GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    tmp = target + ".tmp"
    writer = gguf.GGUFWriter(tmp, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue
        vtype = field.types[0]
        sub_type = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub_type)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        # GGUF lists dimensions innermost first; numpy wants them outermost first.
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        writer.add_tensor(tensor.name, values.reshape(shape), raw_dtype=gguf.GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, target)


def quantize(source: str, target: str, ftype: int) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = 2
    tmp = target + ".tmp"
    status = llama_cpp.llama_model_quantize(source.encode(), tmp.encode(), ctypes.byref(params))
    if status != 0:
        sys.exit(f"llama_model_quantize({target}) failed with status {status}")
    os.replace(tmp, target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default=".cache/assets/SmolLM2-135M-Instruct.Q4_1.gguf")
    args = parser.parse_args()
    if not os.path.exists(args.source):
        sys.exit(f"{args.source} not found: run scripts/fetch_smollm2.sh first")
    base = args.source.rsplit(".", 2)[0]
    f32 = f"{base}.f32.gguf"
    if not os.path.exists(f32):
        write_f32(args.source, f32)
    print(f32)
    import llama_cpp

    for name, ftype in [
        ("Q4_K_M", llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M),
        ("Q6_K", llama_cpp.LLAMA_FTYPE_MOSTLY_Q6_K),
        ("Q8_0", llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0),
    ]:
        target = f"{base}.{name}.gguf"
        if not os.path.exists(target):
            quantize(f32, target, ftype)
        print(target)


if __name__ == "__main__":
    main()

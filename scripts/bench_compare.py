#!/usr/bin/env python3
"""Generation speed of one GGUF model through Hugging Face transformers, llama.cpp and ember, side by side.

Every engine runs the same workload, batch 1 on the CPU with the same thread count:
  * the prompt is `--prompt-len` token ids built as ember's `synthetic_prompt` builds it,
    `ids[i] = (i * 7919 + 13) % vocab_size` (no BOS, no tokenizer);
  * then `--gen-len` tokens are generated greedily (argmax of the last position's logits, inside every timed
    step; end-of-sequence does not stop generation): the first by the prefill, the rest by one decode step each;
  * `--warmup` discarded runs, then `--runs` measured runs, each from an empty KV cache.

Figures are reduced exactly as `ember bench` reduces them (crates/bench/src/generation.rs), so the columns compare:
  TTFT            median over runs of prefill + first-token argmax, ms
  prefill tok/s   prompt_len / median prefill time
  decode tok/s    every measured decode step / their total time (pooled over runs)
  p50 decode ms   median per-token decode latency (pooled over runs, numpy's linear percentile)
  peak RSS        peak resident memory while generating, with the model loaded: the kernel's peak counter is reset
                  (write 5 to /proc/self/clear_refs) after loading, then VmHWM is read, as ember does; the JSON
                  output also has each Python engine's peak up to the end of loading (`load_peak_rss_bytes`).

Engines:
  transformers  `AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)` dequantizes the GGUF to fp32; a manual
                loop under torch.inference_mode: the prompt with use_cache=True and logits_to_keep=1 (only the last
                position's logits, as `generate()` does), then one token at a time with the returned KV cache
                (`cache=`, the name transformers 5.x gives `past_key_values`).
  llama.cpp     `llama_cpp.Llama` (llama-cpp-python) runs the weights as stored in the GGUF (Q4_1, with a Q8_0
                token embedding for SmolLM2-135M-Instruct.Q4_1): `llm.eval(prompt)`, then `llm.eval([token])`; the
                last logits are read with `llama_get_logits_ith(ctx, -1)` (with logits_all=False `Llama.eval`
                does not copy them into `llm.scores`).
  ember         `EMBER --threads T --quiet bench --model GGUF ... --format json [--quantize Q]` for every precision
                of `--ember-quantize` ("none" passes no --quantize), only when `--ember-bin` is given. Its greedy
                ids come from `ember generate --tokens ... --temperature 0 [--quantize Q]`.

transformers and llama.cpp each run in a child process of this script (`--engine NAME`, which prints one JSON
object), so each one's memory and threads are its own; ember runs as its own binary. One engine failing marks its
row failed and leaves the others. The first 16 generated ids of every engine are printed to check greedy agreement
(transformers fp32 and ember f32 should agree; llama.cpp's quantized weights may diverge); a mismatch is shown,
never fatal.

Setup (once): the repository's .venv has torch, transformers and gguf; llama.cpp's Python binding builds from source
(cmake and ninja come from PyPI, a C++ compiler must be installed; several minutes on 2 cores):
    .venv/bin/pip install llama-cpp-python
    scripts/fetch_smollm2.sh

Run from the repository root:
    .venv/bin/python scripts/bench_compare.py [--prompt-len 128] [--gen-len 64] [--runs 3] [--warmup 1] \
        [--threads 2] [--ember-bin target/release/ember] [--ember-quantize none,gguf,int8,int4] \
        [--markdown-out FILE] [--json-out FILE]
"""

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / ".cache/assets/SmolLM2-135M-Instruct.Q4_1.gguf"
PYTHON_ENGINES = ("transformers", "llamacpp")
ENGINE_LABELS = {"transformers": "transformers", "llamacpp": "llama.cpp"}
SHOWN_IDS = 16
STATUS = "/proc/self/status"
CLEAR_REFS = "/proc/self/clear_refs"


# ---------------------------------------------------------------------------------------------------------------------
# The measurement, shared by the Python engines (run inside the `--engine` child process).


def synthetic_prompt(length: int, vocab_size: int) -> list[int]:
    """ember's `synthetic_prompt` (crates/bench/src/lm_workload.rs)."""
    return [(i * 7919 + 13) % vocab_size for i in range(length)]


def reset_peak_rss() -> str:
    """Resets the kernel's peak-RSS counter; returns the scope later peaks cover (`phase` or `process`)."""
    try:
        with open(CLEAR_REFS, "w") as f:
            f.write("5")
        return "phase"
    except OSError:
        return "process"


def peak_rss_bytes() -> int | None:
    """VmHWM of this process in bytes, or None where /proc does not report it."""
    try:
        with open(STATUS) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def time_generation(prefill, decode_step, args) -> dict:
    """Times `args.warmup + args.runs` generations; reduces the measured ones as ember's `bench_generation` does.

    `prefill()` starts from an empty cache, runs the prompt and returns the first generated id; `decode_step(tok)`
    feeds one id and returns the next.
    """
    load_peak = peak_rss_bytes()
    scope = reset_peak_rss()
    prefill_s, steps_s, total_s = [], [], []
    ids = []
    for run in range(args.warmup + args.runs):
        measured = run >= args.warmup
        start = time.perf_counter()
        token = prefill()
        prefilled = time.perf_counter()
        ids = [token]
        step_start = prefilled
        for _ in range(args.gen_len - 1):
            token = decode_step(token)
            step_end = time.perf_counter()
            if measured:
                steps_s.append(step_end - step_start)
            step_start = step_end
            ids.append(token)
        if measured:
            prefill_s.append(prefilled - start)
            total_s.append(step_start - start)
    peak = peak_rss_bytes()
    latencies_ms = np.array(steps_s) * 1e3
    prefill_median = statistics.median(prefill_s)
    return {
        "ttft_ms": prefill_median * 1e3,
        "prefill_tokens_per_s": args.prompt_len / prefill_median,
        "decode_tokens_per_s": len(steps_s) / sum(steps_s),
        "decode_latency_ms": {
            name: float(np.percentile(latencies_ms, q))
            for name, q in (("p50", 50), ("p90", 90), ("p95", 95), ("p99", 99), ("max", 100))
        },
        "end_to_end_tokens_per_s": args.gen_len / statistics.median(total_s),
        "peak_memory_bytes": peak,
        "peak_memory_scope": scope if peak is not None else "process",
        "load_peak_rss_bytes": load_peak,
        "generated_ids": ids,
        "prefill_s": prefill_s,
        "decode_steps_s": steps_s,
    }


def run_transformers(args) -> dict:
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(args.model.parent), gguf_file=args.model.name, dtype=torch.float32
    )
    model.eval()
    vocab = model.config.vocab_size
    prompt = torch.tensor([synthetic_prompt(args.prompt_len, vocab)])
    cache = None

    def prefill():
        nonlocal cache
        out = model(input_ids=prompt, use_cache=True, logits_to_keep=1)
        cache = out.cache
        return int(out.logits[0, -1].argmax())

    def decode_step(token):
        nonlocal cache
        out = model(input_ids=torch.tensor([[token]]), cache=cache, use_cache=True)
        cache = out.cache
        return int(out.logits[0, -1].argmax())

    with torch.inference_mode():
        result = time_generation(prefill, decode_step, args)
    return {
        **result,
        "precision": "fp32 (GGUF dequantized)",
        "threads": torch.get_num_threads(),
        "vocab_size": vocab,
        "attn_implementation": model.config._attn_implementation,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }


def gguf_weight_types(path: Path) -> str:
    """The ggml types of the GGUF's matrices, most common first, e.g. `Q4_1+Q8_0`."""
    import gguf

    counts: dict[str, int] = {}
    for tensor in gguf.GGUFReader(path).tensors:
        if len(tensor.shape) >= 2:
            counts[tensor.tensor_type.name] = counts.get(tensor.tensor_type.name, 0) + 1
    return "+".join(sorted(counts, key=counts.get, reverse=True))


def gguf_vocab_size(path: Path) -> int:
    """The vocabulary size of a GGUF model: `<arch>.vocab_size`, else the length of its token list."""
    import gguf

    reader = gguf.GGUFReader(path)
    arch = reader.fields["general.architecture"].contents()
    field = reader.fields.get(f"{arch}.vocab_size")
    return int(field.contents()) if field is not None else len(reader.fields["tokenizer.ggml.tokens"].data)


def run_llamacpp(args) -> dict:
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=str(args.model),
        n_ctx=args.prompt_len + args.gen_len + 16,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        logits_all=False,
        verbose=False,
    )
    vocab = llm.n_vocab()
    prompt = synthetic_prompt(args.prompt_len, vocab)

    def last_argmax():
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(vocab,))
        return int(logits.argmax())

    def prefill():
        llm.reset()
        llm.eval(prompt)
        return last_argmax()

    def decode_step(token):
        llm.eval([token])
        return last_argmax()

    result = time_generation(prefill, decode_step, args)
    return {
        **result,
        "precision": f"{gguf_weight_types(args.model)} (GGUF as stored)",
        "threads": args.threads,
        "vocab_size": vocab,
        "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
        "versions": {"llama-cpp-python": llama_cpp.__version__},
    }


ENGINES = {"transformers": run_transformers, "llamacpp": run_llamacpp}


# ---------------------------------------------------------------------------------------------------------------------
# The parent: child processes, ember, and the table.


def workload_flags(args) -> list[str]:
    return [
        *("--model", str(args.model)),
        *("--prompt-len", str(args.prompt_len)),
        *("--gen-len", str(args.gen_len)),
        *("--runs", str(args.runs)),
        *("--warmup", str(args.warmup)),
    ]


def last_json(text: str) -> dict:
    """The JSON object of a command's stdout: the whole text if it parses, else its last line that does."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    for line in reversed(text.splitlines()):
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    start, end = text.find("{"), text.rfind("}")
    return json.loads(text[start : end + 1])


def run_command(name: str, cmd: list[str], env=None) -> tuple[dict | None, str | None]:
    """Runs `cmd`; returns (its stdout's JSON, None) or (None, an error message with its stderr)."""
    print(f"[{name}] {shlex.join(cmd)}", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode == 0:
        try:
            return last_json(proc.stdout), None
        except json.JSONDecodeError:
            error = "no JSON object on stdout"
    else:
        error = f"exit status {proc.returncode}"
    detail = (proc.stderr.strip() or proc.stdout.strip())[-4000:]
    print(f"[{name}] FAILED ({error}):\n{detail}", file=sys.stderr, flush=True)
    return None, f"{error}: {detail}"


def run_python_engine(engine: str, args) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--engine", engine, "--threads", str(args.threads)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
    result, error = run_command(ENGINE_LABELS[engine], cmd + workload_flags(args), env)
    row = {"engine": ENGINE_LABELS[engine], "status": "ok" if error is None else "failed", "error": error}
    return {**row, **(result or {})}


def find_owner(value, key: str):
    """The first dict (depth first) in a JSON value that has `key`, or None."""
    if isinstance(value, dict):
        if key in value:
            return value
        children = value.values()
    elif isinstance(value, list):
        children = value
    else:
        return None
    for child in children:
        owner = find_owner(child, key)
        if owner is not None:
            return owner
    return None


def lookup(report: dict, key: str):
    owner = find_owner(report, key)
    return None if owner is None else owner[key]


def parse_ember_report(report: dict, quantize: str) -> dict:
    """The figures of an `ember bench --format json` model report.

    The report is flat (crates/bench/src/report.rs flattens the body next to `backend` and `threads`), but keys are
    looked up wherever they are nested, so a `body` or `model_bench` wrapper reads the same.
    """
    latency = lookup(report, "decode_latency_ms")
    if not isinstance(latency, dict):
        latency = {"p50": latency}
    model = lookup(report, "model")
    dtype = model.get("dtype") if isinstance(model, dict) else None
    precision = dtype or ("f32" if quantize == "none" else quantize)
    if quantize != "none" and quantize not in precision:
        precision = f"{quantize} ({precision})"
    keys = (
        "ttft_ms",
        "prefill_tokens_per_s",
        "decode_tokens_per_s",
        "end_to_end_tokens_per_s",
        "peak_memory_bytes",
        "peak_memory_scope",
        "backend",
        "threads",
        "ember_version",
    )
    figures = {key: lookup(report, key) for key in keys}
    missing = [k for k in ("ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s") if figures[k] is None]
    if missing:
        raise KeyError(f"ember report lacks {', '.join(missing)}")
    return {**figures, "decode_latency_ms": latency, "precision": precision}


def ember_greedy_ids(args, quantize: str) -> tuple[list[int] | None, str | None]:
    """The first SHOWN_IDS greedy ids of ember at one precision on the synthetic prompt, from `ember generate`."""
    prompt = synthetic_prompt(args.prompt_len, gguf_vocab_size(args.model))
    cmd = [
        *(str(args.ember_bin), "--threads", str(args.threads), "--quiet", "generate", "--model", str(args.model)),
        *("--tokens", ",".join(map(str, prompt)), "--temperature", "0", "--max-new-tokens", str(SHOWN_IDS)),
        *("--ignore-eos", "--format", "json"),
    ]
    if quantize != "none":
        cmd += ["--quantize", quantize]
    result, error = run_command(f"ember generate {quantize}", cmd)
    if result is None:
        return None, error
    ids = result.get("ids")
    if not isinstance(ids, list):
        return None, "no `ids` in ember generate's JSON"
    if ids[: len(prompt)] == prompt:
        ids = ids[len(prompt) :]
    return ids, None


def run_ember(args) -> list[dict]:
    rows = []
    for quantize in args.ember_quantize:
        cmd = [str(args.ember_bin), "--threads", str(args.threads), "--quiet", "bench", *workload_flags(args)]
        cmd += ["--format", "json"]
        if quantize != "none":
            cmd += ["--quantize", quantize]
        name = f"ember {quantize}"
        report, error = run_command(name, cmd)
        precision = "f32" if quantize == "none" else quantize
        row = {"engine": "ember", "status": "failed", "error": error, "quantize": quantize, "precision": precision}
        row["threads"] = args.threads
        if report is not None:
            try:
                row.update(parse_ember_report(report, quantize), status="ok", error=None, raw_report=report)
            except (KeyError, TypeError, AttributeError) as e:
                row["error"] = f"unreadable report: {e}"
                print(f"[{name}] FAILED: {row['error']}", file=sys.stderr)
        if row["status"] == "ok":
            row["generated_ids"], row["generated_ids_error"] = ember_greedy_ids(args, quantize)
        rows.append(row)
    return rows


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def header(rows: list[dict]) -> dict:
    ember_versions = sorted({r["ember_version"] for r in rows if r.get("ember_version")})
    versions = {name: package_version(name) for name in ("torch", "transformers", "llama-cpp-python")}
    if ember_versions:
        versions["ember"] = ", ".join(ember_versions)
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_model(),
        "cores": len(os.sched_getaffinity(0)),
        "versions": versions,
        "command": shlex.join([sys.executable, *sys.argv]),
    }


def fmt(value, digits: int) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def markdown(head: dict, settings: dict, rows: list[dict], notes: list[str]) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in head["versions"].items())
    load = " → ".join(f"{x:.2f}" for x in head["load_1min"])
    lines = [
        f"{head['date_utc']} · {head['cpu']}, {head['cores']} cores (1-min load {load}) · {versions}",
        "",
        f"`{head['command']}`",
        "",
        f"Workload: `{Path(settings['model']).name}`, batch 1, prompt {settings['prompt_len']} synthetic ids, "
        f"{settings['gen_len']} greedy new tokens, {settings['warmup']} warm-up + {settings['runs']} measured runs "
        f"(medians; decode pooled over runs).",
        "",
        "| engine | precision | threads | TTFT ms | prefill tok/s | decode tok/s | p50 decode ms | peak RSS MiB |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['engine']} | {r['precision']} | {r['threads']} | failed | | | | |")
            continue
        peak = r.get("peak_memory_bytes")
        peak_mib = None if peak is None else peak / 2**20
        lines.append(
            f"| {r['engine']} | {r['precision']} | {r['threads']} | {fmt(r['ttft_ms'], 1)} "
            f"| {fmt(r['prefill_tokens_per_s'], 1)} | {fmt(r['decode_tokens_per_s'], 1)} "
            f"| {fmt(r['decode_latency_ms'].get('p50'), 2)} | {fmt(peak_mib, 0)} |"
        )
    lines += ["", *notes]
    return "\n".join(lines) + "\n"


def agreement_lines(rows: list[dict]) -> list[str]:
    """The first SHOWN_IDS generated ids of each engine and how far each agrees with the first engine's."""
    with_ids = [r for r in rows if r.get("generated_ids")]
    if not with_ids:
        return []
    reference = with_ids[0]
    ref_ids = reference["generated_ids"][:SHOWN_IDS]
    lines = [f"Greedy ids (first {SHOWN_IDS}; agreement is the common prefix with {reference['engine']}):", ""]
    for r in with_ids:
        ids = r["generated_ids"][:SHOWN_IDS]
        same = next((i for i, (a, b) in enumerate(zip(ids, ref_ids)) if a != b), min(len(ids), len(ref_ids)))
        lines.append(f"- {r['engine']} {r['precision']}: `{' '.join(map(str, ids))}` ({same}/{len(ref_ids)} agree)")
    return lines


def error_summary(error: str) -> str:
    """One line of a failure for the notes: the first line that says `error`, else the last line."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    return next((line for line in lines if "error" in line.lower()), lines[-1])[:300]


def compare(args) -> None:
    load_before = os.getloadavg()[0]
    settings = {k: getattr(args, k) for k in ("prompt_len", "gen_len", "runs", "warmup", "threads")}
    settings["model"] = str(args.model)
    vocab = gguf_vocab_size(args.model)
    rows = [run_python_engine(engine, args) for engine in args.engines]
    notes = []
    for r in rows:
        r.setdefault("precision", "—")
        r.setdefault("threads", args.threads)
        if r.get("vocab_size", vocab) != vocab:
            notes.append(f"Warning: {r['engine']} has vocabulary {r['vocab_size']}, the GGUF {vocab}: prompts differ.")
    if args.ember_bin:
        rows += run_ember(args)
    else:
        notes.append("ember skipped: pass `--ember-bin PATH` (e.g. target/release/ember) to add its rows.")
    for r in rows:
        label = f"{r['engine']} {r['precision']}"
        if r["status"] != "ok":
            notes.append(f"{label} failed: {error_summary(r['error'])}")
        if r.get("generated_ids_error"):
            notes.append(f"{label}: no greedy ids ({error_summary(r['generated_ids_error'])}).")
    notes.append(
        "Peak RSS: the peak while generating with the model loaded (VmHWM after resetting it post-load), "
        "as `ember bench` reports it."
    )
    notes += ["", *agreement_lines(rows)]
    head = header(rows)
    head["load_1min"] = [load_before, os.getloadavg()[0]]
    text = markdown(head, settings, rows, notes)
    print(text, end="")
    if args.markdown_out:
        args.markdown_out.write_text(text)
    if args.json_out:
        args.json_out.write_text(json.dumps({"header": head, "settings": settings, "results": rows}, indent=2) + "\n")


def comma_list(choices=None):
    def parse(text: str) -> list[str]:
        items = [s.strip() for s in text.split(",") if s.strip()]
        bad = [s for s in items if choices is not None and s not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(bad)} (choose from {', '.join(choices)})")
        return items

    return parse


def positive(minimum: int):
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}")
        return value

    return parse


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="GGUF file (default: %(default)s)")
    p.add_argument("--prompt-len", type=positive(1), default=128, help="prompt tokens (default: %(default)s)")
    p.add_argument("--gen-len", type=positive(2), default=64, help="generated tokens (default: %(default)s)")
    p.add_argument("--runs", type=positive(1), default=3, help="measured runs (default: %(default)s)")
    p.add_argument("--warmup", type=positive(0), default=1, help="discarded runs (default: %(default)s)")
    p.add_argument("--threads", type=positive(1), default=2, help="CPU threads everywhere (default: %(default)s)")
    p.add_argument(
        "--engines",
        type=comma_list(PYTHON_ENGINES),
        default=list(PYTHON_ENGINES),
        help="Python engines to run, comma-separated (default: transformers,llamacpp)",
    )
    p.add_argument("--ember-bin", type=Path, help="ember binary; ember is skipped without it")
    p.add_argument(
        "--ember-quantize",
        type=comma_list(),
        default=["none", "gguf", "int8", "int4"],
        help="ember precisions, each one `ember bench --quantize` value or `none` (default: none,gguf,int8,int4)",
    )
    p.add_argument("--markdown-out", type=Path, help="also write the markdown block to this file")
    p.add_argument("--json-out", type=Path, help="also write every raw number to this JSON file")
    p.add_argument("--engine", choices=PYTHON_ENGINES, help=argparse.SUPPRESS)  # the child-process mode
    args = p.parse_args()
    if not args.model.is_file():
        p.error(f"{args.model} not found (scripts/fetch_smollm2.sh downloads the default)")
    if args.ember_bin and not args.ember_bin.is_file():
        p.error(f"--ember-bin {args.ember_bin} not found")
    if args.engine:
        print(json.dumps(ENGINES[args.engine](args)))
    else:
        compare(args)


if __name__ == "__main__":
    main()

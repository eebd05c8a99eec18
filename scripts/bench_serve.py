#!/usr/bin/env python3
"""Serving throughput and latency of `ember serve` against llama-cpp-python's server, on one GGUF, same load.

Both servers run the same GGUF on the CPU with the same thread count. For each concurrency level C, C clients
each send `--rounds` streaming chat requests back to back (every client its own prompt, greedy, `--max-tokens`
tokens at most) and the script measures, per server:
  agg tok/s      completion tokens of every request / wall time of the level
  TTFT p50/p99   from sending a request to its first content chunk, ms
  ITL p50/p99    between consecutive content chunks of one request, ms (pooled over requests)
Completion tokens are the server's `usage.completion_tokens` where the stream reports it (ember, with
`stream_options.include_usage`), else the number of content chunks (llama-cpp-python sends one per token).
The levels alternate between the servers (ember C=1, llama.cpp C=1, ember C=4, ...), so drift on this VM
(30-40% within an hour) hits both alike; both processes stay up, the idle one uses no CPU.

ember:     EMBER --threads T --quiet serve --model GGUF --quantize gguf --max-batch MAXC --port P
llama.cpp: python -m llama_cpp.server --model GGUF --n_threads T --n_ctx 2048 --port P
           (llama-cpp-python's server runs one request at a time: its figures at C > 1 are queueing).

Setup (once, several minutes on 2 cores):
    CMAKE_BUILD_PARALLEL_LEVEL=2 .venv/bin/pip install llama-cpp-python fastapi uvicorn sse-starlette \
        starlette-context pydantic-settings
    scripts/fetch_smollm2.sh
Run from the repository root:
    .venv/bin/python scripts/bench_serve.py --ember-bin target/release/ember [--clients 1,4,8,16] \
        [--rounds 2] [--max-tokens 64] [--threads 2] [--markdown-out FILE] [--json-out FILE]
"""

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

TOPICS = [
    "a lighthouse keeper", "a lost robot", "the first snow", "a dragon who bakes", "an old violin",
    "a city under the sea", "a clockmaker's apprentice", "a fox and a crow", "the last train home",
    "a garden on Mars", "a talking cat", "the silent library", "a pirate's map", "a winter market",
    "a broken compass", "the moon's shadow",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port, proc, path, timeout=300):
    start = time.time()
    while time.time() - start < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("server never became healthy")


def one_request(port, model, prompt, max_tokens):
    """Streams one chat completion; returns (ttft_s, [inter-chunk gaps], completion tokens)."""
    body = json.dumps({
        "model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
        "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
    })
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    sent = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {response.read()[:300]!r}")
    times, usage = [], None
    while True:
        line = response.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        if chunk.get("usage"):
            usage = chunk["usage"]["completion_tokens"]
        for choice in chunk.get("choices", []):
            if choice.get("delta", {}).get("content"):
                times.append(time.perf_counter())
    conn.close()
    if not times:
        raise RuntimeError("no content streamed")
    gaps = [b - a for a, b in zip(times, times[1:])]
    return times[0] - sent, gaps, usage if usage is not None else len(times)


def run_level(port, model, clients, rounds, max_tokens):
    results, errors = [], []

    def client(i):
        for r in range(rounds):
            prompt = f"Write a short story about {TOPICS[(i + r * clients) % len(TOPICS)]}."
            try:
                results.append(one_request(port, model, prompt, max_tokens))
            except Exception as e:  # reported, not fatal: the table marks the level
                errors.append(str(e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        return {"error": errors[0], "failed": len(errors)}
    ttft = sorted(r[0] for r in results)
    gaps = sorted(g for r in results for g in r[1])
    tokens = sum(r[2] for r in results)

    def pct(xs, q):
        return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else xs[0]

    return {
        "requests": len(results), "tokens": tokens, "wall_s": wall, "agg_tokens_per_s": tokens / wall,
        "ttft_p50_ms": 1e3 * pct(ttft, 50), "ttft_p99_ms": 1e3 * pct(ttft, 99),
        "itl_p50_ms": 1e3 * pct(gaps, 50) if gaps else None, "itl_p99_ms": 1e3 * pct(gaps, 99) if gaps else None,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=".cache/assets/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--ember-bin", default="target/release/ember")
    ap.add_argument("--ember-quantize", default="gguf", help="ember's --quantize; none: f32 weights")
    ap.add_argument("--clients", default="1,4,8,16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-llama", action="store_true", help="measure ember only")
    ap.add_argument("--markdown-out")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    levels = [int(c) for c in args.clients.split(",")]
    servers, procs = {}, []
    try:
        port = free_port()
        cmd = [args.ember_bin, "--threads", str(args.threads), "--quiet", "serve", "--model", args.model,
               "--max-batch", str(max(levels)), "--port", str(port), "--model-name", "model"]
        if args.ember_quantize != "none":
            cmd += ["--quantize", args.ember_quantize]
        proc = subprocess.Popen(cmd)
        procs.append(proc)
        wait_healthy(port, proc, "/health")
        servers["ember"] = (port, "model")
        if not args.skip_llama:
            port = free_port()
            cmd = [sys.executable, "-m", "llama_cpp.server", "--model", args.model, "--n_threads",
                   str(args.threads), "--n_threads_batch", str(args.threads), "--n_ctx", "2048",
                   "--port", str(port), "--model_alias", "model", "--interrupt_requests", "False"]
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(proc)
            wait_healthy(port, proc, "/v1/models")
            servers["llama.cpp"] = (port, "model")
        for name, (port, model) in servers.items():  # warm-up: first-request costs out of the figures
            run_level(port, model, 1, 1, 8)
        results = {name: {} for name in servers}
        for c in levels:
            for name, (port, model) in servers.items():
                r = run_level(port, model, c, args.rounds, args.max_tokens)
                results[name][c] = r
                print(f"{name:9} C={c:2}: {json.dumps(r)}", file=sys.stderr)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()

    head = "| clients | server | agg tok/s | vs 1 client | vs llama.cpp | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |"
    lines = [head, "|" + "---|" * 9]
    for c in levels:
        for name in servers:
            r = results[name][c]
            if "error" in r:
                lines.append(f"| {c} | {name} | failed: {r['error'][:60]} | | | | | | |")
                continue
            one = results[name][levels[0]].get("agg_tokens_per_s")
            anchor = results.get("llama.cpp", {}).get(c, {}).get("agg_tokens_per_s")
            vs_one = f"{r['agg_tokens_per_s'] / one:.2f}x" if one else ""
            vs_llama = f"{r['agg_tokens_per_s'] / anchor:.2f}x" if anchor and name == "ember" else ""
            lines.append(
                f"| {c} | {name} | {r['agg_tokens_per_s']:.1f} | {vs_one} | {vs_llama} | {r['ttft_p50_ms']:.0f} | "
                f"{r['ttft_p99_ms']:.0f} | {r['itl_p50_ms']:.1f} | {r['itl_p99_ms']:.1f} |"
            )
    table = "\n".join(lines)
    print(table)
    if args.markdown_out:
        with open(args.markdown_out, "w") as f:
            f.write(table + "\n")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"args": vars(args), "results": results, "cpu": os.cpu_count()}, f, indent=1)


if __name__ == "__main__":
    main()

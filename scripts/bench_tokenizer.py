#!/usr/bin/env python3
"""Tokenizer benchmarks: ours vs tiktoken vs HF `tokenizers`, measured in one run.

    ./scripts/fetch_gpt2_tiktoken.sh
    .venv/bin/python scripts/bench_tokenizer.py [--repeat 10] [--rounds 3] [--vocab 8192]

1. Single-thread encode throughput (MB/s) with the GPT-2 ranks on Tiny Shakespeare x REPEAT (best of ROUNDS),
   each encoder checked to give the same ids as tiktoken.
2. Training time for a byte-level BPE of VOCAB tokens on Tiny Shakespeare, ours vs HF's BpeTrainer, and the
   compression (bytes per token) each result achieves on the corpus.

Ours runs as `cargo run --release -p ember-tokenizer --example bench_tokenizer` (single thread: encode_ordinary
on one string does not use rayon). Prints a Markdown table for docs/TOKENIZER.md.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import tiktoken  # noqa: E402
from tiktoken.load import load_tiktoken_bpe  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "data/tinyshakespeare.txt"
RANKS = ROOT / ".cache/assets/gpt2.tiktoken"
R50K = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def fnv1a64(ids):
    h = 0xCBF29CE484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little"):
            h ^= b
            h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def hf_gpt2(ranks):
    """HF byte-level BPE with GPT-2's ranks: every split of a token into two tokens is a merge with its rank."""
    b2u = bytes_to_unicode()
    enc = lambda b: "".join(b2u[x] for x in b)  # noqa: E731
    vocab = {enc(t): r for t, r in ranks.items()}
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        for k in range(1, len(token)):
            left, right = token[:k], token[k:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], enc(left), enc(right)))
    merges.sort()
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(m[3], m[4]) for m in merges], ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def best_of(rounds, fn):
    best, out = float("inf"), None
    for _ in range(rounds):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def cargo_example(*args):
    env = dict(os.environ)
    env.setdefault("CARGO_TARGET_DIR", str(Path.home() / ".cache/ember-target"))
    cmd = ["cargo", "run", "--quiet", "--release", "-p", "ember-tokenizer", "--example", "bench_tokenizer", "--", *args]
    out = subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=8192)
    args = parser.parse_args()
    if not RANKS.exists():
        sys.exit(f"{RANKS} is missing: run ./scripts/fetch_gpt2_tiktoken.sh")

    text = CORPUS.read_text(encoding="utf-8") * args.repeat
    mb = len(text.encode()) / 1e6
    ranks = load_tiktoken_bpe(str(RANKS))
    tk = tiktoken.Encoding(name="gpt2", pat_str=R50K, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256})
    t_tk, ids_tk = best_of(args.rounds, lambda: tk.encode_ordinary(text))
    hf = hf_gpt2(ranks)
    t_hf, ids_hf = best_of(args.rounds, lambda: hf.encode(text, add_special_tokens=False).ids)
    ours = cargo_example("encode", str(RANKS), str(CORPUS), str(args.repeat), str(args.rounds))
    ref = fnv1a64(ids_tk)

    rows = [
        ("ember (ours)", ours["seconds"], ours["fnv1a64"] == ref and ours["tokens"] == len(ids_tk)),
        (f"tiktoken {tiktoken.__version__}", t_tk, True),
        (f"HF tokenizers {__import__('tokenizers').__version__}", t_hf, fnv1a64(ids_hf) == ref),
    ]
    print(f"## Encode: GPT-2 ranks, Tiny Shakespeare x{args.repeat} ({mb:.1f} MB), one thread, best of {args.rounds}\n")
    print("| encoder | MB/s | x tiktoken | ids equal tiktoken's |")
    print("|---|---:|---:|---|")
    for name, seconds, same in rows:
        print(f"| {name} | {mb / seconds:.1f} | {t_tk / seconds:.2f} | {'yes' if same else 'NO'} |")

    corpus = CORPUS.read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory() as tmp:
        ours_train = cargo_example("train", str(CORPUS), str(args.vocab), tmp)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    start = time.perf_counter()
    tok.train_from_iterator([corpus], trainer)
    t_hf_train = time.perf_counter() - start
    hf_bpt = len(corpus.encode()) / len(tok.encode(corpus, add_special_tokens=False).ids)
    print(f"\n## Training: byte-level BPE, vocab {args.vocab}, Tiny Shakespeare (1.1 MB)\n")
    print("| trainer | seconds | bytes per token on the corpus |")
    print("|---|---:|---:|")
    print(f"| ember BpeTrainer (ours) | {ours_train['seconds']:.2f} | {ours_train['bytes_per_token']:.3f} |")
    print(f"| HF BpeTrainer (RAYON_NUM_THREADS=1) | {t_hf_train:.2f} | {hf_bpt:.3f} |")


if __name__ == "__main__":
    main()

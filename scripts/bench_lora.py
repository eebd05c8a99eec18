"""LoRA training throughput: `ember train` against transformers + peft on the same model, batch, block and threads.

Both sides train the same LoRA (rank, alpha, dropout, target modules from the ember config) on the same base:
transformers loads the GGUF named by `model.from` (dequantized to f32, as ember does), peft wraps it, and
torch.optim.AdamW steps the adapters. Each side runs `--steps` optimizer steps of `batch_size` windows of
`block_size` tokens; the first `--warmup` steps are not timed. Runs alternate (ember, peft, ember, peft, ...)
because this VM's speed drifts within an hour: only same-run ratios count. Prints one JSON line per run and a
summary line with the ratio of the medians.

    .venv/bin/python scripts/bench_lora.py --config configs/smollm2-shakespeare.yaml \
        --ember target/release/ember --threads 2 --rounds 2
(the python needs torch, transformers, peft, gguf and pyyaml; the fixture venv has them).
"""

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import yaml


def peft_run(config, config_dir, steps, warmup, threads):
    import torch
    import torch.nn.functional as F
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    gguf = (config_dir / config["model"]["from"]).resolve()
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, torch_dtype=torch.float32
    )
    lora = config["training"]["lora"]
    model = get_peft_model(
        model,
        LoraConfig(
            r=lora["rank"],
            lora_alpha=lora["alpha"],
            lora_dropout=lora.get("dropout", 0.0),
            target_modules=lora["targets"],
        ),
    )
    model.train()
    training = config["training"]
    opt = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=training["learning_rate"],
        betas=(training.get("beta1", 0.9), training.get("beta2", 0.95)),
        eps=training.get("eps", 1e-8),
        weight_decay=training.get("weight_decay", 0.1),
    )
    batch, block = training["batch_size"], config["model"]["block_size"]
    vocab = model.config.vocab_size
    # Token ids do not change the work; random ones keep the script free of a tokenizer.
    gen = torch.Generator().manual_seed(1)
    start = None
    for step in range(steps):
        if step == warmup:
            start = time.perf_counter()
        rows = torch.randint(0, vocab, (batch, block + 1), generator=gen)
        logits = model(input_ids=rows[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, vocab), rows[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(
            [p for p in model.parameters() if p.requires_grad], training.get("grad_clip", 1.0)
        )
        opt.step()
        opt.zero_grad(set_to_none=True)
    elapsed = time.perf_counter() - start
    return (steps - warmup) * batch * block / elapsed


def ember_run(ember, config, config_dir, steps, warmup, threads):
    with tempfile.TemporaryDirectory() as tmp:
        # The same config with a line per step and no validation or checkpoint inside the timed steps; its paths
        # made absolute, since they are relative to the config's directory.
        derived = json.loads(json.dumps(config))
        derived["data"]["inputs"] = [str((config_dir / p).resolve()) for p in config["data"]["inputs"]]
        derived["data"]["cache_dir"] = str((config_dir / config["data"]["cache_dir"]).resolve())
        derived["model"]["from"] = str((config_dir / config["model"]["from"]).resolve())
        derived["training"].update(
            log_interval=1, eval_interval=steps + 1, checkpoint_interval=steps + 1, time_limit_min=None
        )
        derived_path = Path(tmp) / "config.yaml"
        derived_path.write_text(yaml.safe_dump(derived))
        run_dir = Path(tmp) / "run"
        subprocess.run(
            [ember, "--quiet", "--threads", str(threads), "train", "--config", str(derived_path),
             "--out", str(run_dir), "--max-steps", str(steps)],
            check=True,
        )
        lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
        train = [l for l in lines if "loss" in l]
        # Each line's tokens/s covers its own step (equal tokens each), so the harmonic mean over the timed steps
        # is their tokens over their time.
        timed = train[warmup:]
        return len(timed) / sum(1.0 / l["tokens_per_sec"] for l in timed)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--ember", required=True, help="path to the ember binary (release build)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    config = yaml.safe_load(args.config.read_text())
    results = {"ember": [], "peft": []}
    for round_ in range(args.rounds):
        for side in ("ember", "peft"):
            if side == "ember":
                rate = ember_run(args.ember, config, args.config.parent, args.steps, args.warmup, args.threads)
            else:
                rate = peft_run(config, args.config.parent, args.steps, args.warmup, args.threads)
            results[side].append(rate)
            print(json.dumps({"round": round_, "side": side, "tokens_per_sec": round(rate, 1)}), flush=True)
    ember, peft = statistics.median(results["ember"]), statistics.median(results["peft"])
    print(json.dumps({"ember_tokens_per_sec": round(ember, 1), "peft_tokens_per_sec": round(peft, 1),
                      "ratio": round(ember / peft, 3)}))


if __name__ == "__main__":
    main()

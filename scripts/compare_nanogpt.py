"""A nanoGPT-style PyTorch baseline for `ember train`: same data, same tokenizer, equal parameter count, equal wall time.

It reads the ember run's config (YAML) and tokenizer (the run's best/tokenizer.json), trains a GPT-2-style model
(learned positions, LayerNorm, GELU MLP, tied embeddings) sized to the ember model's parameter count, with AdamW and a
warm-up + cosine schedule, for the same wall time, on the same number of CPU threads. It prints one JSON line with
tokens/s and the validation loss in nats/token and bits/byte on the last `val_fraction` of the corpus, measured like
ember measures it (sequential windows of block_size + 1 tokens, bytes of the decoded target tokens).

    .venv/bin/python scripts/compare_nanogpt.py --config configs/tinyshakespeare.yaml \
        --run runs/tinyshakespeare --minutes 10 --threads 2
"""

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml
from tokenizers import Tokenizer


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.fc, self.out = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, d, layers, heads, block):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return self.ln(x) @ self.wte.weight.T


def ember_param_count(vocab, m):
    d, kv = m["hidden_size"], m["hidden_size"] // m["num_heads"] * m["num_kv_heads"]
    per_layer = 2 * d * d + 2 * d * kv + 3 * d * m["intermediate_size"] + 2 * d
    head = 0 if m.get("tie_embeddings", True) else vocab * d
    return vocab * d + m["num_layers"] * per_layer + d + head


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--run", required=True, help="ember run directory (its best/tokenizer.json is used)")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-steps", type=int, default=None,
                    help="schedule length [default: the config's training.max_steps]; set it so that the cosine "
                         "ends at --minutes for an equal-wall-time comparison")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1337)
    cfg = yaml.safe_load(Path(args.config).read_text())
    base = Path(args.config).parent
    m, t = cfg["model"], cfg.get("training", {})
    tok = Tokenizer.from_file(str(Path(args.run) / "best" / "tokenizer.json"))
    text = "".join((base / p).read_text() for p in cfg["data"]["inputs"])
    ids = torch.tensor(tok.encode(text, add_special_tokens=False).ids, dtype=torch.long)
    split = int(len(ids) * (1 - cfg["data"].get("val_fraction", 0.1)))
    train, val = ids[:split], ids[split:]
    vocab, block, batch = tok.get_vocab_size(), m["block_size"], t.get("batch_size", 16)

    target = ember_param_count(vocab, m)
    # Pick the nanoGPT width (multiple of the head count) whose parameter count is closest to ember's model.
    heads, layers = m["num_heads"], m["num_layers"]
    widths = range(heads * 4, 4 * m["hidden_size"], heads)
    count = lambda d: sum(p.numel() for p in GPT(vocab, d, layers, heads, block).parameters())
    d = min(widths, key=lambda d: abs(count(d) - target))
    model = GPT(vocab, d, layers, heads, block)
    params = sum(p.numel() for p in model.parameters())

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": t.get("weight_decay", 0.1)}, {"params": no_decay, "weight_decay": 0.0}],
        lr=t.get("learning_rate", 1e-3),
        betas=(t.get("beta1", 0.9), t.get("beta2", 0.95)),
    )
    peak, floor = t.get("learning_rate", 1e-3), t.get("min_learning_rate", 1e-4)
    warmup, total = t.get("warmup_steps", 100), args.max_steps or t.get("max_steps", 2000)

    def lr_at(step):
        if step < warmup:
            return peak * (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    gen = torch.Generator().manual_seed(1337)
    start, step, tokens = time.time(), 0, 0
    while time.time() - start < args.minutes * 60 and step < total:
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        starts = torch.randint(0, len(train) - block - 1, (batch,), generator=gen)
        x = torch.stack([train[s : s + block] for s in starts])
        y = torch.stack([train[s + 1 : s + block + 1] for s in starts])
        loss = F.cross_entropy(model(x).view(-1, vocab), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.get("grad_clip", 1.0))
        opt.step()
        step, tokens = step + 1, tokens + batch * block
    elapsed = time.time() - start

    model.eval()
    windows = [val[i : i + block + 1] for i in range(0, len(val) - block - 1, block)]
    windows = windows[: t.get("eval_batches", 20) * batch]
    total_loss, total_bytes, total_tokens = 0.0, 0, 0
    with torch.no_grad():
        for i in range(0, len(windows), batch):
            w = torch.stack(windows[i : i + batch])
            logits = model(w[:, :-1])
            total_loss += F.cross_entropy(logits.reshape(-1, vocab), w[:, 1:].reshape(-1), reduction="sum").item()
            total_tokens += w[:, 1:].numel()
            total_bytes += sum(len(tok.decode(r.tolist(), skip_special_tokens=False).encode()) for r in w[:, 1:])
    val_loss = total_loss / total_tokens
    print(json.dumps({
        "params": params, "ember_params": target, "width": d, "steps": step, "seconds": round(elapsed, 1),
        "tokens_per_sec": round(tokens / elapsed, 1), "val_loss": round(val_loss, 4),
        "val_bpb": round(val_loss / math.log(2) * total_tokens / total_bytes, 4),
    }))


if __name__ == "__main__":
    main()

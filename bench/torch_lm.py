#!/usr/bin/env python3
"""PyTorch's side of `bench_train_step` and `bench_decode`: a decoder-only LM built the way
rusting_brain's TransformerLm is (tied embedding and head, pre-norm RMSNorm with eps 1e-5,
rotate-half RoPE with theta 10000, grouped-query attention through SDPA, SwiGLU, AdamW with
weight decay 0.1), timed on random token ids.

It prints one JSON line. Training: tokens/s of a whole step (forward, backward, AdamW),
median of --steps after three warm-up steps. With --decode N: greedy KV-cached decode of N
tokens at batch 1 after a 16-token prompt. With --prefill 16,128,512: prompt processing
tokens/s at each length (one forward over the prompt into an empty cache, best of 3).
With --int8: decode and prefill run the model after torch's dynamic int8 quantization of
every Linear (`torch.ao.quantization.quantize_dynamic`); the tied head stays f32, as
PyTorch has no dynamic int8 embedding-as-matmul.

  python3 bench/torch_lm.py --d-model 256 --layers 6 --heads 8 --kv-heads 2 --head-dim 32 \\
      --d-ff 704 --vocab 4096 --batch 8 --seq 256 --steps 10 [--compile] [--bf16] \\
      [--decode 128] [--prefill 16,128,512] [--int8] [--device cuda]
"""
import argparse
import json
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.w = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.w


def rotate(x, cos, sin):
    """RoPE in the rotate-half convention: x is (batch, heads, positions, head_dim)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


class Attention(nn.Module):
    """Grouped-query self-attention with RoPE; `cache`, when given, keeps keys and values."""

    def __init__(self, a):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = a.heads, a.kv_heads, a.head_dim
        self.wq = nn.Linear(a.d_model, a.heads * a.head_dim, bias=False)
        self.wk = nn.Linear(a.d_model, a.kv_heads * a.head_dim, bias=False)
        self.wv = nn.Linear(a.d_model, a.kv_heads * a.head_dim, bias=False)
        self.wo = nn.Linear(a.heads * a.head_dim, a.d_model, bias=False)

    def forward(self, h, cos, sin, cache=None):
        b, t, _ = h.shape
        q = self.wq(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if cache is not None:
            if cache:
                k = torch.cat([cache["k"], k], 2)
                v = torch.cat([cache["v"], v], 2)
            cache["k"], cache["v"] = k, v
        group = self.heads // self.kv_heads
        k = k.repeat_interleave(group, 1)
        v = v.repeat_interleave(group, 1)
        # Causal only when the queries are the whole sequence (training, or a prompt into
        # an empty cache); one new token attends to everything cached.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.attn_norm, self.ffn_norm = RMSNorm(a.d_model), RMSNorm(a.d_model)
        self.attn = Attention(a)
        self.gate = nn.Linear(a.d_model, a.d_ff, bias=False)
        self.up = nn.Linear(a.d_model, a.d_ff, bias=False)
        self.down = nn.Linear(a.d_ff, a.d_model, bias=False)

    def forward(self, x, cos, sin, cache):
        x = x + self.attn(self.attn_norm(x), cos, sin, cache)
        h = self.ffn_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Lm(nn.Module):
    def __init__(self, a, max_positions):
        super().__init__()
        self.embed = nn.Embedding(a.vocab, a.d_model)
        self.blocks = nn.ModuleList(Block(a) for _ in range(a.layers))
        self.norm = RMSNorm(a.d_model)
        inv = 1.0 / (10000 ** (torch.arange(0, a.head_dim, 2).float() / a.head_dim))
        angles = torch.outer(torch.arange(max_positions).float(), inv)
        angles = torch.cat([angles, angles], -1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, ids, start=0, caches=None):
        t = ids.shape[1]
        cos, sin = self.cos[start : start + t], self.sin[start : start + t]
        x = self.embed(ids)
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, None if caches is None else caches[i])
        return self.norm(x) @ self.embed.weight.T


def train_rate(a, model, dev):
    opt = torch.optim.AdamW(
        model.parameters(), lr=3e-4, weight_decay=0.1, fused=dev.type == "cuda"
    )
    run = torch.compile(model) if a.compile else model
    ids = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device=dev)

    def step():
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=a.bf16):
            logits = run(ids[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, a.vocab), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    sync(dev)
    times = []
    for _ in range(a.steps):
        t = time.perf_counter()
        step()
        sync(dev)
        times.append(time.perf_counter() - t)
    times.sort()
    median = times[len(times) // 2]
    return a.batch * a.seq / median, median


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def decode_rate(a, model, dev):
    caches = [dict() for _ in range(a.layers)]
    prompt = torch.randint(0, a.vocab, (1, 16), device=dev)
    nxt = model(prompt, 0, caches)[:, -1].argmax(-1, keepdim=True)
    sync(dev)
    t = time.perf_counter()
    for i in range(a.decode):
        nxt = model(nxt, 16 + i, caches)[:, -1].argmax(-1, keepdim=True)
    sync(dev)
    return a.decode / (time.perf_counter() - t)


def prefill_rate(a, model, dev, length):
    prompt = torch.randint(0, a.vocab, (1, length), device=dev)
    best = float("inf")
    for _ in range(4):  # the first is a warm-up
        caches = [dict() for _ in range(a.layers)]
        sync(dev)
        t = time.perf_counter()
        model(prompt, 0, caches)
        sync(dev)
        best = min(best, time.perf_counter() - t)
    return length / best


def main():
    p = argparse.ArgumentParser()
    defaults = dict(d_model=256, layers=6, heads=8, kv_heads=2, head_dim=32, d_ff=704,
                    vocab=4096, batch=8, seq=256, steps=10, decode=0, threads=0)
    for k, v in defaults.items():
        p.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    p.add_argument("--prefill", default="", help="comma-separated prompt lengths")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--int8", action="store_true", help="dynamic int8 Linear layers for decode/prefill")
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dev = torch.device(a.device)
    lengths = [int(v) for v in a.prefill.split(",") if v]
    model = Lm(a, max(a.seq, 16 + a.decode, *lengths, 1) + 1).to(dev)
    out = dict(
        framework="torch " + torch.__version__,
        mode=("compile" if a.compile else "eager") + ("+bf16" if a.bf16 else "") + ("+int8" if a.int8 else ""),
        device=a.device,
        threads=torch.get_num_threads(),
        params=sum(p.numel() for p in model.parameters()),
    )
    if a.steps > 0 and not a.int8:
        rate, median = train_rate(a, model, dev)
        out.update(shape=f"{a.batch}x{a.seq}", train_tokens_per_s=round(rate, 1),
                   step_ms_median=round(median * 1e3, 2))
    if a.decode or lengths:
        model.eval()
        if a.int8:
            # Deprecated in favour of torchao, which is not a dependency here; the eager
            # API still runs and is what a user of plain torch has.
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            warnings.filterwarnings("ignore", category=UserWarning)
            model = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
        with torch.no_grad():
            if a.decode:
                out["decode_tokens_per_s"] = round(decode_rate(a, model, dev), 1)
            for n in lengths:
                out[f"prefill{n}_tokens_per_s"] = round(prefill_rate(a, model, dev, n), 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

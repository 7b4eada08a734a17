#!/usr/bin/env python3
"""PyTorch side of `bench_train_step -- <batch> <seq> cpu --moe`: the same decoder-only LM as
bench/torch_lm.py (tied embeddings, pre-norm RMSNorm, RoPE, GQA through SDPA,
AdamW) with every feed-forward a mixture of experts written the way Hugging Face's Mixtral
block is: a linear router, softmax, top-k, the k weights renormalized, then a loop over
experts that gathers each expert's tokens (index), runs its SwiGLU, and scatter-adds the
weighted result (index_add_). The Switch load-balancing loss (0.01) and the router
z-loss (0.001) are added to the objective, as rusting_brain does. Prints one line of JSON
with training tokens/s (forward + backward + AdamW step, median of --steps).

  python3 bench/torch_moe.py --batch 8 --seq 256 --experts 8 --top-k 2 --expert-d-ff 352
"""
import argparse
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# Same directory: the dense benchmark's norm and attention, so the two models cannot drift.
from torch_lm import Attention, RMSNorm


class Expert(nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.gate = nn.Linear(d, f, bias=False)
        self.up = nn.Linear(d, f, bias=False)
        self.down = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Moe(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.router = nn.Linear(a.d_model, a.experts, bias=False)
        self.experts = nn.ModuleList(Expert(a.d_model, a.expert_d_ff) for _ in range(a.experts))
        self.k = a.top_k

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits = self.router(x)
        probs = torch.softmax(logits, -1)
        weights, chosen = torch.topk(probs, self.k, -1)
        weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(chosen == e)
            if token.numel():
                out.index_add_(0, token, expert(x[token]) * weights[token, slot, None])
        n_e = len(self.experts)
        f = F.one_hot(chosen, n_e).sum((0, 1)).float() / chosen.numel()
        lb = n_e * (f * probs.mean(0)).sum()
        z = torch.logsumexp(logits, -1).pow(2).mean()
        return out.reshape(shape), 0.01 * lb + 0.001 * z


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.n1, self.n2 = RMSNorm(a.d_model), RMSNorm(a.d_model)
        self.attn = Attention(a)
        self.moe = Moe(a)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.n1(x), cos, sin)
        out, aux = self.moe(self.n2(x))
        return x + out, aux


class Lm(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.emb = nn.Embedding(a.vocab, a.d_model)
        self.blocks = nn.ModuleList(Block(a) for _ in range(a.layers))
        self.norm = RMSNorm(a.d_model)
        inv = 1.0 / (10000 ** (torch.arange(0, a.head_dim, 2).float() / a.head_dim))
        f = torch.outer(torch.arange(a.seq).float(), inv)
        f = torch.cat([f, f], -1)
        self.register_buffer("cos", f.cos(), persistent=False)
        self.register_buffer("sin", f.sin(), persistent=False)

    def forward(self, ids):
        x = self.emb(ids)
        aux = 0.0
        for blk in self.blocks:
            x, a = blk(x, self.cos, self.sin)
            aux = aux + a
        return self.norm(x) @ self.emb.weight.T, aux / len(self.blocks)


def main():
    p = argparse.ArgumentParser()
    for k, v in dict(d_model=256, layers=6, heads=8, kv_heads=2, head_dim=32, vocab=4096, batch=8, seq=256,
                     steps=10, threads=0, experts=8, top_k=2, expert_d_ff=352).items():
        p.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Lm(a)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq + 1))

    def step():
        logits, aux = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, a.vocab), ids[:, 1:].reshape(-1)) + aux
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    times = []
    for _ in range(a.steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    times.sort()
    med = times[len(times) // 2]
    print(json.dumps(dict(framework="torch " + torch.__version__, mode="eager moe", threads=torch.get_num_threads(),
                          params=params, shape=f"{a.batch}x{a.seq}", train_tokens_per_s=round(a.batch * a.seq / med, 1),
                          step_ms_median=round(med * 1e3, 2))))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""PyTorch side of the dense-network benchmark (native/examples/bench_dense.rs).

Same network and step as rusting_brain's Network: Linear layers (784-256-128-10), ReLU,
softmax + categorical cross-entropy (as log_softmax + NLL, mean over rows), Adam(lr 1e-3),
mini-batches of --batch from a shuffled random data set of --samples rows, float32, eager
mode. Prints one line of JSON: training samples/s of the best of --epochs epochs after one
warm-up (the best, because this shared VM's noise only ever slows a run down).

  python3 bench/torch_dense.py --batch 64 --samples 8192 --epochs 3 [--threads N]
"""
import argparse, json, os, time
import torch, torch.nn as nn, torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=64)
p.add_argument("--samples", type=int, default=8192)
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--threads", type=int, default=os.cpu_count())
p.add_argument("--sizes", default="784,256,128,10")
a = p.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)
sizes = [int(s) for s in a.sizes.split(",")]
layers = []
for i in range(len(sizes) - 1):
    layers.append(nn.Linear(sizes[i], sizes[i + 1]))
    if i < len(sizes) - 2:
        layers.append(nn.ReLU())
model = nn.Sequential(*layers)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.rand(a.samples, sizes[0])
y = torch.randint(0, sizes[-1], (a.samples,))


def epoch():
    order = torch.randperm(a.samples)
    for i in range(0, a.samples, a.batch):
        idx = order[i : i + a.batch]
        opt.zero_grad(set_to_none=True)
        loss = F.nll_loss(F.log_softmax(model(x[idx]), dim=1), y[idx])
        loss.backward()
        opt.step()


epoch()  # warm-up
best = float("inf")
for _ in range(a.epochs):
    t = time.perf_counter()
    epoch()
    best = min(best, time.perf_counter() - t)
print(json.dumps({"framework": "torch", "version": torch.__version__, "threads": a.threads, "batch": a.batch,
                  "samples_per_s": a.samples / best}))

"""PyTorch's side of native/examples/bench_unet.rs: one UNet2DConditionModel call (one
sampling step with classifier-free guidance, batch 2) of diffusers' model built from the
same configurations, random weights, on the CPU in float32, best time of --reps, and the
rise of the process's peak resident memory over the first call. Prints one JSON line.

    python bench/torch_unet.py --threads 2 --reps 3 --cases '[{"config": {...}, "latent": 64,
        "tokens": 77}, ...]'
"""
import argparse
import json
import resource
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--threads", type=int, default=1)
p.add_argument("--reps", type=int, default=3)
p.add_argument("--cases", type=str, default="[]")
a = p.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)

import diffusers  # noqa: E402


def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


out = {"version": torch.__version__, "diffusers": diffusers.__version__, "threads": a.threads, "step": [],
       "peak_rise_mib": []}
with torch.inference_mode():
    for case in json.loads(a.cases):
        model = diffusers.UNet2DConditionModel(**case["config"]).eval()
        n = case["latent"]
        x = torch.randn(2, model.config.in_channels, n, n)
        ctx = torch.randn(2, case["tokens"], model.config.cross_attention_dim)
        t = torch.tensor([500.0, 500.0])
        before = peak_mib()
        model(x, t, ctx)
        out["peak_rise_mib"].append(peak_mib() - before)
        best = float("inf")
        for _ in range(a.reps):
            s = time.perf_counter()
            model(x, t, ctx)
            best = min(best, time.perf_counter() - s)
        out["step"].append(best)
print(json.dumps(out))

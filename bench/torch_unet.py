"""PyTorch's side of native/examples/bench_unet.rs: one UNet2DConditionModel call (one
sampling step with classifier-free guidance, batch 2) of diffusers' model built from the
same configurations, random weights, on the CPU in float32 and, where the CPU has native
bf16 (oneDNN's check), under bf16 autocast; best time of --reps each, and the process's
peak resident memory. Prints one JSON line.

    python bench/torch_unet.py --threads 2 --reps 3 --cases '[{"config": {...}, "latent": 64,
        "tokens": 77}, ...]'
"""
import json

import torch

from bench_args import best, parser, peak_mib, start, unet_case

p = parser()
p.add_argument("--cases", type=str, default="[]")
a = start(p)

import diffusers  # noqa: E402


out = {"version": torch.__version__, "diffusers": diffusers.__version__, "threads": a.threads, "step": [],
       "step_bf16": [], "peak_rise_mib": [], "peak_mib": []}
bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()
with torch.inference_mode():
    for case in json.loads(a.cases):
        model, x, t, ctx = unet_case(diffusers, case)
        before = peak_mib()
        model(x, t, ctx)
        out["peak_rise_mib"].append(peak_mib() - before)
        # The first call above was the warm-up.
        out["step"].append(best(lambda: model(x, t, ctx), a.reps, warm_up=False))
        if bf16:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out["step_bf16"].append(best(lambda: model(x, t, ctx), a.reps))
        else:
            out["step_bf16"].append(None)
        out["peak_mib"].append(peak_mib())
print(json.dumps(out))

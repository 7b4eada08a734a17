"""PyTorch's side of native/examples/bench_dit.rs: one denoiser call (one sampling step)
of diffusers' FLUX.1, FLUX.2 and SD3 transformers built from the same configurations,
random weights, on the CPU in float32 and, where the CPU has native bf16 (oneDNN's check),
under bf16 autocast; best time of --reps each, and the process's peak resident memory.
Prints one JSON line.

    python bench/torch_dit.py --threads 2 --reps 3 --cases '[{"class": ..., "config": {...},
        "batch": 1, "grid": [16, 16], "text": 128}, ...]'
"""
import json

import torch

from bench_args import best, parser, peak_mib, start

p = parser()
p.add_argument("--cases", type=str, default="[]")
a = start(p)

import diffusers  # noqa: E402

out = {"version": torch.__version__, "diffusers": diffusers.__version__, "threads": a.threads, "step": [],
       "step_bf16": [], "peak_mib": []}
bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()
with torch.inference_mode():
    for case in json.loads(a.cases):
        cls = getattr(diffusers, case["class"])
        cfg = case["config"]
        model = cls(**cfg).eval()
        b, (gh, gw), nt = case["batch"], case["grid"], case["text"]
        ctx = torch.randn(b, nt, cfg["joint_attention_dim"])
        t = torch.full((b,), 0.5)
        if case["class"] == "SD3Transformer2DModel":
            p_ = cfg["patch_size"]
            x = torch.randn(b, cfg["in_channels"], gh * p_, gw * p_)
            pooled = torch.randn(b, cfg["pooled_projection_dim"])
            f = lambda: model(hidden_states=x, encoder_hidden_states=ctx, pooled_projections=pooled,
                              timestep=t * 1000)
        else:
            axes = len(cfg["axes_dims_rope"])
            x = torch.randn(b, gh * gw, cfg["in_channels"])
            img_ids = torch.zeros(gh * gw, axes)
            img_ids[:, 1] = torch.arange(gh).repeat_interleave(gw)
            img_ids[:, 2] = torch.arange(gw).repeat(gh)
            txt_ids = torch.zeros(nt, axes)
            kw = dict(hidden_states=x, encoder_hidden_states=ctx, timestep=t, img_ids=img_ids, txt_ids=txt_ids)
            if case["class"] == "FluxTransformer2DModel":
                kw["pooled_projections"] = torch.randn(b, cfg["pooled_projection_dim"])
            kw["guidance"] = torch.full((b,), 3.5) if cfg.get("guidance_embeds") else None
            f = lambda: model(**kw)
        out["step"].append(best(f, a.reps))
        if bf16:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out["step_bf16"].append(best(f, a.reps))
        else:
            out["step_bf16"].append(None)
        out["peak_mib"].append(peak_mib())
print(json.dumps(out))

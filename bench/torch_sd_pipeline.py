"""diffusers' side of bench/sd_pipeline.py: one picture from a StableDiffusionPipeline
folder (bench/sd15_folder.py), as a user makes it, on the CPU in float32 or under bf16
autocast, with the DDIM scheduler (one UNet call of batch 2 a step, as ours). Times the
whole call, and the UNet's, text encoder's and VAE decoder's calls inside it through
forward hooks; after one warm-up picture of one step. Prints one JSON line, with the
process's peak resident memory.

    python bench/torch_sd_pipeline.py --folder /var/tmp/rb-sdcpp/sd15 --threads 2 --steps 20 [--bf16]
"""
import json
import time

import torch

from bench_args import parser, peak_mib, start

p = parser()
p.add_argument("--folder", required=True)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--size", type=int, default=512)
p.add_argument("--bf16", action="store_true")
a = start(p)

import diffusers  # noqa: E402
from diffusers import DDIMScheduler, StableDiffusionPipeline  # noqa: E402

t0 = time.perf_counter()
pipe = StableDiffusionPipeline.from_pretrained(a.folder, torch_dtype=torch.float32, safety_checker=None)
pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
pipe.set_progress_bar_config(disable=True)
load_s = time.perf_counter() - t0

spent = {"unet": 0.0, "text_encoder": 0.0, "decode": 0.0}


def timed(module, name):
    def pre(*_):
        module._rb_start = time.perf_counter()

    def post(*_):
        spent[name] += time.perf_counter() - module._rb_start

    module.register_forward_pre_hook(pre)
    module.register_forward_hook(post)


timed(pipe.unet, "unet")
timed(pipe.text_encoder, "text_encoder")
timed(pipe.vae.decoder, "decode")


def picture(steps):
    g = torch.Generator().manual_seed(0)
    return pipe("a lighthouse in fog", num_inference_steps=steps, height=a.size, width=a.size, generator=g,
                guidance_scale=7.5, output_type="np")


with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
    picture(1)
    for k in spent:
        spent[k] = 0.0
    t0 = time.perf_counter()
    picture(a.steps)
    total = time.perf_counter() - t0
print(json.dumps({"version": torch.__version__, "diffusers": diffusers.__version__, "threads": a.threads,
                  "bf16": a.bf16, "load_s": load_s, "total_s": total, "denoise_s": spent["unet"],
                  "prompt_s": spent["text_encoder"], "decode_s": spent["decode"], "steps": a.steps,
                  "peak_mib": peak_mib()}))

"""PyTorch's side of `bench_image --published`: SD's AutoencoderKL decode (random weights,
SD's configuration) from a latent of --latent x --latent, on the CPU in float32 and, where
the CPU has native bf16 (oneDNN's check), under bf16 autocast; best time of --reps each,
and the process's peak resident memory. Prints one JSON line.

    python bench/torch_vae.py --threads 2 --reps 1 --latent 64
"""
import json

import torch

from bench_args import best, parser, peak_mib, start

p = parser()
p.add_argument("--latent", type=int, default=64)
a = start(p)

from diffusers import AutoencoderKL  # noqa: E402

out = {"version": torch.__version__, "threads": a.threads}
bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()
with torch.inference_mode():
    vae = AutoencoderKL(block_out_channels=(128, 256, 512, 512), layers_per_block=2,
                        down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4,
                        latent_channels=4, norm_num_groups=32).eval()
    z = torch.randn(1, 4, a.latent, a.latent)
    out["decode"] = best(lambda: vae.decode(z).sample, a.reps)
    if bf16:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out["decode_bf16"] = best(lambda: vae.decode(z).sample, a.reps)
    out["peak_mib"] = peak_mib()
print(json.dumps(out))

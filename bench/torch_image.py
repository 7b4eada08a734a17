"""PyTorch's side of native/examples/bench_image.rs: the same convolutions, the same
AutoencoderKL decode (SD's VAE configuration, random weights) and the same attention, on
the CPU in float32, best time of --reps. Prints one JSON line.

    python bench/torch_image.py --threads 2 --reps 3 --convs '[[1,512,512,64,64,3], ...]' \
        --latent 32 --tokens 4608 --heads 24 --head-dim 128
"""
import json

import torch
import torch.nn.functional as F

from bench_args import best as best_of, parser, start

p = parser()
p.add_argument("--convs", type=str, default="[]")
p.add_argument("--latent", type=int, default=32)
p.add_argument("--tokens", type=int, default=4608)
p.add_argument("--heads", type=int, default=24)
p.add_argument("--head-dim", type=int, default=128)
a = start(p)


def best(f):
    return best_of(f, a.reps)


out = {"version": torch.__version__, "threads": a.threads, "conv": []}
with torch.inference_mode():
    for b, cin, cout, h, w, k in json.loads(a.convs):
        x = torch.randn(b, cin, h, w)
        wt = torch.randn(cout, cin, k, k) * 0.02
        bias = torch.randn(cout)
        out["conv"].append(best(lambda: F.conv2d(x, wt, bias, padding=k // 2)))

    from diffusers import AutoencoderKL
    vae = AutoencoderKL(block_out_channels=(128, 256, 512, 512), layers_per_block=2,
                        down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4,
                        latent_channels=4, norm_num_groups=32).eval()
    z = torch.randn(1, 4, a.latent, a.latent)
    out["vae_decode"] = best(lambda: vae.decode(z).sample)
    out["vae_parameters"] = sum(p.numel() for p in vae.parameters())

    q = torch.randn(1, a.heads, a.tokens, a.head_dim)
    k = torch.randn(1, a.heads, a.tokens, a.head_dim)
    v = torch.randn(1, a.heads, a.tokens, a.head_dim)
    out["sdpa"] = best(lambda: F.scaled_dot_product_attention(q, k, v))
print(json.dumps(out))

"""Writes a Stable Diffusion 1.5 pipeline folder of random weights at the published sizes,
through diffusers' and transformers' own `save_pretrained`: the UNet, VAE, text encoder
and scheduler of tests/fixtures/real_configs/sd1.5 (each model built from its config, so
the folder has the published shapes and tensor names, not its weights) and the small
CLIP vocabulary of tests/fixtures/clip_tokenizer (ids below the text encoder's 49,408).
`bench/sd_pipeline.py` runs ours, diffusers' StableDiffusionPipeline and
stable-diffusion.cpp (which takes a diffusers folder) on it.

    python bench/sd15_folder.py --out /var/tmp/rb-sd15
"""
import argparse
import json
import os
import shutil

import torch
from diffusers import AutoencoderKL, PNDMScheduler, UNet2DConditionModel
from safetensors.torch import load_file, save_file
from transformers import CLIPTextConfig, CLIPTextModel

here = os.path.dirname(os.path.abspath(__file__))
configs = os.path.join(here, "..", "tests", "fixtures", "real_configs", "sd1.5")
tokenizer = os.path.join(here, "..", "tests", "fixtures", "clip_tokenizer")

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--seed", type=int, default=0)
a = p.parse_args()

if os.path.exists(os.path.join(a.out, "model_index.json")):
    print(f"{a.out} is there already")
    raise SystemExit(0)
torch.manual_seed(a.seed)
os.makedirs(a.out, exist_ok=True)
# Random weights at each module's default initialization: the timings do not depend on
# the values, and the pictures are noise either way.
UNet2DConditionModel.from_config(UNet2DConditionModel.load_config(os.path.join(configs, "unet"))) \
    .save_pretrained(os.path.join(a.out, "unet"))
AutoencoderKL.from_config(AutoencoderKL.load_config(os.path.join(configs, "vae"))) \
    .save_pretrained(os.path.join(a.out, "vae"))
CLIPTextModel(CLIPTextConfig.from_pretrained(os.path.join(configs, "text_encoder"))) \
    .save_pretrained(os.path.join(a.out, "text_encoder"))
# The text encoder's tensors named as the published folder names them ("text_model."
# first, as transformers 4 wrote them): transformers 5 writes them without it, which
# stable-diffusion.cpp does not recognize, and every reader takes the published names.
te = os.path.join(a.out, "text_encoder", "model.safetensors")
tensors = load_file(te)
save_file({k if k.startswith("text_model.") else "text_model." + k: v.contiguous() for k, v in tensors.items()}, te,
          metadata={"format": "pt"})
PNDMScheduler.from_config(PNDMScheduler.load_config(os.path.join(configs, "scheduler"))) \
    .save_pretrained(os.path.join(a.out, "scheduler"))
os.makedirs(os.path.join(a.out, "tokenizer"), exist_ok=True)
for f in ["merges.txt", "special_tokens_map.json", "tokenizer_config.json", "vocab.json"]:
    shutil.copy(os.path.join(tokenizer, f), os.path.join(a.out, "tokenizer", f))
# The folder as a user's has it: the tokenizer, and no safety checker.
with open(os.path.join(configs, "model_index.json")) as f:
    index = json.load(f)
index["tokenizer"] = ["transformers", "CLIPTokenizer"]
index["safety_checker"] = [None, None]
index["feature_extractor"] = [None, None]
index["requires_safety_checker"] = False
with open(os.path.join(a.out, "model_index.json"), "w") as f:
    json.dump(index, f, indent=2)
print(f"wrote {a.out}")

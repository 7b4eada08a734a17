"""Writes a random Qwen2-0.5B-shaped checkpoint (494M parameters, BF16, tied embedding,
sharded at 400 MB) with transformers' own `save_pretrained`, for `bench_load`:

    python3 bench/hf_load_model.py /tmp/rb-qwen2-0.5b
    cargo run --release -p rusting_brain --example bench_load -- /tmp/rb-qwen2-0.5b

Nothing is downloaded: the configuration is Qwen2.5-0.5B's shape and the weights are
transformers' random initialization. The directory is about 1 GB; it is not committed.
Prints one JSON line: the parameter count and the seconds transformers took to write it.
"""
import json
import sys
import time

import torch
import transformers


def main():
    out = sys.argv[1]
    config = transformers.Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    model = transformers.Qwen2ForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    t = time.time()
    model.save_pretrained(out, max_shard_size="400MB")
    print(json.dumps(dict(parameters=params, save_seconds=round(time.time() - t, 2))))


if __name__ == "__main__":
    main()

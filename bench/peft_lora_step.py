#!/usr/bin/env python3
"""PyTorch side of `bench_lora`: full fine-tuning and PEFT LoRA of a LlamaForCausalLM at the
README's 38.9M shape (vocab 32000, d_model 512, 8 layers, heads 8/2/64, d_ff 1408, tied
embedding), AdamW, float32 on the CPU. One mode per process; prints one line of JSON:
training tokens/s (forward + backward + step, median over the timed steps), the trainable
parameter count and the peak RSS.

  python3 bench/peft_lora_step.py --mode full|lora [--batch 4 --seq 256 --steps 3 --threads 2]
"""
import argparse, json, statistics, time

import torch
import transformers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["full", "lora"], required=True)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
        num_key_value_heads=2, head_dim=64, intermediate_size=1408, max_position_embeddings=1024,
        tie_word_embeddings=True, rms_norm_eps=1e-5,
    )
    model = transformers.LlamaForCausalLM(cfg)
    if a.mode == "lora":
        from peft import LoraConfig, get_peft_model
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=targets, lora_dropout=0.0))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    ids = torch.randint(0, 32000, (a.batch, a.seq + 1))
    times = []
    for i in range(a.steps + 1):
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        out = model(input_ids=ids[:, :-1], labels=ids[:, :-1])  # transformers shifts the labels itself
        out.loss.backward()
        opt.step()
        if i > 0:  # the first step warms up (allocations, the optimizer's state)
            times.append(time.perf_counter() - t)
    tokens = a.batch * a.seq
    print(json.dumps({
        "mode": a.mode,
        "tokens_per_s": tokens / statistics.median(times),
        "trainable": sum(p.numel() for p in params),
        # VmHWM, not ru_maxrss (which carries the starting process's high-water mark).
        "peak_rss_kib": next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")),
        "torch": torch.__version__, "transformers": transformers.__version__,
    }))


if __name__ == "__main__":
    main()

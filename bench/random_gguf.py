#!/usr/bin/env python3
"""A GGUF of a random Llama with the shape of a `bench_decode` model, without torch: the
`gguf` package's writer and numpy. For llama.cpp's `llama-bench` column, where only the
shapes matter (the benchmark feeds random ids), so the weights are random normals (0.02),
the norms ones, the embedding tied to the head as in rusting_brain's TransformerLm, and
the vocabulary placeholder tokens in llama.cpp's SentencePiece ("llama") form. Written
as F32, then `llama-quantize` makes the type asked for (Q8_0, Q4_0, Q4_K_M, ...).

  python3 bench/random_gguf.py --quantize /var/tmp/rb-llama/build/bin/llama-quantize \\
      --type Q8_0 --out readme-q8_0.gguf --vocab 32000 --d-model 512 --layers 8 \\
      --heads 8 --kv-heads 2 --head-dim 64 --d-ff 1408

`bench/setup_llama_cpp.sh` runs it for both benchmark shapes where torch is not installed
(`bench/llama_gguf.py`, which needs torch and transformers, goes through llama.cpp's own
converter instead).
"""
import argparse
import pathlib
import subprocess
import tempfile

import numpy as np
from gguf import GGUFWriter, TokenType


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--quantize", required=True, type=pathlib.Path, help="llama-quantize")
    p.add_argument("--type", default="Q8_0", help="llama-quantize's type name")
    p.add_argument("--out", required=True, type=pathlib.Path)
    for k, v in dict(vocab=32000, d_model=512, layers=8, heads=8, kv_heads=2, head_dim=64,
                     d_ff=1408, max_positions=4096).items():
        p.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    a = p.parse_args()
    rng = np.random.default_rng(0)
    normal = lambda *shape: (0.02 * rng.standard_normal(shape)).astype(np.float32)
    ones = lambda n: np.ones(n, dtype=np.float32)
    q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    with tempfile.TemporaryDirectory() as tmp:
        f32 = pathlib.Path(tmp) / "f32.gguf"
        w = GGUFWriter(str(f32), "llama")
        w.add_name("random-llama")
        w.add_context_length(a.max_positions)
        w.add_embedding_length(a.d_model)
        w.add_block_count(a.layers)
        w.add_feed_forward_length(a.d_ff)
        w.add_head_count(a.heads)
        w.add_head_count_kv(a.kv_heads)
        w.add_key_length(a.head_dim)
        w.add_value_length(a.head_dim)
        w.add_rope_dimension_count(a.head_dim)
        w.add_rope_freq_base(10000.0)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_file_type(0)  # all F32
        w.add_tokenizer_model("llama")
        special = ["<unk>", "<s>", "</s>"]
        tokens = special + [f"t{i}" for i in range(a.vocab - len(special))]
        w.add_token_list(tokens)
        w.add_token_scores([0.0] * a.vocab)
        w.add_token_types([TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL]
                          + [TokenType.NORMAL] * (a.vocab - 3))
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        # Shapes as numpy arrays (rows, cols): llama.cpp reads them reversed, as its own
        # converter writes them.
        w.add_tensor("token_embd.weight", normal(a.vocab, a.d_model))
        for l in range(a.layers):
            b = f"blk.{l}."
            w.add_tensor(b + "attn_norm.weight", ones(a.d_model))
            w.add_tensor(b + "attn_q.weight", normal(q, a.d_model))
            w.add_tensor(b + "attn_k.weight", normal(kv, a.d_model))
            w.add_tensor(b + "attn_v.weight", normal(kv, a.d_model))
            w.add_tensor(b + "attn_output.weight", normal(a.d_model, q))
            w.add_tensor(b + "ffn_norm.weight", ones(a.d_model))
            w.add_tensor(b + "ffn_gate.weight", normal(a.d_ff, a.d_model))
            w.add_tensor(b + "ffn_up.weight", normal(a.d_ff, a.d_model))
            w.add_tensor(b + "ffn_down.weight", normal(a.d_model, a.d_ff))
        w.add_tensor("output_norm.weight", ones(a.d_model))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        subprocess.run([str(a.quantize), str(f32), str(a.out), a.type], check=True,
                       stdout=subprocess.DEVNULL)
    print(f"{a.out}: a random Llama ({a.layers} layers, d_model {a.d_model}, vocab {a.vocab}), {a.type}")


if __name__ == "__main__":
    main()

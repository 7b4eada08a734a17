#!/usr/bin/env python3
"""SmolLM2-135M's Q4_1 GGUF run in numpy, to find what tips llama.cpp's chat reply ("L'Étoile,
..." where ours and transformers' readings say "The capital of France is Paris."). Modes:
`f32` multiplies the decoded blocks in float (what `from_gguf` does, and llama.cpp on the
file's dequantized twin); `q8` rounds every product's activations as ggml's CPU path does
before its integer dot products (Q8_1 blocks for the Q4_1 matrices: an f16 scale
`amax / 127`, values `rint(x * 127 / amax)`, an f16 `scale * sum(q)`; Q8_0 blocks for the
Q8_0 head) and sums `d_w d_a sum(q_w q_a) + m_w s_a` over the blocks in float64; `ggml`
sums them in ggml's AVX2 `vec_dot_q4_1_q8_1` float32 order (eight lanes of fused
multiply-adds folded as `hsum_float_8`, the offsets' products added block by block in
float32; `ggml-fma` with that sum fused too). Attention, norms and RoPE in float as
llama.cpp runs them with an F32 KV cache. Prints the top logits after the France chat
prompt, or (`--window`) how far the mode is from llama.cpp's logits on the 40-id window
the Rust test reads (`tests/fixtures/gguf_llama_cpp/smollm2.safetensors`).

Measured at commit 8824934 ("AMD EPYC"): `f32` is llama.cpp on the dequantized twin to
6.5e-7 of the logits' range and puts "The" (504) 0.082 above "L" (60); `q8` keeps "The"
first by 0.118; `ggml` puts "L" first by 0.069, llama.cpp's choice. The offsets' term
`m_w s_a` is large and cancels against the first, so its float32 sum moves the logits by
more than the near-tie: the reply is decided by llama.cpp's float32 rounding inside its
Q4_1 dot product, not by the activations' 8 bits alone. (No mode comes closer than 2.6e-2
of the range to llama.cpp's window logits on the file itself, so some of its order is
still not reproduced here: llamafile's tiles for the Q8_0 head, its exp and SiLU.)

Needs: pip install gguf==0.19.0 numpy (and safetensors for --window).
Usage: python3 bench/emulate_llama_q8.py FILE.q4_1.gguf {f32,q8,ggml,ggml-fma} [--window]
"""

import argparse
import json
import pathlib

import numpy as np
from gguf import GGUFReader

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "tests/fixtures/gguf_llama_cpp"
LAYERS, HEADS, KV_HEADS, HEAD_DIM, THETA, EPS = 30, 9, 3, 64, 100000.0, 1e-5


def f16(a):
    return a.astype(np.float16).astype(np.float32)


def blocks(t):
    """(d, m or None, q) per row and block of 32 for a Q4_1 or Q8_0 tensor."""
    n, k = int(t.shape[1]), int(t.shape[0])
    if t.tensor_type.name == "Q4_1":
        raw = np.asarray(t.data).reshape(-1, 20)
        d = raw[:, 0:2].copy().view(np.float16).astype(np.float32)[:, 0]
        m = raw[:, 2:4].copy().view(np.float16).astype(np.float32)[:, 0]
        q = np.concatenate([raw[:, 4:] & 15, raw[:, 4:] >> 4], axis=1).astype(np.float64)
        return d.reshape(n, k // 32), m.reshape(n, k // 32), q.reshape(n, k // 32, 32)
    assert t.tensor_type.name == "Q8_0", t.tensor_type.name
    raw = np.asarray(t.data).reshape(-1, 34)
    d = raw[:, 0:2].copy().view(np.float16).astype(np.float32)[:, 0]
    q = raw[:, 2:].view(np.int8).astype(np.float64)
    return d.reshape(n, k // 32), None, q.reshape(n, k // 32, 32)


class Model:
    def __init__(self, path, mode):
        self.t = {t.name: t for t in GGUFReader(path).tensors}
        self.mode, self.cache = mode, {}

    def w(self, name):
        if name not in self.cache:
            self.cache[name] = blocks(self.t[name])
        return self.cache[name]

    def vec(self, name):
        return np.asarray(self.t[name].data).astype(np.float32)

    def matmul(self, x, name):
        d, m, q = self.w(name)
        if self.mode == "f32":
            w = d[:, :, None] * q + (0 if m is None else m[:, :, None])
            return (x.astype(np.float64) @ w.reshape(q.shape[0], -1).T).astype(np.float32)
        xb = x.reshape(x.shape[0], -1, 32)
        amax = np.abs(xb).max(axis=2)
        scale = (amax / np.float32(127)).astype(np.float32)
        inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
        qa = np.rint(xb * inv[:, :, None]).astype(np.float64)
        da, sa = f16(scale), f16((scale * qa.sum(axis=2)).astype(np.float32))
        if self.mode == "q8":
            out = np.einsum("tnb,nb,tb->tn", np.einsum("tbi,nbi->tnb", qa, q), d, da)
            if m is not None:
                out += np.einsum("nb,tb->tn", m.astype(np.float64), sa.astype(np.float64))
            return out.astype(np.float32)
        # ggml's AVX2 vec_dot_q4_1_q8_1 (and q8_0's) in its float32 order: eight lanes of four
        # products each, fused multiply-adds of d_w d_a over the blocks, the lanes folded as
        # hsum_float_8 folds them, plus the offsets' sum accumulated block by block.
        tt, nb = x.shape[0], q.shape[1]
        lanes = np.einsum("tbjk,nbjk->tnbj", qa.reshape(tt, nb, 8, 4), q.reshape(q.shape[0], nb, 8, 4))
        acc = np.zeros((tt, q.shape[0], 8), np.float32)
        summs = np.zeros((tt, q.shape[0]), np.float32)
        for b in range(nb):
            d0d1 = (d[None, :, b] * da[:, None, b]).astype(np.float32)
            acc = (d0d1[..., None].astype(np.float64) * lanes[:, :, b, :] + acc).astype(np.float32)
            if m is not None:
                ms = m[None, :, b].astype(np.float64) * sa[:, None, b]
                summs = (summs + (ms if self.mode == "ggml-fma" else ms.astype(np.float32))).astype(np.float32)
        r4 = (acc[..., 4:] + acc[..., :4]).astype(np.float32)
        r2 = (r4[..., :2] + r4[..., 2:]).astype(np.float32)
        return ((r2[..., 0] + r2[..., 1]).astype(np.float32) + summs).astype(np.float32)

    def logits(self, ids):
        n = len(ids)
        d, _, q = self.w("token_embd.weight")
        x = (d[:, :, None] * q).reshape(q.shape[0], -1)[ids].astype(np.float32)
        ang = np.arange(n)[:, None] / THETA ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM)[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

        def rope(v, heads):  # llama.cpp's order: adjacent pairs turn
            v = v.reshape(n, heads, HEAD_DIM // 2, 2)
            a, b = v[..., 0], v[..., 1]
            return np.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(n, heads, HEAD_DIM)

        def norm(x, name):
            r = np.sqrt((x.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + EPS)
            return (x / r).astype(np.float32) * self.vec(name)

        mask = np.tril(np.ones((n, n))) > 0
        for layer in range(LAYERS):
            p = f"blk.{layer}."
            h = norm(x, p + "attn_norm.weight")
            qh, kh = rope(self.matmul(h, p + "attn_q.weight"), HEADS), rope(self.matmul(h, p + "attn_k.weight"), KV_HEADS)
            vh = self.matmul(h, p + "attn_v.weight").reshape(n, KV_HEADS, HEAD_DIM)
            out = np.zeros((n, HEADS, HEAD_DIM))
            for head in range(HEADS):
                g = head // (HEADS // KV_HEADS)
                s = np.where(mask, qh[:, head] @ kh[:, g].T / np.sqrt(HEAD_DIM), -np.inf)
                s = np.exp(s - s.max(axis=1, keepdims=True))
                out[:, head] = (s / s.sum(axis=1, keepdims=True)) @ vh[:, g]
            x = x + self.matmul(out.reshape(n, -1).astype(np.float32), p + "attn_output.weight")
            h = norm(x, p + "ffn_norm.weight")
            gate, up = self.matmul(h, p + "ffn_gate.weight"), self.matmul(h, p + "ffn_up.weight")
            x = x + self.matmul((gate / (1 + np.exp(-gate)) * up).astype(np.float32), p + "ffn_down.weight")
        return self.matmul(norm(x, "output_norm.weight"), "token_embd.weight")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("mode", choices=["f32", "q8", "ggml", "ggml-fma"])
    ap.add_argument("--window", action="store_true")
    a = ap.parse_args()
    meta = json.loads((FIXTURES / "smollm2.json").read_text())
    model = Model(a.gguf, a.mode)
    if a.window:
        from safetensors.numpy import load_file

        ours = model.logits(meta["ids"])[-meta["last"]:]
        ref = load_file(str(FIXTURES / "smollm2.safetensors"))
        for name in ["llama_cpp", "llama_cpp_f32"]:
            print(f"{a.mode}: {np.abs(ref[name] - ours).max() / np.abs(ref[name]).max():.2e} of the range from {name}")
        return
    last = model.logits(meta["chat_prompt_ids"])[-1]
    top = np.argsort(-last)[:3]
    print(f"{a.mode}: top logits after the chat prompt {[(int(t), round(float(last[t]), 4)) for t in top]}; "
          f"llama.cpp's first reply token {meta['reply_ids'][0]} at {float(last[meta['reply_ids'][0]]):.4f}")


if __name__ == "__main__":
    main()

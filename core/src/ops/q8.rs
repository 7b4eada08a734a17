//! Int8 weights in blocks of [`Q8_BLOCK`] values along each row, one f32 scale a block
//! (absmax / 127: GGUF's Q8_0 layout, with f32 scales), and the products that read them.
//! A product rounds each activation row in the same blocks to 13-bit integers (absmax /
//! [`ACT_MAX`], held in `i16`), sums each block's products in i32, exactly (every backend
//! gets the same integer), and adds the blocks up in order,
//! `acc = acc + (d as f32 * x_scale) * w_scale`: two products and one add, none fused, so
//! the result is bit-identical across backends.
//!
//! Why 13 bits for the activations: on SmolLM2-135M (whose residual stream reaches
//! ~25,000 beside values of 0.1) int8 activations in blocks of 32 move the next-token
//! distribution as far as llama.cpp's Q8_0 does (mean KL 0.0036 nats) and flip the chat
//! answer to "What is the capital of France?"; rounding the weights alone keeps it. 4095
//! is the most that keeps a block's sum (32 x 4095 x 127 < 2^24) exact in an f32, so no
//! backend's integer-to-float conversion can round it differently.
//!
//! The block size is read from the number of scales: `n * k.div_ceil(Q8_BLOCK)` is
//! blocked, `n` is one scale a row (the layout of int8 checkpoints before blocks, which
//! still load and run as they were written: the row is one block and the activations are
//! int8 with one scale a row, absmax / 127). The two agree when `k <= Q8_BLOCK`; a row that
//! short is one block either way and keeps the per-row rounding.
//!
//! Four int8 values are packed into each f32 slot of an ordinary buffer, in memory order
//! (`f32::from_ne_bytes`), so every backend stores them without a new buffer type and a
//! kernel can read the slot's bytes as `i8`s directly.

use alloc::vec::Vec;

use crate::backend::AttentionOps;
use crate::backend::RopeOps;
use crate::backend::SwigluOps;
use crate::error::{check_len, check_range, nonzero, product};
use crate::ops::attention::AttentionSpec;
use crate::ops::matmul::MatmulSpec;
use crate::ops::rope::RopeSpec;
use crate::reference::ReferenceBackend;
use crate::{CoreError, Real, Result};

/// f32 slots per packed row of `cols` int8 values.
pub fn packed_cols(cols: usize) -> usize {
    cols.div_ceil(4)
}

/// Values per scale of a blocked int8 weight (and of the activations it meets).
pub const Q8_BLOCK: usize = 32;

/// Blocks in a row of `k` values for a block size of `block`.
pub fn blocks_of(k: usize, block: usize) -> usize {
    k.div_ceil(block.max(1))
}

/// The block size of an int8 weight of `n` rows of `k` values with `scales` scales:
/// [`Q8_BLOCK`] for `n * k.div_ceil(Q8_BLOCK)` scales, `k` (one block a row) for `n`.
pub fn q8_block(op: &'static str, n: usize, k: usize, scales: usize) -> Result<usize> {
    nonzero(op, "k", k)?;
    let blocked = product(op, &[n, blocks_of(k, Q8_BLOCK)])?;
    if scales == blocked {
        Ok(Q8_BLOCK.min(k))
    } else if scales == n {
        Ok(k)
    } else {
        Err(CoreError::InvalidArgument {
            op,
            message: alloc::format!(
                "an int8 weight of {n} rows of {k} has {blocked} scales (one per {Q8_BLOCK} values) \
                 or {n} (one per row), not {scales}"
            ),
        })
    }
}

/// Bytes of a `(rows, cols)` matrix held as blocked int8: a byte a weight (rows padded to
/// whole f32 words) and an f32 scale a block.
pub fn q8_bytes(rows: usize, cols: usize) -> usize {
    4 * rows * (packed_cols(cols) + blocks_of(cols, Q8_BLOCK))
}

/// Rounds `w` (rows x cols) to int8 in blocks of [`Q8_BLOCK`] along each row, one scale a
/// block: the packed values (rows x packed_cols(cols) slots; padding bytes are 0) and the
/// scales (rows x cols.div_ceil(Q8_BLOCK)). A block of zeros gets scale 0. Per value,
/// |w - q * scale| <= scale / 2.
pub fn quantize_blocks(w: &[f32], rows: usize, cols: usize) -> Result<(Vec<f32>, Vec<f32>)> {
    quantize_with_block(w, rows, cols, Q8_BLOCK)
}

/// Rounds each row of `w` (rows x cols) to int8 with one scale for the whole row: the
/// layout of int8 checkpoints before blocks (see the module docs). Kept for what reads
/// and writes those files and for the tests that pin their values.
pub fn quantize_rows(w: &[f32], rows: usize, cols: usize) -> Result<(Vec<f32>, Vec<f32>)> {
    quantize_with_block(w, rows, cols, cols.max(1))
}

fn quantize_with_block(w: &[f32], rows: usize, cols: usize, block: usize) -> Result<(Vec<f32>, Vec<f32>)> {
    const OP: &str = "quantize";
    check_len(OP, "w", w.len(), product(OP, &[rows, cols])?)?;
    if let Some(i) = w.iter().position(|v| !v.is_finite()) {
        return Err(CoreError::NonFinite { op: OP, value: w[i] as f64 });
    }
    let (pc, nb) = (packed_cols(cols), blocks_of(cols, block));
    let mut packed = alloc::vec![0.0f32; rows * pc];
    let mut scales = alloc::vec![0.0f32; rows * nb];
    for r in 0..rows {
        let row = &w[r * cols..(r + 1) * cols];
        let (q, s) = quantize_activation_blocks(row, block);
        scales[r * nb..(r + 1) * nb].copy_from_slice(&s);
        for (slot, four) in packed[r * pc..(r + 1) * pc].iter_mut().zip(q.chunks(4)) {
            let mut bytes = [0u8; 4];
            for (b, &v) in bytes.iter_mut().zip(four) {
                *b = v as u8;
            }
            *slot = f32::from_ne_bytes(bytes);
        }
    }
    Ok((packed, scales))
}

/// The int8 value at column `c` of packed row `row`.
pub fn q8_at(row: &[f32], c: usize) -> i8 {
    row[c / 4].to_ne_bytes()[c % 4] as i8
}

/// Unpacks row `r` of an int8 weight of `cols` columns to f32: `q * scale` (per-row or
/// blocked scales, as the scale count says).
pub fn dequantize_row(packed: &[f32], scales: &[f32], r: usize, cols: usize) -> Vec<f32> {
    let pc = packed_cols(cols);
    let rows = packed.len() / pc.max(1);
    let block = q8_block("dequantize_row", rows, cols, scales.len()).unwrap_or(cols.max(1));
    let nb = blocks_of(cols, block);
    let row = &packed[r * pc..(r + 1) * pc];
    (0..cols).map(|c| q8_at(row, c) as f32 * scales[r * nb + c / block]).collect()
}

/// What a model's matrices are rounded to when it is quantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantFormat {
    /// Int8 in blocks of [`Q8_BLOCK`].
    Q8,
    /// Int8 with one scale a row, met by activation rows rounded to int8 with one scale
    /// each (W8A8): an image denoiser's matrices at `Precision::Q8`, which the CPU
    /// multiplies on its VNNI GEMM at about twice its BF16 rate.
    Q8Rows,
    /// Four bits in blocks of 32 ([`crate::ops::q4`]); a model's embedding and output head
    /// stay int8.
    Q4,
}

/// How a quantized weight is laid out, read from its buffers' lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantLayout {
    /// Int8 with one scale per `block` values (`block == k`: one a row).
    Int8 {
        /// Values per scale.
        block: usize,
    },
    /// Four bits in blocks of 32 ([`crate::ops::q4`]).
    Q4,
}

/// The layout of a quantized weight of `n` rows of `k` with `packed` slots and `scales`
/// scales: 4-bit ([`crate::ops::q4::is_q4`]) or int8 ([`check_q8`]), else an error.
pub fn quant_layout(
    op: &'static str, n: usize, k: usize, packed: usize, scales: usize,
) -> Result<QuantLayout> {
    if crate::ops::q4::is_q4(n, k, packed, scales) {
        return Ok(QuantLayout::Q4);
    }
    Ok(QuantLayout::Int8 { block: check_q8(op, packed, scales, n, k)? })
}

/// The bytes a quantized weight's buffers hold.
pub fn quant_bytes(packed: usize, scales: usize) -> usize {
    4 * (packed + scales)
}

/// Checks a packed int8 weight of `n` rows of `k` columns and returns its block size; a
/// 4-bit weight is refused by name (the kernels that call this read int8 only).
pub fn check_q8(op: &'static str, packed: usize, scales: usize, n: usize, k: usize) -> Result<usize> {
    nonzero(op, "k", k)?;
    if crate::ops::q4::is_q4(n, k, packed, scales) {
        return Err(CoreError::InvalidArgument {
            op,
            message: alloc::format!(
                "this {n} x {k} weight is 4-bit, and this backend's kernel reads int8 weights only; \
                 run 4-bit models on the CPU or wgpu, or load the model at Precision::Q8"
            ),
        });
    }
    check_len(op, "packed weights", packed, product(op, &[n, packed_cols(k)])?)?;
    q8_block(op, n, k, scales)
}

/// The contract of `q8_matmul`, shared by every backend (buffer lengths); returns the
/// weight's block size.
pub fn check_q8_matmul(
    out: usize, x: usize, packed: usize, scales: usize, m: usize, n: usize, k: usize,
) -> Result<usize> {
    const OP: &str = "q8_matmul";
    let block = check_q8(OP, packed, scales, n, k)?;
    check_len(OP, "x", x, product(OP, &[m, k])?)?;
    check_len(OP, "out", out, product(OP, &[m, n])?)?;
    Ok(block)
}

/// The `MatmulSpec` form of `q8_matmul` on backends: `out = x W^T + beta * out`, so the
/// spec must say `trans_b` (W is stored `(n, k)` like a `Linear` weight), with no `trans_a`,
/// `alpha` 1 and one problem; a window may place `x` and `out` inside larger buffers (its `b`
/// offset must be 0: the weight is always whole). Returns the `x` and `out` operands.
pub fn q8_operands<'a>(
    spec: &MatmulSpec, x: &'a [f32], out: &'a mut [f32],
) -> Result<(&'a [f32], &'a mut [f32])> {
    const OP: &str = "q8_matmul";
    if !spec.trans_b || spec.trans_a || spec.alpha != 1.0 || spec.batch != 1 {
        return Err(CoreError::InvalidArgument {
            op: OP,
            message: alloc::format!(
                "the int8 product is out = x W^T + beta * out (trans_b, alpha 1, one problem); got {spec:?}"
            ),
        });
    }
    let (m, n, k) = (spec.m, spec.n, spec.k);
    match spec.window {
        None => Ok((x, out)),
        Some(w) => {
            if w.b != 0 {
                return Err(CoreError::InvalidArgument {
                    op: OP,
                    message: "the int8 weight cannot be windowed (window b must be 0)".into(),
                });
            }
            let (lx, lo) = (product(OP, &[m, k])?, product(OP, &[m, n])?);
            check_range(OP, "x", x.len(), w.a, lx)?;
            check_range(OP, "out", out.len(), w.c, lo)?;
            Ok((&x[w.a..w.a + lx], &mut out[w.c..w.c + lo]))
        }
    }
}

/// An activation row rounded to int8 with one scale (absmax / 127): the values and the
/// scale. A block of [`quantize_activation_blocks`].
pub fn quantize_activations(x: &[f32]) -> (Vec<i8>, f32) {
    let absmax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let scale = absmax / 127.0;
    let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    (x.iter().map(|&v| libm::roundf(v * inv).clamp(-127.0, 127.0) as i8).collect(), scale)
}

/// An activation row rounded to int8 in blocks of `block` values, each with its own
/// scale (absmax / 127): the values and the `x.len().div_ceil(block)` scales. Weights are
/// rounded this way ([`quantize_blocks`]).
pub fn quantize_activation_blocks(x: &[f32], block: usize) -> (Vec<i8>, Vec<f32>) {
    let mut q = Vec::with_capacity(x.len());
    let mut scales = Vec::with_capacity(blocks_of(x.len(), block));
    for chunk in x.chunks(block.max(1)) {
        let (qb, s) = quantize_activations(chunk);
        q.extend_from_slice(&qb);
        scales.push(s);
    }
    (q, scales)
}

/// The largest magnitude of an activation rounded for blocked weights (13-bit integers; see
/// the module docs).
pub const ACT_MAX: f32 = 4095.0;

/// An activation row rounded for blocked weights: in blocks of `block` values, each to
/// integers in `[-ACT_MAX, ACT_MAX]` with its own scale (absmax / ACT_MAX), rounding half
/// away from zero; a NaN becomes 0. The values and the `x.len().div_ceil(block)` scales.
pub fn quantize_activations_wide(x: &[f32], block: usize) -> (Vec<i16>, Vec<f32>) {
    let (mut q, mut scales) = (Vec::new(), Vec::new());
    quantize_activations_wide_into(x, block, &mut q, &mut scales);
    (q, scales)
}

/// [`quantize_activations_wide`] into kept buffers (cleared first): a decode step rounds
/// ~25 rows, and the CPU backend lends the same buffers to each.
pub fn quantize_activations_wide_into(x: &[f32], block: usize, q: &mut Vec<i16>, scales: &mut Vec<f32>) {
    q.clear();
    scales.clear();
    for chunk in x.chunks(block.max(1)) {
        let absmax = chunk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let scale = absmax / ACT_MAX;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        q.extend(chunk.iter().map(|&v| libm::roundf(v * inv).clamp(-ACT_MAX, ACT_MAX) as i16));
        scales.push(scale);
    }
}

/// `out (m x n) = x (m x k) W^T + beta * out`, W the (n x k) int8 weight (or a 4-bit one,
/// by its layout: [`crate::ops::q4::q4_matmul`]): the `Linear` product at one byte per weight. Blocked weights: each row of `x` rounded in the
/// weight's blocks ([`quantize_activations_wide`]), each block's i32 sum exact, the blocks
/// added in order as `acc = acc + (d as f32 * x_scale) * w_scale`. One block a row: the row
/// of `x` rounded to int8 ([`quantize_activations`]) and `out = d as f32 * x_scale *
/// w_scale`, as before blocks (see the module docs).
#[allow(clippy::too_many_arguments)]
pub fn q8_matmul(
    out: &mut [f32], x: &[f32], packed: &[f32], scales: &[f32], m: usize, n: usize, k: usize, beta: f32,
) -> Result<()> {
    if crate::ops::q4::is_q4(n, k, packed.len(), scales.len()) {
        return crate::ops::q4::q4_matmul(out, x, packed, scales, m, n, k, beta);
    }
    let block = check_q8_matmul(out.len(), x.len(), packed.len(), scales.len(), m, n, k)?;
    let (pc, nb) = (packed_cols(k), blocks_of(k, block));
    for i in 0..m {
        let xi = &x[i * k..(i + 1) * k];
        let (xq, sx): (Vec<i32>, Vec<f32>) = if nb == 1 {
            let (q, s) = quantize_activations(xi);
            (q.into_iter().map(i32::from).collect(), alloc::vec![s])
        } else {
            let (q, s) = quantize_activations_wide(xi, block);
            (q.into_iter().map(i32::from).collect(), s)
        };
        for j in 0..n {
            let row = &packed[j * pc..(j + 1) * pc];
            let mut acc = 0.0f32;
            for (b, (xb, &sxb)) in xq.chunks(block).zip(&sx).enumerate() {
                let d: i32 = xb.iter().enumerate().map(|(t, &v)| v * q8_at(row, b * block + t) as i32).sum();
                acc += d as f32 * sxb * scales[j * nb + b];
            }
            out[i * n + j] = if beta == 0.0 { acc } else { acc + beta * out[i * n + j] };
        }
    }
    Ok(())
}

/// Embedding lookup from an int8 table (vocab x dim): `out[r] = dequantize(table[ids[r]])`
/// (a 4-bit table by its layout: [`crate::ops::q4::q4_embedding`]).
pub fn q8_embedding<T: Real>(
    out: &mut [T], packed: &[f32], scales: &[f32], ids: &[u32], vocab: usize, dim: usize,
) -> Result<()> {
    const OP: &str = "q8_embedding";
    if crate::ops::q4::is_q4(vocab, dim, packed.len(), scales.len()) {
        return crate::ops::q4::q4_embedding(out, packed, scales, ids, vocab, dim);
    }
    let block = check_q8(OP, packed.len(), scales.len(), vocab, dim)?;
    check_len(OP, "out", out.len(), product(OP, &[ids.len(), dim])?)?;
    crate::ops::embedding::check_ids(OP, ids, vocab)?;
    let (pc, nb) = (packed_cols(dim), blocks_of(dim, block));
    for (r, &id) in ids.iter().enumerate() {
        let id = id as usize;
        let row = &packed[id * pc..(id + 1) * pc];
        for c in 0..dim {
            out[r * dim + c] = T::from_f32(q8_at(row, c) as f32 * scales[id * nb + c / block]);
        }
    }
    Ok(())
}

/// Int8 inference: products on int8 weights and the fused decode calls built on them: see [`crate::ops::q8`].
pub trait Q8Ops: SwigluOps + RopeOps + AttentionOps {
    /// `out = x W^T + beta * out` with W (n x k) int8, packed four to a slot, with its
    /// scales (or 4-bit, told by its layout: [`quant_layout`]; a backend without 4-bit
    /// kernels refuses it through [`check_q8`]); `spec` as for an f32 `Linear` product (see
    /// [`crate::ops::q8::q8_operands`]).
    fn q8_matmul(
        &self, out: &mut Self::Buffer, x: &Self::Buffer, packed: &Self::Buffer, scales: &Self::Buffer,
        spec: &MatmulSpec,
    ) -> Result<()>;
    /// Several int8 products of one input, each `out = x W^T + beta * out` as in
    /// [`Q8Ops::q8_matmul`] with its own spec: attention's q, k and v projections. A
    /// backend that runs them as one job (one hand-off between threads, one rounding of
    /// `x`) overrides this; the default, one `q8_matmul` each, is what an override is
    /// tested against ([`q8_matmul_each`]).
    fn q8_matmul_many(&self, x: &Self::Buffer, products: &mut [Q8Product<'_, Self::Buffer>]) -> Result<()> {
        q8_matmul_each(self, x, products)
    }
    /// The first half of a SwiGLU feed-forward on int8 weights: `gate = x Wg^T`,
    /// `up = x Wu^T` (`spec` is `(m, f, d)`: `x` `(m, d)`, both weights `(f, d)`, beta 0),
    /// then `out = silu(gate) * up`; `gate` and `up` keep their values for a backward pass.
    /// The default is the two products and [`SwigluOps::swiglu_forward`]
    /// ([`q8_swiglu_unfused`]); a backend may run all three as one job.
    #[allow(clippy::too_many_arguments)]
    fn q8_swiglu(
        &self, out: &mut Self::Buffer, gate: &mut Self::Buffer, up: &mut Self::Buffer, x: &Self::Buffer,
        gate_w: (&Self::Buffer, &Self::Buffer), up_w: (&Self::Buffer, &Self::Buffer), spec: &MatmulSpec,
    ) -> Result<()> {
        q8_swiglu_unfused(self, out, gate, up, x, gate_w, up_w, spec)
    }
    /// A SwiGLU feed-forward on int8 weights, added to `out`: [`Q8Ops::q8_swiglu`] of
    /// `x` into `s` (`gate` and `up` keep their values), then `out = s Wd^T + out` with
    /// `Wd` `(d, f)`. `spec` is the gating products' `(m, f, d)`. The default is those two
    /// calls ([`q8_mlp_unfused`]); a backend may run the whole feed-forward as one job.
    #[allow(clippy::too_many_arguments)]
    fn q8_mlp(
        &self, out: &mut Self::Buffer, acts: [&mut Self::Buffer; 3], x: &Self::Buffer,
        gate_w: (&Self::Buffer, &Self::Buffer), up_w: (&Self::Buffer, &Self::Buffer),
        down_w: (&Self::Buffer, &Self::Buffer), spec: &MatmulSpec,
    ) -> Result<()> {
        q8_mlp_unfused(self, out, acts, x, gate_w, up_w, down_w, spec)
    }
    /// The attention half of a cached block on int8 weights ([`Q8Attention`]): q, k, v
    /// projected from `h`, rotated, k and v written into the cache at `pos`, attention
    /// over the cache, and `x = att Wo^T + x`. The default is those calls one by one
    /// ([`q8_attention_unfused`]); a backend may run them as one job.
    fn q8_attention(&self, a: Q8Attention<'_, Self::Buffer>) -> Result<()> {
        q8_attention_unfused(self, a)
    }
    /// Rows of an int8 table, dequantized.
    #[allow(clippy::too_many_arguments)]
    fn q8_embedding(
        &self, out: &mut Self::Buffer, packed: &Self::Buffer, scales: &Self::Buffer, ids: &[u32],
        vocab: usize, dim: usize,
    ) -> Result<()>;
}

impl Q8Ops for ReferenceBackend {
    fn q8_matmul(
        &self, out: &mut Vec<f32>, x: &Vec<f32>, packed: &Vec<f32>, scales: &Vec<f32>, spec: &MatmulSpec,
    ) -> Result<()> {
        // Exact integer sums: no f64 detour needed.
        let (x, out) = q8_operands(spec, x, out)?;
        q8_matmul(out, x, packed, scales, spec.m, spec.n, spec.k, spec.beta)
    }
    fn q8_embedding(
        &self, out: &mut Vec<f32>, packed: &Vec<f32>, scales: &Vec<f32>, ids: &[u32], vocab: usize,
        dim: usize,
    ) -> Result<()> {
        q8_embedding(out, packed, scales, ids, vocab, dim)
    }
}

/// One product of [`Q8Ops::q8_matmul_many`]: its output, its int8 weight (packed
/// values and row scales) and its spec.
pub struct Q8Product<'a, T> {
    /// `(m, n)`, or the spec's window of it.
    pub out: &'a mut T,
    /// The int8 weight `(n, k)`, four values a slot.
    pub packed: &'a T,
    /// One scale per weight row.
    pub scales: &'a T,
    /// `m, n, k`, beta and window, as for [`Q8Ops::q8_matmul`].
    pub spec: MatmulSpec,
}

/// The operands of [`Q8Ops::q8_attention`] at `n` new positions of one sequence
/// (`spec.q_len`).
pub struct Q8Attention<'a, T> {
    /// The residual stream `(n, d)`: `att Wo^T` is added to it.
    pub x: &'a mut T,
    /// Its normed copy `(n, d)`, the projections' input.
    pub h: &'a T,
    /// The query projection `(n, q_dim)`, rotated.
    pub q: &'a mut T,
    /// The key projection `(n, kv_dim)`, rotated.
    pub k: &'a mut T,
    /// The value projection `(n, kv_dim)`.
    pub v: &'a mut T,
    /// The block's key cache (`spec.kv_capacity` positions of `kv_dim`); the new keys go
    /// at `pos`.
    pub cache_k: &'a mut T,
    /// The block's value cache, laid out as `cache_k`.
    pub cache_v: &'a mut T,
    /// Positions already in the cache.
    pub pos: usize,
    /// Attention's output `(n, q_dim)`.
    pub att: &'a mut T,
    /// Its log-sum-exps `(n, q_heads)`.
    pub lse: &'a mut T,
    /// `[Wq, Wk, Wv, Wo]`, each as (packed values, row scales).
    pub weights: [(&'a T, &'a T); 4],
    /// The rotation of `q`.
    pub rope_q: &'a RopeSpec,
    /// The rotation of `k`.
    pub rope_k: &'a RopeSpec,
    /// The attention over the cache (`kv_len = pos + n`).
    pub spec: &'a AttentionSpec,
}

/// [`Q8Ops::q8_matmul_many`] as one of `backend`'s `q8_matmul` a product: the definition,
/// and what an override falls back to for shapes it does not fuse.
pub fn q8_matmul_each<B: Q8Ops + ?Sized>(
    backend: &B, x: &B::Buffer, products: &mut [Q8Product<'_, B::Buffer>],
) -> Result<()> {
    for p in products.iter_mut() {
        backend.q8_matmul(p.out, x, p.packed, p.scales, &p.spec)?;
    }
    Ok(())
}

/// [`Q8Ops::q8_swiglu`] as `backend`'s two products and its `swiglu_forward`: the
/// definition, and what an override falls back to for shapes it does not fuse.
#[allow(clippy::too_many_arguments)]
pub fn q8_swiglu_unfused<B: Q8Ops + ?Sized>(
    backend: &B, out: &mut B::Buffer, gate: &mut B::Buffer, up: &mut B::Buffer, x: &B::Buffer,
    gate_w: (&B::Buffer, &B::Buffer), up_w: (&B::Buffer, &B::Buffer), spec: &MatmulSpec,
) -> Result<()> {
    backend.q8_matmul(gate, x, gate_w.0, gate_w.1, spec)?;
    backend.q8_matmul(up, x, up_w.0, up_w.1, spec)?;
    backend.swiglu_forward(out, gate, up)
}

/// [`Q8Ops::q8_attention`] as `backend`'s calls one by one: [`Q8Ops::q8_matmul_many`]
/// for q, k and v, [`RopeOps::rope_forward`] of q and k, [`Memory::copy_range`](crate::backend::Memory::copy_range) into the
/// cache, [`AttentionOps::attention_forward`], and Wo's product added to `x`. The definition,
/// and what an override falls back to for shapes it does not fuse.
pub fn q8_attention_unfused<B: Q8Ops + ?Sized>(backend: &B, a: Q8Attention<'_, B::Buffer>) -> Result<()> {
    let s = a.spec;
    let n = s.q_len;
    let (q_dim, kv_dim) = (s.q_heads * s.head_dim, s.kv_heads * s.head_dim);
    // The model width, from h (a length that is not whole rows fails the products' checks).
    let d = backend.len(a.h) / n.max(1);
    let [wq, wk, wv, wo] = a.weights;
    let t = |m, nn, k| MatmulSpec::new(m, nn, k).trans_b(true);
    backend.q8_matmul_many(
        a.h,
        &mut [
            Q8Product { out: &mut *a.q, packed: wq.0, scales: wq.1, spec: t(n, q_dim, d) },
            Q8Product { out: &mut *a.k, packed: wk.0, scales: wk.1, spec: t(n, kv_dim, d) },
            Q8Product { out: &mut *a.v, packed: wv.0, scales: wv.1, spec: t(n, kv_dim, d) },
        ],
    )?;
    backend.rope_forward(a.q, a.rope_q)?;
    backend.rope_forward(a.k, a.rope_k)?;
    backend.copy_range(a.cache_k, a.pos * kv_dim, a.k, 0, n * kv_dim)?;
    backend.copy_range(a.cache_v, a.pos * kv_dim, a.v, 0, n * kv_dim)?;
    backend.attention_forward(a.att, a.lse, a.q, a.cache_k, a.cache_v, s)?;
    backend.q8_matmul(a.x, a.att, wo.0, wo.1, &t(n, d, q_dim).beta(1.0))
}

/// [`Q8Ops::q8_mlp`] as `backend`'s [`Q8Ops::q8_swiglu`] into `s` and its down
/// product added to `out`: the definition, and what an override falls back to for shapes
/// it does not fuse. `acts` is `[gate, up, s]`.
#[allow(clippy::too_many_arguments)]
pub fn q8_mlp_unfused<B: Q8Ops + ?Sized>(
    backend: &B, out: &mut B::Buffer, [gate, up, s]: [&mut B::Buffer; 3], x: &B::Buffer,
    gate_w: (&B::Buffer, &B::Buffer), up_w: (&B::Buffer, &B::Buffer), down_w: (&B::Buffer, &B::Buffer),
    spec: &MatmulSpec,
) -> Result<()> {
    backend.q8_swiglu(s, gate, up, x, gate_w, up_w, spec)?;
    let down = MatmulSpec::new(spec.m, spec.k, spec.n).precision(spec.precision).trans_b(true).beta(1.0);
    backend.q8_matmul(out, s, down_w.0, down_w.1, &down)
}

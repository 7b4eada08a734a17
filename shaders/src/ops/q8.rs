//! int8 and 4-bit products and lookups (`quantize_activations*.wgsl`, `q8_matmul*.wgsl`,
//! `q4_matmul*.wgsl`, `q8_embedding.wgsl`); twin of `rusting_brain_core::ops::q8` and `q4`.

use super::*;
use crate::backend::unsupported;
use crate::backend::WgpuBackend;
use crate::GpuBuffer;
use rusting_brain_core::backend::MatmulSpec;
use rusting_brain_core::backend::Q8Ops;
use rusting_brain_core::ops::q4::{q4_packed_cols, q4_row_scales, Q4_BLOCK};
use rusting_brain_core::ops::q8::{quant_layout, QuantLayout};
use rusting_brain_core::CoreError;
use rusting_brain_core::Result;

/// int8 for one block a row, 13-bit in blocks for blocked and 4-bit weights (`wide`);
/// workgroup reductions, [`QUANTIZE_ACTIVATIONS_SG`] where the device has subgroups.
const QUANTIZE_ACTIVATIONS: Kernel = kernel!(
    "quantize_activations",
    { rows: u32, cols: u32, packed_cols: u32, block: u32, wide: u32 },
    [read x: f32, read_write xq: u32, read_write xs: f32], prelude "int8"
)
.with_subgroup_twin(&QUANTIZE_ACTIVATIONS_SG);
/// The row maxima with subgroup reductions.
const QUANTIZE_ACTIVATIONS_SG: Kernel = kernel!(
    "quantize_activations_sg",
    { rows: u32, cols: u32, packed_cols: u32, block: u32, wide: u32 },
    [read x: f32, read_write xq: u32, read_write xs: f32], prelude "int8"
)
.with_subgroups();

const Q8_MATMUL: Kernel = kernel!(
    "q8_matmul",
    { m: u32, n: u32, packed_cols: u32, beta: f32, out_n: u32, j0: u32, blocks: u32, block: u32 },
    [read xq: u32, read xs: f32, read w: u32, read ws: f32, read_write out: f32], prelude "int8"
);
const Q8_MATMUL_TILED: Kernel = kernel!(
    "q8_matmul_tiled",
    { m: u32, n: u32, packed_cols: u32, beta: f32, out_n: u32, j0: u32, blocks: u32, block: u32 },
    [read xq: u32, read xs: f32, read w: u32, read ws: f32, read_write out: f32], prelude "int8", "tile_store"
);
/// The 4-bit product: one invocation an output (decode), or 32 x 32 register tiles from
/// [`TILED_ROWS`] rows (prefill).
const Q4_MATMUL: Kernel = kernel!(
    "q4_matmul",
    { m: u32, n: u32, packed_cols: u32, beta: f32, out_n: u32, j0: u32, blocks: u32, wpc: u32 },
    [read xq: u32, read xs: f32, read w: u32, read ws: f32, read_write out: f32], prelude "int8"
);
const Q4_MATMUL_TILED: Kernel = kernel!(
    "q4_matmul_tiled",
    { m: u32, n: u32, packed_cols: u32, beta: f32, out_n: u32, j0: u32, blocks: u32, wpc: u32 },
    [read xq: u32, read xs: f32, read w: u32, read ws: f32, read_write out: f32], prelude "int8", "tile_store"
);
const Q8_EMBEDDING: Kernel = kernel!(
    "q8_embedding",
    { rows: u32, dim: u32, packed_cols: u32, vocab: u32, id0: u32, slab_rows: u32, blocks: u32, block: u32 },
    [read ids: u32, read table: u32, read scales: f32, read_write out: f32]
);

/// The kernels this family dispatches (gathered in `ops::KERNELS`).
pub(super) const KERNELS: &[Kernel] = &[
    QUANTIZE_ACTIVATIONS,
    QUANTIZE_ACTIVATIONS_SG,
    Q8_MATMUL,
    Q8_MATMUL_TILED,
    Q4_MATMUL,
    Q4_MATMUL_TILED,
    Q8_EMBEDDING,
];

/// Words a row of activations takes when rounded for a weight of `blocks` blocks a row of
/// `k` values: int8 four to a word for one block, 13-bit two to a word for several.
pub fn activation_words(k: usize, blocks: usize) -> usize {
    packed_cols(k) * if blocks > 1 { 2 } else { 1 }
}

impl Batch<'_> {
    /// Each row of `x` (rows x cols) to int8 with its own scale: `xq` gets
    /// `rows * packed_cols(cols)` packed words, `xs` the scales.
    pub fn quantize_activations(
        &mut self, xq: &GpuBuffer, xs: &GpuBuffer, x: &GpuBuffer, rows: usize, cols: usize,
    ) -> Result<(), ShaderError> {
        self.quantize_activation_blocks(xq, xs, x, rows, cols, cols)
    }

    /// Each row of `x` (rows x cols) rounded for a weight with blocks of `block` values (a
    /// multiple of 4, or `cols`): one block, int8 with the row's scale; several, 13-bit in
    /// blocks, each with its own scale (core's `quantize_activations_wide`). `xq` gets
    /// `rows * activation_words(cols, blocks)` words, `xs` the `rows * blocks` scales.
    pub fn quantize_activation_blocks(
        &mut self, xq: &GpuBuffer, xs: &GpuBuffer, x: &GpuBuffer, rows: usize, cols: usize, block: usize,
    ) -> Result<(), ShaderError> {
        let wide = cols.div_ceil(block.max(1)) > 1;
        self.round_activations(xq, xs, x, rows, cols, block, wide)
    }

    /// Each row of `x` (rows x cols) rounded for a 4-bit weight: 13-bit in blocks of 32
    /// (core's `quantize_activations_wide`) however short the row; `xq` gets
    /// `rows * 2 * packed_cols(cols)` words, `xs` the `rows * cols.div_ceil(32)` scales.
    pub fn quantize_activations_wide(
        &mut self, xq: &GpuBuffer, xs: &GpuBuffer, x: &GpuBuffer, rows: usize, cols: usize,
    ) -> Result<(), ShaderError> {
        self.round_activations(xq, xs, x, rows, cols, Q4_BLOCK, true)
    }

    #[allow(clippy::too_many_arguments)]
    fn round_activations(
        &mut self, xq: &GpuBuffer, xs: &GpuBuffer, x: &GpuBuffer, rows: usize, cols: usize, block: usize,
        wide: bool,
    ) -> Result<(), ShaderError> {
        const OP: &str = "quantize_activations";
        let (pc, nb) = (packed_cols(cols), cols.div_ceil(block.max(1)));
        if block == 0 || (block != cols && !block.is_multiple_of(4)) {
            return Err(ShaderError::Invalid(format!("{OP}: blocks of {block} values split packed words")));
        }
        need(OP, "x", x, rows * cols)?;
        need(OP, "xq", xq, rows * pc * if wide { 2 } else { 1 })?;
        need(OP, "xs", xs, rows * nb)?;
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let p = [u(rows, "rows")?, u(cols, "cols")?, u(pc, "packed cols")?, u(block, "block")?, wide as u32];
        self.dispatch(&QUANTIZE_ACTIVATIONS, &p, &[x, xq, xs], grid(rows * nb))?;
        Ok(())
    }

    /// `out (m x n) = xq . W^T + beta * out` with int8 activations (from
    /// [`Batch::quantize_activation_blocks`] in the weight's blocks) and int8 weights `w`
    /// (n x packed_cols(k)) with scales `ws`, one a row or one a block of 32 (core's
    /// `q8::q8_block` reads which from their count).
    #[allow(clippy::too_many_arguments)]
    pub fn q8_matmul(
        &mut self, out: &GpuBuffer, xq: &GpuBuffer, xs: &GpuBuffer, w: &GpuBuffer, ws: &GpuBuffer, m: usize,
        n: usize, k: usize, beta: f32,
    ) -> Result<(), ShaderError> {
        self.q8_matmul_cols(out, (n, 0), xq, xs, w, ws, m, n, k, beta)
    }

    /// [`Batch::q8_matmul`] into columns `j0 .. j0 + n` of an output with rows of `out_n`:
    /// one row slab of a weight split across bindings.
    #[allow(clippy::too_many_arguments)]
    pub fn q8_matmul_cols(
        &mut self, out: &GpuBuffer, cols: (usize, usize), xq: &GpuBuffer, xs: &GpuBuffer, w: &GpuBuffer,
        ws: &GpuBuffer, m: usize, n: usize, k: usize, beta: f32,
    ) -> Result<(), ShaderError> {
        let block = weight_block("q8_matmul", n, k, ws)?;
        self.quant_matmul(out, cols, xq, xs, (w, ws, Weight::Int8 { block }), m, n, k, beta)
    }

    /// `out (m x n) = xq . W^T + beta * out` with 13-bit activations (from
    /// [`Batch::quantize_activations_wide`]) and a 4-bit weight (n x k): `w` its packed
    /// rows (n x `q4_packed_cols(k)` words), `ws` its scales (n x `q4_row_scales(k)`), as
    /// core's `q4` lays them out.
    #[allow(clippy::too_many_arguments)]
    pub fn q4_matmul(
        &mut self, out: &GpuBuffer, xq: &GpuBuffer, xs: &GpuBuffer, w: &GpuBuffer, ws: &GpuBuffer, m: usize,
        n: usize, k: usize, beta: f32,
    ) -> Result<(), ShaderError> {
        self.q4_matmul_cols(out, (n, 0), xq, xs, w, ws, m, n, k, beta)
    }

    /// [`Batch::q4_matmul`] into columns `j0 .. j0 + n` of an output with rows of `out_n`.
    #[allow(clippy::too_many_arguments)]
    pub fn q4_matmul_cols(
        &mut self, out: &GpuBuffer, cols: (usize, usize), xq: &GpuBuffer, xs: &GpuBuffer, w: &GpuBuffer,
        ws: &GpuBuffer, m: usize, n: usize, k: usize, beta: f32,
    ) -> Result<(), ShaderError> {
        self.quant_matmul(out, cols, xq, xs, (w, ws, Weight::Q4), m, n, k, beta)
    }

    /// The int8 and 4-bit products: checks, row slabs of a weight over one binding, and the
    /// kernel (one invocation an output, or register tiles from [`TILED_ROWS`] rows).
    #[allow(clippy::too_many_arguments)]
    fn quant_matmul(
        &mut self, out: &GpuBuffer, (out_n, j0): (usize, usize), xq: &GpuBuffer, xs: &GpuBuffer,
        (w, ws, weight): (&GpuBuffer, &GpuBuffer, Weight), m: usize, n: usize, k: usize, beta: f32,
    ) -> Result<(), ShaderError> {
        let pc = packed_cols(k);
        // Blocks a row, words and scales a weight row holds, activation words a row, the
        // kernels, and the last parameter (int8: the block; 4-bit: the row's words).
        let (op, nb, row_words, row_scales, act_words, kernels, last) = match weight {
            Weight::Int8 { block } => {
                let nb = k.div_ceil(block);
                ("q8_matmul", nb, pc, nb, activation_words(k, nb), (&Q8_MATMUL, &Q8_MATMUL_TILED), block)
            }
            Weight::Q4 => {
                let wpc = q4_packed_cols(k);
                let kernels = (&Q4_MATMUL, &Q4_MATMUL_TILED);
                ("q4_matmul", k.div_ceil(Q4_BLOCK), wpc, q4_row_scales(k), 2 * pc, kernels, wpc)
            }
        };
        need(op, "xq", xq, m * act_words)?;
        need(op, "xs", xs, m * nb)?;
        need(op, "w", w, n * row_words)?;
        need(op, "ws", ws, n * row_scales)?;
        if j0 + n > out_n {
            return Err(ShaderError::Invalid(format!("{op}: columns {j0}..{} of rows of {out_n}", j0 + n)));
        }
        need(op, "out", out, m * out_n)?;
        if n > 0 && self.over_binding(&[w, ws]) {
            // A weight over one binding: its row slabs, each into its columns of `out`.
            let rows = self.slab_rows(op, row_words)?;
            let mut r0 = 0;
            while r0 < n {
                let r = rows.min(n - r0);
                let (w, ws) =
                    (w.slab(r0 * row_words, r * row_words), ws.slab(r0 * row_scales, r * row_scales));
                self.quant_matmul(out, (out_n, j0 + r0), xq, xs, (&w, &ws, weight), m, r, k, beta)?;
                r0 += r;
            }
            return Ok(());
        }
        if m > MAX_GROUPS || n.div_ceil(WG) > MAX_GROUPS {
            return Err(ShaderError::Invalid(format!(
                "{op}: {m} rows x {n} outputs is over the grid's limits ({MAX_GROUPS} rows); split the batch"
            )));
        }
        if m == 0 || n == 0 {
            return Ok(());
        }
        let p = [
            u(m, "m")?,
            u(n, "n")?,
            u(pc, "packed cols")?,
            beta.to_bits(),
            u(out_n, "out_n")?,
            u(j0, "j0")?,
            u(nb, "blocks")?,
            u(last, "block or row words")?,
        ];
        if m >= TILED_ROWS {
            // Prefill: 32 x 32 register tiles, each loaded word used 32 times.
            let groups = grid2(n.div_ceil(32), m.div_ceil(32))?;
            self.dispatch(kernels.1, &p, &[xq, xs, w, ws, out], groups)?;
        } else {
            self.dispatch(kernels.0, &p, &[xq, xs, w, ws, out], (n.div_ceil(WG) as u32, m as u32))?;
        }
        Ok(())
    }

    /// `out[r] = table[ids[r]] * scales[ids[r]]` from an int8 table (vocab x dim). Ids
    /// from the host are checked when uploaded (see [`check_ids`]); an id the GPU made
    /// itself (the sampler's) is in range by construction, and a stray one reads as NaN.
    #[allow(clippy::too_many_arguments)]
    pub fn q8_embedding(
        &mut self, out: &GpuBuffer, ids: &GpuBuffer, table: &GpuBuffer, scales: &GpuBuffer, rows: usize,
        vocab: usize, dim: usize,
    ) -> Result<(), ShaderError> {
        self.q8_embedding_slab(out, ids, table, scales, rows, vocab, dim, (0, vocab))
    }

    /// [`Batch::q8_embedding`] from one row slab of a table split across bindings: `table`
    /// holds rows `id0 .. id0 + slab_rows`; other ids are left to the other slabs' calls.
    #[allow(clippy::too_many_arguments)]
    pub fn q8_embedding_slab(
        &mut self, out: &GpuBuffer, ids: &GpuBuffer, table: &GpuBuffer, scales: &GpuBuffer, rows: usize,
        vocab: usize, dim: usize, (id0, slab_rows): (usize, usize),
    ) -> Result<(), ShaderError> {
        const OP: &str = "q8_embedding";
        let pc = packed_cols(dim);
        let block = weight_block(OP, slab_rows, dim, scales)?;
        let nb = dim.div_ceil(block);
        need(OP, "ids", ids, rows)?;
        need(OP, "table", table, slab_rows * pc)?;
        need(OP, "out", out, rows * dim)?;
        if rows * dim == 0 {
            return Ok(());
        }
        if self.over_binding(&[table, scales]) {
            // A table over one binding: each row slab writes the rows whose ids it holds.
            let step = self.slab_rows(OP, pc)?;
            let mut r0 = 0;
            while r0 < slab_rows {
                let r = step.min(slab_rows - r0);
                let (t, s) = (table.slab(r0 * pc, r * pc), scales.slab(r0 * nb, r * nb));
                self.q8_embedding_slab(out, ids, &t, &s, rows, vocab, dim, (id0 + r0, r))?;
                r0 += r;
            }
            return Ok(());
        }
        let p = [
            u(rows, "rows")?,
            u(dim, "dim")?,
            u(pc, "packed cols")?,
            u(vocab, "vocab")?,
            u(id0, "id0")?,
            u(slab_rows, "slab rows")?,
            u(nb, "blocks")?,
            u(block, "block")?,
        ];
        self.dispatch(&Q8_EMBEDDING, &p, &[ids, table, scales, out], grid((rows * dim).div_ceil(WG)))?;
        Ok(())
    }

    /// Whether any of `bufs` is over one binding.
    fn over_binding(&self, bufs: &[&GpuBuffer]) -> bool {
        let limit = self.gpu.max_binding();
        bufs.iter().any(|b| b.bound_bytes() > limit)
    }

    /// Rows per slab of a weight with rows of `row_words`, or the error saying none fits.
    fn slab_rows(&self, op: &str, row_words: usize) -> Result<usize, ShaderError> {
        self.gpu.slab_rows(row_words).ok_or_else(|| ShaderError::TooLarge {
            what: format!("{op}: a slab of {} weight rows", self.gpu.slab_align()),
            bytes: (self.gpu.slab_align() * row_words * 4) as u64,
            limit: self.gpu.max_binding(),
        })
    }
}

impl Q8Ops for WgpuBackend {
    fn q8_matmul(
        &self, out: &mut GpuBuffer, x: &GpuBuffer, packed: &GpuBuffer, scales: &GpuBuffer, spec: &MatmulSpec,
    ) -> Result<()> {
        if spec.batch != 1 || !spec.trans_b || spec.trans_a || spec.alpha != 1.0 {
            return Err(unsupported("a batched, transposed or scaled int8 product"));
        }
        let (m, n, k) = (spec.m, spec.n, spec.k);
        // A window places x and out inside larger buffers (an expert's rows); the weight is
        // always whole, as core's q8_operands has it.
        let (xa, oc) = match spec.window {
            None => (0, 0),
            Some(w) if w.b == 0 => (w.a, w.c),
            Some(_) => {
                return Err(CoreError::InvalidArgument {
                    op: "q8_matmul",
                    message: "the int8 weight cannot be windowed (window b must be 0)".into(),
                })
            }
        };
        let inside = |have: usize, at: usize, len: usize| at.checked_add(len).is_some_and(|end| end <= have);
        let (lx, lo) = (m * k, m * n);
        if !inside(x.len(), xa, lx)
            || !inside(out.len(), oc, lo)
            || (spec.window.is_none() && (x.len() != lx || out.len() != lo))
        {
            return Err(CoreError::InvalidDimension {
                op: "q8_matmul",
                message: format!(
                    "x holds {} and out {} values; ({m} x {k}) at {xa} and ({m} x {n}) at {oc} do not fit",
                    x.len(),
                    out.len()
                ),
            });
        }
        // A 4-bit weight (told by its buffers' lengths) or an int8 one with its block.
        let weight = match quant_layout("q8_matmul", n, k, packed.len(), scales.len())? {
            QuantLayout::Q4 => {
                rusting_brain_core::ops::q4::check_q4_matmul(lo, lx, packed.len(), scales.len(), m, n, k)?;
                Weight::Q4
            }
            QuantLayout::Int8 { .. } => Weight::Int8 {
                block: rusting_brain_core::ops::q8::check_q8_matmul(
                    lo,
                    lx,
                    packed.len(),
                    scales.len(),
                    m,
                    n,
                    k,
                )?,
            },
        };
        let (nb, words, block) = match weight {
            Weight::Int8 { block } => (k.div_ceil(block), activation_words(k, k.div_ceil(block)), block),
            Weight::Q4 => (k.div_ceil(Q4_BLOCK), 2 * packed_cols(k), Q4_BLOCK),
        };
        self.record(|b, pools| {
            let xq = pools.scratch("int8 activations", m * words)?;
            let xs = pools.scratch("int8 activation scales", m * nb)?;
            let window;
            let xin = if xa == 0 {
                x
            } else {
                window = pools.scratch("int8 window input", lx)?;
                b.copy(&window, 0, x, xa, lx)?;
                &window
            };
            match weight {
                Weight::Q4 => b.quantize_activations_wide(&xq, &xs, xin, m, k)?,
                Weight::Int8 { .. } => b.quantize_activation_blocks(&xq, &xs, xin, m, k, block)?,
            }
            let product = |b: &mut Batch<'_>, o: &GpuBuffer| {
                b.quant_matmul(o, (n, 0), &xq, &xs, (packed, scales, weight), m, n, k, spec.beta)
            };
            if oc == 0 {
                return product(b, out);
            }
            // Into scratch, then back into the window (with beta, the window's old values
            // go in first).
            let o = pools.scratch("int8 window output", lo)?;
            if spec.beta != 0.0 {
                b.copy(&o, 0, out, oc, lo)?;
            }
            product(b, &o)?;
            b.copy(out, oc, &o, 0, lo)
        })
    }
    fn q8_embedding(
        &self, out: &mut GpuBuffer, packed: &GpuBuffer, scales: &GpuBuffer, ids: &[u32], vocab: usize,
        dim: usize,
    ) -> Result<()> {
        rusting_brain_core::ops::embedding::check_ids("q8_embedding", ids, vocab)?;
        self.record(|b, pools| {
            let gids = pools.stage(ids)?;
            b.q8_embedding(out, &gids, packed, scales, ids.len(), vocab, dim)
        })
    }
}

/// A quantized weight's layout, as the products read it.
#[derive(Clone, Copy)]
enum Weight {
    /// Int8 with one scale per `block` values.
    Int8 { block: usize },
    /// Four bits in blocks of 32 with a scale and an offset each (core's `q4`).
    Q4,
}

/// The block size of an int8 weight of `n` rows of `k` whose scales are `ws` (core's
/// `q8::q8_block`: one scale a row, or one per 32 values).
fn weight_block(op: &'static str, n: usize, k: usize, ws: &GpuBuffer) -> Result<usize, ShaderError> {
    rusting_brain_core::ops::q8::q8_block(op, n, k, ws.len()).map_err(|e| ShaderError::Invalid(e.to_string()))
}

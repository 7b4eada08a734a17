//! int8 products and lookups (`quantize_activations*.wgsl`, `q8_matmul*.wgsl`, `q8_embedding.wgsl`);
//! twin of `rusting_brain_core::ops::q8`.

use super::*;
use crate::backend::unsupported;
use crate::backend::WgpuBackend;
use crate::GpuBuffer;
use rusting_brain_core::backend::MatmulSpec;
use rusting_brain_core::backend::Q8Ops;
use rusting_brain_core::CoreError;
use rusting_brain_core::Result;

/// int8 for one block a row, 13-bit in blocks for blocked weights; workgroup reductions,
/// [`QUANTIZE_ACTIVATIONS_SG`] where the device has subgroups.
const QUANTIZE_ACTIVATIONS: Kernel = kernel!(
    "quantize_activations",
    { rows: u32, cols: u32, packed_cols: u32, block: u32 },
    [read x: f32, read_write xq: u32, read_write xs: f32], prelude "int8"
)
.with_subgroup_twin(&QUANTIZE_ACTIVATIONS_SG);
/// The row maxima with subgroup reductions.
const QUANTIZE_ACTIVATIONS_SG: Kernel = kernel!(
    "quantize_activations_sg",
    { rows: u32, cols: u32, packed_cols: u32, block: u32 },
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
    [read xq: u32, read xs: f32, read w: u32, read ws: f32, read_write out: f32], prelude "int8"
);
const Q8_EMBEDDING: Kernel = kernel!(
    "q8_embedding",
    { rows: u32, dim: u32, packed_cols: u32, vocab: u32, id0: u32, slab_rows: u32, blocks: u32, block: u32 },
    [read ids: u32, read table: u32, read scales: f32, read_write out: f32]
);

/// The kernels this family dispatches (gathered in `ops::KERNELS`).
pub(super) const KERNELS: &[Kernel] =
    &[QUANTIZE_ACTIVATIONS, QUANTIZE_ACTIVATIONS_SG, Q8_MATMUL, Q8_MATMUL_TILED, Q8_EMBEDDING];

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
        const OP: &str = "quantize_activations";
        let (pc, nb) = (packed_cols(cols), cols.div_ceil(block.max(1)));
        if block == 0 || (block != cols && !block.is_multiple_of(4)) {
            return Err(ShaderError::Invalid(format!("{OP}: blocks of {block} values split packed words")));
        }
        need(OP, "x", x, rows * cols)?;
        need(OP, "xq", xq, rows * activation_words(cols, nb))?;
        need(OP, "xs", xs, rows * nb)?;
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let p = [u(rows, "rows")?, u(cols, "cols")?, u(pc, "packed cols")?, u(block, "block")?];
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
        &mut self, out: &GpuBuffer, (out_n, j0): (usize, usize), xq: &GpuBuffer, xs: &GpuBuffer,
        w: &GpuBuffer, ws: &GpuBuffer, m: usize, n: usize, k: usize, beta: f32,
    ) -> Result<(), ShaderError> {
        const OP: &str = "q8_matmul";
        let pc = packed_cols(k);
        let block = weight_block(OP, n, k, ws)?;
        let nb = k.div_ceil(block);
        need(OP, "xq", xq, m * activation_words(k, nb))?;
        need(OP, "xs", xs, m * nb)?;
        need(OP, "w", w, n * pc)?;
        if j0 + n > out_n {
            return Err(ShaderError::Invalid(format!("{OP}: columns {j0}..{} of rows of {out_n}", j0 + n)));
        }
        need(OP, "out", out, m * out_n)?;
        if n > 0 && self.over_binding(&[w, ws]) {
            // A weight over one binding: its row slabs, each into its columns of `out`.
            let rows = self.slab_rows(OP, pc)?;
            let mut r0 = 0;
            while r0 < n {
                let r = rows.min(n - r0);
                let (w, ws) = (w.slab(r0 * pc, r * pc), ws.slab(r0 * nb, r * nb));
                self.q8_matmul_cols(out, (out_n, j0 + r0), xq, xs, &w, &ws, m, r, k, beta)?;
                r0 += r;
            }
            return Ok(());
        }
        if m > MAX_GROUPS || n.div_ceil(WG) > MAX_GROUPS {
            return Err(ShaderError::Invalid(format!(
                "{OP}: {m} rows x {n} outputs is over the grid's limits ({MAX_GROUPS} rows); split the batch"
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
            u(block, "block")?,
        ];
        if m >= TILED_ROWS {
            // Prefill: 32 x 32 register tiles, each loaded word used 32 times.
            let groups = grid2(n.div_ceil(32), m.div_ceil(32))?;
            self.dispatch(&Q8_MATMUL_TILED, &p, &[xq, xs, w, ws, out], groups)?;
        } else {
            self.dispatch(&Q8_MATMUL, &p, &[xq, xs, w, ws, out], (n.div_ceil(WG) as u32, m as u32))?;
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
        let block =
            rusting_brain_core::ops::q8::check_q8_matmul(lo, lx, packed.len(), scales.len(), m, n, k)?;
        self.record(|b, pools| {
            let nb = k.div_ceil(block);
            let xq = pools.scratch("int8 activations", m * activation_words(k, nb))?;
            let xs = pools.scratch("int8 activation scales", m * nb)?;
            if xa == 0 {
                b.quantize_activation_blocks(&xq, &xs, x, m, k, block)?;
            } else {
                let xin = pools.scratch("int8 window input", lx)?;
                b.copy(&xin, 0, x, xa, lx)?;
                b.quantize_activation_blocks(&xq, &xs, &xin, m, k, block)?;
            }
            if oc == 0 {
                return b.q8_matmul(out, &xq, &xs, packed, scales, m, n, k, spec.beta);
            }
            // Into scratch, then back into the window (with beta, the window's old values
            // go in first).
            let o = pools.scratch("int8 window output", lo)?;
            if spec.beta != 0.0 {
                b.copy(&o, 0, out, oc, lo)?;
            }
            b.q8_matmul(&o, &xq, &xs, packed, scales, m, n, k, spec.beta)?;
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

/// The block size of an int8 weight of `n` rows of `k` whose scales are `ws` (core's
/// `q8::q8_block`: one scale a row, or one per 32 values).
fn weight_block(op: &'static str, n: usize, k: usize, ws: &GpuBuffer) -> Result<usize, ShaderError> {
    rusting_brain_core::ops::q8::q8_block(op, n, k, ws.len()).map_err(|e| ShaderError::Invalid(e.to_string()))
}

//! A block's weights as the products read them (f32 or int8), and the low-rank adapters on them.

use super::*;

/// A weight as a product reads it: f32, or int8 with one scale per row.
pub(super) enum Mat<'a, B: Backend> {
    F32(&'a B::Buffer),
    Q8(&'a B::Buffer, &'a B::Buffer),
}

impl<B: Backend> Mat<'_, B> {
    /// `out = x W^T + beta * out` with the spec's `m, n, k`, `beta`, precision and window
    /// (W is stored `(n, k)`, a `Linear` weight).
    pub(super) fn apply(&self, b: &B, out: &mut B::Buffer, x: &B::Buffer, spec: MatmulSpec) -> Result<()> {
        match *self {
            Mat::F32(w) => b.matmul(out, x, w, &spec.trans_b(true)),
            Mat::Q8(packed, scales) => b.q8_matmul(out, x, packed, scales, &spec.trans_b(true)),
        }
    }
}

impl<B: Backend> Mat<'_, B> {
    /// `out = dy W + beta * out` with the spec's `m, n, k` (W is `(k, n)`, stored as a
    /// `Linear` weight `(n_out = k, n_in = n)`): the input gradient of [`Mat::apply`]. An
    /// int8 W (a frozen base under adapters) is dequantized into `deq` first.
    pub(super) fn grad_input(
        &self, b: &B, out: &mut B::Buffer, dy: &B::Buffer, spec: MatmulSpec, deq: &mut Dequant<B>,
    ) -> Result<()> {
        match *self {
            Mat::F32(w) => b.matmul(out, dy, w, &spec),
            Mat::Q8(packed, scales) => {
                let (rows, cols) = (spec.k, spec.n);
                let w = deq.get(b, packed, scales, rows, cols)?;
                b.matmul(out, dy, w, &spec)
            }
        }
    }
}

/// f32 copies of int8 weights for the backward pass of an int8 base, one buffer per size,
/// refilled for each matrix.
pub(super) struct Dequant<B: Backend> {
    pub(super) by_len: Vec<(usize, B::Buffer)>,
    /// `0..rows` for the lookup that dequantizes a whole matrix, grown to the most rows seen.
    pub(super) ids: Vec<u32>,
}

impl<B: Backend> Dequant<B> {
    pub(super) fn new() -> Self {
        Dequant { by_len: Vec::new(), ids: Vec::new() }
    }
    pub(super) fn get(
        &mut self, b: &B, packed: &B::Buffer, scales: &B::Buffer, rows: usize, cols: usize,
    ) -> Result<&B::Buffer> {
        let len = rows * cols;
        let i = match self.by_len.iter().position(|(l, _)| *l == len) {
            Some(i) => i,
            None => {
                self.by_len.push((len, b.zeros(len)?));
                self.by_len.len() - 1
            }
        };
        if self.ids.len() < rows {
            self.ids = (0..rows as u32).collect();
        }
        let buf = &mut self.by_len[i].1;
        b.q8_embedding(buf, packed, scales, &self.ids[..rows], rows, cols)?;
        Ok(&self.by_len[i].1)
    }
}

/// What the adapter products of one pass share: rank, scale, GEMM precision.
#[derive(Clone, Copy)]
pub(super) struct LoraCtx {
    pub(super) rank: usize,
    pub(super) scale: f32,
    pub(super) prec: OperandPrecision,
}

impl LoraCtx {
    /// The adapters' settings for a pass at GEMM precision `prec`; `None` without adapters.
    pub(super) fn of<B: Backend>(lora: Option<&LoraState<B>>, prec: OperandPrecision) -> Option<LoraCtx> {
        lora.map(|st| LoraCtx { rank: st.config.rank, scale: st.config.scale(), prec })
    }

    pub(super) fn spec(&self, rows: usize, d_in: usize, d_out: usize) -> LoraSpec {
        LoraSpec::new(rows, d_in, d_out, self.rank, self.scale).precision(self.prec)
    }
}

/// Rows `first..first + rows` of a pass and the adapters they take (`w`: a block's, or a
/// part of one) with their settings: one group of every row for a model's attached
/// adapters, a group per sequence when each picks its own.
pub(super) struct Rows<'a, W> {
    pub(super) w: &'a W,
    pub(super) ctx: LoraCtx,
    pub(super) first: usize,
    pub(super) rows: usize,
}

impl<W> Clone for Rows<'_, W> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<W> Copy for Rows<'_, W> {}

impl<'a, W> Rows<'a, W> {
    /// The same rows with a part of the adapters (`w.mlp`), if the part is there.
    pub(super) fn part<P>(&self, f: impl Fn(&'a W) -> Option<&'a P>) -> Option<Rows<'a, P>> {
        f(self.w).map(|w| Rows { w, ctx: self.ctx, first: self.first, rows: self.rows })
    }
}

/// `y += scale (x A^T) B^T` on each group's rows where its adapters adapt the projection
/// `pick` names; `t` keeps `x A^T`, `stride` values a row. Each group is its own product,
/// so a row's sums do not depend on the other groups.
#[allow(clippy::too_many_arguments)]
pub(super) fn adapt<B: Backend, W>(
    b: &B, groups: &[Rows<'_, W>], pick: impl Fn(&W) -> &Option<LoraPair<B::Buffer>>,
    t: &mut Option<B::Buffer>, stride: usize, y: &mut B::Buffer, x: &B::Buffer, d_in: usize, d_out: usize,
) -> Result<()> {
    for g in groups {
        let s = g.ctx.spec(g.rows, d_in, d_out).offsets(g.first * d_in, g.first * d_out, g.first * stride);
        adapt_with(b, pick(g.w), t, y, x, s)?;
    }
    Ok(())
}

/// `y += scale (x A^T) B^T` over the spec's rows where the projection has an adapter (`t`
/// keeps `x A^T`).
pub(super) fn adapt_with<B: Backend>(
    b: &B, pair: &Option<LoraPair<B::Buffer>>, t: &mut Option<B::Buffer>, y: &mut B::Buffer, x: &B::Buffer,
    s: LoraSpec,
) -> Result<()> {
    match (pair, t) {
        (Some(p), Some(t)) => b.lora_forward(y, t, x, &p.a, &p.b, &s),
        _ => Ok(()),
    }
}

/// The backward of [`adapt`]: the adapter's gradients, and `dx += ...` when given.
#[allow(clippy::too_many_arguments)]
pub(super) fn adapt_backward<B: Backend>(
    b: &B, pair: &Option<LoraPair<B::Buffer>>, grad: &mut Option<LoraPair<B::Buffer>>, t: &Option<B::Buffer>,
    dt: &mut B::Buffer, dx: Option<&mut B::Buffer>, dy: &B::Buffer, x: &B::Buffer, s: LoraSpec,
) -> Result<()> {
    match (pair, grad, t) {
        (Some(p), Some(g), Some(t)) => b.lora_backward(dx, &mut g.a, &mut g.b, dt, dy, x, t, &p.a, &p.b, &s),
        _ => Ok(()),
    }
}

/// A block's adapters, `Some` where a projection is adapted.
pub(super) type BlockAdapters<B> = Block<Option<LoraPair<<B as Memory>::Buffer>>>;

/// One block's adapters in a pass: which rows take which adapters, and their kept `x A^T`
/// (`stride` values a row: the largest rank).
pub(super) struct BlockLora<'a, B: Backend> {
    pub(super) groups: Vec<Rows<'a, BlockAdapters<B>>>,
    pub(super) t: &'a mut Block<Option<B::Buffer>>,
    pub(super) stride: usize,
}

/// Block `l`'s attached adapters over every one of `n` rows in a pass, keeping their
/// `x A^T` in `t[l]`; `None` without adapters (then `t` is empty).
pub(super) fn block_lora<'a, B: Backend>(
    lora: Option<&'a LoraState<B>>, ctx: Option<LoraCtx>, l: usize, t: &'a mut [Block<Option<B::Buffer>>],
    n: usize,
) -> Option<BlockLora<'a, B>> {
    match (lora, ctx) {
        (Some(st), Some(ctx)) => Some(BlockLora {
            groups: alloc::vec![Rows { w: &st.weights.layers[l], ctx, first: 0, rows: n }],
            t: &mut t[l],
            stride: ctx.rank,
        }),
        _ => None,
    }
}

/// Buffers of `x A^T` for one block's adapted projections over `n` rows (`n * top_k` for
/// the experts).
pub(super) fn lora_acts<B: Backend>(
    b: &B, shapes: &Block<Option<(usize, usize)>>, n: usize, top_k: usize, rank: usize,
) -> Result<Block<Option<B::Buffer>>> {
    let mut lens: Block<Option<usize>> = shapes.as_ref().map(|s| s.map(|_| n * rank));
    if let Some(e) = lens.moe.as_mut() {
        for ex in &mut e.experts {
            for leaf in [&mut ex.gate, &mut ex.up, &mut ex.down] {
                *leaf = leaf.map(|_| n * top_k * rank);
            }
        }
    }
    lens.try_map("", &mut |_, l: Option<usize>| l.map(|l| b.zeros(l)).transpose())
}

/// Block `l`'s weights as the forward pass reads them: int8 where quantized, else f32.
pub(super) fn block_view<'a, B: Backend>(
    params: &'a Params<B>, quantized: Option<&'a QuantParams<B>>, l: usize,
) -> Result<Block<Mat<'a, B>>> {
    let f = params.layers[l].as_ref();
    match quantized {
        None => Ok(f.map(Mat::F32)),
        Some(q) => f
            .zip(q.layers[l].as_ref())
            .map(|pair| {
                pair.map(|(w, q)| match q {
                    Some((packed, scales)) => Mat::Q8(packed, scales),
                    None => Mat::F32(w),
                })
            })
            .ok_or_else(|| invalid(format!("the int8 weights of layer {l} do not match its layout"))),
    }
}

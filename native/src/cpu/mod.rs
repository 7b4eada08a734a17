//! The CPU backend: every primitive of `rusting_brain_core::Backend`, parallel over rayon's
//! pool and vectorized for the instruction set detected at run time (AVX-512, AVX2+FMA,
//! or the baseline / NEON). GEMMs go to the `gemm` crate, GEMVs to our own kernels.
//!
//! Each op lives in the file named after it, beside its reference twin in
//! `rusting_brain_core::ops`; `tests/backend_vs_reference.rs` compares every one of them on
//! awkward shapes with the outputs poisoned first.
//!
//! Reductions are split at fixed sizes (never by thread count) and their partial results
//! added in a fixed order, so a run gives the same bits on 2 cores and on 64.

mod attention;
pub mod bf16;
mod conv;
mod cross_entropy;
mod dense;
mod elementwise;
mod embedding;
mod matmul;
mod moe;
mod norm;
mod optim;
pub(crate) mod q8;
mod rmsnorm;
mod rope;
pub mod sdpa;
mod shared_buf;
pub mod simd;
mod softmax;
mod spatial;
mod swiglu;
pub(crate) mod team;

use rusting_brain_core::backend::*;
use rusting_brain_core::error::check_len;
use rusting_brain_core::ops::modulation;
use rusting_brain_core::{Activation, Loss, Result};

/// Elements per parallel task for element-wise work: large enough that rayon's overhead
/// (~1 us a task) is noise, small enough to spread over many cores.
pub(crate) const ELEMENTS_PER_TASK: usize = 1 << 14;

/// Rows per parallel task for row-wise work with `cols` columns: about
/// `ELEMENTS_PER_TASK` elements, at least one row. Depends on the shape only.
pub(crate) fn rows_per_task(cols: usize) -> usize {
    (ELEMENTS_PER_TASK / cols.max(1)).max(1)
}

/// The multi-threaded, SIMD CPU backend. Buffers are `Vec<f32>`.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuBackend;

impl CpuBackend {
    /// The CPU backend (stateless: the thread team and the kernels' choice are global).
    pub fn new() -> Self {
        CpuBackend
    }
    /// Threads in rayon's pool (set `RAYON_NUM_THREADS` to change it).
    pub fn threads(&self) -> usize {
        rayon::current_num_threads()
    }
    /// The SIMD instruction set the kernels run with on this CPU (`RB_CPU_ISA` and
    /// `RB_CPU_VNNI=0` lower it), with `+vnni` when the int8 products use VNNI.
    pub fn isa(&self) -> &'static str {
        match (simd::isa().name(), simd::has_vnni()) {
            ("avx512f", true) => "avx512f+vnni",
            (name, _) => name,
        }
    }
}

/// Whether a SwiGLU's gating products (`spec`, `x` into `s`, keeping `gate` and `up`; `op`
/// and `name` name the call and `s` in errors) take
/// the fused one-row path: one activation row over all of `x`, beta 0. When they do, the
/// checks the unfused calls would make of the spec and lengths are made here; `false`
/// leaves the checking to those calls.
fn fused_swiglu_row(
    (op, name): (&'static str, &'static str),
    spec: &MatmulSpec,
    x: &[f32],
    s: &mut [f32],
    gate: &[f32],
    up: &[f32],
) -> Result<bool> {
    if !(spec.one_row_of(x.len()) && spec.beta == 0.0) {
        return Ok(false);
    }
    rusting_brain_core::ops::q8::q8_operands(spec, x, s)?;
    rusting_brain_core::ops::swiglu::check_swiglu_forward(s.len(), gate.len(), up.len())?;
    check_len(op, name, s.len(), spec.n)?;
    Ok(true)
}

impl Backend for CpuBackend {
    type Buffer = Vec<f32>;

    fn name(&self) -> &'static str {
        "cpu"
    }
    fn zeros(&self, len: usize) -> Result<Vec<f32>> {
        Ok(vec![0.0; len])
    }
    fn upload(&self, data: &[f32]) -> Result<Vec<f32>> {
        Ok(data.to_vec())
    }
    fn download(&self, buf: &Vec<f32>) -> Result<Vec<f32>> {
        Ok(buf.clone())
    }
    fn write(&self, dst: &mut Vec<f32>, data: &[f32]) -> Result<()> {
        check_len("write", "data", data.len(), dst.len())?;
        dst.copy_from_slice(data);
        Ok(())
    }
    fn len(&self, buf: &Vec<f32>) -> usize {
        buf.len()
    }
    fn fill(&self, buf: &mut Vec<f32>, value: f32) -> Result<()> {
        buf.fill(value);
        Ok(())
    }
    fn copy(&self, dst: &mut Vec<f32>, src: &Vec<f32>) -> Result<()> {
        check_len("copy", "src", src.len(), dst.len())?;
        dst.copy_from_slice(src);
        Ok(())
    }
    fn copy_range(
        &self,
        dst: &mut Vec<f32>,
        dst_offset: usize,
        src: &Vec<f32>,
        src_offset: usize,
        len: usize,
    ) -> Result<()> {
        rusting_brain_core::error::check_range("copy_range", "dst", dst.len(), dst_offset, len)?;
        rusting_brain_core::error::check_range("copy_range", "src", src.len(), src_offset, len)?;
        dst[dst_offset..dst_offset + len].copy_from_slice(&src[src_offset..src_offset + len]);
        Ok(())
    }
    fn axpy(&self, y: &mut Vec<f32>, alpha: f32, x: &Vec<f32>) -> Result<()> {
        elementwise::axpy(y, alpha, x)
    }
    fn scale(&self, x: &mut Vec<f32>, alpha: f32) -> Result<()> {
        elementwise::scale(x, alpha);
        Ok(())
    }
    fn sum_of_squares(&self, x: &Vec<f32>) -> Result<f64> {
        Ok(elementwise::sum_of_squares(x))
    }
    fn matmul(&self, c: &mut Vec<f32>, a: &Vec<f32>, b: &Vec<f32>, spec: &MatmulSpec) -> Result<()> {
        matmul::matmul(c, a, b, spec)
    }
    fn add_bias(&self, out: &mut Vec<f32>, bias: &Vec<f32>, rows: usize, cols: usize) -> Result<()> {
        elementwise::add_bias(out, bias, rows, cols)
    }
    fn bias_backward(&self, dbias: &mut Vec<f32>, dout: &Vec<f32>, rows: usize, cols: usize) -> Result<()> {
        elementwise::bias_backward(dbias, dout, rows, cols)
    }
    fn activation_forward(
        &self,
        act: Activation,
        out: &mut Vec<f32>,
        inp: &Vec<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        dense::activation_forward(act, out, inp, rows, cols)
    }
    fn activation_backward(
        &self,
        act: Activation,
        dinp: &mut Vec<f32>,
        dout: &Vec<f32>,
        inp: &Vec<f32>,
        out: &Vec<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        dense::activation_backward(act, dinp, dout, inp, out, rows, cols)
    }
    fn loss_forward(
        &self,
        l: Loss,
        pred: &Vec<f32>,
        target: &Vec<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<f64> {
        dense::loss_forward(l, pred, target, rows, cols)
    }
    fn loss_backward(
        &self,
        l: Loss,
        dpred: &mut Vec<f32>,
        pred: &Vec<f32>,
        target: &Vec<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        dense::loss_backward(l, dpred, pred, target, rows, cols)
    }
    fn fused_output_backward(
        &self,
        l: Loss,
        dlogits: &mut Vec<f32>,
        pred: &Vec<f32>,
        target: &Vec<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        dense::fused_output_backward(l, dlogits, pred, target, rows, cols)
    }
    fn rmsnorm_forward(
        &self,
        out: &mut Vec<f32>,
        rstd: &mut Vec<f32>,
        inp: &Vec<f32>,
        weight: &Vec<f32>,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        rmsnorm::rmsnorm_forward(out, rstd, inp, weight, rows, dim, eps)
    }
    fn rmsnorm_backward(
        &self,
        dinp: &mut Vec<f32>,
        dweight: &mut Vec<f32>,
        dout: &Vec<f32>,
        inp: &Vec<f32>,
        weight: &Vec<f32>,
        rstd: &Vec<f32>,
        rows: usize,
        dim: usize,
    ) -> Result<()> {
        rmsnorm::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, rows, dim)
    }
    fn rope_forward(&self, x: &mut Vec<f32>, spec: &RopeSpec) -> Result<()> {
        rope::rope_forward(x, spec)
    }
    fn rope_backward(&self, dx: &mut Vec<f32>, spec: &RopeSpec) -> Result<()> {
        rope::rope_backward(dx, spec)
    }
    fn softmax_forward(&self, out: &mut Vec<f32>, inp: &Vec<f32>, rows: usize, cols: usize) -> Result<()> {
        softmax::softmax_forward(out, inp, rows, cols)
    }
    fn softmax_backward(
        &self,
        dinp: &mut Vec<f32>,
        dout: &Vec<f32>,
        out: &Vec<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        softmax::softmax_backward(dinp, dout, out, rows, cols)
    }
    fn swiglu_forward(&self, out: &mut Vec<f32>, gate: &Vec<f32>, up: &Vec<f32>) -> Result<()> {
        swiglu::swiglu_forward(out, gate, up)
    }
    fn swiglu_backward(
        &self,
        dgate: &mut Vec<f32>,
        dup: &mut Vec<f32>,
        dout: &Vec<f32>,
        gate: &Vec<f32>,
        up: &Vec<f32>,
    ) -> Result<()> {
        swiglu::swiglu_backward(dgate, dup, dout, gate, up)
    }
    fn attention_forward(
        &self,
        out: &mut Vec<f32>,
        lse: &mut Vec<f32>,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        spec: &AttentionSpec,
    ) -> Result<()> {
        attention::attention_forward(out, lse, q, k, v, spec)
    }
    fn attention_backward(
        &self,
        dq: &mut Vec<f32>,
        dk: &mut Vec<f32>,
        dv: &mut Vec<f32>,
        dout: &Vec<f32>,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        out: &Vec<f32>,
        lse: &Vec<f32>,
        spec: &AttentionSpec,
    ) -> Result<()> {
        attention::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, spec)
    }
    fn embedding_forward(
        &self,
        out: &mut Vec<f32>,
        table: &Vec<f32>,
        ids: &[u32],
        vocab: usize,
        dim: usize,
    ) -> Result<()> {
        embedding::embedding_forward(out, table, ids, vocab, dim)
    }
    fn embedding_backward(
        &self,
        dtable: &mut Vec<f32>,
        dout: &Vec<f32>,
        ids: &[u32],
        vocab: usize,
        dim: usize,
    ) -> Result<()> {
        embedding::embedding_backward(dtable, dout, ids, vocab, dim)
    }
    fn cross_entropy(
        &self,
        logits: &mut Vec<f32>,
        targets: &[u32],
        mask: Option<&[bool]>,
        rows: usize,
        vocab: usize,
        grad_scale: Option<f32>,
    ) -> Result<CrossEntropySum> {
        cross_entropy::cross_entropy(logits, targets, mask, rows, vocab, grad_scale)
    }
    fn moe_combine(
        &self,
        out: &mut Vec<f32>,
        y: &Vec<f32>,
        row_of_slot: &[u32],
        weight: &[f32],
        top_k: usize,
        dim: usize,
    ) -> Result<()> {
        moe::moe_combine(out, y, row_of_slot, weight, top_k, dim)
    }
    fn moe_combine_backward(
        &self,
        dy: &mut Vec<f32>,
        dout: &Vec<f32>,
        y: &Vec<f32>,
        row_of_slot: &[u32],
        weight: &[f32],
        top_k: usize,
        dim: usize,
    ) -> Result<Vec<f32>> {
        moe::moe_combine_backward(dy, dout, y, row_of_slot, weight, top_k, dim)
    }
    fn q8_matmul(
        &self,
        out: &mut Vec<f32>,
        x: &Vec<f32>,
        packed: &Vec<f32>,
        scales: &Vec<f32>,
        spec: &MatmulSpec,
    ) -> Result<()> {
        let (x, out) = rusting_brain_core::ops::q8::q8_operands(spec, x, out)?;
        q8::q8_matmul(out, x, packed, scales, spec.m, spec.n, spec.k, spec.beta)
    }
    fn q8_matmul_many(&self, x: &Vec<f32>, products: &mut [Q8Product<'_, Vec<f32>>]) -> Result<()> {
        // One activation row over all of `x` (a decode step's projections): one job.
        // Anything else runs product by product.
        if products.len() > q8::MANY_MAX || !products.iter().all(|p| p.spec.one_row_of(x.len())) {
            return rusting_brain_core::backend::q8_matmul_each(self, x, products);
        }
        let mut rows: [Option<q8::DecodeProduct<'_>>; q8::MANY_MAX] = Default::default();
        for (p, row) in products.iter_mut().zip(&mut rows) {
            // The checks q8_matmul makes of the spec (trans_b, alpha, batch).
            let (_, out) = rusting_brain_core::ops::q8::q8_operands(&p.spec, x, p.out)?;
            check_len("q8_matmul_many", "out", out.len(), p.spec.n)?;
            *row = Some(q8::DecodeProduct {
                out,
                packed: p.packed,
                scales: p.scales,
                beta: p.spec.beta,
            });
        }
        q8::q8_matmul_many(x, rows)
    }
    fn q8_swiglu(
        &self,
        out: &mut Vec<f32>,
        gate: &mut Vec<f32>,
        up: &mut Vec<f32>,
        x: &Vec<f32>,
        gate_w: (&Vec<f32>, &Vec<f32>),
        up_w: (&Vec<f32>, &Vec<f32>),
        spec: &MatmulSpec,
    ) -> Result<()> {
        if !fused_swiglu_row(("q8_swiglu", "out"), spec, x, out, gate, up)? {
            return rusting_brain_core::backend::q8_swiglu_unfused(
                self, out, gate, up, x, gate_w, up_w, spec,
            );
        }
        q8::q8_swiglu(out, gate, up, x, (gate_w.0, gate_w.1), (up_w.0, up_w.1))
    }
    fn q8_attention(&self, a: Q8Attention<'_, Vec<f32>>) -> Result<()> {
        // One position of one sequence, over the team: one phased job. Anything else (a
        // prompt, one thread, a model too small to split) as the calls one by one.
        let s = a.spec;
        let bytes = (s.q_heads.saturating_add(s.kv_heads))
            .saturating_mul(s.head_dim)
            .saturating_mul(2 * a.h.len());
        if !q8::attention_row_fits(s, a.rope_q, a.rope_k) || team::parts() < 2 || bytes < q8::TEAM_MIN_BYTES {
            return rusting_brain_core::backend::q8_attention_unfused(self, a);
        }
        let [wq, wk, wv, wo] = a.weights;
        q8::q8_attention_row(q8::DecodeAttention {
            x: a.x,
            h: a.h,
            q: a.q,
            k: a.k,
            v: a.v,
            cache_k: a.cache_k,
            cache_v: a.cache_v,
            pos: a.pos,
            att: a.att,
            lse: a.lse,
            weights: [(wq.0, wq.1), (wk.0, wk.1), (wv.0, wv.1), (wo.0, wo.1)],
            rope_q: a.rope_q,
            rope_k: a.rope_k,
            spec: s,
        })
    }
    fn q8_mlp(
        &self,
        out: &mut Vec<f32>,
        [gate, up, s]: [&mut Vec<f32>; 3],
        x: &Vec<f32>,
        gate_w: (&Vec<f32>, &Vec<f32>),
        up_w: (&Vec<f32>, &Vec<f32>),
        down_w: (&Vec<f32>, &Vec<f32>),
        spec: &MatmulSpec,
    ) -> Result<()> {
        // One activation row (a decode step's feed-forward): one phased job. Anything
        // else as the two calls.
        if !fused_swiglu_row(("q8_mlp", "s"), spec, x, s, gate, up)? {
            return rusting_brain_core::backend::q8_mlp_unfused(
                self,
                out,
                [gate, up, s],
                x,
                gate_w,
                up_w,
                down_w,
                spec,
            );
        }
        check_len("q8_mlp", "out", out.len(), spec.k)?;
        q8::q8_mlp(
            out,
            gate,
            up,
            s,
            x,
            (gate_w.0, gate_w.1),
            (up_w.0, up_w.1),
            (down_w.0, down_w.1),
        )
    }
    fn q8_embedding(
        &self,
        out: &mut Vec<f32>,
        packed: &Vec<f32>,
        scales: &Vec<f32>,
        ids: &[u32],
        vocab: usize,
        dim: usize,
    ) -> Result<()> {
        q8::q8_embedding(out, packed, scales, ids, vocab, dim)
    }
    fn conv2d(
        &self,
        out: &mut Vec<f32>,
        inp: &Vec<f32>,
        weight: &Vec<f32>,
        bias: Option<&Vec<f32>>,
        spec: &Conv2dSpec,
    ) -> Result<()> {
        conv::conv2d(out, inp, weight, bias.map(|b| &b[..]), spec)
    }
    fn group_norm(
        &self,
        out: &mut Vec<f32>,
        inp: &Vec<f32>,
        weight: Option<&Vec<f32>>,
        bias: Option<&Vec<f32>>,
        spec: &GroupNormSpec,
    ) -> Result<()> {
        norm::group_norm(out, inp, weight.map(|w| &w[..]), bias.map(|b| &b[..]), spec)
    }
    fn layer_norm(
        &self,
        out: &mut Vec<f32>,
        inp: &Vec<f32>,
        weight: Option<&Vec<f32>>,
        bias: Option<&Vec<f32>>,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        norm::layer_norm(
            out,
            inp,
            weight.map(|w| &w[..]),
            bias.map(|b| &b[..]),
            rows,
            dim,
            eps,
        )
    }
    fn unary(&self, op: Unary, out: &mut Vec<f32>, inp: &Vec<f32>) -> Result<()> {
        elementwise::unary(op, out, inp)
    }
    fn gated(&self, op: Unary, out: &mut Vec<f32>, gate: &Vec<f32>, up: &Vec<f32>) -> Result<()> {
        elementwise::gated(op, out, gate, up)
    }
    fn sdpa(
        &self,
        out: &mut Vec<f32>,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        key_mask: Option<&[bool]>,
        bias: Option<&Vec<f32>>,
        spec: &SdpaSpec,
    ) -> Result<()> {
        sdpa::sdpa(out, q, k, v, key_mask, bias.map(|b| &b[..]), spec)
    }
    fn upsample_nearest2d(
        &self,
        out: &mut Vec<f32>,
        inp: &Vec<f32>,
        planes: usize,
        h: usize,
        w: usize,
        scale: usize,
    ) -> Result<()> {
        spatial::upsample_nearest2d(out, inp, planes, h, w, scale)
    }
    fn patchify(&self, out: &mut Vec<f32>, inp: &Vec<f32>, spec: &PatchSpec) -> Result<()> {
        spatial::patchify(out, inp, spec)
    }
    fn unpatchify(&self, out: &mut Vec<f32>, inp: &Vec<f32>, spec: &PatchSpec) -> Result<()> {
        spatial::unpatchify(out, inp, spec)
    }
    // Memory-bound glue of the diffusion transformers: the reference loops run on the
    // buffers in place (no copies), which is all a CPU can do with them.
    fn modulate(
        &self,
        out: &mut Vec<f32>,
        x: &Vec<f32>,
        mods: &Vec<f32>,
        shift_at: usize,
        scale_at: usize,
        spec: &ModulationSpec,
    ) -> Result<()> {
        modulation::modulate(out, x, mods, shift_at, scale_at, spec)
    }
    fn gate_add(
        &self,
        x: &mut Vec<f32>,
        y: &Vec<f32>,
        mods: &Vec<f32>,
        gate_at: usize,
        spec: &ModulationSpec,
    ) -> Result<()> {
        modulation::gate_add(x, y, mods, gate_at, spec)
    }
    fn copy_cols(&self, dst: &mut Vec<f32>, src: &Vec<f32>, spec: &ColumnCopy) -> Result<()> {
        modulation::copy_cols(dst, src, spec)
    }
    fn rope_pairs(
        &self,
        x: &mut Vec<f32>,
        cos: &Vec<f32>,
        sin: &Vec<f32>,
        spec: &RopePairsSpec,
    ) -> Result<()> {
        modulation::rope_pairs(x, cos, sin, spec)
    }
    fn adam_update(
        &self,
        param: &mut Vec<f32>,
        grad: &Vec<f32>,
        m: &mut Vec<f32>,
        v: &mut Vec<f32>,
        hp: &AdamParams,
        step: u64,
    ) -> Result<()> {
        optim::adam_update(param, grad, m, v, hp, step)
    }
    fn sgd_update(
        &self,
        param: &mut Vec<f32>,
        grad: &Vec<f32>,
        velocity: Option<&mut Vec<f32>>,
        hp: &SgdParams,
    ) -> Result<()> {
        optim::sgd_update(param, grad, velocity.map(|v| v.as_mut_slice()), hp)
    }
}

//! `Profiled`: a backend that runs another one and adds up the wall time of each primitive,
//! for "where does the step's time go" tables. It changes no result.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rusting_brain_core::backend::*;
use rusting_brain_core::{Activation, Backend, Loss, Result};

/// Wraps a backend; `report()` gives (primitive, calls, total time), largest first.
pub struct Profiled<B: Backend> {
    /// The backend doing the work.
    pub inner: B,
    times: RefCell<BTreeMap<&'static str, (usize, Duration)>>,
}

impl<B: Backend> Profiled<B> {
    /// Profiles `inner`.
    pub fn new(inner: B) -> Self {
        Profiled {
            inner,
            times: RefCell::new(BTreeMap::new()),
        }
    }
    fn time<R>(&self, op: &'static str, f: impl FnOnce() -> R) -> R {
        let t = Instant::now();
        let r = f();
        // A device backend queues work: fence it so the time is the op's, not its launch's.
        // A failure surfaces again at the next call that reads a result.
        let _ = self.inner.synchronize();
        let mut times = self.times.borrow_mut();
        let e = times.entry(op).or_insert((0, Duration::ZERO));
        e.0 += 1;
        e.1 += t.elapsed();
        r
    }
    /// Clears the counters.
    pub fn reset(&self) {
        self.times.borrow_mut().clear();
    }
    /// The table the benchmarks print: each primitive's calls and time per step over
    /// `steps` steps of `step_seconds` each, and what fell outside the primitives;
    /// times in milliseconds, or microseconds when `micros`.
    pub fn breakdown(&self, steps: usize, step_seconds: f64, micros: bool) -> String {
        let (scale, unit) = if micros { (1e6, "us") } else { (1e3, "ms") };
        let steps = steps.max(1);
        let wall = step_seconds * scale;
        let mut out = String::new();
        let mut covered = 0.0;
        for (op, calls, total) in self.report() {
            let t = total.as_secs_f64() * scale / steps as f64;
            covered += t;
            out += &format!(
                "  {op:<22} {:>6} calls {t:>9.2} {unit} {:>6.1}%\n",
                calls / steps,
                100.0 * t / wall
            );
        }
        out += &format!(
            "  {:<22} {:>6}       {:>9.2} {unit} {:>6.1}%\n",
            "(outside primitives)",
            "",
            wall - covered,
            100.0 * (1.0 - covered / wall)
        );
        out
    }
    /// (primitive, calls, total time), largest total first.
    pub fn report(&self) -> Vec<(&'static str, usize, Duration)> {
        let mut v: Vec<_> = self
            .times
            .borrow()
            .iter()
            .map(|(k, (n, d))| (*k, *n, *d))
            .collect();
        v.sort_by_key(|e| std::cmp::Reverse(e.2));
        v
    }
}

impl<B: Backend> Backend for Profiled<B> {
    type Buffer = B::Buffer;

    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }
    fn zeros(&self, len: usize) -> Result<B::Buffer> {
        self.time("zeros", || self.inner.zeros(len))
    }
    fn upload(&self, data: &[f32]) -> Result<B::Buffer> {
        self.time("upload", || self.inner.upload(data))
    }
    fn download(&self, buf: &B::Buffer) -> Result<Vec<f32>> {
        self.time("download", || self.inner.download(buf))
    }
    fn write(&self, dst: &mut B::Buffer, data: &[f32]) -> Result<()> {
        self.time("write", || self.inner.write(dst, data))
    }
    fn len(&self, buf: &B::Buffer) -> usize {
        self.inner.len(buf)
    }
    fn fill(&self, buf: &mut B::Buffer, value: f32) -> Result<()> {
        self.time("fill", || self.inner.fill(buf, value))
    }
    fn copy_range(
        &self,
        dst: &mut B::Buffer,
        dst_offset: usize,
        src: &B::Buffer,
        src_offset: usize,
        len: usize,
    ) -> Result<()> {
        self.time("copy_range", || {
            self.inner.copy_range(dst, dst_offset, src, src_offset, len)
        })
    }
    fn moe_combine(
        &self,
        out: &mut B::Buffer,
        y: &B::Buffer,
        row_of_slot: &[u32],
        weight: &[f32],
        top_k: usize,
        dim: usize,
    ) -> Result<()> {
        self.time("moe_combine", || {
            self.inner.moe_combine(out, y, row_of_slot, weight, top_k, dim)
        })
    }
    fn moe_combine_backward(
        &self,
        dy: &mut B::Buffer,
        dout: &B::Buffer,
        y: &B::Buffer,
        row_of_slot: &[u32],
        weight: &[f32],
        top_k: usize,
        dim: usize,
    ) -> Result<Vec<f32>> {
        self.time("moe_combine_backward", || {
            self.inner
                .moe_combine_backward(dy, dout, y, row_of_slot, weight, top_k, dim)
        })
    }
    fn q8_matmul(
        &self,
        out: &mut B::Buffer,
        x: &B::Buffer,
        packed: &B::Buffer,
        scales: &B::Buffer,
        spec: &MatmulSpec,
    ) -> Result<()> {
        self.time("q8_matmul", || self.inner.q8_matmul(out, x, packed, scales, spec))
    }
    fn q8_matmul_many(&self, x: &B::Buffer, products: &mut [Q8Product<'_, B::Buffer>]) -> Result<()> {
        self.time("q8_matmul_many", || self.inner.q8_matmul_many(x, products))
    }
    fn q8_swiglu(
        &self,
        out: &mut B::Buffer,
        gate: &mut B::Buffer,
        up: &mut B::Buffer,
        x: &B::Buffer,
        gate_w: (&B::Buffer, &B::Buffer),
        up_w: (&B::Buffer, &B::Buffer),
        spec: &MatmulSpec,
    ) -> Result<()> {
        self.time("q8_swiglu", || {
            self.inner.q8_swiglu(out, gate, up, x, gate_w, up_w, spec)
        })
    }
    fn q8_mlp(
        &self,
        out: &mut B::Buffer,
        acts: [&mut B::Buffer; 3],
        x: &B::Buffer,
        gate_w: (&B::Buffer, &B::Buffer),
        up_w: (&B::Buffer, &B::Buffer),
        down_w: (&B::Buffer, &B::Buffer),
        spec: &MatmulSpec,
    ) -> Result<()> {
        self.time("q8_mlp", || {
            self.inner.q8_mlp(out, acts, x, gate_w, up_w, down_w, spec)
        })
    }
    fn q8_attention(&self, a: Q8Attention<'_, B::Buffer>) -> Result<()> {
        self.time("q8_attention", || self.inner.q8_attention(a))
    }
    fn q8_embedding(
        &self,
        out: &mut B::Buffer,
        packed: &B::Buffer,
        scales: &B::Buffer,
        ids: &[u32],
        vocab: usize,
        dim: usize,
    ) -> Result<()> {
        self.time("q8_embedding", || {
            self.inner.q8_embedding(out, packed, scales, ids, vocab, dim)
        })
    }
    fn copy(&self, dst: &mut B::Buffer, src: &B::Buffer) -> Result<()> {
        self.time("copy", || self.inner.copy(dst, src))
    }
    fn axpy(&self, y: &mut B::Buffer, alpha: f32, x: &B::Buffer) -> Result<()> {
        self.time("axpy", || self.inner.axpy(y, alpha, x))
    }
    fn scale(&self, x: &mut B::Buffer, alpha: f32) -> Result<()> {
        self.time("scale", || self.inner.scale(x, alpha))
    }
    fn sum_of_squares(&self, x: &B::Buffer) -> Result<f64> {
        self.time("sum_of_squares", || self.inner.sum_of_squares(x))
    }
    fn matmul(&self, c: &mut B::Buffer, a: &B::Buffer, b: &B::Buffer, spec: &MatmulSpec) -> Result<()> {
        self.time("matmul", || self.inner.matmul(c, a, b, spec))
    }
    fn add_bias(&self, out: &mut B::Buffer, bias: &B::Buffer, rows: usize, cols: usize) -> Result<()> {
        self.time("add_bias", || self.inner.add_bias(out, bias, rows, cols))
    }
    fn bias_backward(&self, dbias: &mut B::Buffer, dout: &B::Buffer, rows: usize, cols: usize) -> Result<()> {
        self.time("bias_backward", || {
            self.inner.bias_backward(dbias, dout, rows, cols)
        })
    }
    fn activation_forward(
        &self,
        act: Activation,
        out: &mut B::Buffer,
        inp: &B::Buffer,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        self.time("activation_forward", || {
            self.inner.activation_forward(act, out, inp, rows, cols)
        })
    }
    fn activation_backward(
        &self,
        act: Activation,
        dinp: &mut B::Buffer,
        dout: &B::Buffer,
        inp: &B::Buffer,
        out: &B::Buffer,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        self.time("activation_backward", || {
            self.inner
                .activation_backward(act, dinp, dout, inp, out, rows, cols)
        })
    }
    fn loss_forward(
        &self,
        loss: Loss,
        pred: &B::Buffer,
        target: &B::Buffer,
        rows: usize,
        cols: usize,
    ) -> Result<f64> {
        self.time("loss_forward", || {
            self.inner.loss_forward(loss, pred, target, rows, cols)
        })
    }
    fn loss_backward(
        &self,
        loss: Loss,
        dpred: &mut B::Buffer,
        pred: &B::Buffer,
        target: &B::Buffer,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        self.time("loss_backward", || {
            self.inner.loss_backward(loss, dpred, pred, target, rows, cols)
        })
    }
    fn fused_output_backward(
        &self,
        loss: Loss,
        dlogits: &mut B::Buffer,
        pred: &B::Buffer,
        target: &B::Buffer,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        self.time("fused_output_backward", || {
            self.inner
                .fused_output_backward(loss, dlogits, pred, target, rows, cols)
        })
    }
    fn rmsnorm_forward(
        &self,
        out: &mut B::Buffer,
        rstd: &mut B::Buffer,
        inp: &B::Buffer,
        weight: &B::Buffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        self.time("rmsnorm_forward", || {
            self.inner.rmsnorm_forward(out, rstd, inp, weight, rows, dim, eps)
        })
    }
    fn rmsnorm_backward(
        &self,
        dinp: &mut B::Buffer,
        dweight: &mut B::Buffer,
        dout: &B::Buffer,
        inp: &B::Buffer,
        weight: &B::Buffer,
        rstd: &B::Buffer,
        rows: usize,
        dim: usize,
    ) -> Result<()> {
        self.time("rmsnorm_backward", || {
            self.inner
                .rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, rows, dim)
        })
    }
    fn rope_forward(&self, x: &mut B::Buffer, spec: &RopeSpec) -> Result<()> {
        self.time("rope_forward", || self.inner.rope_forward(x, spec))
    }
    fn rope_backward(&self, dx: &mut B::Buffer, spec: &RopeSpec) -> Result<()> {
        self.time("rope_backward", || self.inner.rope_backward(dx, spec))
    }
    fn softmax_forward(&self, out: &mut B::Buffer, inp: &B::Buffer, rows: usize, cols: usize) -> Result<()> {
        self.time("softmax_forward", || {
            self.inner.softmax_forward(out, inp, rows, cols)
        })
    }
    fn softmax_backward(
        &self,
        dinp: &mut B::Buffer,
        dout: &B::Buffer,
        out: &B::Buffer,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        self.time("softmax_backward", || {
            self.inner.softmax_backward(dinp, dout, out, rows, cols)
        })
    }
    fn swiglu_forward(&self, out: &mut B::Buffer, gate: &B::Buffer, up: &B::Buffer) -> Result<()> {
        self.time("swiglu_forward", || self.inner.swiglu_forward(out, gate, up))
    }
    fn swiglu_backward(
        &self,
        dgate: &mut B::Buffer,
        dup: &mut B::Buffer,
        dout: &B::Buffer,
        gate: &B::Buffer,
        up: &B::Buffer,
    ) -> Result<()> {
        self.time("swiglu_backward", || {
            self.inner.swiglu_backward(dgate, dup, dout, gate, up)
        })
    }
    fn attention_forward(
        &self,
        out: &mut B::Buffer,
        lse: &mut B::Buffer,
        q: &B::Buffer,
        k: &B::Buffer,
        v: &B::Buffer,
        spec: &AttentionSpec,
    ) -> Result<()> {
        self.time("attention_forward", || {
            self.inner.attention_forward(out, lse, q, k, v, spec)
        })
    }
    fn attention_backward(
        &self,
        dq: &mut B::Buffer,
        dk: &mut B::Buffer,
        dv: &mut B::Buffer,
        dout: &B::Buffer,
        q: &B::Buffer,
        k: &B::Buffer,
        v: &B::Buffer,
        out: &B::Buffer,
        lse: &B::Buffer,
        spec: &AttentionSpec,
    ) -> Result<()> {
        self.time("attention_backward", || {
            self.inner
                .attention_backward(dq, dk, dv, dout, q, k, v, out, lse, spec)
        })
    }
    fn embedding_forward(
        &self,
        out: &mut B::Buffer,
        table: &B::Buffer,
        ids: &[u32],
        vocab: usize,
        dim: usize,
    ) -> Result<()> {
        self.time("embedding_forward", || {
            self.inner.embedding_forward(out, table, ids, vocab, dim)
        })
    }
    fn embedding_backward(
        &self,
        dtable: &mut B::Buffer,
        dout: &B::Buffer,
        ids: &[u32],
        vocab: usize,
        dim: usize,
    ) -> Result<()> {
        self.time("embedding_backward", || {
            self.inner.embedding_backward(dtable, dout, ids, vocab, dim)
        })
    }
    fn cross_entropy(
        &self,
        logits: &mut B::Buffer,
        targets: &[u32],
        mask: Option<&[bool]>,
        rows: usize,
        vocab: usize,
        grad_scale: Option<f32>,
    ) -> Result<CrossEntropySum> {
        self.time("cross_entropy", || {
            self.inner
                .cross_entropy(logits, targets, mask, rows, vocab, grad_scale)
        })
    }
    fn conv2d(
        &self,
        out: &mut B::Buffer,
        inp: &B::Buffer,
        weight: &B::Buffer,
        bias: Option<&B::Buffer>,
        spec: &Conv2dSpec,
    ) -> Result<()> {
        self.time("conv2d", || self.inner.conv2d(out, inp, weight, bias, spec))
    }
    fn group_norm(
        &self,
        out: &mut B::Buffer,
        inp: &B::Buffer,
        weight: Option<&B::Buffer>,
        bias: Option<&B::Buffer>,
        spec: &GroupNormSpec,
    ) -> Result<()> {
        self.time("group_norm", || {
            self.inner.group_norm(out, inp, weight, bias, spec)
        })
    }
    fn layer_norm(
        &self,
        out: &mut B::Buffer,
        inp: &B::Buffer,
        weight: Option<&B::Buffer>,
        bias: Option<&B::Buffer>,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        self.time("layer_norm", || {
            self.inner.layer_norm(out, inp, weight, bias, rows, dim, eps)
        })
    }
    fn unary(&self, op: Unary, out: &mut B::Buffer, inp: &B::Buffer) -> Result<()> {
        self.time("unary", || self.inner.unary(op, out, inp))
    }
    fn gated(&self, op: Unary, out: &mut B::Buffer, gate: &B::Buffer, up: &B::Buffer) -> Result<()> {
        self.time("gated", || self.inner.gated(op, out, gate, up))
    }
    fn sdpa(
        &self,
        out: &mut B::Buffer,
        q: &B::Buffer,
        k: &B::Buffer,
        v: &B::Buffer,
        key_mask: Option<&[bool]>,
        bias: Option<&B::Buffer>,
        spec: &SdpaSpec,
    ) -> Result<()> {
        self.time("sdpa", || self.inner.sdpa(out, q, k, v, key_mask, bias, spec))
    }
    fn upsample_nearest2d(
        &self,
        out: &mut B::Buffer,
        inp: &B::Buffer,
        planes: usize,
        h: usize,
        w: usize,
        scale: usize,
    ) -> Result<()> {
        self.time("upsample_nearest2d", || {
            self.inner.upsample_nearest2d(out, inp, planes, h, w, scale)
        })
    }
    fn patchify(&self, out: &mut B::Buffer, inp: &B::Buffer, spec: &PatchSpec) -> Result<()> {
        self.time("patchify", || self.inner.patchify(out, inp, spec))
    }
    fn unpatchify(&self, out: &mut B::Buffer, inp: &B::Buffer, spec: &PatchSpec) -> Result<()> {
        self.time("unpatchify", || self.inner.unpatchify(out, inp, spec))
    }
    fn modulate(
        &self,
        out: &mut B::Buffer,
        x: &B::Buffer,
        mods: &B::Buffer,
        shift_at: usize,
        scale_at: usize,
        spec: &ModulationSpec,
    ) -> Result<()> {
        self.time("modulate", || {
            self.inner.modulate(out, x, mods, shift_at, scale_at, spec)
        })
    }
    fn gate_add(
        &self,
        x: &mut B::Buffer,
        y: &B::Buffer,
        mods: &B::Buffer,
        gate_at: usize,
        spec: &ModulationSpec,
    ) -> Result<()> {
        self.time("gate_add", || self.inner.gate_add(x, y, mods, gate_at, spec))
    }
    fn copy_cols(&self, dst: &mut B::Buffer, src: &B::Buffer, spec: &ColumnCopy) -> Result<()> {
        self.time("copy_cols", || self.inner.copy_cols(dst, src, spec))
    }
    fn rope_pairs(
        &self,
        x: &mut B::Buffer,
        cos: &B::Buffer,
        sin: &B::Buffer,
        spec: &RopePairsSpec,
    ) -> Result<()> {
        self.time("rope_pairs", || self.inner.rope_pairs(x, cos, sin, spec))
    }
    fn adam_update(
        &self,
        param: &mut B::Buffer,
        grad: &B::Buffer,
        m: &mut B::Buffer,
        v: &mut B::Buffer,
        hp: &AdamParams,
        step: u64,
    ) -> Result<()> {
        self.time("adam_update", || {
            self.inner.adam_update(param, grad, m, v, hp, step)
        })
    }
    fn sgd_update(
        &self,
        param: &mut B::Buffer,
        grad: &B::Buffer,
        velocity: Option<&mut B::Buffer>,
        hp: &SgdParams,
    ) -> Result<()> {
        self.time("sgd_update", || self.inner.sgd_update(param, grad, velocity, hp))
    }
}

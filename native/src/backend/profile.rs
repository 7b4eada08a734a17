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
        Profiled { inner, times: RefCell::new(BTreeMap::new()) }
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
        let mut v: Vec<_> = self.times.borrow().iter().map(|(k, (n, d))| (*k, *n, *d)).collect();
        v.sort_by_key(|e| std::cmp::Reverse(e.2));
        v
    }
}

/// The methods of a family on [`Profiled`], each timing the inner backend's method of the
/// same name: one line a method instead of a forwarding body.
macro_rules! timed {
    ($(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty;)*) => {
        $(
            #[allow(clippy::too_many_arguments)]
            fn $name(&self, $($arg: $ty),*) -> $ret {
                self.time(stringify!($name), || self.inner.$name($($arg),*))
            }
        )*
    };
}

impl<B: Backend> Memory for Profiled<B> {
    type Buffer = B::Buffer;

    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }
    fn len(&self, buf: &B::Buffer) -> usize {
        self.inner.len(buf)
    }
    timed! {
        fn zeros(len: usize) -> Result<B::Buffer>;
        fn upload(data: &[f32]) -> Result<B::Buffer>;
        fn download(buf: &B::Buffer) -> Result<Vec<f32>>;
        fn write(dst: &mut B::Buffer, data: &[f32]) -> Result<()>;
        fn fill(buf: &mut B::Buffer, value: f32) -> Result<()>;
        fn copy_range(dst: &mut B::Buffer, dst_offset: usize, src: &B::Buffer, src_offset: usize, len: usize) -> Result<()>;
        fn copy(dst: &mut B::Buffer, src: &B::Buffer) -> Result<()>;
    }
}
impl<B: Backend> ElementwiseOps for Profiled<B> {
    timed! {
        fn axpy(y: &mut B::Buffer, alpha: f32, x: &B::Buffer) -> Result<()>;
        fn scale(x: &mut B::Buffer, alpha: f32) -> Result<()>;
        fn add_bias(out: &mut B::Buffer, bias: &B::Buffer, rows: usize, cols: usize) -> Result<()>;
        fn bias_backward(dbias: &mut B::Buffer, dout: &B::Buffer, rows: usize, cols: usize) -> Result<()>;
    }
}
impl<B: Backend> L2normOps for Profiled<B> {
    timed! {
        fn sum_of_squares(x: &B::Buffer) -> Result<f64>;
    }
}
impl<B: Backend> MatmulOps for Profiled<B> {
    timed! {
        fn matmul(c: &mut B::Buffer, a: &B::Buffer, b: &B::Buffer, spec: &MatmulSpec) -> Result<()>;
    }
}
impl<B: Backend> ActivationOps for Profiled<B> {
    timed! {
        fn activation_forward(act: Activation, out: &mut B::Buffer, inp: &B::Buffer, rows: usize, cols: usize) -> Result<()>;
        fn activation_backward(act: Activation, dinp: &mut B::Buffer, dout: &B::Buffer, inp: &B::Buffer, out: &B::Buffer, rows: usize, cols: usize) -> Result<()>;
    }
}
impl<B: Backend> LossOps for Profiled<B> {
    timed! {
        fn loss_forward(loss: Loss, pred: &B::Buffer, target: &B::Buffer, rows: usize, cols: usize) -> Result<f64>;
        fn loss_backward(loss: Loss, dpred: &mut B::Buffer, pred: &B::Buffer, target: &B::Buffer, rows: usize, cols: usize) -> Result<()>;
        fn fused_output_backward(loss: Loss, dlogits: &mut B::Buffer, pred: &B::Buffer, target: &B::Buffer, rows: usize, cols: usize) -> Result<()>;
    }
}
impl<B: Backend> RmsnormOps for Profiled<B> {
    timed! {
        fn rmsnorm_forward(out: &mut B::Buffer, rstd: &mut B::Buffer, inp: &B::Buffer, weight: &B::Buffer, rows: usize, dim: usize, eps: f32) -> Result<()>;
        fn rmsnorm_backward(dinp: &mut B::Buffer, dweight: &mut B::Buffer, dout: &B::Buffer, inp: &B::Buffer, weight: &B::Buffer, rstd: &B::Buffer, rows: usize, dim: usize) -> Result<()>;
    }
}
impl<B: Backend> RopeOps for Profiled<B> {
    timed! {
        fn rope_forward(x: &mut B::Buffer, spec: &RopeSpec) -> Result<()>;
        fn rope_backward(dx: &mut B::Buffer, spec: &RopeSpec) -> Result<()>;
    }
}
impl<B: Backend> SoftmaxOps for Profiled<B> {
    timed! {
        fn softmax_forward(out: &mut B::Buffer, inp: &B::Buffer, rows: usize, cols: usize) -> Result<()>;
        fn softmax_backward(dinp: &mut B::Buffer, dout: &B::Buffer, out: &B::Buffer, rows: usize, cols: usize) -> Result<()>;
    }
}
impl<B: Backend> SwigluOps for Profiled<B> {
    timed! {
        fn swiglu_forward(out: &mut B::Buffer, gate: &B::Buffer, up: &B::Buffer) -> Result<()>;
        fn swiglu_backward(dgate: &mut B::Buffer, dup: &mut B::Buffer, dout: &B::Buffer, gate: &B::Buffer, up: &B::Buffer) -> Result<()>;
    }
}
impl<B: Backend> AttentionOps for Profiled<B> {
    timed! {
        fn attention_forward(out: &mut B::Buffer, lse: &mut B::Buffer, q: &B::Buffer, k: &B::Buffer, v: &B::Buffer, spec: &AttentionSpec) -> Result<()>;
        fn attention_rows(a: AttentionRows<'_, B::Buffer>) -> Result<()>;
        fn attention_backward(dq: &mut B::Buffer, dk: &mut B::Buffer, dv: &mut B::Buffer, dout: &B::Buffer, q: &B::Buffer, k: &B::Buffer, v: &B::Buffer, out: &B::Buffer, lse: &B::Buffer, spec: &AttentionSpec) -> Result<()>;
    }
}
impl<B: Backend> EmbeddingOps for Profiled<B> {
    timed! {
        fn embedding_forward(out: &mut B::Buffer, table: &B::Buffer, ids: &[u32], vocab: usize, dim: usize) -> Result<()>;
        fn embedding_backward(dtable: &mut B::Buffer, dout: &B::Buffer, ids: &[u32], vocab: usize, dim: usize) -> Result<()>;
    }
}
impl<B: Backend> CrossEntropyOps for Profiled<B> {
    timed! {
        fn cross_entropy(logits: &mut B::Buffer, targets: &[u32], mask: Option<&[bool]>, rows: usize, vocab: usize, grad_scale: Option<f32>) -> Result<CrossEntropySum>;
    }
}
impl<B: Backend> MoeOps for Profiled<B> {
    timed! {
        fn moe_combine(out: &mut B::Buffer, y: &B::Buffer, row_of_slot: &[u32], weight: &[f32], top_k: usize, dim: usize) -> Result<()>;
        fn moe_combine_backward(dy: &mut B::Buffer, dout: &B::Buffer, y: &B::Buffer, row_of_slot: &[u32], weight: &[f32], top_k: usize, dim: usize) -> Result<Vec<f32>>;
    }
}
impl<B: Backend> Q8Ops for Profiled<B> {
    timed! {
        fn q8_matmul(out: &mut B::Buffer, x: &B::Buffer, packed: &B::Buffer, scales: &B::Buffer, spec: &MatmulSpec) -> Result<()>;
        fn q8_matmul_many(x: &B::Buffer, products: &mut [Q8Product<'_, B::Buffer>]) -> Result<()>;
        fn q8_swiglu(out: &mut B::Buffer, gate: &mut B::Buffer, up: &mut B::Buffer, x: &B::Buffer, gate_w: (&B::Buffer, &B::Buffer), up_w: (&B::Buffer, &B::Buffer), spec: &MatmulSpec) -> Result<()>;
        fn q8_mlp(out: &mut B::Buffer, acts: [&mut B::Buffer; 3], x: &B::Buffer, gate_w: (&B::Buffer, &B::Buffer), up_w: (&B::Buffer, &B::Buffer), down_w: (&B::Buffer, &B::Buffer), spec: &MatmulSpec) -> Result<()>;
        fn q8_attention(a: Q8Attention<'_, B::Buffer>) -> Result<()>;
        fn q8_embedding(out: &mut B::Buffer, packed: &B::Buffer, scales: &B::Buffer, ids: &[u32], vocab: usize, dim: usize) -> Result<()>;
    }
}
impl<B: Backend> LoraOps for Profiled<B> {}
impl<B: Backend> ConvOps for Profiled<B> {
    timed! {
        fn conv2d(out: &mut B::Buffer, inp: &B::Buffer, weight: &B::Buffer, bias: Option<&B::Buffer>, spec: &Conv2dSpec) -> Result<()>;
        fn conv2d_q8(out: &mut B::Buffer, inp: &B::Buffer, packed: &B::Buffer, scales: &B::Buffer, bias: Option<&B::Buffer>, spec: &Conv2dSpec) -> Result<()>;
    }
}
impl<B: Backend> NormOps for Profiled<B> {
    timed! {
        fn group_norm(out: &mut B::Buffer, inp: &B::Buffer, weight: Option<&B::Buffer>, bias: Option<&B::Buffer>, spec: &GroupNormSpec) -> Result<()>;
        fn layer_norm(out: &mut B::Buffer, inp: &B::Buffer, weight: Option<&B::Buffer>, bias: Option<&B::Buffer>, rows: usize, dim: usize, eps: f32) -> Result<()>;
    }
}
impl<B: Backend> UnaryOps for Profiled<B> {
    timed! {
        fn unary(op: Unary, out: &mut B::Buffer, inp: &B::Buffer) -> Result<()>;
        fn gated(op: Unary, out: &mut B::Buffer, gate: &B::Buffer, up: &B::Buffer) -> Result<()>;
    }
}
impl<B: Backend> SdpaOps for Profiled<B> {
    timed! {
        fn sdpa(out: &mut B::Buffer, q: &B::Buffer, k: &B::Buffer, v: &B::Buffer, key_mask: Option<&[bool]>, bias: Option<&B::Buffer>, spec: &SdpaSpec) -> Result<()>;
    }
}
impl<B: Backend> SpatialOps for Profiled<B> {
    timed! {
        fn upsample_nearest2d(out: &mut B::Buffer, inp: &B::Buffer, planes: usize, h: usize, w: usize, scale: usize) -> Result<()>;
        fn patchify(out: &mut B::Buffer, inp: &B::Buffer, spec: &PatchSpec) -> Result<()>;
        fn unpatchify(out: &mut B::Buffer, inp: &B::Buffer, spec: &PatchSpec) -> Result<()>;
    }
}
impl<B: Backend> ModulationOps for Profiled<B> {
    timed! {
        fn modulate(out: &mut B::Buffer, x: &B::Buffer, mods: &B::Buffer, shift_at: usize, scale_at: usize, spec: &ModulationSpec) -> Result<()>;
        fn gate_add(x: &mut B::Buffer, y: &B::Buffer, mods: &B::Buffer, gate_at: usize, spec: &ModulationSpec) -> Result<()>;
        fn copy_cols(dst: &mut B::Buffer, src: &B::Buffer, spec: &ColumnCopy) -> Result<()>;
        fn rope_pairs(x: &mut B::Buffer, cos: &B::Buffer, sin: &B::Buffer, spec: &RopePairsSpec) -> Result<()>;
    }
}
impl<B: Backend> OptimOps for Profiled<B> {
    timed! {
        fn adam_update(param: &mut B::Buffer, grad: &B::Buffer, m: &mut B::Buffer, v: &mut B::Buffer, hp: &AdamParams, step: u64) -> Result<()>;
        fn sgd_update(param: &mut B::Buffer, grad: &B::Buffer, velocity: Option<&mut B::Buffer>, hp: &SgdParams) -> Result<()>;
    }
}

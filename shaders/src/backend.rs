//! `WgpuBackend`: core's `Backend` trait over the WGSL kernels, so a model written once in
//! core (the transformer and the dense network, forward, backward and optimizer steps)
//! runs on the GPU unchanged.
//!
//! Recording, not submitting: each primitive records its kernels into one pending command
//! encoder, and the work is submitted only when the host needs a value (`download`,
//! `synchronize`, a loss, a norm, the router's logits). Bind groups and their parameter
//! buffers are found again by (kernel, buffers) (see [`KeyedCache`]); host data a
//! primitive needs (token ids, targets, routing tables, `write`) goes through a pool of
//! staging buffers, each used once per submission so a queued write always lands before
//! the commands that read it; scratch (attention's scores and deltas, int8 activations,
//! per-row losses, partial sums) is kept per role and grown, never freed. A training or
//! decode step that has run once therefore creates no GPU object
//! ([`WgpuBackend::counters`] counts them).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use rusting_brain_core::backend::{
    AdamParams, AttentionSpec, CrossEntropySum, LoraSpec, MatmulSpec, Precision, RopeSpec, RoutedSpec,
    SgdParams,
};
use rusting_brain_core::error::{check_len, check_rows};
use rusting_brain_core::ops::optim::{check_adam, check_sgd, AdamConstants};
use rusting_brain_core::{Activation, Backend, CoreError, Loss, Result, RopeScaling};

use crate::ops::{embedding_groups, NOT_COUNTED};
use crate::{Batch, DenseOp, Gpu, GpuBuffer, GpuCounters, KeyedCache, ShaderError, SUM_OF_SQUARES_CHUNK};

/// The wgpu backend; cheap to clone (clones share the device and the pending work).
#[derive(Clone)]
pub struct WgpuBackend {
    gpu: Arc<Gpu>,
    rec: Arc<Mutex<Recorder>>,
}

impl std::fmt::Debug for WgpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuBackend").field("gpu", &self.gpu).finish()
    }
}

/// The pending work and what it reuses.
#[derive(Default)]
struct Recorder {
    encoder: Option<wgpu::CommandEncoder>,
    cache: KeyedCache,
    /// Staging buffers by size class (words, a power of two), and how many of each the
    /// pending submission has taken.
    staged: HashMap<usize, (Vec<GpuBuffer>, usize)>,
    /// Scratch by role.
    scratch: HashMap<&'static str, GpuBuffer>,
    /// RoPE cos/sin tables by (head_dim, theta bits, scaling).
    rope: HashMap<(usize, u32, ScalingKey), GpuBuffer>,
    /// Cross-entropy leaves its per-row losses on the device (see
    /// [`WgpuBackend::defer_losses`]).
    defer_losses: bool,
    /// The rows the last deferred cross-entropy counts.
    deferred: Option<Vec<bool>>,
}

/// The pools a primitive draws on while it records.
struct Pools<'a> {
    gpu: &'a Gpu,
    staged: &'a mut HashMap<usize, (Vec<GpuBuffer>, usize)>,
    scratch: &'a mut HashMap<&'static str, GpuBuffer>,
    rope: &'a mut HashMap<(usize, u32, ScalingKey), GpuBuffer>,
}

impl Pools<'_> {
    /// `words` on the device, ordered with the recorded work: a staging buffer of this
    /// submission's own, written through the queue (which lands before the submission).
    fn stage(&mut self, words: &[u32]) -> std::result::Result<GpuBuffer, ShaderError> {
        let class = words.len().max(64).next_power_of_two();
        let (list, used) = self.staged.entry(class).or_default();
        if *used == list.len() {
            list.push(self.gpu.zeros("staging", class)?);
        }
        let view = list[*used].prefix(words.len());
        *used += 1;
        self.gpu.write_u32(&view, 0, words)?;
        Ok(view)
    }

    fn stage_f32(&mut self, values: &[f32]) -> std::result::Result<GpuBuffer, ShaderError> {
        let words: Vec<u32> = values.iter().map(|v| v.to_bits()).collect();
        self.stage(&words)
    }

    /// A scratch buffer of at least `words` for `role`, grown to the next power of two.
    fn scratch(&mut self, role: &'static str, words: usize) -> std::result::Result<GpuBuffer, ShaderError> {
        let have = self.scratch.get(role).map_or(0, |b| b.len);
        if have < words.max(1) {
            // Doubling, but never past one binding when the request itself fits one.
            let grown = words.max(1).next_power_of_two();
            let cap = (self.gpu.max_binding() / 4) as usize;
            let size = if grown > cap && words <= cap { cap } else { grown };
            let b = self.gpu.zeros(role, size)?;
            self.scratch.insert(role, b);
        }
        Ok(self.scratch[role].prefix(words))
    }

    /// cos/sin for positions `0..positions` (see [`crate::rope_table`]), kept per head size
    /// and theta. Made for at least [`ROPE_POSITIONS`] positions, so decoding does not
    /// rebuild it as the sequence grows; past that it doubles.
    fn rope(
        &mut self,
        positions: usize,
        head_dim: usize,
        theta: f32,
        scaling: RopeScaling,
    ) -> std::result::Result<GpuBuffer, ShaderError> {
        let key = (head_dim, theta.to_bits(), scaling_key(scaling));
        let have = self.rope.get(&key).map_or(0, |b| b.len / head_dim.max(1));
        if have < positions {
            // Room to grow, but within one binding when the positions asked for fit one.
            let fit = (self.gpu.max_binding() / 4) as usize / head_dim.max(1);
            let n = positions
                .next_power_of_two()
                .max(ROPE_POSITIONS)
                .min(fit)
                .max(positions);
            let t = self
                .gpu
                .upload("rope table", &crate::rope_table(n, head_dim, theta, scaling))?;
            self.rope.insert(key, t);
        }
        Ok(self.rope[&key].clone())
    }
}

/// A RoPE scaling as a hashable key: the variant and its parameters' bits.
type ScalingKey = (u8, [u64; 4]);

fn scaling_key(s: RopeScaling) -> ScalingKey {
    match s {
        RopeScaling::None => (0, [0; 4]),
        RopeScaling::Linear { factor } => (1, [factor.to_bits().into(), 0, 0, 0]),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position,
        } => (
            2,
            [
                factor.to_bits().into(),
                low_freq_factor.to_bits().into(),
                high_freq_factor.to_bits().into(),
                original_max_position as u64,
            ],
        ),
    }
}

/// Positions a RoPE table is first made for (2 MiB at head size 128).
const ROPE_POSITIONS: usize = 4096;

fn device(e: ShaderError) -> CoreError {
    match e {
        ShaderError::Core(c) => c,
        other => CoreError::Device {
            backend: "wgpu",
            message: other.to_string(),
        },
    }
}

fn unsupported(op: &str) -> CoreError {
    CoreError::Device {
        backend: "wgpu",
        message: format!("{op} is not on the wgpu backend; use the CPU backend for it"),
    }
}

fn act_code(act: Activation) -> (u32, f32) {
    match act {
        Activation::Identity => (0, 0.0),
        Activation::Relu => (1, 0.0),
        Activation::LeakyRelu(a) => (2, a),
        Activation::Sigmoid => (3, 0.0),
        Activation::Tanh => (4, 0.0),
        Activation::Softmax => (5, 0.0),
    }
}

fn loss_code(loss: Loss) -> u32 {
    match loss {
        Loss::MeanSquaredError => 0,
        Loss::BinaryCrossEntropy => 1,
        Loss::CategoricalCrossEntropy => 2,
    }
}

/// The sum and count of the counted rows' losses; a non-finite one is an error.
fn sum_losses(losses: &[f32], counted: impl Fn(usize) -> bool) -> Result<CrossEntropySum> {
    let mut total = CrossEntropySum::default();
    for (r, &loss) in losses.iter().enumerate() {
        if !counted(r) {
            continue;
        }
        let loss = loss as f64;
        if !loss.is_finite() {
            return Err(CoreError::NonFinite {
                op: "cross_entropy",
                value: loss,
            });
        }
        total.loss_sum += loss;
        total.count += 1;
    }
    Ok(total)
}

fn rows_check(op: &'static str, rows: usize, cols: usize, bufs: &[(&'static str, usize)]) -> Result<usize> {
    check_rows(op, rows, cols, bufs)
}

impl WgpuBackend {
    /// A backend recording onto `gpu`'s device (shared: several backends may use one).
    pub fn new(gpu: Arc<Gpu>) -> WgpuBackend {
        WgpuBackend {
            gpu,
            rec: Arc::default(),
        }
    }
    /// The device this backend records onto.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Objects created, submissions and dispatches on this backend's device so far.
    pub fn counters(&self) -> GpuCounters {
        self.gpu.counters()
    }

    fn lock(&self) -> MutexGuard<'_, Recorder> {
        self.rec.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records kernels into the pending encoder.
    fn record<R>(
        &self,
        f: impl FnOnce(&mut Batch<'_>, &mut Pools<'_>) -> std::result::Result<R, ShaderError>,
    ) -> Result<R> {
        self.record_raw(f).map_err(device)
    }

    fn record_raw<R>(
        &self,
        f: impl FnOnce(&mut Batch<'_>, &mut Pools<'_>) -> std::result::Result<R, ShaderError>,
    ) -> std::result::Result<R, ShaderError> {
        let mut rec = self.lock();
        let Recorder {
            encoder,
            cache,
            staged,
            scratch,
            rope,
            ..
        } = &mut *rec;
        let pending = encoder
            .take()
            .unwrap_or_else(|| self.gpu.device.create_command_encoder(&Default::default()));
        let mut pools = Pools {
            gpu: &self.gpu,
            staged,
            scratch,
            rope,
        };
        let mut batch = self.gpu.batch_keyed(pending, cache);
        let r = f(&mut batch, &mut pools);
        *encoder = Some(batch.finish());
        r
    }

    /// Submits the pending work (a no-op with none) and frees the staging buffers for the
    /// next submission.
    pub fn flush(&self) -> Result<()> {
        let mut rec = self.lock();
        let r = match rec.encoder.take() {
            Some(e) => self.gpu.submit(e),
            None => self.gpu.check_errors(),
        };
        rec.cache.submitted();
        for (_, used) in rec.staged.values_mut() {
            *used = 0;
        }
        r.map_err(device)
    }

    /// Records kernels of the crate's own (the device draw) after the pending work, with
    /// the same bind-group cache.
    pub(crate) fn record_after<R>(
        &self,
        f: impl FnOnce(&mut Batch<'_>) -> std::result::Result<R, ShaderError>,
    ) -> std::result::Result<R, ShaderError> {
        self.record_raw(|b, _| f(b))
    }

    /// The pending work, handed over to be submitted with a read (see
    /// `Gpu::read_words_after`); the pools start a new submission, as after a flush.
    pub(crate) fn take_pending(&self) -> Option<wgpu::CommandEncoder> {
        let mut rec = self.lock();
        let e = rec.encoder.take();
        rec.cache.submitted();
        for (_, used) in rec.staged.values_mut() {
            *used = 0;
        }
        e
    }

    /// A scratch buffer's first `len` values, read after the pending work.
    fn read_scratch(&self, role: &'static str, len: usize) -> Result<Vec<f32>> {
        let buf = {
            let rec = self.lock();
            match rec.scratch.get(role) {
                Some(b) => b.prefix(len.min(b.len)),
                None => return Ok(Vec::new()),
            }
        };
        self.download(&buf)
    }

    /// [`Self::read_scratch`] without blocking: the pending work is submitted, the read
    /// awaited.
    async fn read_scratch_async(&self, role: &'static str, len: usize) -> Result<Vec<f32>> {
        let buf = {
            let rec = self.lock();
            match rec.scratch.get(role) {
                Some(b) => b.prefix(len.min(b.len)),
                None => return Ok(Vec::new()),
            }
        };
        self.flush()?;
        self.gpu.read(&buf).await.map_err(device)
    }

    /// From now on (`true`), `cross_entropy` leaves its per-row losses on the device and
    /// reports a loss sum of 0 with the right count; [`Self::deferred_loss`] reads them
    /// without blocking. What a browser needs to train: a page cannot block on a read, and
    /// core's training step asks for the loss in the middle of the pass.
    pub fn defer_losses(&self, on: bool) {
        let mut rec = self.lock();
        rec.defer_losses = on;
        rec.deferred = None;
    }

    /// The loss sum and count of the last deferred `cross_entropy`, read back without
    /// blocking; `None` when there is none pending. A non-finite loss is an error.
    pub async fn deferred_loss(&self) -> Result<Option<CrossEntropySum>> {
        let Some(counted) = self.lock().deferred.take() else {
            return Ok(None);
        };
        let losses = self
            .read_scratch_async("cross-entropy losses", counted.len())
            .await?;
        sum_losses(&losses, |r| counted[r]).map(Some)
    }

    /// `sum_of_squares_many` without blocking: the same kernels, the read awaited.
    pub async fn sum_of_squares_many_async(&self, xs: &[&GpuBuffer]) -> Result<f64> {
        let total = self.record_sum_of_squares(xs)?;
        if total == 0 {
            return Ok(0.0);
        }
        let partials = self.read_scratch_async("sum of squares", total).await?;
        Ok(partials.iter().map(|&v| v as f64).sum())
    }

    /// Records the partial sums of squares of `xs` (chunks of 4,096 values, in f32) into the
    /// "sum of squares" scratch; returns how many partials there are.
    fn record_sum_of_squares(&self, xs: &[&GpuBuffer]) -> Result<usize> {
        let total: usize = xs.iter().map(|x| x.len().div_ceil(SUM_OF_SQUARES_CHUNK)).sum();
        if total == 0 {
            return Ok(0);
        }
        self.record(|b, pools| {
            let partials = pools.scratch("sum of squares", total)?;
            let mut at = 0;
            for x in xs {
                at += b.sum_of_squares(&partials, at, x, x.len())?;
            }
            Ok(())
        })?;
        Ok(total)
    }

    fn dense(
        &self,
        op: DenseOp,
        x: [Option<&GpuBuffer>; 3],
        y: &GpuBuffer,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        self.record(|b, _| b.dense(op, x, y, rows, cols))
    }

    fn rope(&self, x: &mut GpuBuffer, spec: &RopeSpec, inverse: bool) -> Result<()> {
        spec.check(if inverse { "rope_backward" } else { "rope_forward" }, x.len())?;
        self.record(|b, pools| {
            let table = pools.rope(
                spec.pos_offset + spec.seq,
                spec.head_dim,
                spec.theta,
                spec.scaling,
            )?;
            b.rope(x, &table, spec, inverse)
        })
    }
}

impl Backend for WgpuBackend {
    type Buffer = GpuBuffer;

    fn name(&self) -> &'static str {
        "wgpu"
    }

    fn zeros(&self, len: usize) -> Result<GpuBuffer> {
        self.gpu.zeros("buffer", len).map_err(device)
    }
    fn upload(&self, data: &[f32]) -> Result<GpuBuffer> {
        self.gpu.upload("buffer", data).map_err(device)
    }
    fn synchronize(&self) -> Result<()> {
        self.flush()?;
        #[cfg(not(target_arch = "wasm32"))]
        self.gpu
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| device(ShaderError::Readback(e.to_string())))?;
        self.gpu.check_errors().map_err(device)
    }
    fn download(&self, buf: &GpuBuffer) -> Result<Vec<f32>> {
        self.flush()?;
        #[cfg(not(target_arch = "wasm32"))]
        {
            self.gpu.read_blocking(buf).map_err(device)
        }
        // The browser must never block: a page reads buffers with the async `Gpu::read`.
        #[cfg(target_arch = "wasm32")]
        {
            let _ = buf;
            Err(CoreError::Device {
                backend: "wgpu",
                message: "a blocking read-back is not possible in the browser; use Gpu::read".into(),
            })
        }
    }
    fn write(&self, dst: &mut GpuBuffer, data: &[f32]) -> Result<()> {
        check_len("write", "data", data.len(), dst.len())?;
        // Through a staging buffer and a recorded copy, so the write lands after the work
        // recorded before it and before the work recorded after it.
        self.record(|b, pools| {
            let staged = pools.stage_f32(data)?;
            b.copy(dst, 0, &staged, 0, data.len())
        })
    }
    fn len(&self, buf: &GpuBuffer) -> usize {
        buf.len()
    }
    fn fill(&self, buf: &mut GpuBuffer, value: f32) -> Result<()> {
        let n = buf.len();
        self.dense(DenseOp::Fill(value), [None; 3], buf, 1, n)
    }
    fn copy(&self, dst: &mut GpuBuffer, src: &GpuBuffer) -> Result<()> {
        check_len("copy", "src", src.len(), dst.len())?;
        let n = dst.len();
        self.record(|b, _| b.copy(dst, 0, src, 0, n))
    }
    fn copy_range(
        &self,
        dst: &mut GpuBuffer,
        dst_offset: usize,
        src: &GpuBuffer,
        src_offset: usize,
        len: usize,
    ) -> Result<()> {
        self.record(|b, _| b.copy(dst, dst_offset, src, src_offset, len))
    }

    fn axpy(&self, y: &mut GpuBuffer, alpha: f32, x: &GpuBuffer) -> Result<()> {
        check_len("axpy", "x", x.len(), y.len())?;
        let n = y.len();
        self.dense(DenseOp::Axpy(alpha), [Some(x), None, None], y, 1, n)
    }
    fn scale(&self, x: &mut GpuBuffer, alpha: f32) -> Result<()> {
        let n = x.len();
        self.dense(DenseOp::Scale(alpha), [None; 3], x, 1, n)
    }
    fn sum_of_squares(&self, x: &GpuBuffer) -> Result<f64> {
        self.sum_of_squares_many(&[x])
    }
    fn sum_of_squares_many(&self, xs: &[&GpuBuffer]) -> Result<f64> {
        // Partial sums in f32 over chunks of 4,096 values on the device, added in f64 here:
        // one read-back for every tensor of a global gradient norm.
        let total = self.record_sum_of_squares(xs)?;
        if total == 0 {
            return Ok(0.0);
        }
        let partials = self.read_scratch("sum of squares", total)?;
        Ok(partials.iter().map(|&v| v as f64).sum())
    }

    fn matmul(&self, c: &mut GpuBuffer, a: &GpuBuffer, b: &GpuBuffer, spec: &MatmulSpec) -> Result<()> {
        spec.check("matmul", a.len(), b.len(), c.len())?;
        let at = spec.window.map_or((0, 0, 0), |w| (w.a, w.b, w.c));
        if spec.k == 0 {
            // No products: C = beta * C, as the reference.
            let n = spec.batch * spec.m * spec.n;
            if at.2 == 0 && n == c.len() {
                return if spec.beta == 0.0 {
                    self.fill(c, 0.0)
                } else {
                    self.scale(c, spec.beta)
                };
            }
        }
        self.record(|g, _| {
            g.matmul(
                c,
                a,
                b,
                (spec.m, spec.n, spec.k, spec.batch),
                (spec.trans_a, spec.trans_b),
                (spec.alpha, spec.beta),
                at,
                spec.precision == Precision::Bf16,
            )
        })
    }
    fn add_bias(&self, out: &mut GpuBuffer, bias: &GpuBuffer, rows: usize, cols: usize) -> Result<()> {
        rows_check("add_bias", rows, cols, &[("out", out.len())])?;
        check_len("add_bias", "bias", bias.len(), cols)?;
        self.dense(DenseOp::AddBias, [Some(bias), None, None], out, rows, cols)
    }
    fn bias_backward(&self, dbias: &mut GpuBuffer, dout: &GpuBuffer, rows: usize, cols: usize) -> Result<()> {
        rows_check("bias_backward", rows, cols, &[("dout", dout.len())])?;
        check_len("bias_backward", "dbias", dbias.len(), cols)?;
        self.dense(DenseOp::BiasBackward, [Some(dout), None, None], dbias, rows, cols)
    }
    fn activation_forward(
        &self,
        act: Activation,
        out: &mut GpuBuffer,
        inp: &GpuBuffer,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        rows_check(
            "activation_forward",
            rows,
            cols,
            &[("inp", inp.len()), ("out", out.len())],
        )?;
        let (code, slope) = act_code(act);
        self.dense(
            DenseOp::ActivationForward(code, slope),
            [Some(inp), None, None],
            out,
            rows,
            cols,
        )
    }
    fn activation_backward(
        &self,
        act: Activation,
        dinp: &mut GpuBuffer,
        dout: &GpuBuffer,
        inp: &GpuBuffer,
        out: &GpuBuffer,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        rows_check(
            "activation_backward",
            rows,
            cols,
            &[
                ("dinp", dinp.len()),
                ("dout", dout.len()),
                ("inp", inp.len()),
                ("out", out.len()),
            ],
        )?;
        let (code, slope) = act_code(act);
        self.dense(
            DenseOp::ActivationBackward(code, slope),
            [Some(dout), Some(inp), Some(out)],
            dinp,
            rows,
            cols,
        )
    }
    fn loss_forward(
        &self,
        loss: Loss,
        pred: &GpuBuffer,
        target: &GpuBuffer,
        rows: usize,
        cols: usize,
    ) -> Result<f64> {
        // A scalar for the progress report: computed by the reference on the read-back
        // values, so it means exactly what it means on the CPU.
        rusting_brain_core::ops::loss::loss_forward(
            loss,
            &self.download(pred)?,
            &self.download(target)?,
            rows,
            cols,
        )
    }
    fn loss_backward(
        &self,
        loss: Loss,
        dpred: &mut GpuBuffer,
        pred: &GpuBuffer,
        target: &GpuBuffer,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        rows_check(
            "loss_backward",
            rows,
            cols,
            &[
                ("dpred", dpred.len()),
                ("pred", pred.len()),
                ("target", target.len()),
            ],
        )?;
        if rows == 0 {
            return Ok(());
        }
        let inv = 1.0 / loss.divisor(rows, cols) as f32;
        self.dense(
            DenseOp::LossBackward(loss_code(loss), inv),
            [Some(pred), Some(target), None],
            dpred,
            rows,
            cols,
        )
    }
    fn fused_output_backward(
        &self,
        loss: Loss,
        dlogits: &mut GpuBuffer,
        pred: &GpuBuffer,
        target: &GpuBuffer,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        rows_check(
            "fused_output_backward",
            rows,
            cols,
            &[
                ("dlogits", dlogits.len()),
                ("pred", pred.len()),
                ("target", target.len()),
            ],
        )?;
        if rows == 0 {
            return Ok(());
        }
        let inv = 1.0 / loss.divisor(rows, cols) as f32;
        self.dense(
            DenseOp::FusedOutputBackward(inv),
            [Some(pred), Some(target), None],
            dlogits,
            rows,
            cols,
        )
    }

    fn rmsnorm_forward(
        &self,
        out: &mut GpuBuffer,
        rstd: &mut GpuBuffer,
        inp: &GpuBuffer,
        weight: &GpuBuffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        rusting_brain_core::ops::rmsnorm::check_rmsnorm_forward(
            out.len(),
            rstd.len(),
            inp.len(),
            weight.len(),
            rows,
            dim,
        )?;
        self.record(|b, _| b.rmsnorm(out, rstd, inp, weight, rows, dim, eps))
    }
    fn rmsnorm_backward(
        &self,
        dinp: &mut GpuBuffer,
        dweight: &mut GpuBuffer,
        dout: &GpuBuffer,
        inp: &GpuBuffer,
        weight: &GpuBuffer,
        rstd: &GpuBuffer,
        rows: usize,
        dim: usize,
    ) -> Result<()> {
        rusting_brain_core::ops::rmsnorm::check_rmsnorm_backward(
            dinp.len(),
            dweight.len(),
            dout.len(),
            inp.len(),
            weight.len(),
            rstd.len(),
            rows,
            dim,
        )?;
        self.record(|b, _| b.rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, rows, dim))
    }
    fn rope_forward(&self, x: &mut GpuBuffer, spec: &RopeSpec) -> Result<()> {
        self.rope(x, spec, false)
    }
    fn rope_backward(&self, dx: &mut GpuBuffer, spec: &RopeSpec) -> Result<()> {
        self.rope(dx, spec, true)
    }
    fn softmax_forward(&self, out: &mut GpuBuffer, inp: &GpuBuffer, rows: usize, cols: usize) -> Result<()> {
        self.activation_forward(Activation::Softmax, out, inp, rows, cols)
    }
    fn softmax_backward(
        &self,
        dinp: &mut GpuBuffer,
        dout: &GpuBuffer,
        out: &GpuBuffer,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        rows_check(
            "softmax_backward",
            rows,
            cols,
            &[("dinp", dinp.len()), ("dout", dout.len()), ("out", out.len())],
        )?;
        self.dense(
            DenseOp::ActivationBackward(5, 0.0),
            [Some(dout), Some(out), Some(out)],
            dinp,
            rows,
            cols,
        )
    }
    fn swiglu_forward(&self, out: &mut GpuBuffer, gate: &GpuBuffer, up: &GpuBuffer) -> Result<()> {
        rusting_brain_core::ops::swiglu::check_swiglu_forward(out.len(), gate.len(), up.len())?;
        let n = out.len();
        self.record(|b, _| b.swiglu(out, gate, up, n))
    }
    fn swiglu_backward(
        &self,
        dgate: &mut GpuBuffer,
        dup: &mut GpuBuffer,
        dout: &GpuBuffer,
        gate: &GpuBuffer,
        up: &GpuBuffer,
    ) -> Result<()> {
        rusting_brain_core::ops::swiglu::check_swiglu_backward(
            dgate.len(),
            dup.len(),
            dout.len(),
            gate.len(),
            up.len(),
        )?;
        let n = gate.len();
        self.record(|b, _| b.swiglu_backward(dgate, dup, dout, gate, up, n))
    }
    fn attention_forward(
        &self,
        out: &mut GpuBuffer,
        lse: &mut GpuBuffer,
        q: &GpuBuffer,
        k: &GpuBuffer,
        v: &GpuBuffer,
        spec: &AttentionSpec,
    ) -> Result<()> {
        let (_, _, nl) = spec.check("attention_forward")?;
        spec.check_forward(out.len(), lse.len(), q.len(), k.len(), v.len())?;
        self.record(|b, pools| {
            let scratch = pools.scratch("attention scores", nl * spec.kv_capacity)?;
            b.attention(out, lse, q, k, v, &scratch, spec)
        })
    }
    fn attention_backward(
        &self,
        dq: &mut GpuBuffer,
        dk: &mut GpuBuffer,
        dv: &mut GpuBuffer,
        dout: &GpuBuffer,
        q: &GpuBuffer,
        k: &GpuBuffer,
        v: &GpuBuffer,
        out: &GpuBuffer,
        lse: &GpuBuffer,
        spec: &AttentionSpec,
    ) -> Result<()> {
        spec.check_backward([
            dq.len(),
            dk.len(),
            dv.len(),
            dout.len(),
            q.len(),
            k.len(),
            v.len(),
            out.len(),
            lse.len(),
        ])?;
        let (_, _, nl) = spec.check("attention_backward")?;
        self.record(|b, pools| {
            let delta = pools.scratch("attention delta", nl)?;
            b.attention_backward([dq, dk, dv], dout, [q, k, v, out, lse], &delta, spec)
        })
    }
    fn embedding_forward(
        &self,
        out: &mut GpuBuffer,
        table: &GpuBuffer,
        ids: &[u32],
        vocab: usize,
        dim: usize,
    ) -> Result<()> {
        rusting_brain_core::ops::embedding::check_embedding(
            "embedding_forward",
            ["table", "out"],
            table.len(),
            out.len(),
            ids,
            vocab,
            dim,
        )?;
        self.record(|b, pools| {
            let ids_buf = pools.stage(ids)?;
            b.embedding(out, &ids_buf, table, ids.len(), dim)
        })
    }
    fn embedding_backward(
        &self,
        dtable: &mut GpuBuffer,
        dout: &GpuBuffer,
        ids: &[u32],
        vocab: usize,
        dim: usize,
    ) -> Result<()> {
        rusting_brain_core::ops::embedding::check_embedding(
            "embedding_backward",
            ["dtable", "dout"],
            dtable.len(),
            dout.len(),
            ids,
            vocab,
            dim,
        )?;
        let (groups, n_ids) = embedding_groups(ids, vocab);
        self.record(|b, pools| {
            let groups = pools.stage(&groups)?;
            b.embedding_backward(dtable, &groups, n_ids, dout, dim)
        })
    }
    fn cross_entropy(
        &self,
        logits: &mut GpuBuffer,
        targets: &[u32],
        mask: Option<&[bool]>,
        rows: usize,
        vocab: usize,
        grad_scale: Option<f32>,
    ) -> Result<CrossEntropySum> {
        rusting_brain_core::ops::cross_entropy::check_cross_entropy(
            logits.len(),
            targets,
            mask,
            rows,
            vocab,
        )?;
        let counted = |r: usize| mask.is_none_or(|m| m[r]);
        let words: Vec<u32> = (0..rows)
            .map(|r| if counted(r) { targets[r] } else { NOT_COUNTED })
            .collect();
        self.record(|b, pools| {
            let targets = pools.stage(&words)?;
            let loss = pools.scratch("cross-entropy losses", rows)?;
            b.cross_entropy(logits, &targets, &loss, (rows, vocab), grad_scale)
        })?;
        {
            let mut rec = self.lock();
            if rec.defer_losses {
                let flags: Vec<bool> = (0..rows).map(counted).collect();
                let count = flags.iter().filter(|&&c| c).count();
                rec.deferred = Some(flags);
                return Ok(CrossEntropySum { loss_sum: 0.0, count });
            }
        }
        let losses = self.read_scratch("cross-entropy losses", rows)?;
        sum_losses(&losses, counted)
    }
    fn moe_combine(
        &self,
        out: &mut GpuBuffer,
        y: &GpuBuffer,
        row_of_slot: &[u32],
        weight: &[f32],
        top_k: usize,
        dim: usize,
    ) -> Result<()> {
        let n = rusting_brain_core::ops::moe::check_combine(
            "moe_combine",
            out.len(),
            y.len(),
            row_of_slot,
            weight,
            top_k,
            dim,
        )?;
        self.record(|b, pools| {
            let rows = pools.stage(row_of_slot)?;
            let w = pools.stage_f32(weight)?;
            b.moe_combine(out, &rows, &w, y, n, dim, top_k)
        })
    }
    fn moe_combine_backward(
        &self,
        dy: &mut GpuBuffer,
        dout: &GpuBuffer,
        y: &GpuBuffer,
        row_of_slot: &[u32],
        weight: &[f32],
        top_k: usize,
        dim: usize,
    ) -> Result<Vec<f32>> {
        const OP: &str = "moe_combine_backward";
        let n = rusting_brain_core::ops::moe::check_combine(
            OP,
            dout.len(),
            y.len(),
            row_of_slot,
            weight,
            top_k,
            dim,
        )?;
        check_len(OP, "dy", dy.len(), y.len())?;
        let slots = row_of_slot.len();
        self.record(|b, pools| {
            let rows = pools.stage(row_of_slot)?;
            let w = pools.stage_f32(weight)?;
            let dweight = pools.scratch("moe weight gradients", slots)?;
            b.moe_combine_backward(dy, &dweight, &rows, &w, dout, y, (n, dim, top_k))
        })?;
        self.read_scratch("moe weight gradients", slots)
    }
    fn max_binding_len(&self) -> usize {
        usize::try_from(self.gpu.max_binding() / 4).unwrap_or(usize::MAX)
    }
    fn routes_on_device(&self) -> bool {
        // In a page nothing may wait for a read, and natively the read-back of the
        // router's logits would cost a submission per sparse block.
        true
    }
    fn moe_route(
        &self,
        expert: &mut GpuBuffer,
        weight: &mut GpuBuffer,
        logits: &GpuBuffer,
        n: usize,
        n_experts: usize,
        top_k: usize,
        renormalize: bool,
    ) -> Result<()> {
        const OP: &str = "moe_route";
        check_len(OP, "logits", logits.len(), n * n_experts)?;
        check_len(OP, "expert", expert.len(), n * top_k)?;
        check_len(OP, "weight", weight.len(), n * top_k)?;
        self.record(|b, _| b.moe_route(expert, weight, logits, n, n_experts, top_k, renormalize))
    }
    fn q8_matmul_routed(
        &self,
        out: &mut GpuBuffer,
        x: &GpuBuffer,
        experts: &[(&GpuBuffer, &GpuBuffer)],
        expert: &GpuBuffer,
        spec: &RoutedSpec,
    ) -> Result<()> {
        let lens: Vec<(usize, usize)> = experts.iter().map(|(p, s)| (p.len(), s.len())).collect();
        spec.check(out.len(), x.len(), expert.len(), &lens)?;
        let (rows, k) = (spec.x_rows(), spec.k);
        let pc = rusting_brain_core::ops::q8::packed_cols(k);
        self.record(|b, pools| {
            // The activations are rounded once; each expert's dispatch fills its slots.
            let xq = pools.scratch("int8 activations", rows * pc)?;
            let xs = pools.scratch("int8 activation scales", rows)?;
            b.quantize_activations(&xq, &xs, x, rows, k)?;
            for (e, (w, ws)) in experts.iter().enumerate() {
                b.q8_expert(
                    out,
                    &xq,
                    &xs,
                    w,
                    ws,
                    expert,
                    (spec.slots, spec.n, k, spec.top_k),
                    spec.x_per_token,
                    e,
                )?;
            }
            Ok(())
        })
    }
    fn moe_combine_slots(
        &self,
        out: &mut GpuBuffer,
        y: &GpuBuffer,
        weight: &GpuBuffer,
        top_k: usize,
        dim: usize,
    ) -> Result<()> {
        const OP: &str = "moe_combine_slots";
        if top_k == 0 || dim == 0 || !weight.len().is_multiple_of(top_k) {
            return Err(CoreError::InvalidDimension {
                op: OP,
                message: format!("{} weights for top_k {top_k}, dim {dim}", weight.len()),
            });
        }
        let n = weight.len() / top_k;
        check_len(OP, "out", out.len(), n * dim)?;
        check_len(OP, "y", y.len(), n * top_k * dim)?;
        let identity: Vec<u32> = (0..weight.len() as u32).collect();
        self.record(|b, pools| {
            let rows = pools.stage(&identity)?;
            b.moe_combine(out, &rows, weight, y, n, dim, top_k)
        })
    }
    fn lora_forward(
        &self,
        y: &mut GpuBuffer,
        t: &mut GpuBuffer,
        x: &GpuBuffer,
        a: &GpuBuffer,
        b: &GpuBuffer,
        s: &LoraSpec,
    ) -> Result<()> {
        s.check("lora_forward", x.len(), y.len(), t.len(), a.len(), b.len())?;
        // One pass for f32 adapters of the usual ranks (a decode step's one dispatch per
        // projection instead of two); bf16 operands and larger ranks take the two GEMMs.
        if s.rank > crate::ops::LORA_MAX_RANK || s.precision != Precision::F32 {
            return rusting_brain_core::backend::lora_forward_by_gemm(self, y, t, x, a, b, s);
        }
        self.record(|batch, _| batch.lora_forward(y, t, x, a, b, s))
    }
    fn q8_matmul(
        &self,
        out: &mut GpuBuffer,
        x: &GpuBuffer,
        packed: &GpuBuffer,
        scales: &GpuBuffer,
        spec: &MatmulSpec,
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
        rusting_brain_core::ops::q8::check_q8_matmul(lo, lx, packed.len(), scales.len(), m, n, k)?;
        let pc = rusting_brain_core::ops::q8::packed_cols(k);
        self.record(|b, pools| {
            let xq = pools.scratch("int8 activations", m * pc)?;
            let xs = pools.scratch("int8 activation scales", m)?;
            if xa == 0 {
                b.quantize_activations(&xq, &xs, x, m, k)?;
            } else {
                let xin = pools.scratch("int8 window input", lx)?;
                b.copy(&xin, 0, x, xa, lx)?;
                b.quantize_activations(&xq, &xs, &xin, m, k)?;
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
        &self,
        out: &mut GpuBuffer,
        packed: &GpuBuffer,
        scales: &GpuBuffer,
        ids: &[u32],
        vocab: usize,
        dim: usize,
    ) -> Result<()> {
        rusting_brain_core::ops::embedding::check_ids("q8_embedding", ids, vocab)?;
        self.record(|b, pools| {
            let gids = pools.stage(ids)?;
            b.q8_embedding(out, &gids, packed, scales, ids.len(), vocab, dim)
        })
    }

    fn adam_update(
        &self,
        param: &mut GpuBuffer,
        grad: &GpuBuffer,
        m: &mut GpuBuffer,
        v: &mut GpuBuffer,
        hp: &AdamParams,
        step: u64,
    ) -> Result<()> {
        check_adam(param.len(), grad.len(), m.len(), v.len(), hp, step)?;
        let c = AdamConstants::<f32>::new(hp, step);
        let words = [
            0,
            u32::try_from(param.len()).map_err(|_| unsupported("a parameter over 2^32 values"))?,
            c.decoupled as u32,
            0,
            c.lr.to_bits(),
            c.beta1.to_bits(),
            c.beta2.to_bits(),
            c.one_minus_beta1.to_bits(),
            c.one_minus_beta2.to_bits(),
            c.eps.to_bits(),
            c.weight_decay.to_bits(),
            c.grad_scale.to_bits(),
            c.step_size.to_bits(),
            c.bias_correction2_sqrt.to_bits(),
            0,
            0,
        ];
        self.record(|b, _| b.optim(&words, param, grad, Some(m), Some(v)))
    }
    fn sgd_update(
        &self,
        param: &mut GpuBuffer,
        grad: &GpuBuffer,
        velocity: Option<&mut GpuBuffer>,
        hp: &SgdParams,
    ) -> Result<()> {
        check_sgd(param.len(), grad.len(), velocity.as_ref().map(|v| v.len()), hp)?;
        let momentum = if velocity.is_some() { hp.momentum } else { 0.0 };
        let words = [
            1,
            u32::try_from(param.len()).map_err(|_| unsupported("a parameter over 2^32 values"))?,
            0,
            hp.nesterov as u32,
            hp.lr.to_bits(),
            0,
            0,
            0,
            0,
            0,
            hp.weight_decay.to_bits(),
            hp.grad_scale.to_bits(),
            0,
            0,
            momentum.to_bits(),
            0,
        ];
        let vel = velocity.map(|v| &*v);
        self.record(|b, _| b.optim(&words, param, grad, vel, None))
    }
}

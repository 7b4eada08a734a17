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

use rusting_brain_core::backend::{CrossEntropySum, RopeSpec};
use rusting_brain_core::{CoreError, Result, RopeScaling};

use crate::{Batch, DenseOp, Gpu, GpuBuffer, GpuCounters, KeyedCache, ShaderError, SUM_OF_SQUARES_CHUNK};
use rusting_brain_core::backend::ConvOps;
use rusting_brain_core::backend::Memory;
use rusting_brain_core::backend::ModulationOps;
use rusting_brain_core::backend::NormOps;
use rusting_brain_core::backend::SdpaOps;
use rusting_brain_core::backend::SpatialOps;
use rusting_brain_core::backend::UnaryOps;

/// The wgpu backend; cheap to clone (clones share the device and the pending work).
#[derive(Clone)]
pub struct WgpuBackend {
    pub(crate) gpu: Arc<Gpu>,
    rec: Arc<Mutex<Recorder>>,
}

impl std::fmt::Debug for WgpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuBackend").field("gpu", &self.gpu).finish()
    }
}

/// The pending work and what it reuses.
#[derive(Default)]
pub(crate) struct Recorder {
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
    pub(crate) defer_losses: bool,
    /// The rows the last deferred cross-entropy counts.
    pub(crate) deferred: Option<Vec<bool>>,
}

/// The pools a primitive draws on while it records.
pub(crate) struct Pools<'a> {
    gpu: &'a Gpu,
    staged: &'a mut HashMap<usize, (Vec<GpuBuffer>, usize)>,
    scratch: &'a mut HashMap<&'static str, GpuBuffer>,
    rope: &'a mut HashMap<(usize, u32, ScalingKey), GpuBuffer>,
}

impl Pools<'_> {
    /// `words` on the device, ordered with the recorded work: a staging buffer of this
    /// submission's own, written through the queue (which lands before the submission).
    pub(crate) fn stage(&mut self, words: &[u32]) -> std::result::Result<GpuBuffer, ShaderError> {
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

    pub(crate) fn stage_f32(&mut self, values: &[f32]) -> std::result::Result<GpuBuffer, ShaderError> {
        let words: Vec<u32> = values.iter().map(|v| v.to_bits()).collect();
        self.stage(&words)
    }

    /// A scratch buffer of at least `words` for `role`, grown to the next power of two.
    pub(crate) fn scratch(
        &mut self, role: &'static str, words: usize,
    ) -> std::result::Result<GpuBuffer, ShaderError> {
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
    pub(crate) fn rope(
        &mut self, positions: usize, head_dim: usize, theta: f32, scaling: RopeScaling,
    ) -> std::result::Result<GpuBuffer, ShaderError> {
        let key = (head_dim, theta.to_bits(), scaling_key(scaling));
        let have = self.rope.get(&key).map_or(0, |b| b.len / head_dim.max(1));
        if have < positions {
            // Room to grow, but within one binding when the positions asked for fit one.
            let fit = (self.gpu.max_binding() / 4) as usize / head_dim.max(1);
            let n = positions.next_power_of_two().max(ROPE_POSITIONS).min(fit).max(positions);
            let t = self.gpu.upload("rope table", &crate::rope_table(n, head_dim, theta, scaling))?;
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
        RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position } => (
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

pub(crate) fn device(e: ShaderError) -> CoreError {
    match e {
        ShaderError::Core(c) => c,
        other => CoreError::Device { backend: "wgpu", message: other.to_string() },
    }
}

pub(crate) fn unsupported(op: &str) -> CoreError {
    CoreError::Device {
        backend: "wgpu",
        message: format!("{op} is not on the wgpu backend; use the CPU backend for it"),
    }
}

/// The sum and count of the counted rows' losses; a non-finite one is an error.
pub(crate) fn sum_losses(losses: &[f32], counted: impl Fn(usize) -> bool) -> Result<CrossEntropySum> {
    let mut total = CrossEntropySum::default();
    for (r, &loss) in losses.iter().enumerate() {
        if !counted(r) {
            continue;
        }
        let loss = loss as f64;
        if !loss.is_finite() {
            return Err(CoreError::NonFinite { op: "cross_entropy", value: loss });
        }
        total.loss_sum += loss;
        total.count += 1;
    }
    Ok(total)
}

impl WgpuBackend {
    /// A backend recording onto `gpu`'s device (shared: several backends may use one).
    pub fn new(gpu: Arc<Gpu>) -> WgpuBackend {
        WgpuBackend { gpu, rec: Arc::default() }
    }
    /// The device this backend records onto.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Objects created, submissions and dispatches on this backend's device so far.
    pub fn counters(&self) -> GpuCounters {
        self.gpu.counters()
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Recorder> {
        self.rec.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records kernels into the pending encoder.
    pub(crate) fn record<R>(
        &self, f: impl FnOnce(&mut Batch<'_>, &mut Pools<'_>) -> std::result::Result<R, ShaderError>,
    ) -> Result<R> {
        self.record_raw(f).map_err(device)
    }

    pub(crate) fn record_raw<R>(
        &self, f: impl FnOnce(&mut Batch<'_>, &mut Pools<'_>) -> std::result::Result<R, ShaderError>,
    ) -> std::result::Result<R, ShaderError> {
        let mut rec = self.lock();
        let Recorder { encoder, cache, staged, scratch, rope, .. } = &mut *rec;
        let pending =
            encoder.take().unwrap_or_else(|| self.gpu.device.create_command_encoder(&Default::default()));
        let mut pools = Pools { gpu: &self.gpu, staged, scratch, rope };
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
        &self, f: impl FnOnce(&mut Batch<'_>) -> std::result::Result<R, ShaderError>,
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
    pub(crate) fn read_scratch(&self, role: &'static str, len: usize) -> Result<Vec<f32>> {
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
        let losses = self.read_scratch_async("cross-entropy losses", counted.len()).await?;
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
    pub(crate) fn record_sum_of_squares(&self, xs: &[&GpuBuffer]) -> Result<usize> {
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

    pub(crate) fn dense(
        &self, op: DenseOp, x: [Option<&GpuBuffer>; 3], y: &GpuBuffer, rows: usize, cols: usize,
    ) -> Result<()> {
        self.record(|b, _| b.dense(op, x, y, rows, cols))
    }

    pub(crate) fn rope(&self, x: &mut GpuBuffer, spec: &RopeSpec, inverse: bool) -> Result<()> {
        spec.check(if inverse { "rope_backward" } else { "rope_forward" }, x.len())?;
        self.record(|b, pools| {
            let table = pools.rope(spec.pos_offset + spec.seq, spec.head_dim, spec.theta, spec.scaling)?;
            b.rope(x, &table, spec, inverse)
        })
    }
}

// Families this backend runs through their default methods (on the host, or through
// the backend's other primitives).
impl ConvOps for WgpuBackend {}
impl NormOps for WgpuBackend {}
impl UnaryOps for WgpuBackend {}
impl SdpaOps for WgpuBackend {}
impl SpatialOps for WgpuBackend {}
impl ModulationOps for WgpuBackend {}

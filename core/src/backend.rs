//! The `Backend` trait: the primitives every model is written against.
//!
//! A backend owns its buffers (`Backend::Buffer`: a `Vec<f32>` on the CPU, a device
//! allocation on a GPU) and runs the primitives of [`crate::ops`] on them. Semantics are
//! exactly those of the reference functions of the same name (shapes, which outputs are
//! overwritten and which accumulate, errors); [`crate::ReferenceBackend`] is the definition
//! and every backend is tested against it.
//!
//! Dispatch: model code is generic over `B: Backend` internally, so each backend's kernels
//! are called statically; the user-facing model types hold an enum of per-backend states
//! and pick the arm at run time, which is how a built model moves to a device without a
//! type parameter. The trait is also object-safe for a fixed buffer type
//! (`&dyn Backend<Buffer = Vec<f32>>`), which the tests use to run one sweep over several
//! host backends.
//!
//! Token ids, targets and masks are host slices: they are small, and a device backend
//! uploads them itself.

use alloc::vec::Vec;

pub use crate::ops::attention::AttentionSpec;
pub use crate::ops::conv::Conv2dSpec;
pub use crate::ops::cross_entropy::CrossEntropySum;
pub use crate::ops::lora::LoraSpec;
pub use crate::ops::matmul::{MatmulSpec, Precision};
pub use crate::ops::modulation::{ColumnCopy, ModulationSpec, RopePairsSpec};
pub use crate::ops::moe::RoutedSpec;
pub use crate::ops::norm::GroupNormSpec;
pub use crate::ops::optim::{AdamParams, SgdParams};
pub use crate::ops::rope::RopeSpec;
pub use crate::ops::sdpa::SdpaSpec;
pub use crate::ops::spatial::PatchSpec;
pub use crate::ops::unary::Unary;
use crate::{Activation, Loss, Result};

/// One product of [`Backend::q8_matmul_many`]: its output, its int8 weight (packed
/// values and row scales) and its spec.
pub struct Q8Product<'a, T> {
    /// `(m, n)`, or the spec's window of it.
    pub out: &'a mut T,
    /// The int8 weight `(n, k)`, four values a slot.
    pub packed: &'a T,
    /// One scale per weight row.
    pub scales: &'a T,
    /// `m, n, k`, beta and window, as for [`Backend::q8_matmul`].
    pub spec: MatmulSpec,
}

/// Where buffers live and the primitives run: core's model definitions call these methods, and each backend (the reference, the CPU's kernels, wgpu, CUDA, the portable wasm one) implements them, checked against the reference in the shared sweep.
pub trait Backend {
    /// A contiguous f32 buffer living wherever this backend computes.
    type Buffer;

    /// A short name for messages ("reference", "cpu", "cuda", "wgpu").
    fn name(&self) -> &'static str;

    /// Waits until every queued operation has finished, reporting a failure of any of them.
    /// Host backends finish each call before returning; a device backend that queues work
    /// overrides this (timing wrappers fence each primitive with it).
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    // ----- memory -----
    /// A new buffer of `len` zeros.
    fn zeros(&self, len: usize) -> Result<Self::Buffer>;
    /// A new buffer holding `data`.
    fn upload(&self, data: &[f32]) -> Result<Self::Buffer>;
    /// The buffer's contents on the host.
    fn download(&self, buf: &Self::Buffer) -> Result<Vec<f32>>;
    /// Overwrites `dst` with `data` (same length).
    fn write(&self, dst: &mut Self::Buffer, data: &[f32]) -> Result<()>;
    /// Number of f32 elements.
    fn len(&self, buf: &Self::Buffer) -> usize;
    /// Sets every element to `value`.
    fn fill(&self, buf: &mut Self::Buffer, value: f32) -> Result<()>;
    /// dst = src (same length).
    fn copy(&self, dst: &mut Self::Buffer, src: &Self::Buffer) -> Result<()>;
    /// `dst[dst_offset..][..len] = src[src_offset..][..len]` (KV-cache appends, row picks).
    fn copy_range(
        &self,
        dst: &mut Self::Buffer,
        dst_offset: usize,
        src: &Self::Buffer,
        src_offset: usize,
        len: usize,
    ) -> Result<()>;

    // ----- element-wise -----
    /// y += alpha * x.
    fn axpy(&self, y: &mut Self::Buffer, alpha: f32, x: &Self::Buffer) -> Result<()>;
    /// x *= alpha.
    fn scale(&self, x: &mut Self::Buffer, alpha: f32) -> Result<()>;
    /// sum(x^2), accumulated in f64 where the backend can.
    fn sum_of_squares(&self, x: &Self::Buffer) -> Result<f64>;
    /// The sum of `sum_of_squares` over several buffers (a global gradient norm). A device
    /// backend overrides it to read back one total instead of one value per buffer.
    fn sum_of_squares_many(&self, xs: &[&Self::Buffer]) -> Result<f64> {
        let mut total = 0.0;
        for x in xs {
            total += self.sum_of_squares(x)?;
        }
        Ok(total)
    }

    // ----- dense layers -----
    /// See [`crate::ops::matmul::matmul`].
    fn matmul(
        &self,
        c: &mut Self::Buffer,
        a: &Self::Buffer,
        b: &Self::Buffer,
        spec: &MatmulSpec,
    ) -> Result<()>;
    /// `out[r][c] += bias[c]` over `rows x cols`.
    fn add_bias(&self, out: &mut Self::Buffer, bias: &Self::Buffer, rows: usize, cols: usize) -> Result<()>;
    /// Accumulates.
    fn bias_backward(
        &self,
        dbias: &mut Self::Buffer,
        dout: &Self::Buffer,
        rows: usize,
        cols: usize,
    ) -> Result<()>;
    /// `out = act(inp)` elementwise (softmax over each row).
    fn activation_forward(
        &self,
        act: Activation,
        out: &mut Self::Buffer,
        inp: &Self::Buffer,
        rows: usize,
        cols: usize,
    ) -> Result<()>;
    /// `dinp` from `dout` through `act`, given its input and output (overwrites `dinp`).
    #[allow(clippy::too_many_arguments)]
    fn activation_backward(
        &self,
        act: Activation,
        dinp: &mut Self::Buffer,
        dout: &Self::Buffer,
        inp: &Self::Buffer,
        out: &Self::Buffer,
        rows: usize,
        cols: usize,
    ) -> Result<()>;
    /// The mean loss of `rows x cols` predictions against their targets, on the host.
    fn loss_forward(
        &self,
        loss: Loss,
        pred: &Self::Buffer,
        target: &Self::Buffer,
        rows: usize,
        cols: usize,
    ) -> Result<f64>;
    /// The gradient of the mean loss with respect to the predictions (overwrites `dpred`).
    fn loss_backward(
        &self,
        loss: Loss,
        dpred: &mut Self::Buffer,
        pred: &Self::Buffer,
        target: &Self::Buffer,
        rows: usize,
        cols: usize,
    ) -> Result<()>;
    /// Softmax + categorical cross-entropy or sigmoid + binary cross-entropy back to the logits at once: `(pred - target) / rows`, stable where the two steps apart would saturate.
    fn fused_output_backward(
        &self,
        loss: Loss,
        dlogits: &mut Self::Buffer,
        pred: &Self::Buffer,
        target: &Self::Buffer,
        rows: usize,
        cols: usize,
    ) -> Result<()>;

    // ----- transformer blocks -----
    /// RMSNorm of each `dim`-wide row times `weight`, keeping each row's 1/rms in `rstd` for the backward.
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_forward(
        &self,
        out: &mut Self::Buffer,
        rstd: &mut Self::Buffer,
        inp: &Self::Buffer,
        weight: &Self::Buffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()>;
    /// dinp overwritten, dweight accumulated.
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_backward(
        &self,
        dinp: &mut Self::Buffer,
        dweight: &mut Self::Buffer,
        dout: &Self::Buffer,
        inp: &Self::Buffer,
        weight: &Self::Buffer,
        rstd: &Self::Buffer,
        rows: usize,
        dim: usize,
    ) -> Result<()>;
    /// In place.
    fn rope_forward(&self, x: &mut Self::Buffer, spec: &RopeSpec) -> Result<()>;
    /// In place.
    fn rope_backward(&self, dx: &mut Self::Buffer, spec: &RopeSpec) -> Result<()>;
    /// Softmax over each row of `cols`.
    fn softmax_forward(
        &self,
        out: &mut Self::Buffer,
        inp: &Self::Buffer,
        rows: usize,
        cols: usize,
    ) -> Result<()>;
    /// Softmax's backward from its output (overwrites `dinp`).
    fn softmax_backward(
        &self,
        dinp: &mut Self::Buffer,
        dout: &Self::Buffer,
        out: &Self::Buffer,
        rows: usize,
        cols: usize,
    ) -> Result<()>;
    /// `out = silu(gate) * up`.
    fn swiglu_forward(&self, out: &mut Self::Buffer, gate: &Self::Buffer, up: &Self::Buffer) -> Result<()>;
    /// SwiGLU's backward: the gradients of `gate` and `up` (overwritten).
    fn swiglu_backward(
        &self,
        dgate: &mut Self::Buffer,
        dup: &mut Self::Buffer,
        dout: &Self::Buffer,
        gate: &Self::Buffer,
        up: &Self::Buffer,
    ) -> Result<()>;
    /// Causal grouped-query attention (see [`AttentionSpec`] for the layout), keeping each row's log-sum-exp in `lse` for the backward.
    fn attention_forward(
        &self,
        out: &mut Self::Buffer,
        lse: &mut Self::Buffer,
        q: &Self::Buffer,
        k: &Self::Buffer,
        v: &Self::Buffer,
        spec: &AttentionSpec,
    ) -> Result<()>;
    /// Attention's backward: `dq`, `dk`, `dv` (overwritten) from the forward's output and `lse`.
    #[allow(clippy::too_many_arguments)]
    fn attention_backward(
        &self,
        dq: &mut Self::Buffer,
        dk: &mut Self::Buffer,
        dv: &mut Self::Buffer,
        dout: &Self::Buffer,
        q: &Self::Buffer,
        k: &Self::Buffer,
        v: &Self::Buffer,
        out: &Self::Buffer,
        lse: &Self::Buffer,
        spec: &AttentionSpec,
    ) -> Result<()>;
    /// Rows of `table` (`vocab x dim`) for `ids`; an id not below `vocab` is an error.
    fn embedding_forward(
        &self,
        out: &mut Self::Buffer,
        table: &Self::Buffer,
        ids: &[u32],
        vocab: usize,
        dim: usize,
    ) -> Result<()>;
    /// Accumulates.
    fn embedding_backward(
        &self,
        dtable: &mut Self::Buffer,
        dout: &Self::Buffer,
        ids: &[u32],
        vocab: usize,
        dim: usize,
    ) -> Result<()>;
    /// See [`crate::ops::cross_entropy::cross_entropy`]: logits overwritten by their
    /// gradient when `grad_scale` is given.
    fn cross_entropy(
        &self,
        logits: &mut Self::Buffer,
        targets: &[u32],
        mask: Option<&[bool]>,
        rows: usize,
        vocab: usize,
        grad_scale: Option<f32>,
    ) -> Result<CrossEntropySum>;

    // ----- mixture of experts (see crate::ops::moe) -----
    /// `out[t] += sum_j weight[t, j] * y[row_of_slot[t, j]]`; `out (n, dim)`,
    /// `y (n * top_k, dim)`. Host-side routing tables, like token ids.
    fn moe_combine(
        &self,
        out: &mut Self::Buffer,
        y: &Self::Buffer,
        row_of_slot: &[u32],
        weight: &[f32],
        top_k: usize,
        dim: usize,
    ) -> Result<()>;
    /// `dy` overwritten; returns the gradient of each slot's weight on the host.
    #[allow(clippy::too_many_arguments)]
    fn moe_combine_backward(
        &self,
        dy: &mut Self::Buffer,
        dout: &Self::Buffer,
        y: &Self::Buffer,
        row_of_slot: &[u32],
        weight: &[f32],
        top_k: usize,
        dim: usize,
    ) -> Result<Vec<f32>>;

    /// The most values a buffer a kernel reads or writes whole may hold (a GPU's storage
    /// binding); a model keeps its scratch within it, e.g. by prefilling a long prompt in
    /// pieces. The host backends have no such bound.
    fn max_binding_len(&self) -> usize {
        usize::MAX
    }

    /// Whether an int8 model's inference routes its experts on this backend's buffers
    /// ([`Backend::moe_route`], [`Backend::q8_matmul_routed`], [`Backend::moe_combine_slots`])
    /// instead of reading the router's logits back to group the tokens on the host. A
    /// device that must not wait for a read (WebGPU in a page) says yes; the host
    /// backends keep the grouped products, which batch a prefill into one GEMM per expert.
    fn routes_on_device(&self) -> bool {
        false
    }
    /// Each slot's expert (`u32` bits) and combine weight from the router's logits, on the
    /// backend; see [`crate::ops::moe::route_slots`]. The default reads the logits back
    /// and routes on the host.
    #[allow(clippy::too_many_arguments)]
    fn moe_route(
        &self,
        expert: &mut Self::Buffer,
        weight: &mut Self::Buffer,
        logits: &Self::Buffer,
        n: usize,
        n_experts: usize,
        top_k: usize,
        renormalize: bool,
    ) -> Result<()> {
        let (mut e, mut w) = (alloc::vec![0.0; n * top_k], alloc::vec![0.0; n * top_k]);
        let l = self.download(logits)?;
        crate::ops::moe::route_slots(&mut e, &mut w, &l, n, n_experts, top_k, renormalize)?;
        self.write(expert, &e)?;
        self.write(weight, &w)
    }
    /// The routed experts' int8 products slot by slot; see
    /// [`crate::ops::moe::q8_matmul_routed`]. `experts`: (packed, scales) per expert. The
    /// default computes on the host.
    fn q8_matmul_routed(
        &self,
        out: &mut Self::Buffer,
        x: &Self::Buffer,
        experts: &[(&Self::Buffer, &Self::Buffer)],
        expert: &Self::Buffer,
        spec: &RoutedSpec,
    ) -> Result<()> {
        let host: Vec<(Vec<f32>, Vec<f32>)> = experts
            .iter()
            .map(|(p, s)| Ok((self.download(p)?, self.download(s)?)))
            .collect::<Result<_>>()?;
        let views: Vec<(&[f32], &[f32])> = host.iter().map(|(p, s)| (&p[..], &s[..])).collect();
        let mut o = alloc::vec![0.0; self.len(out)];
        let (x, expert) = (self.download(x)?, self.download(expert)?);
        crate::ops::moe::q8_matmul_routed(&mut o, &x, &views, &expert, spec)?;
        self.write(out, &o)
    }
    /// `out[t] += sum_j weight[t, j] * y[t * top_k + j]`: [`Backend::moe_combine`] with the
    /// expert outputs in slot order and the weights on the backend.
    fn moe_combine_slots(
        &self,
        out: &mut Self::Buffer,
        y: &Self::Buffer,
        weight: &Self::Buffer,
        top_k: usize,
        dim: usize,
    ) -> Result<()> {
        let w = self.download(weight)?;
        let rows: Vec<u32> = (0..w.len() as u32).collect();
        self.moe_combine(out, y, &rows, &w, top_k, dim)
    }

    // ----- int8 inference (see crate::ops::q8) -----
    /// `out = x W^T + beta * out` with W (n x k) int8, packed four to a slot, one scale a
    /// row; `spec` as for an f32 `Linear` product (see [`crate::ops::q8::q8_operands`]).
    fn q8_matmul(
        &self,
        out: &mut Self::Buffer,
        x: &Self::Buffer,
        packed: &Self::Buffer,
        scales: &Self::Buffer,
        spec: &MatmulSpec,
    ) -> Result<()>;
    /// Several int8 products of one input, each `out = x W^T + beta * out` as in
    /// [`Backend::q8_matmul`] with its own spec: attention's q, k and v projections. A
    /// backend that runs them as one job (one hand-off between threads, one rounding of
    /// `x`) overrides this; the default, one `q8_matmul` each, is what an override is
    /// tested against ([`q8_matmul_each`]).
    fn q8_matmul_many(&self, x: &Self::Buffer, products: &mut [Q8Product<'_, Self::Buffer>]) -> Result<()> {
        q8_matmul_each(self, x, products)
    }
    /// The first half of a SwiGLU feed-forward on int8 weights: `gate = x Wg^T`,
    /// `up = x Wu^T` (`spec` is `(m, f, d)`: `x` `(m, d)`, both weights `(f, d)`, beta 0),
    /// then `out = silu(gate) * up`; `gate` and `up` keep their values for a backward pass.
    /// The default is the two products and [`Backend::swiglu_forward`]
    /// ([`q8_swiglu_unfused`]); a backend may run all three as one job.
    #[allow(clippy::too_many_arguments)]
    fn q8_swiglu(
        &self,
        out: &mut Self::Buffer,
        gate: &mut Self::Buffer,
        up: &mut Self::Buffer,
        x: &Self::Buffer,
        gate_w: (&Self::Buffer, &Self::Buffer),
        up_w: (&Self::Buffer, &Self::Buffer),
        spec: &MatmulSpec,
    ) -> Result<()> {
        q8_swiglu_unfused(self, out, gate, up, x, gate_w, up_w, spec)
    }
    /// A SwiGLU feed-forward on int8 weights, added to `out`: [`Backend::q8_swiglu`] of
    /// `x` into `s` (`gate` and `up` keep their values), then `out = s Wd^T + out` with
    /// `Wd` `(d, f)`. `spec` is the gating products' `(m, f, d)`. The default is those two
    /// calls ([`q8_mlp_unfused`]); a backend may run the whole feed-forward as one job.
    #[allow(clippy::too_many_arguments)]
    fn q8_mlp(
        &self,
        out: &mut Self::Buffer,
        acts: [&mut Self::Buffer; 3],
        x: &Self::Buffer,
        gate_w: (&Self::Buffer, &Self::Buffer),
        up_w: (&Self::Buffer, &Self::Buffer),
        down_w: (&Self::Buffer, &Self::Buffer),
        spec: &MatmulSpec,
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
        &self,
        out: &mut Self::Buffer,
        packed: &Self::Buffer,
        scales: &Self::Buffer,
        ids: &[u32],
        vocab: usize,
        dim: usize,
    ) -> Result<()>;

    // ----- low-rank adapters (see crate::ops::lora) -----
    /// `t = x A^T` (overwritten, kept for the backward pass), then `y += scale * t B^T`.
    /// The default is two of the backend's own GEMMs ([`lora_forward_by_gemm`]); a backend
    /// with a one-pass kernel overrides it.
    #[allow(clippy::too_many_arguments)]
    fn lora_forward(
        &self,
        y: &mut Self::Buffer,
        t: &mut Self::Buffer,
        x: &Self::Buffer,
        a: &Self::Buffer,
        b: &Self::Buffer,
        s: &LoraSpec,
    ) -> Result<()> {
        lora_forward_by_gemm(self, y, t, x, a, b, s)
    }
    /// From `dy`: `dB += scale * dy^T t`, `dt = scale * dy B` (scratch, overwritten),
    /// `dA += dt^T x`, and `dx += dt A` when `dx` is given.
    #[allow(clippy::too_many_arguments)]
    fn lora_backward(
        &self,
        dx: Option<&mut Self::Buffer>,
        da: &mut Self::Buffer,
        db: &mut Self::Buffer,
        dt: &mut Self::Buffer,
        dy: &Self::Buffer,
        x: &Self::Buffer,
        t: &Self::Buffer,
        a: &Self::Buffer,
        b: &Self::Buffer,
        s: &LoraSpec,
    ) -> Result<()> {
        let op = "lora_backward";
        s.check(
            op,
            self.len(x),
            self.len(dy),
            self.len(t),
            self.len(a),
            self.len(b),
        )?;
        s.check(
            op,
            self.len(x),
            self.len(dy),
            self.len(dt),
            self.len(da),
            self.len(db),
        )?;
        if let Some(dx) = &dx {
            s.check(
                op,
                self.len(dx),
                self.len(dy),
                self.len(t),
                self.len(a),
                self.len(b),
            )?;
        }
        if s.rows == 0 {
            return Ok(());
        }
        let mm = |m, n, k| MatmulSpec::new(m, n, k).precision(s.precision);
        let (rows, r, di, dout) = (s.rows, s.rank, s.d_in, s.d_out);
        let (xo, yo, to) = (s.x_offset, s.y_offset, s.t_offset);
        self.matmul(
            db,
            dy,
            t,
            &mm(dout, r, rows)
                .trans_a(true)
                .alpha(s.scale)
                .accumulate()
                .window(yo, to, 0),
        )?;
        self.matmul(dt, dy, b, &mm(rows, r, dout).alpha(s.scale).window(yo, 0, to))?;
        self.matmul(
            da,
            dt,
            x,
            &mm(r, di, rows).trans_a(true).accumulate().window(to, xo, 0),
        )?;
        if let Some(dx) = dx {
            self.matmul(dx, dt, a, &mm(rows, di, r).accumulate().window(to, 0, xo))?;
        }
        Ok(())
    }

    // ----- image models and text encoders (inference; see crate::ops) -----
    // The defaults compute on the host through the reference ops (a download and an
    // upload around each call): correct on every backend, and what a device backend has
    // until it brings its own kernel. The CPU backend overrides each one.

    /// See [`crate::ops::conv::conv2d`].
    fn conv2d(
        &self,
        out: &mut Self::Buffer,
        inp: &Self::Buffer,
        weight: &Self::Buffer,
        bias: Option<&Self::Buffer>,
        spec: &Conv2dSpec,
    ) -> Result<()> {
        let bias = bias.map(|b| self.download(b)).transpose()?;
        let mut o = alloc::vec![0.0; self.len(out)];
        crate::ops::conv::conv2d(
            &mut o,
            &self.download(inp)?,
            &self.download(weight)?,
            bias.as_deref(),
            spec,
        )?;
        self.write(out, &o)
    }
    /// See [`crate::ops::norm::group_norm`].
    fn group_norm(
        &self,
        out: &mut Self::Buffer,
        inp: &Self::Buffer,
        weight: Option<&Self::Buffer>,
        bias: Option<&Self::Buffer>,
        spec: &GroupNormSpec,
    ) -> Result<()> {
        let weight = weight.map(|w| self.download(w)).transpose()?;
        let bias = bias.map(|b| self.download(b)).transpose()?;
        let mut o = alloc::vec![0.0; self.len(out)];
        crate::ops::norm::group_norm(
            &mut o,
            &self.download(inp)?,
            weight.as_deref(),
            bias.as_deref(),
            spec,
        )?;
        self.write(out, &o)
    }
    /// See [`crate::ops::norm::layer_norm`].
    #[allow(clippy::too_many_arguments)]
    fn layer_norm(
        &self,
        out: &mut Self::Buffer,
        inp: &Self::Buffer,
        weight: Option<&Self::Buffer>,
        bias: Option<&Self::Buffer>,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        let weight = weight.map(|w| self.download(w)).transpose()?;
        let bias = bias.map(|b| self.download(b)).transpose()?;
        let mut o = alloc::vec![0.0; self.len(out)];
        crate::ops::norm::layer_norm(
            &mut o,
            &self.download(inp)?,
            weight.as_deref(),
            bias.as_deref(),
            rows,
            dim,
            eps,
        )?;
        self.write(out, &o)
    }
    /// See [`crate::ops::unary::unary`].
    fn unary(&self, op: Unary, out: &mut Self::Buffer, inp: &Self::Buffer) -> Result<()> {
        let mut o = alloc::vec![0.0; self.len(out)];
        crate::ops::unary::unary(op, &mut o, &self.download(inp)?)?;
        self.write(out, &o)
    }
    /// See [`crate::ops::unary::gated`]: `out = f(gate) * up`.
    fn gated(&self, op: Unary, out: &mut Self::Buffer, gate: &Self::Buffer, up: &Self::Buffer) -> Result<()> {
        let mut o = alloc::vec![0.0; self.len(out)];
        crate::ops::unary::gated(op, &mut o, &self.download(gate)?, &self.download(up)?)?;
        self.write(out, &o)
    }
    /// See [`crate::ops::sdpa::sdpa`]. The key mask is a host slice, like token ids.
    #[allow(clippy::too_many_arguments)]
    fn sdpa(
        &self,
        out: &mut Self::Buffer,
        q: &Self::Buffer,
        k: &Self::Buffer,
        v: &Self::Buffer,
        key_mask: Option<&[bool]>,
        bias: Option<&Self::Buffer>,
        spec: &SdpaSpec,
    ) -> Result<()> {
        let bias = bias.map(|b| self.download(b)).transpose()?;
        let mut o = alloc::vec![0.0; self.len(out)];
        let (q, k, v) = (self.download(q)?, self.download(k)?, self.download(v)?);
        crate::ops::sdpa::sdpa(&mut o, &q, &k, &v, key_mask, bias.as_deref(), spec)?;
        self.write(out, &o)
    }
    /// See [`crate::ops::spatial::upsample_nearest2d`].
    fn upsample_nearest2d(
        &self,
        out: &mut Self::Buffer,
        inp: &Self::Buffer,
        planes: usize,
        h: usize,
        w: usize,
        scale: usize,
    ) -> Result<()> {
        let mut o = alloc::vec![0.0; self.len(out)];
        crate::ops::spatial::upsample_nearest2d(&mut o, &self.download(inp)?, planes, h, w, scale)?;
        self.write(out, &o)
    }
    /// See [`crate::ops::spatial::patchify`].
    fn patchify(&self, out: &mut Self::Buffer, inp: &Self::Buffer, spec: &PatchSpec) -> Result<()> {
        let mut o = alloc::vec![0.0; self.len(out)];
        crate::ops::spatial::patchify(&mut o, &self.download(inp)?, spec)?;
        self.write(out, &o)
    }
    /// See [`crate::ops::spatial::unpatchify`].
    fn unpatchify(&self, out: &mut Self::Buffer, inp: &Self::Buffer, spec: &PatchSpec) -> Result<()> {
        let mut o = alloc::vec![0.0; self.len(out)];
        crate::ops::spatial::unpatchify(&mut o, &self.download(inp)?, spec)?;
        self.write(out, &o)
    }

    /// See [`crate::ops::modulation::modulate`].
    fn modulate(
        &self,
        out: &mut Self::Buffer,
        x: &Self::Buffer,
        mods: &Self::Buffer,
        shift_at: usize,
        scale_at: usize,
        spec: &ModulationSpec,
    ) -> Result<()> {
        let mut o = alloc::vec![0.0; self.len(out)];
        let (x, mods) = (self.download(x)?, self.download(mods)?);
        crate::ops::modulation::modulate(&mut o, &x, &mods, shift_at, scale_at, spec)?;
        self.write(out, &o)
    }
    /// See [`crate::ops::modulation::gate_add`].
    fn gate_add(
        &self,
        x: &mut Self::Buffer,
        y: &Self::Buffer,
        mods: &Self::Buffer,
        gate_at: usize,
        spec: &ModulationSpec,
    ) -> Result<()> {
        let mut o = self.download(x)?;
        let (y, mods) = (self.download(y)?, self.download(mods)?);
        crate::ops::modulation::gate_add(&mut o, &y, &mods, gate_at, spec)?;
        self.write(x, &o)
    }
    /// See [`crate::ops::modulation::copy_cols`].
    fn copy_cols(&self, dst: &mut Self::Buffer, src: &Self::Buffer, spec: &ColumnCopy) -> Result<()> {
        let mut o = self.download(dst)?;
        crate::ops::modulation::copy_cols(&mut o, &self.download(src)?, spec)?;
        self.write(dst, &o)
    }
    /// See [`crate::ops::modulation::rope_pairs`]. In place.
    fn rope_pairs(
        &self,
        x: &mut Self::Buffer,
        cos: &Self::Buffer,
        sin: &Self::Buffer,
        spec: &RopePairsSpec,
    ) -> Result<()> {
        let mut o = self.download(x)?;
        let (cos, sin) = (self.download(cos)?, self.download(sin)?);
        crate::ops::modulation::rope_pairs(&mut o, &cos, &sin, spec)?;
        self.write(x, &o)
    }

    // ----- optimizers -----
    /// One Adam(W) step (`step` counted from 1) of `param` with `grad`, the moments `m`, `v` updated in place.
    fn adam_update(
        &self,
        param: &mut Self::Buffer,
        grad: &Self::Buffer,
        m: &mut Self::Buffer,
        v: &mut Self::Buffer,
        hp: &AdamParams,
        step: u64,
    ) -> Result<()>;
    /// One SGD step of `param` with `grad`, the momentum buffer updated when there is one.
    fn sgd_update(
        &self,
        param: &mut Self::Buffer,
        grad: &Self::Buffer,
        velocity: Option<&mut Self::Buffer>,
        hp: &SgdParams,
    ) -> Result<()>;
}

/// [`Backend::q8_matmul_many`] as one of `backend`'s `q8_matmul` a product: the definition,
/// and what an override falls back to for shapes it does not fuse.
pub fn q8_matmul_each<B: Backend + ?Sized>(
    backend: &B,
    x: &B::Buffer,
    products: &mut [Q8Product<'_, B::Buffer>],
) -> Result<()> {
    for p in products.iter_mut() {
        backend.q8_matmul(p.out, x, p.packed, p.scales, &p.spec)?;
    }
    Ok(())
}

/// [`Backend::q8_swiglu`] as `backend`'s two products and its `swiglu_forward`: the
/// definition, and what an override falls back to for shapes it does not fuse.
#[allow(clippy::too_many_arguments)]
pub fn q8_swiglu_unfused<B: Backend + ?Sized>(
    backend: &B,
    out: &mut B::Buffer,
    gate: &mut B::Buffer,
    up: &mut B::Buffer,
    x: &B::Buffer,
    gate_w: (&B::Buffer, &B::Buffer),
    up_w: (&B::Buffer, &B::Buffer),
    spec: &MatmulSpec,
) -> Result<()> {
    backend.q8_matmul(gate, x, gate_w.0, gate_w.1, spec)?;
    backend.q8_matmul(up, x, up_w.0, up_w.1, spec)?;
    backend.swiglu_forward(out, gate, up)
}

/// The operands of [`Backend::q8_attention`] at `n` new positions of one sequence
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

/// [`Backend::q8_attention`] as `backend`'s calls one by one: [`Backend::q8_matmul_many`]
/// for q, k and v, [`Backend::rope_forward`] of q and k, [`Backend::copy_range`] into the
/// cache, [`Backend::attention_forward`], and Wo's product added to `x`. The definition,
/// and what an override falls back to for shapes it does not fuse.
pub fn q8_attention_unfused<B: Backend + ?Sized>(backend: &B, a: Q8Attention<'_, B::Buffer>) -> Result<()> {
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
            Q8Product {
                out: &mut *a.q,
                packed: wq.0,
                scales: wq.1,
                spec: t(n, q_dim, d),
            },
            Q8Product {
                out: &mut *a.k,
                packed: wk.0,
                scales: wk.1,
                spec: t(n, kv_dim, d),
            },
            Q8Product {
                out: &mut *a.v,
                packed: wv.0,
                scales: wv.1,
                spec: t(n, kv_dim, d),
            },
        ],
    )?;
    backend.rope_forward(a.q, a.rope_q)?;
    backend.rope_forward(a.k, a.rope_k)?;
    backend.copy_range(a.cache_k, a.pos * kv_dim, a.k, 0, n * kv_dim)?;
    backend.copy_range(a.cache_v, a.pos * kv_dim, a.v, 0, n * kv_dim)?;
    backend.attention_forward(a.att, a.lse, a.q, a.cache_k, a.cache_v, s)?;
    backend.q8_matmul(a.x, a.att, wo.0, wo.1, &t(n, d, q_dim).beta(1.0))
}

/// [`Backend::q8_mlp`] as `backend`'s [`Backend::q8_swiglu`] into `s` and its down
/// product added to `out`: the definition, and what an override falls back to for shapes
/// it does not fuse. `acts` is `[gate, up, s]`.
#[allow(clippy::too_many_arguments)]
pub fn q8_mlp_unfused<B: Backend + ?Sized>(
    backend: &B,
    out: &mut B::Buffer,
    [gate, up, s]: [&mut B::Buffer; 3],
    x: &B::Buffer,
    gate_w: (&B::Buffer, &B::Buffer),
    up_w: (&B::Buffer, &B::Buffer),
    down_w: (&B::Buffer, &B::Buffer),
    spec: &MatmulSpec,
) -> Result<()> {
    backend.q8_swiglu(s, gate, up, x, gate_w, up_w, spec)?;
    let down = MatmulSpec::new(spec.m, spec.k, spec.n)
        .precision(spec.precision)
        .trans_b(true)
        .beta(1.0);
    backend.q8_matmul(out, s, down_w.0, down_w.1, &down)
}

/// [`Backend::lora_forward`] as two of `backend`'s GEMMs, the scale folded into the
/// second's alpha: at the ranks adapters use (4 to 64) both products are bound by reading
/// `x` and writing `y`, which a GEMM already does once each.
pub fn lora_forward_by_gemm<B: Backend + ?Sized>(
    backend: &B,
    y: &mut B::Buffer,
    t: &mut B::Buffer,
    x: &B::Buffer,
    a: &B::Buffer,
    b: &B::Buffer,
    s: &LoraSpec,
) -> Result<()> {
    let len = |buf| backend.len(buf);
    s.check("lora_forward", len(x), len(y), len(t), len(a), len(b))?;
    if s.rows == 0 {
        return Ok(());
    }
    let mm = |m, n, k| MatmulSpec::new(m, n, k).precision(s.precision);
    backend.matmul(
        t,
        x,
        a,
        &mm(s.rows, s.rank, s.d_in)
            .trans_b(true)
            .window(s.x_offset, 0, s.t_offset),
    )?;
    backend.matmul(
        y,
        t,
        b,
        &mm(s.rows, s.d_out, s.rank)
            .trans_b(true)
            .alpha(s.scale)
            .accumulate()
            .window(s.t_offset, 0, s.y_offset),
    )
}

/// The global L2 norm over several buffers (gradient clipping): `sqrt(sum of sum(x^2))`.
/// NaN/Inf anywhere gives a NaN/Inf norm, which the caller reports.
pub fn global_l2_norm<B: Backend + ?Sized>(backend: &B, buffers: &[&B::Buffer]) -> Result<f64> {
    Ok(libm::sqrt(backend.sum_of_squares_many(buffers)?))
}

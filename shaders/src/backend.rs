//! `WgpuBackend`: core's `Backend` trait over the WGSL kernels, so a model definition
//! written once in core (the dense network's forward, backward and optimizer steps) runs on
//! the GPU unchanged. Each call records its kernels and submits them; buffers stay on the
//! device, and only `download` (and the two host-side reductions) read back.
//!
//! Dense-network training has every primitive it needs here. Training a transformer on
//! this backend does not yet: RMSNorm, attention and embedding backward, cross-entropy and
//! the mixture-of-experts scatter return an error that says so (int8 transformer
//! inference runs through `rusting_brain`'s `to_gpu`, which records whole forward passes).

use std::sync::Arc;

use rusting_brain_core::backend::{
    AdamParams, AttentionSpec, CrossEntropySum, MatmulSpec, Precision, RopeSpec, SgdParams,
};
use rusting_brain_core::ops::optim::{check_adam, check_sgd, AdamConstants};
use rusting_brain_core::{Activation, Backend, CoreError, Loss, Result};

use crate::{DenseOp, Gpu, GpuBuffer, ShaderError};

/// The wgpu backend; cheap to clone (the device is shared).
#[derive(Clone, Debug)]
pub struct WgpuBackend {
    gpu: Arc<Gpu>,
}

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
        message: format!("{op} is not on the wgpu backend yet; train transformers on the CPU backend"),
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

/// Buffer lengths against (rows, cols), as core's checks compare them.
fn rows_check(op: &'static str, rows: usize, cols: usize, bufs: &[(&'static str, usize)]) -> Result<usize> {
    rusting_brain_core::error::check_rows(op, rows, cols, bufs)
}

impl WgpuBackend {
    pub fn new(gpu: Arc<Gpu>) -> WgpuBackend {
        WgpuBackend { gpu }
    }
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    fn run(&self, f: impl FnOnce(&mut crate::Batch) -> std::result::Result<(), ShaderError>) -> Result<()> {
        let mut b = self.gpu.batch();
        f(&mut b).map_err(device)?;
        b.submit().map_err(device)
    }

    fn dense(
        &self,
        op: DenseOp,
        x: [Option<&GpuBuffer>; 3],
        y: &GpuBuffer,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        self.run(|b| b.dense(op, x, y, rows, cols))
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
    fn download(&self, buf: &GpuBuffer) -> Result<Vec<f32>> {
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
        rusting_brain_core::error::check_len("write", "data", data.len(), dst.len())?;
        self.gpu.write(dst, 0, data).map_err(device)
    }
    fn len(&self, buf: &GpuBuffer) -> usize {
        buf.len()
    }
    fn fill(&self, buf: &mut GpuBuffer, value: f32) -> Result<()> {
        let n = buf.len();
        self.dense(DenseOp::Fill(value), [None; 3], buf, 1, n)
    }
    fn copy(&self, dst: &mut GpuBuffer, src: &GpuBuffer) -> Result<()> {
        rusting_brain_core::error::check_len("copy", "src", src.len(), dst.len())?;
        let n = dst.len();
        self.run(|b| b.copy(dst, 0, src, 0, n))
    }
    fn copy_range(
        &self,
        dst: &mut GpuBuffer,
        dst_offset: usize,
        src: &GpuBuffer,
        src_offset: usize,
        len: usize,
    ) -> Result<()> {
        self.run(|b| b.copy(dst, dst_offset, src, src_offset, len))
    }

    fn axpy(&self, y: &mut GpuBuffer, alpha: f32, x: &GpuBuffer) -> Result<()> {
        rusting_brain_core::error::check_len("axpy", "x", x.len(), y.len())?;
        let n = y.len();
        self.dense(DenseOp::Axpy(alpha), [Some(x), None, None], y, 1, n)
    }
    fn scale(&self, x: &mut GpuBuffer, alpha: f32) -> Result<()> {
        let n = x.len();
        self.dense(DenseOp::Scale(alpha), [None; 3], x, 1, n)
    }
    fn sum_of_squares(&self, x: &GpuBuffer) -> Result<f64> {
        // A host reduction in f64 over one read-back: the gradient-clipping norm, once a step.
        Ok(self.download(x)?.iter().map(|&v| v as f64 * v as f64).sum())
    }

    fn matmul(&self, c: &mut GpuBuffer, a: &GpuBuffer, b: &GpuBuffer, spec: &MatmulSpec) -> Result<()> {
        spec.check("matmul", a.len(), b.len(), c.len())?;
        if spec.precision != Precision::F32 {
            return Err(unsupported("a bf16 matmul"));
        }
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
        self.run(|g| {
            g.matmul(
                c,
                a,
                b,
                (spec.m, spec.n, spec.k, spec.batch),
                (spec.trans_a, spec.trans_b),
                (spec.alpha, spec.beta),
                at,
            )
        })
    }
    fn add_bias(&self, out: &mut GpuBuffer, bias: &GpuBuffer, rows: usize, cols: usize) -> Result<()> {
        rows_check("add_bias", rows, cols, &[("out", out.len())])?;
        rusting_brain_core::error::check_len("add_bias", "bias", bias.len(), cols)?;
        self.dense(DenseOp::AddBias, [Some(bias), None, None], out, rows, cols)
    }
    fn bias_backward(&self, dbias: &mut GpuBuffer, dout: &GpuBuffer, rows: usize, cols: usize) -> Result<()> {
        rows_check("bias_backward", rows, cols, &[("dout", dout.len())])?;
        rusting_brain_core::error::check_len("bias_backward", "dbias", dbias.len(), cols)?;
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
        self.run(|b| b.rmsnorm(out, rstd, inp, weight, rows, dim, eps))
    }
    fn rmsnorm_backward(
        &self,
        _: &mut GpuBuffer,
        _: &mut GpuBuffer,
        _: &GpuBuffer,
        _: &GpuBuffer,
        _: &GpuBuffer,
        _: &GpuBuffer,
        _: usize,
        _: usize,
    ) -> Result<()> {
        Err(unsupported("rmsnorm_backward"))
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
        self.run(|b| b.swiglu(out, gate, up, n))
    }
    fn swiglu_backward(
        &self,
        _: &mut GpuBuffer,
        _: &mut GpuBuffer,
        _: &GpuBuffer,
        _: &GpuBuffer,
        _: &GpuBuffer,
    ) -> Result<()> {
        Err(unsupported("swiglu_backward"))
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
        let (nq, nkv, nl) = spec.check("attention_forward")?;
        spec.check_forward(out.len(), lse.len(), q.len(), k.len(), v.len())?;
        let _ = (nq, nkv);
        let scratch = self.zeros(nl * spec.kv_capacity)?;
        self.run(|b| b.attention(out, lse, q, k, v, &scratch, spec))
    }
    fn attention_backward(
        &self,
        _: &mut GpuBuffer,
        _: &mut GpuBuffer,
        _: &mut GpuBuffer,
        _: &GpuBuffer,
        _: &GpuBuffer,
        _: &GpuBuffer,
        _: &GpuBuffer,
        _: &GpuBuffer,
        _: &GpuBuffer,
        _: &AttentionSpec,
    ) -> Result<()> {
        Err(unsupported("attention_backward"))
    }
    fn embedding_forward(
        &self,
        _: &mut GpuBuffer,
        _: &GpuBuffer,
        _: &[u32],
        _: usize,
        _: usize,
    ) -> Result<()> {
        Err(unsupported("an f32 embedding"))
    }
    fn embedding_backward(
        &self,
        _: &mut GpuBuffer,
        _: &GpuBuffer,
        _: &[u32],
        _: usize,
        _: usize,
    ) -> Result<()> {
        Err(unsupported("embedding_backward"))
    }
    fn cross_entropy(
        &self,
        _: &mut GpuBuffer,
        _: &[u32],
        _: Option<&[bool]>,
        _: usize,
        _: usize,
        _: Option<f32>,
    ) -> Result<CrossEntropySum> {
        Err(unsupported("cross_entropy"))
    }
    fn moe_combine(
        &self,
        _: &mut GpuBuffer,
        _: &GpuBuffer,
        _: &[u32],
        _: &[f32],
        _: usize,
        _: usize,
    ) -> Result<()> {
        Err(unsupported("moe_combine"))
    }
    fn moe_combine_backward(
        &self,
        _: &mut GpuBuffer,
        _: &GpuBuffer,
        _: &GpuBuffer,
        _: &[u32],
        _: &[f32],
        _: usize,
        _: usize,
    ) -> Result<Vec<f32>> {
        Err(unsupported("moe_combine_backward"))
    }
    fn q8_matmul(
        &self,
        out: &mut GpuBuffer,
        x: &GpuBuffer,
        packed: &GpuBuffer,
        scales: &GpuBuffer,
        spec: &MatmulSpec,
    ) -> Result<()> {
        if spec.window.is_some() || spec.batch != 1 || !spec.trans_b || spec.trans_a || spec.alpha != 1.0 {
            return Err(unsupported("a windowed, batched or scaled int8 product"));
        }
        let (m, n, k) = (spec.m, spec.n, spec.k);
        rusting_brain_core::ops::q8::check_q8_matmul(
            out.len(),
            x.len(),
            packed.len(),
            scales.len(),
            m,
            n,
            k,
        )?;
        let pc = rusting_brain_core::ops::q8::packed_cols(k);
        let (xq, xs) = (self.zeros(m * pc)?, self.zeros(m)?);
        self.run(|b| {
            b.q8_quantize(&xq, &xs, x, m, k)?;
            b.q8_matmul(out, &xq, &xs, packed, scales, m, n, k, spec.beta)
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
        let gids = self.gpu.upload_u32("ids", ids).map_err(device)?;
        self.run(|b| b.q8_embedding(out, &gids, packed, scales, ids.len(), vocab, dim))
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
        self.run(|b| b.optim(&words, param, grad, Some(m), Some(v)))
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
        self.run(|b| b.optim(&words, param, grad, vel, None))
    }
}

impl WgpuBackend {
    fn rope(&self, x: &mut GpuBuffer, spec: &RopeSpec, inverse: bool) -> Result<()> {
        spec.check(if inverse { "rope_backward" } else { "rope_forward" }, x.len())?;
        let table = crate::rope_table(spec.pos_offset + spec.seq, spec.head_dim, spec.theta);
        let table = self.upload(&table)?;
        self.run(|b| b.rope(x, &table, spec, inverse))
    }
}

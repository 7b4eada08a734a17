//! The reference backend: [`crate::ops`] on `Vec<f32>`, single-threaded. It is the
//! definition the other backends are tested against, and it runs anywhere `alloc` does.
//!
//! Every primitive that sums (matmul, norms, softmax, attention, losses, gradient
//! accumulation) runs in f64 on the f32 inputs and rounds once at the end, so the
//! reference is the exact answer to within one f32 rounding, whatever the summation order.
//! A backend's distance from it is then its own error alone, and tolerances can be tight.
//! The purely element-wise updates (optimizers, axpy, scale, bias add) run in f32: they do
//! not accumulate, and keeping them in f32 lets backends match them bit for bit.

use alloc::vec::Vec;

use crate::backend::*;
use crate::error::check_len;
use crate::ops::{
    activation, attention, cross_entropy, elementwise, embedding, l2norm, lora, loss, matmul, moe, optim, q8,
    rmsnorm, rope, softmax, swiglu,
};
use crate::{Activation, Loss, Result};

fn wide(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

fn narrow(dst: &mut [f32], src: &[f64]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = s as f32;
    }
}

/// Runs `f` on f64 copies of the outputs (`outs`, read first so accumulating outputs
/// keep their values) and writes the rounded results back.
fn in_f64<const N: usize, R>(
    outs: [&mut Vec<f32>; N],
    f: impl FnOnce(&mut [Vec<f64>; N]) -> Result<R>,
) -> Result<R> {
    let mut wide_outs: [Vec<f64>; N] = core::array::from_fn(|i| wide(outs[i]));
    let r = f(&mut wide_outs)?;
    for (o, w) in outs.into_iter().zip(wide_outs.iter()) {
        narrow(o, w);
    }
    Ok(r)
}

/// Plain loops on the host; see the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReferenceBackend;

impl Backend for ReferenceBackend {
    type Buffer = Vec<f32>;

    fn name(&self) -> &'static str {
        "reference"
    }
    fn zeros(&self, len: usize) -> Result<Vec<f32>> {
        Ok(alloc::vec![0.0; len])
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
        buf.iter_mut().for_each(|x| *x = value);
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
        crate::error::check_range("copy_range", "dst", dst.len(), dst_offset, len)?;
        crate::error::check_range("copy_range", "src", src.len(), src_offset, len)?;
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
        Ok(l2norm::sum_of_squares(x))
    }
    fn matmul(&self, c: &mut Vec<f32>, a: &Vec<f32>, b: &Vec<f32>, spec: &MatmulSpec) -> Result<()> {
        in_f64([c], |[c]| matmul::matmul(c, &wide(a), &wide(b), spec))
    }
    fn add_bias(&self, out: &mut Vec<f32>, bias: &Vec<f32>, rows: usize, cols: usize) -> Result<()> {
        elementwise::add_bias(out, bias, rows, cols)
    }
    fn bias_backward(&self, dbias: &mut Vec<f32>, dout: &Vec<f32>, rows: usize, cols: usize) -> Result<()> {
        in_f64([dbias], |[d]| {
            elementwise::bias_backward(d, &wide(dout), rows, cols)
        })
    }
    fn activation_forward(
        &self,
        act: Activation,
        out: &mut Vec<f32>,
        inp: &Vec<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        in_f64([out], |[o]| {
            activation::activation_forward(act, o, &wide(inp), rows, cols)
        })
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
        in_f64([dinp], |[d]| {
            activation::activation_backward(act, d, &wide(dout), &wide(inp), &wide(out), rows, cols)
        })
    }
    fn loss_forward(
        &self,
        l: Loss,
        pred: &Vec<f32>,
        target: &Vec<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<f64> {
        loss::loss_forward(l, &wide(pred), &wide(target), rows, cols)
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
        in_f64([dpred], |[d]| {
            loss::loss_backward(l, d, &wide(pred), &wide(target), rows, cols)
        })
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
        in_f64([dlogits], |[d]| {
            loss::fused_output_backward(l, d, &wide(pred), &wide(target), rows, cols)
        })
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
        in_f64([out, rstd], |[o, r]| {
            rmsnorm::rmsnorm_forward(o, r, &wide(inp), &wide(weight), rows, dim, eps)
        })
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
        in_f64([dinp, dweight], |[dx, dw]| {
            rmsnorm::rmsnorm_backward(
                dx,
                dw,
                &wide(dout),
                &wide(inp),
                &wide(weight),
                &wide(rstd),
                rows,
                dim,
            )
        })
    }
    fn rope_forward(&self, x: &mut Vec<f32>, spec: &RopeSpec) -> Result<()> {
        in_f64([x], |[x]| rope::rope_forward(x, spec))
    }
    fn rope_backward(&self, dx: &mut Vec<f32>, spec: &RopeSpec) -> Result<()> {
        in_f64([dx], |[dx]| rope::rope_backward(dx, spec))
    }
    fn softmax_forward(&self, out: &mut Vec<f32>, inp: &Vec<f32>, rows: usize, cols: usize) -> Result<()> {
        in_f64([out], |[o]| softmax::softmax_forward(o, &wide(inp), rows, cols))
    }
    fn softmax_backward(
        &self,
        dinp: &mut Vec<f32>,
        dout: &Vec<f32>,
        out: &Vec<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        in_f64([dinp], |[d]| {
            softmax::softmax_backward(d, &wide(dout), &wide(out), rows, cols)
        })
    }
    fn swiglu_forward(&self, out: &mut Vec<f32>, gate: &Vec<f32>, up: &Vec<f32>) -> Result<()> {
        in_f64([out], |[o]| swiglu::swiglu_forward(o, &wide(gate), &wide(up)))
    }
    fn swiglu_backward(
        &self,
        dgate: &mut Vec<f32>,
        dup: &mut Vec<f32>,
        dout: &Vec<f32>,
        gate: &Vec<f32>,
        up: &Vec<f32>,
    ) -> Result<()> {
        in_f64([dgate, dup], |[dg, du]| {
            swiglu::swiglu_backward(dg, du, &wide(dout), &wide(gate), &wide(up))
        })
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
        in_f64([out, lse], |[o, l]| {
            attention::attention_forward(o, l, &wide(q), &wide(k), &wide(v), spec)
        })
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
        in_f64([dq, dk, dv], |[dq, dk, dv]| {
            let (q, k, v) = (wide(q), wide(k), wide(v));
            attention::attention_backward(dq, dk, dv, &wide(dout), &q, &k, &v, &wide(out), &wide(lse), spec)
        })
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
        in_f64([dtable], |[d]| {
            embedding::embedding_backward(d, &wide(dout), ids, vocab, dim)
        })
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
        in_f64([logits], |[l]| {
            cross_entropy::cross_entropy(l, targets, mask, rows, vocab, grad_scale)
        })
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
        in_f64([out], |[o]| {
            moe::moe_combine(o, &wide(y), row_of_slot, weight, top_k, dim)
        })
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
        in_f64([dy], |[d]| {
            moe::moe_combine_backward(d, &wide(dout), &wide(y), row_of_slot, weight, top_k, dim)
        })
    }
    fn lora_forward(
        &self,
        y: &mut Vec<f32>,
        t: &mut Vec<f32>,
        x: &Vec<f32>,
        a: &Vec<f32>,
        b: &Vec<f32>,
        s: &LoraSpec,
    ) -> Result<()> {
        s.check("lora_forward", x.len(), y.len(), t.len(), a.len(), b.len())?;
        // t rounds to f32 as a backend stores it; y's sum then runs over the stored t.
        in_f64([t], |[t]| lora::lora_down(t, &wide(x), &wide(a), s))?;
        let t = wide(t);
        in_f64([y], |[y]| lora::lora_up(y, &t, &wide(b), s))
    }
    fn lora_backward(
        &self,
        dx: Option<&mut Vec<f32>>,
        da: &mut Vec<f32>,
        db: &mut Vec<f32>,
        dt: &mut Vec<f32>,
        dy: &Vec<f32>,
        x: &Vec<f32>,
        t: &Vec<f32>,
        a: &Vec<f32>,
        b: &Vec<f32>,
        s: &LoraSpec,
    ) -> Result<()> {
        let mut sink;
        let dx = match dx {
            Some(dx) => dx,
            None => {
                sink = alloc::vec![0.0f32; s.x_offset + s.rows * s.d_in];
                &mut sink
            }
        };
        in_f64([dx, da, db, dt], |[dx, da, db, dt]| {
            lora::lora_backward(
                dx,
                da,
                db,
                dt,
                &wide(dy),
                &wide(x),
                &wide(t),
                &wide(a),
                &wide(b),
                s,
            )
        })
    }
    fn q8_matmul(
        &self,
        out: &mut Vec<f32>,
        x: &Vec<f32>,
        packed: &Vec<f32>,
        scales: &Vec<f32>,
        spec: &MatmulSpec,
    ) -> Result<()> {
        // Exact integer sums: no f64 detour needed.
        let (x, out) = q8::q8_operands(spec, x, out)?;
        q8::q8_matmul(out, x, packed, scales, spec.m, spec.n, spec.k, spec.beta)
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

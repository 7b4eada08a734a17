//! The reference backend: [`crate::ops`] in f32 on `Vec<f32>`, single-threaded. It is the
//! definition the other backends are tested against, and it runs anywhere `alloc` does.

use alloc::vec::Vec;

use crate::backend::*;
use crate::error::check_len;
use crate::ops::{
    activation, attention, cross_entropy, elementwise, embedding, l2norm, loss, matmul, optim, rmsnorm, rope,
    softmax, swiglu,
};
use crate::{Activation, Loss, Result};

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
        self.write(dst, src)
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
        activation::activation_forward(act, out, inp, rows, cols)
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
        activation::activation_backward(act, dinp, dout, inp, out, rows, cols)
    }
    fn loss_forward(
        &self,
        l: Loss,
        pred: &Vec<f32>,
        target: &Vec<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<f64> {
        loss::loss_forward(l, pred, target, rows, cols)
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
        loss::loss_backward(l, dpred, pred, target, rows, cols)
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
        loss::fused_output_backward(l, dlogits, pred, target, rows, cols)
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

//! `rusting_brain_portable`: a single-threaded CPU backend that needs nothing but `alloc`,
//! for WebAssembly (the browser's CPU path when there is no WebGPU) and any target
//! without threads.
//!
//! It runs `rusting_brain_core`'s own definitions of the primitives, in f32 directly on
//! the buffers: the reference backend runs the same functions on f64 copies, which makes
//! it exact but costs a copy and an allocation per call and halves what SIMD holds. The
//! products and attention run this crate's kernels instead (`kernels.rs`), built on two
//! inner loops (`dot.rs`): an f32 dot product on eight lanes that the compiler turns into
//! SIMD128 on wasm32, and an exact int8 dot product written with SIMD128 intrinsics there.
//! Every addition's order is fixed in the source, so a native build computes the same bits
//! as the browser does and the native tests speak for the page; the int8 products are
//! bit-identical to core's on every backend.
//!
//! ```
//! use rusting_brain_core::backend::MatmulSpec;
//! use rusting_brain_core::Backend;
//! use rusting_brain_portable::PortableBackend;
//!
//! let be = PortableBackend;
//! let a = be.upload(&[1.0, 2.0, 3.0, 4.0])?; // (2, 2)
//! let b = be.upload(&[1.0, 0.0, 0.0, 1.0])?; // identity
//! let mut c = be.zeros(4)?;
//! be.matmul(&mut c, &a, &b, &MatmulSpec::new(2, 2, 2))?;
//! assert_eq!(be.download(&c)?, vec![1.0, 2.0, 3.0, 4.0]);
//! # Ok::<(), rusting_brain_core::CoreError>(())
//! ```

#![cfg_attr(not(test), no_std)]
#![warn(missing_docs)]

extern crate alloc;

mod dot;
mod exp;
mod kernels;
mod rope;

use alloc::vec;
use alloc::vec::Vec;

use rusting_brain_core::backend::*;
use rusting_brain_core::error::{check_len, check_range};
use rusting_brain_core::ops::{
    activation, cross_entropy, elementwise, embedding, l2norm, lora, loss, moe, optim, q8, rmsnorm, softmax,
    swiglu,
};
use rusting_brain_core::{Activation, Loss, Result};

/// Core's math in f32 on one thread, with SIMD128 kernels for the products and attention
/// on wasm32; buffers are `Vec<f32>`.
#[derive(Debug, Clone, Copy, Default)]
pub struct PortableBackend;

impl Backend for PortableBackend {
    type Buffer = Vec<f32>;

    fn name(&self) -> &'static str {
        "portable"
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
        check_range("copy_range", "dst", dst.len(), dst_offset, len)?;
        check_range("copy_range", "src", src.len(), src_offset, len)?;
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
        kernels::matmul(c, a, b, spec)
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
        crate::rope::rope_forward(x, spec)
    }
    fn rope_backward(&self, dx: &mut Vec<f32>, spec: &RopeSpec) -> Result<()> {
        crate::rope::rope_backward(dx, spec)
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
        kernels::swiglu_forward(out, gate, up)
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
        kernels::attention_forward(out, lse, q, k, v, spec)
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
        rusting_brain_core::ops::attention::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, spec)
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
        lora::lora_down(t, x, a, s)?;
        lora::lora_up(y, t, b, s)
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
                sink = vec![0.0f32; s.x_offset + s.rows * s.d_in];
                &mut sink
            }
        };
        lora::lora_backward(dx, da, db, dt, dy, x, t, a, b, s)
    }
    fn q8_matmul(
        &self,
        out: &mut Vec<f32>,
        x: &Vec<f32>,
        packed: &Vec<f32>,
        scales: &Vec<f32>,
        spec: &MatmulSpec,
    ) -> Result<()> {
        let (x, out) = q8::q8_operands(spec, x, out)?;
        kernels::q8_matmul(out, x, packed, scales, spec.m, spec.n, spec.k, spec.beta)
    }
    fn q8_matmul_many(&self, x: &Vec<f32>, products: &mut [Q8Product<'_, Vec<f32>>]) -> Result<()> {
        // One activation row over all of `x` (a decode step's q, k and v): rounded once.
        // Anything else runs product by product.
        if !products.iter().all(|p| p.spec.one_row_of(x.len())) {
            return q8_matmul_each(self, x, products);
        }
        kernels::q8_matmul_many(x, products)
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
        if !spec.one_row_of(x.len()) {
            return q8_swiglu_unfused(self, out, gate, up, x, gate_w, up_w, spec);
        }
        kernels::q8_swiglu(out, gate, up, x, (gate_w.0, gate_w.1), (up_w.0, up_w.1), spec)
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

//! The q8 family on this backend.

use crate::kernels;
use crate::PortableBackend;
use alloc::vec::Vec;
use rusting_brain_core::backend::q8_matmul_each;
use rusting_brain_core::backend::q8_swiglu_unfused;
use rusting_brain_core::backend::MatmulSpec;
use rusting_brain_core::backend::Q8Ops;
use rusting_brain_core::backend::Q8Product;
use rusting_brain_core::ops::q8;
use rusting_brain_core::Result;

impl Q8Ops for PortableBackend {
    fn q8_matmul(
        &self, out: &mut Vec<f32>, x: &Vec<f32>, packed: &Vec<f32>, scales: &Vec<f32>, spec: &MatmulSpec,
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
        &self, out: &mut Vec<f32>, gate: &mut Vec<f32>, up: &mut Vec<f32>, x: &Vec<f32>,
        gate_w: (&Vec<f32>, &Vec<f32>), up_w: (&Vec<f32>, &Vec<f32>), spec: &MatmulSpec,
    ) -> Result<()> {
        if !spec.one_row_of(x.len()) {
            return q8_swiglu_unfused(self, out, gate, up, x, gate_w, up_w, spec);
        }
        kernels::q8_swiglu(out, gate, up, x, (gate_w.0, gate_w.1), (up_w.0, up_w.1), spec)
    }
    fn q8_embedding(
        &self, out: &mut Vec<f32>, packed: &Vec<f32>, scales: &Vec<f32>, ids: &[u32], vocab: usize,
        dim: usize,
    ) -> Result<()> {
        q8::q8_embedding(out, packed, scales, ids, vocab, dim)
    }
}

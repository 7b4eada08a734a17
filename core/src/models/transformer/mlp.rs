//! The SwiGLU feed-forward: forward and backward side by side.

use super::*;

/// A feed-forward's adapters in a forward pass: which rows take which, their `x A^T`
/// buffers, and the values a row of those holds.
pub(super) type MlpLoraFwd<'a, B> = (
    Vec<Rows<'a, Swiglu<Option<LoraPair<<B as Memory>::Buffer>>>>>,
    Swiglu<&'a mut Option<<B as Memory>::Buffer>>,
    usize,
);

/// A SwiGLU feed-forward over `n` rows, added to the stream:
/// `out += down(silu(gate(x)) * up(x))` (the residual add is the down projection's
/// `beta = 1`). `x`, `out`: `(n, d)`; `gate`, `up`, `s`: `(n, f)`, kept for the backward pass.
#[allow(clippy::too_many_arguments)]
pub(super) fn mlp_forward<B: Backend>(
    b: &B, w: &Swiglu<Mat<'_, B>>, x: &B::Buffer, out: &mut B::Buffer, [gate, up, s]: [&mut B::Buffer; 3],
    n: usize, d: usize, f: usize, prec: OperandPrecision, mut lora: Option<MlpLoraFwd<'_, B>>,
) -> Result<()> {
    let mm = |m, nn, k| MatmulSpec::new(m, nn, k).precision(prec);
    if let (Mat::Q8(pg, sg), Mat::Q8(pu, su), Mat::Q8(pd, sd), None) = (&w.gate, &w.up, &w.down, &lora) {
        // Int8 without adapters: the whole feed-forward in one call, which a backend may
        // run as one job.
        let spec = mm(n, f, d).trans_b(true);
        return b.q8_mlp(out, [gate, up, s], x, (pg, sg), (pu, su), (pd, sd), &spec);
    }
    match (&w.gate, &w.up, &lora) {
        // Int8 gating products without adapters (the down product in f32): the products
        // and the gating in one call, which a backend may run as one job.
        (Mat::Q8(pg, sg), Mat::Q8(pu, su), None) => {
            b.q8_swiglu(s, gate, up, x, (pg, sg), (pu, su), &mm(n, f, d).trans_b(true))?;
        }
        _ => {
            w.gate.apply(b, gate, x, mm(n, f, d))?;
            w.up.apply(b, up, x, mm(n, f, d))?;
            if let Some((g, lt, stride)) = &mut lora {
                adapt(b, g, |w| &w.gate, lt.gate, *stride, gate, x, d, f)?;
                adapt(b, g, |w| &w.up, lt.up, *stride, up, x, d, f)?;
            }
            b.swiglu_forward(s, gate, up)?;
        }
    }
    w.down.apply(b, out, s, mm(n, d, f).beta(1.0))?;
    if let Some((g, lt, stride)) = lora {
        adapt(b, &g, |w| &w.down, lt.down, stride, out, s, f, d)?;
    }
    Ok(())
}

/// The adapters of a feed-forward's backward pass: adapters, their gradients, the kept
/// `x A^T`, the `dt` scratch, and the shared settings.
pub(super) type MlpLora<'a, B> = (
    &'a Swiglu<Option<LoraPair<<B as Memory>::Buffer>>>,
    Swiglu<&'a mut Option<LoraPair<<B as Memory>::Buffer>>>,
    &'a Swiglu<Option<<B as Memory>::Buffer>>,
    &'a mut <B as Memory>::Buffer,
    LoraCtx,
);

/// Backward of [`mlp_forward`]: from `dout` `(n, d)`, accumulates the three weight
/// gradients into `g` (none when the weights are frozen) and the adapters' into theirs,
/// and writes `dx` `(n, d)`. `scratch` is `(ds, dgate, dup)`, `(n, f)`.
#[allow(clippy::too_many_arguments)]
pub(super) fn mlp_backward<B: Backend>(
    b: &B, p: &Swiglu<Mat<'_, B>>, g: Option<&mut Swiglu<B::Buffer>>, a: [&B::Buffer; 4], dout: &B::Buffer,
    dx: &mut B::Buffer, [ds, dgate, dup]: &mut [B::Buffer; 3], (n, d, f): (usize, usize, usize),
    prec: OperandPrecision, deq: &mut Dequant<B>, lora: Option<MlpLora<'_, B>>,
) -> Result<()> {
    let [x, gate, up, s] = a;
    let mm = |m, nn, k| MatmulSpec::new(m, nn, k).precision(prec);
    let mut lora = lora;
    // dWd += dout^T s; ds = dout Wd (+ the down adapter's part)
    let mut g = g;
    if let Some(g) = g.as_deref_mut() {
        b.matmul(&mut g.down, dout, s, &mm(d, f, n).trans_a(true).accumulate())?;
    }
    p.down.grad_input(b, ds, dout, mm(n, f, d), deq)?;
    if let Some((lw, lg, lt, dt, ctx)) = lora.as_mut() {
        adapt_backward(b, &lw.down, lg.down, &lt.down, dt, Some(ds), dout, s, ctx.spec(n, f, d))?;
    }
    b.swiglu_backward(dgate, dup, ds, gate, up)?;
    if let Some(g) = g {
        b.matmul(&mut g.gate, dgate, x, &mm(f, d, n).trans_a(true).accumulate())?;
        b.matmul(&mut g.up, dup, x, &mm(f, d, n).trans_a(true).accumulate())?;
    }
    p.gate.grad_input(b, dx, dgate, mm(n, d, f), deq)?;
    p.up.grad_input(b, dx, dup, mm(n, d, f).accumulate(), deq)?;
    if let Some((lw, lg, lt, dt, ctx)) = lora {
        adapt_backward(b, &lw.gate, lg.gate, &lt.gate, dt, Some(&mut *dx), dgate, x, ctx.spec(n, d, f))?;
        adapt_backward(b, &lw.up, lg.up, &lt.up, dt, Some(dx), dup, x, ctx.spec(n, d, f))?;
    }
    Ok(())
}

//! The mixture-of-experts feed-forward: routing, the experts' products and their combination, forward and backward side by side.

use super::*;

/// The routed experts' adapters in a forward pass.
pub(super) type MoeLoraFwd<'a, B> = (
    &'a Experts<Option<LoraPair<<B as Memory>::Buffer>>>,
    Experts<&'a mut Option<<B as Memory>::Buffer>>,
    LoraCtx,
);

/// The routed experts of a sparse block, added to the stream: each token's `top_k` expert
/// outputs, weighted by the router (see [`crate::ops::moe`]). Tokens are grouped by expert
/// (gather, then one product per expert over its rows, then a weighted scatter-add), so
/// an expert multiplies only the tokens routed to it and none is dropped. `x`, `out`:
/// `(n, d)`. The router runs in f32 whatever the GEMM precision: routing is a discrete
/// choice that bf16 rounding would flip.
#[allow(clippy::too_many_arguments)]
pub(super) fn moe_forward<B: Backend>(
    b: &B, w: &Experts<Mat<'_, B>>, m: &MoeConfig, a: &mut MoeActs<B>, x: &B::Buffer, out: &mut B::Buffer,
    n: usize, d: usize, prec: OperandPrecision, inference: bool, mut lora: Option<MoeLoraFwd<'_, B>>,
) -> Result<()> {
    let (e_n, k, fe) = (m.n_experts, m.top_k, m.expert_d_ff);
    let mm = |rows, nn, kk| MatmulSpec::new(rows, nn, kk).precision(prec);
    w.router.apply(b, &mut a.logits, x, MatmulSpec::new(n, e_n, d))?;
    // Adapted experts need their rows grouped (an adapter's product runs on a window).
    let adapted = lora.as_ref().is_some_and(|(lw, _, _)| {
        lw.experts.iter().any(|e| e.gate.is_some() || e.up.is_some() || e.down.is_some())
    });
    if let (true, false, Some(experts)) = (inference, adapted, routed_on_device(b, w)) {
        // Slot order throughout: nothing is counted, so nothing is read back.
        let slots = n * k;
        b.moe_route(&mut a.slot_expert, &mut a.slot_weight, &a.logits, n, e_n, k, m.renormalize)?;
        let spec = |nn, kk, x_per_token| RoutedSpec { slots, n: nn, k: kk, top_k: k, x_per_token };
        b.q8_matmul_routed(&mut a.gate, x, &experts[0], &a.slot_expert, &spec(fe, d, true))?;
        b.q8_matmul_routed(&mut a.up, x, &experts[1], &a.slot_expert, &spec(fe, d, true))?;
        b.swiglu_forward(&mut a.s, &a.gate, &a.up)?;
        b.q8_matmul_routed(&mut a.y, &a.s, &experts[2], &a.slot_expert, &spec(d, fe, false))?;
        return b.moe_combine_slots(out, &a.y, &a.slot_weight, k, d);
    }
    let logits = b.download(&a.logits)?;
    a.routing.route(&logits, n, e_n, k, m.renormalize)?;
    let r = &a.routing;
    // Gather: xe[row] = x[token_of_row[row]], an embedding lookup with x as the table.
    b.embedding_forward(&mut a.xe, x, &r.token_of_row, n, d)?;
    for (e, ex) in w.experts.iter().enumerate() {
        let (o, c) = r.rows(e);
        if c > 0 {
            ex.gate.apply(b, &mut a.gate, &a.xe, mm(c, fe, d).window(o * d, 0, o * fe))?;
            ex.up.apply(b, &mut a.up, &a.xe, mm(c, fe, d).window(o * d, 0, o * fe))?;
            if let Some((lw, lt, ctx)) = &mut lora {
                let spec = ctx.spec(c, d, fe).offsets(o * d, o * fe, o * ctx.rank);
                adapt_with(b, &lw.experts[e].gate, lt.experts[e].gate, &mut a.gate, &a.xe, spec)?;
                adapt_with(b, &lw.experts[e].up, lt.experts[e].up, &mut a.up, &a.xe, spec)?;
            }
        }
    }
    b.swiglu_forward(&mut a.s, &a.gate, &a.up)?;
    for (e, ex) in w.experts.iter().enumerate() {
        let (o, c) = r.rows(e);
        if c > 0 {
            ex.down.apply(b, &mut a.y, &a.s, mm(c, d, fe).window(o * fe, 0, o * d))?;
            if let Some((lw, lt, ctx)) = &mut lora {
                let spec = ctx.spec(c, fe, d).offsets(o * fe, o * d, o * ctx.rank);
                adapt_with(b, &lw.experts[e].down, lt.experts[e].down, &mut a.y, &a.s, spec)?;
            }
        }
    }
    b.moe_combine(out, &a.y, &r.row_of_slot, &r.weight, k, d)
}

/// The experts' int8 (packed, scales) as `[gate, up, down]` lists, when an inference pass
/// routes them on the backend's buffers: the backend says it does
/// ([`MoeOps::routes_on_device`](crate::backend::MoeOps::routes_on_device)) and every expert is int8. `None`: group on the host.
#[allow(clippy::type_complexity)]
pub(super) fn routed_on_device<'a, B: Backend>(
    b: &B, w: &Experts<Mat<'a, B>>,
) -> Option<[Vec<(&'a B::Buffer, &'a B::Buffer)>; 3]> {
    if !b.routes_on_device() {
        return None;
    }
    let mut lists: [Vec<(&'a B::Buffer, &'a B::Buffer)>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    for ex in &w.experts {
        for (list, mat) in lists.iter_mut().zip([&ex.gate, &ex.up, &ex.down]) {
            match *mat {
                Mat::Q8(p, s) => list.push((p, s)),
                Mat::F32(_) => return None,
            }
        }
    }
    Some(lists)
}

/// The experts' adapters in a backward pass, as [`MlpLora`] is for one feed-forward.
pub(super) type MoeLora<'a, B> = (
    &'a Experts<Option<LoraPair<<B as Memory>::Buffer>>>,
    Experts<&'a mut Option<LoraPair<<B as Memory>::Buffer>>>,
    &'a Experts<Option<<B as Memory>::Buffer>>,
    &'a mut <B as Memory>::Buffer,
    LoraCtx,
);

/// Backward of [`moe_forward`]: from `dout` `(n, d)`, accumulates the experts' and the
/// router's gradients into `g` (none when frozen) and the adapters' into theirs, and
/// *adds* the input gradient into `dx` `(n, d)`. The router's gradient includes
/// `lb_scale` times the load-balancing loss and `z_scale` times the z-loss. `dxe`
/// `(n * top_k, d)` and `dlogits` `(n, n_experts)` are scratch, and `ffn` is
/// `(ds, dgate, dup)` of `(n * top_k, expert_d_ff)`.
#[allow(clippy::too_many_arguments)]
pub(super) fn moe_backward<B: Backend>(
    b: &B, p: &Experts<Mat<'_, B>>, g: Option<&mut Experts<B::Buffer>>, m: &MoeConfig, a: &MoeActs<B>,
    x: &B::Buffer, dout: &B::Buffer, dx: &mut B::Buffer, dxe: &mut B::Buffer, dlogits: &mut B::Buffer,
    [ds, dgate, dup]: &mut [B::Buffer; 3], (n, d): (usize, usize), prec: OperandPrecision,
    (lb_scale, z_scale): (f32, f32), deq: &mut Dequant<B>, lora: Option<MoeLora<'_, B>>,
) -> Result<()> {
    let (e_n, k, fe) = (m.n_experts, m.top_k, m.expert_d_ff);
    let mm = |rows, nn, kk| MatmulSpec::new(rows, nn, kk).precision(prec);
    let r = &a.routing;
    let mut g = g;
    let mut lora = lora;
    // dy[row] = weight * dout[token] (into dxe), and each slot's weight gradient.
    let dweight = b.moe_combine_backward(dxe, dout, &a.y, &r.row_of_slot, &r.weight, k, d)?;
    for e in 0..e_n {
        let (o, c) = r.rows(e);
        if c > 0 {
            // dWd_e += dy_e^T s_e; ds_e = dy_e Wd_e (+ the adapter's part)
            if let Some(g) = g.as_deref_mut() {
                let acc = mm(d, fe, c).trans_a(true).accumulate().window(o * d, o * fe, 0);
                b.matmul(&mut g.experts[e].down, dxe, &a.s, &acc)?;
            }
            let into = mm(c, fe, d).window(o * d, 0, o * fe);
            p.experts[e].down.grad_input(b, ds, dxe, into, deq)?;
            if let Some((lw, lg, lt, dt, ctx)) = lora.as_mut() {
                let spec = ctx.spec(c, fe, d).offsets(o * fe, o * d, o * ctx.rank);
                let (w, gr, t) = (&lw.experts[e].down, &mut *lg.experts[e].down, &lt.experts[e].down);
                adapt_backward(b, w, gr, t, dt, Some(&mut *ds), dxe, &a.s, spec)?;
            }
        }
    }
    b.swiglu_backward(dgate, dup, ds, &a.gate, &a.up)?;
    for e in 0..e_n {
        let (o, c) = r.rows(e);
        if c > 0 {
            if let Some(g) = g.as_deref_mut() {
                let acc = mm(fe, d, c).trans_a(true).accumulate().window(o * fe, o * d, 0);
                b.matmul(&mut g.experts[e].gate, dgate, &a.xe, &acc)?;
                b.matmul(&mut g.experts[e].up, dup, &a.xe, &acc)?;
            }
            // dxe_e = dgate_e Wg_e + dup_e Wu_e (dy is spent: its rows are reused)
            let into = mm(c, d, fe).window(o * fe, 0, o * d);
            p.experts[e].gate.grad_input(b, dxe, dgate, into, deq)?;
            p.experts[e].up.grad_input(b, dxe, dup, into.accumulate(), deq)?;
            if let Some((lw, lg, lt, dt, ctx)) = lora.as_mut() {
                let spec = ctx.spec(c, d, fe).offsets(o * d, o * fe, o * ctx.rank);
                let ex = &lw.experts[e];
                adapt_backward(
                    b,
                    &ex.gate,
                    lg.experts[e].gate,
                    &lt.experts[e].gate,
                    dt,
                    Some(&mut *dxe),
                    dgate,
                    &a.xe,
                    spec,
                )?;
                adapt_backward(
                    b,
                    &ex.up,
                    lg.experts[e].up,
                    &lt.experts[e].up,
                    dt,
                    Some(&mut *dxe),
                    dup,
                    &a.xe,
                    spec,
                )?;
            }
        }
    }
    // Scatter-add: dx[token_of_row[row]] += dxe[row], the embedding gradient with x as table.
    b.embedding_backward(dx, dxe, &r.token_of_row, n, d)?;
    let mut dl = alloc::vec![0.0f32; n * e_n];
    r.backward(&mut dl, &dweight, lb_scale, z_scale)?;
    b.write(dlogits, &dl)?;
    if let Some(g) = g {
        b.matmul(&mut g.router, dlogits, x, &MatmulSpec::new(e_n, d, n).trans_a(true).accumulate())?;
    }
    p.router.grad_input(b, dx, dlogits, MatmulSpec::new(n, d, e_n).accumulate(), deq)
}

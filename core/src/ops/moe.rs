//! Mixture-of-experts routing, its auxiliary losses, and the weighted combine of the
//! experts' outputs.
//!
//! A router gives each token `n_experts` logits. Softmax turns them into probabilities, each
//! token goes to its `top_k` most probable experts (ties to the lower index), and the
//! expert outputs are summed with the chosen probabilities as weights — renormalized to sum
//! to one over the `top_k` when [`Routing::route`] is asked to (Mixtral, Qwen-MoE's
//! `norm_topk_prob`). Routing is dropless: every token reaches every expert it chose, with
//! no capacity limit.
//!
//! Two auxiliary losses keep the router healthy, each computed per MoE layer:
//! - load balance (Switch Transformer): `n_experts * sum_i f_i * P_i`, with `f_i` the
//!   fraction of the `n * top_k` routed slots that went to expert `i` (a count, no gradient)
//!   and `P_i` the mean router probability of expert `i` (carries the gradient). It is 1 for
//!   a perfectly even split and `n_experts / top_k` at worst (every token sends its `top_k`
//!   slots to the same experts and puts all its probability there).
//! - router z-loss (ST-MoE): `mean_t logsumexp(logits_t)^2`, which keeps the logits small.
//!
//! The routing decisions are made on the host: they are `n * n_experts` numbers, and the
//! per-expert products that follow need each expert's row count anyway. Computed in f64
//! internally so every backend, given the same logits, routes the same way.

use alloc::vec::Vec;

use crate::backend::Memory;
use crate::error::{check_len, nonzero, product};
use crate::reference::in_f64;
use crate::reference::wide;
use crate::reference::ReferenceBackend;
use crate::{CoreError, Real, Result};

/// How one batch of `n` tokens is routed, and the quantities its backward pass needs.
///
/// Grouped order: the `n * top_k` (token, slot) pairs sorted by expert, tokens ascending
/// within an expert; expert `e` owns rows `offsets[e]..offsets[e + 1]` of the grouped
/// buffers. Slot order: row-major `(n, top_k)`, best choice first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Routing {
    /// Tokens routed.
    pub tokens: usize,
    /// Experts.
    pub n_experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// The chosen experts' weights renormalized to sum to 1.
    pub renormalize: bool,
    /// Router probabilities, `(n, n_experts)`.
    pub probs: Vec<f32>,
    /// `logsumexp` of each token's logits, `(n)`.
    pub lse: Vec<f32>,
    /// Chosen expert per slot, `(n, top_k)`.
    pub expert: Vec<u32>,
    /// Combine weight per slot, `(n, top_k)`.
    pub weight: Vec<f32>,
    /// Token of each grouped row, `(n * top_k)`.
    pub token_of_row: Vec<u32>,
    /// Grouped row of each slot, `(n * top_k)`: the inverse of the grouping.
    pub row_of_slot: Vec<u32>,
    /// `n_experts + 1` row offsets into the grouped buffers.
    pub offsets: Vec<usize>,
    /// This batch's load-balancing loss (see the module docs).
    pub load_balance: f64,
    /// This batch's router z-loss.
    pub z_loss: f64,
}

impl Routing {
    /// Rows of expert `e` in the grouped buffers: `(first row, count)`.
    pub fn rows(&self, e: usize) -> (usize, usize) {
        (self.offsets[e], self.offsets[e + 1] - self.offsets[e])
    }

    /// Fraction of the routed slots each expert received.
    pub fn usage(&self) -> Vec<f64> {
        let slots = (self.tokens * self.top_k).max(1) as f64;
        (0..self.n_experts).map(|e| self.rows(e).1 as f64 / slots).collect()
    }

    /// Routes `n` tokens from their router `logits` `(n, n_experts)`, reusing this value's
    /// storage. Non-finite logits are an error (a diverged router).
    pub fn route(
        &mut self, logits: &[f32], n: usize, n_experts: usize, top_k: usize, renormalize: bool,
    ) -> Result<()> {
        const OP: &str = "moe route";
        nonzero(OP, "n_experts", n_experts)?;
        if top_k == 0 || top_k > n_experts {
            return Err(CoreError::InvalidDimension {
                op: OP,
                message: alloc::format!("top_k {top_k} must be between 1 and n_experts {n_experts}"),
            });
        }
        check_len(OP, "logits", logits.len(), product(OP, &[n, n_experts])?)?;
        if let Some(&v) = logits.iter().find(|v| !v.is_finite()) {
            return Err(CoreError::NonFinite { op: OP, value: v as f64 });
        }
        self.tokens = n;
        self.n_experts = n_experts;
        self.top_k = top_k;
        self.renormalize = renormalize;
        let (e_n, k) = (n_experts, top_k);
        self.probs.clear();
        self.lse.clear();
        self.expert.clear();
        self.weight.clear();
        let mut counts = alloc::vec![0usize; e_n];
        let mut prob_sum = alloc::vec![0.0f64; e_n];
        let mut z = 0.0f64;
        let mut p = alloc::vec![0.0f64; e_n];
        let mut chosen: Vec<usize> = Vec::with_capacity(k);
        for t in 0..n {
            let row = &logits[t * e_n..(t + 1) * e_n];
            let max = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            let mut sum = 0.0;
            for (pi, &v) in p.iter_mut().zip(row) {
                *pi = libm::exp(v as f64 - max);
                sum += *pi;
            }
            let lse = max + libm::log(sum);
            z += lse * lse;
            self.lse.push(lse as f32);
            for (i, pi) in p.iter_mut().enumerate() {
                *pi /= sum;
                prob_sum[i] += *pi;
                self.probs.push(*pi as f32);
            }
            // Top-k by repeated selection: k is small, and ties go to the lower index.
            chosen.clear();
            for _ in 0..k {
                let mut best = usize::MAX;
                for i in 0..e_n {
                    if !chosen.contains(&i) && (best == usize::MAX || p[i] > p[best]) {
                        best = i;
                    }
                }
                chosen.push(best);
            }
            let norm: f64 = if renormalize { chosen.iter().map(|&i| p[i]).sum() } else { 1.0 };
            for &i in &chosen {
                counts[i] += 1;
                self.expert.push(i as u32);
                self.weight.push((p[i] / norm) as f32);
            }
        }
        // Group the slots by expert with a counting sort (stable: tokens stay in order).
        self.offsets.clear();
        self.offsets.push(0);
        for e in 0..e_n {
            let last = self.offsets[e];
            self.offsets.push(last + counts[e]);
        }
        let mut next = self.offsets.clone();
        self.token_of_row.clear();
        self.token_of_row.resize(n * k, 0);
        self.row_of_slot.clear();
        self.row_of_slot.resize(n * k, 0);
        for (slot, &e) in self.expert.iter().enumerate() {
            let row = next[e as usize];
            next[e as usize] += 1;
            self.token_of_row[row] = (slot / k) as u32;
            self.row_of_slot[slot] = row as u32;
        }
        let slots = (n * k).max(1) as f64;
        let tokens = n.max(1) as f64;
        self.load_balance =
            e_n as f64 * (0..e_n).map(|i| counts[i] as f64 / slots * prob_sum[i] / tokens).sum::<f64>();
        self.z_loss = z / tokens;
        Ok(())
    }

    /// The gradient with respect to the router logits `(n, n_experts)` (overwritten), from
    /// the gradient of each slot's combine weight `dweight` `(n, top_k)`, plus `lb_scale`
    /// times the load-balancing loss and `z_scale` times the z-loss.
    pub fn backward(&self, dlogits: &mut [f32], dweight: &[f32], lb_scale: f32, z_scale: f32) -> Result<()> {
        const OP: &str = "moe route backward";
        let (n, e_n, k) = (self.tokens, self.n_experts, self.top_k);
        check_len(OP, "dlogits", dlogits.len(), n * e_n)?;
        check_len(OP, "dweight", dweight.len(), n * k)?;
        let slots = (n * k).max(1) as f64;
        let tokens = n.max(1) as f64;
        // d(load balance)/dP_i = n_experts * f_i, and P_i is a mean over tokens.
        let dlb: Vec<f64> =
            (0..e_n).map(|i| lb_scale as f64 * e_n as f64 * self.rows(i).1 as f64 / slots / tokens).collect();
        let mut dp = alloc::vec![0.0f64; e_n];
        for t in 0..n {
            let p = &self.probs[t * e_n..(t + 1) * e_n];
            dp.copy_from_slice(&dlb);
            let slots_t = t * k..(t + 1) * k;
            let (experts, weights, dw) =
                (&self.expert[slots_t.clone()], &self.weight[slots_t.clone()], &dweight[slots_t]);
            if self.renormalize {
                // w_j = p_j / S over the chosen: dp_j = (dw_j - sum_i dw_i w_i) / S.
                let s: f64 = experts.iter().map(|&e| p[e as usize] as f64).sum();
                let dot: f64 = dw.iter().zip(weights).map(|(&a, &b)| a as f64 * b as f64).sum();
                for (&e, &g) in experts.iter().zip(dw) {
                    dp[e as usize] += (g as f64 - dot) / s;
                }
            } else {
                for (&e, &g) in experts.iter().zip(dw) {
                    dp[e as usize] += g as f64;
                }
            }
            // Softmax backward, then the z-loss term: d(lse^2)/dx_i = 2 lse p_i.
            let pdp: f64 = p.iter().zip(&dp).map(|(&a, &b)| a as f64 * b).sum();
            let zg = z_scale as f64 * 2.0 * self.lse[t] as f64 / tokens;
            for i in 0..e_n {
                let pi = p[i] as f64;
                dlogits[t * e_n + i] = (pi * (dp[i] - pdp) + zg * pi) as f32;
            }
        }
        Ok(())
    }
}

/// The shape contract of the combine ops: `out (n, dim)`, `y (n * top_k, dim)`,
/// `row_of_slot` and `weight` `(n * top_k)`, every row index inside `y`.
pub fn check_combine(
    op: &'static str, out: usize, y: usize, row_of_slot: &[u32], weight: &[f32], top_k: usize, dim: usize,
) -> Result<usize> {
    nonzero(op, "dim", dim)?;
    nonzero(op, "top_k", top_k)?;
    let slots = row_of_slot.len();
    if !slots.is_multiple_of(top_k) {
        return Err(CoreError::InvalidDimension {
            op,
            message: alloc::format!("{slots} slots is not a multiple of top_k {top_k}"),
        });
    }
    let n = slots / top_k;
    check_len(op, "weight", weight.len(), slots)?;
    check_len(op, "out", out, product(op, &[n, dim])?)?;
    check_len(op, "y", y, product(op, &[slots, dim])?)?;
    crate::ops::embedding::check_ids(op, row_of_slot, slots)?;
    Ok(n)
}

/// `out[t] += sum_j weight[t, j] * y[row_of_slot[t, j]]`: the experts' outputs, weighted,
/// back in token order. `out (n, dim)`, `y (n * top_k, dim)` in grouped order.
pub fn moe_combine<T: Real>(
    out: &mut [T], y: &[T], row_of_slot: &[u32], weight: &[f32], top_k: usize, dim: usize,
) -> Result<()> {
    let n = check_combine("moe_combine", out.len(), y.len(), row_of_slot, weight, top_k, dim)?;
    for t in 0..n {
        for j in 0..top_k {
            let slot = t * top_k + j;
            let (r, w) = (row_of_slot[slot] as usize, T::from_f32(weight[slot]));
            for c in 0..dim {
                out[t * dim + c] += w * y[r * dim + c];
            }
        }
    }
    Ok(())
}

/// Backward of [`moe_combine`]: `dy[row] = weight * dout[token]` (overwritten), and the
/// gradient of each slot's weight, `dout[token] . y[row]`, returned in slot order.
pub fn moe_combine_backward<T: Real>(
    dy: &mut [T], dout: &[T], y: &[T], row_of_slot: &[u32], weight: &[f32], top_k: usize, dim: usize,
) -> Result<Vec<f32>> {
    const OP: &str = "moe_combine_backward";
    let n = check_combine(OP, dout.len(), y.len(), row_of_slot, weight, top_k, dim)?;
    check_len(OP, "dy", dy.len(), y.len())?;
    let mut dweight = alloc::vec![0.0f32; n * top_k];
    for t in 0..n {
        for j in 0..top_k {
            let slot = t * top_k + j;
            let (r, w) = (row_of_slot[slot] as usize, T::from_f32(weight[slot]));
            let mut dot = T::ZERO;
            for c in 0..dim {
                let g = dout[t * dim + c];
                dy[r * dim + c] = w * g;
                dot += g * y[r * dim + c];
            }
            dweight[slot] = dot.to_f32();
        }
    }
    Ok(dweight)
}

/// The shape of [`q8_matmul_routed`]: `slots` routed slots (`n_tokens * top_k`), each an
/// `(n x k)` product with its own expert's int8 weight. `x_per_token`: slot `s` reads
/// activation row `s / top_k` (the gate and up projections, whose input is the token's
/// row), else row `s` (the down projection, whose input is the slot's own hidden row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoutedSpec {
    /// Routed slots.
    pub slots: usize,
    /// Output columns of each product.
    pub n: usize,
    /// The summed dimension.
    pub k: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Slot `s` reads activation row `s / top_k`.
    pub x_per_token: bool,
}

impl RoutedSpec {
    /// Rows of `x` the product reads.
    pub fn x_rows(&self) -> usize {
        if self.x_per_token {
            self.slots.div_ceil(self.top_k.max(1))
        } else {
            self.slots
        }
    }

    /// Checks the operands' lengths: `out (slots, n)`, `x (x_rows, k)`, `expert (slots)`
    /// and every expert's `(n, k)` packed weight and its scales (per row or per block).
    pub fn check(&self, out: usize, x: usize, expert: usize, weights: &[(usize, usize)]) -> Result<()> {
        const OP: &str = "q8_matmul_routed";
        nonzero(OP, "top_k", self.top_k)?;
        nonzero(OP, "experts", weights.len())?;
        if !self.slots.is_multiple_of(self.top_k) {
            return Err(CoreError::InvalidDimension {
                op: OP,
                message: alloc::format!("{} slots is not a multiple of top_k {}", self.slots, self.top_k),
            });
        }
        check_len(OP, "out", out, product(OP, &[self.slots, self.n])?)?;
        check_len(OP, "x", x, product(OP, &[self.x_rows(), self.k])?)?;
        check_len(OP, "expert", expert, self.slots)?;
        let pc = crate::ops::q8::packed_cols(self.k);
        for &(packed, scales) in weights {
            check_len(OP, "packed weight", packed, product(OP, &[self.n, pc])?)?;
            crate::ops::q8::q8_block(OP, self.n, self.k, scales)?;
        }
        Ok(())
    }
}

/// Routing decided where the logits are, for inference: each slot's expert (as the bits of
/// a `u32`, `f32::from_bits`, so a device keeps it in the same buffer type) and combine
/// weight, `(n, top_k)` in rank order, exactly as [`Routing::route`] chooses them.
#[allow(clippy::too_many_arguments)]
pub fn route_slots(
    expert: &mut [f32], weight: &mut [f32], logits: &[f32], n: usize, n_experts: usize, top_k: usize,
    renormalize: bool,
) -> Result<()> {
    let mut r = Routing::default();
    r.route(logits, n, n_experts, top_k, renormalize)?;
    check_len("route_slots", "expert", expert.len(), n * top_k)?;
    check_len("route_slots", "weight", weight.len(), n * top_k)?;
    for (o, &e) in expert.iter_mut().zip(&r.expert) {
        *o = f32::from_bits(e);
    }
    weight.copy_from_slice(&r.weight);
    Ok(())
}

/// `out[s] = x[row(s)] W_e^T` for every slot `s`, `e = expert[s]` (the bits of a `u32`,
/// as [`route_slots`] writes them) and `W_e` the int8 `experts[e]` (packed, scales): the
/// routed experts' products slot by slot, with no grouping and so nothing for the host to
/// count. Each product is [`crate::ops::q8::q8_matmul`] on one row, so the values are
/// those of the grouped path bit for bit.
pub fn q8_matmul_routed(
    out: &mut [f32], x: &[f32], experts: &[(&[f32], &[f32])], expert: &[f32], spec: &RoutedSpec,
) -> Result<()> {
    let lens: Vec<(usize, usize)> = experts.iter().map(|(p, s)| (p.len(), s.len())).collect();
    spec.check(out.len(), x.len(), expert.len(), &lens)?;
    let (n, k) = (spec.n, spec.k);
    for s in 0..spec.slots {
        let e = expert[s].to_bits() as usize;
        let &(packed, scales) = experts.get(e).ok_or_else(|| CoreError::InvalidArgument {
            op: "q8_matmul_routed",
            message: alloc::format!("slot {s} names expert {e} of {}", experts.len()),
        })?;
        let xr = if spec.x_per_token { s / spec.top_k } else { s };
        crate::ops::q8::q8_matmul(
            &mut out[s * n..(s + 1) * n],
            &x[xr * k..(xr + 1) * k],
            packed,
            scales,
            1,
            n,
            k,
            0.0,
        )?;
    }
    Ok(())
}

/// Mixture-of-experts routing and combining: see [`crate::ops::moe`].
pub trait MoeOps: Memory {
    /// `out[t] += sum_j weight[t, j] * y[row_of_slot[t, j]]`; `out (n, dim)`,
    /// `y (n * top_k, dim)`. Host-side routing tables, like token ids.
    fn moe_combine(
        &self, out: &mut Self::Buffer, y: &Self::Buffer, row_of_slot: &[u32], weight: &[f32], top_k: usize,
        dim: usize,
    ) -> Result<()>;
    /// `dy` overwritten; returns the gradient of each slot's weight on the host.
    #[allow(clippy::too_many_arguments)]
    fn moe_combine_backward(
        &self, dy: &mut Self::Buffer, dout: &Self::Buffer, y: &Self::Buffer, row_of_slot: &[u32],
        weight: &[f32], top_k: usize, dim: usize,
    ) -> Result<Vec<f32>>;
    /// Whether an int8 model's inference routes its experts on this backend's buffers
    /// ([`MoeOps::moe_route`], [`MoeOps::q8_matmul_routed`], [`MoeOps::moe_combine_slots`])
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
        &self, expert: &mut Self::Buffer, weight: &mut Self::Buffer, logits: &Self::Buffer, n: usize,
        n_experts: usize, top_k: usize, renormalize: bool,
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
        &self, out: &mut Self::Buffer, x: &Self::Buffer, experts: &[(&Self::Buffer, &Self::Buffer)],
        expert: &Self::Buffer, spec: &RoutedSpec,
    ) -> Result<()> {
        let host: Vec<(Vec<f32>, Vec<f32>)> =
            experts.iter().map(|(p, s)| Ok((self.download(p)?, self.download(s)?))).collect::<Result<_>>()?;
        let views: Vec<(&[f32], &[f32])> = host.iter().map(|(p, s)| (&p[..], &s[..])).collect();
        let mut o = alloc::vec![0.0; self.len(out)];
        let (x, expert) = (self.download(x)?, self.download(expert)?);
        crate::ops::moe::q8_matmul_routed(&mut o, &x, &views, &expert, spec)?;
        self.write(out, &o)
    }
    /// `out[t] += sum_j weight[t, j] * y[t * top_k + j]`: [`MoeOps::moe_combine`] with the
    /// expert outputs in slot order and the weights on the backend.
    fn moe_combine_slots(
        &self, out: &mut Self::Buffer, y: &Self::Buffer, weight: &Self::Buffer, top_k: usize, dim: usize,
    ) -> Result<()> {
        let w = self.download(weight)?;
        let rows: Vec<u32> = (0..w.len() as u32).collect();
        self.moe_combine(out, y, &rows, &w, top_k, dim)
    }
}

impl MoeOps for ReferenceBackend {
    fn moe_combine(
        &self, out: &mut Vec<f32>, y: &Vec<f32>, row_of_slot: &[u32], weight: &[f32], top_k: usize,
        dim: usize,
    ) -> Result<()> {
        in_f64([out], |[o]| moe_combine(o, &wide(y), row_of_slot, weight, top_k, dim))
    }
    fn moe_combine_backward(
        &self, dy: &mut Vec<f32>, dout: &Vec<f32>, y: &Vec<f32>, row_of_slot: &[u32], weight: &[f32],
        top_k: usize, dim: usize,
    ) -> Result<Vec<f32>> {
        in_f64([dy], |[d]| moe_combine_backward(d, &wide(dout), &wide(y), row_of_slot, weight, top_k, dim))
    }
}

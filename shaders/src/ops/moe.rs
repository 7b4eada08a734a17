//! Mixture-of-experts routing, expert products and the weighted combine (`moe_route.wgsl`,
//! `q8_expert.wgsl`, `moe_combine.wgsl`, `moe_combine_backward.wgsl`); twin of
//! `rusting_brain_core::ops::moe`.

use super::*;
use crate::backend::WgpuBackend;
use crate::GpuBuffer;
use rusting_brain_core::backend::MoeOps;
use rusting_brain_core::backend::RoutedSpec;
use rusting_brain_core::error::check_len;
use rusting_brain_core::CoreError;
use rusting_brain_core::Result;

const MOE_ROUTE: Kernel = kernel!(
    "moe_route",
    { rows: u32, n_experts: u32, top_k: u32, renormalize: u32 },
    [read logits: f32, read_write expert: u32, read_write weight: f32]
);
const Q8_EXPERT: Kernel = kernel!(
    "q8_expert",
    { slots: u32, n: u32, packed_cols: u32, top_k: u32, x_per_token: u32, only: u32, blocks: u32, block: u32 },
    [read xq: u32, read xs: f32, read w: u32, read ws: f32, read expert: u32,
         read_write out: f32], prelude "int8"
);
const MOE_COMBINE: Kernel = kernel!(
    "moe_combine",
    { rows: u32, dim: u32, top_k: u32, pad: u32 },
    [read row_of_slot: u32, read weight: f32, read y: f32, read_write x: f32]
);
const MOE_COMBINE_BACKWARD: Kernel = kernel!(
    "moe_combine_backward",
    { slots: u32, dim: u32, top_k: u32, pad: u32 },
    [read row_of_slot: u32, read weight: f32, read dout: f32, read y: f32, read_write dy: f32,
         read_write dweight: f32]
);

/// The kernels this family dispatches (gathered in `ops::KERNELS`).
pub(super) const KERNELS: &[Kernel] = &[MOE_ROUTE, Q8_EXPERT, MOE_COMBINE, MOE_COMBINE_BACKWARD];

impl Batch<'_> {
    /// Backward of [`Batch::moe_combine`] over `slots = rows * top_k`: `dy[row] = weight *
    /// dout[token]` (overwritten) and each slot's weight gradient into `dweight`.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_combine_backward(
        &mut self, dy: &GpuBuffer, dweight: &GpuBuffer, row_of_slot: &GpuBuffer, weight: &GpuBuffer,
        dout: &GpuBuffer, y: &GpuBuffer, (rows, dim, top_k): (usize, usize, usize),
    ) -> Result<(), ShaderError> {
        const OP: &str = "moe_combine_backward";
        let slots = rows * top_k;
        need(OP, "row_of_slot", row_of_slot, slots)?;
        need(OP, "weight", weight, slots)?;
        need(OP, "dweight", dweight, slots)?;
        need(OP, "dout", dout, rows * dim)?;
        need(OP, "y", y, slots * dim)?;
        need(OP, "dy", dy, slots * dim)?;
        if slots == 0 {
            return Ok(());
        }
        let p = [u(slots, "slots")?, u(dim, "dim")?, u(top_k, "top_k")?];
        self.dispatch(&MOE_COMBINE_BACKWARD, &p, &[row_of_slot, weight, dout, y, dy, dweight], grid(slots))?;
        Ok(())
    }

    /// Mixture-of-experts routing of `rows` tokens: softmax of `logits` (rows x n_experts),
    /// top-k, optional renormalization; writes `expert` (u32) and `weight` per slot
    /// (rows x top_k, rank order).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_route(
        &mut self, expert: &GpuBuffer, weight: &GpuBuffer, logits: &GpuBuffer, rows: usize, n_experts: usize,
        top_k: usize, renormalize: bool,
    ) -> Result<(), ShaderError> {
        const OP: &str = "moe_route";
        if n_experts == 0 || n_experts > 256 || top_k == 0 || top_k > n_experts {
            return Err(ShaderError::Invalid(format!(
                "{OP}: {n_experts} experts, top {top_k}: the GPU router takes 1..=256 experts and 1..=n_experts of them"
            )));
        }
        need(OP, "logits", logits, rows * n_experts)?;
        need(OP, "expert", expert, rows * top_k)?;
        need(OP, "weight", weight, rows * top_k)?;
        if rows == 0 {
            return Ok(());
        }
        let p = [u(rows, "rows")?, u(n_experts, "experts")?, u(top_k, "top_k")?, renormalize as u32];
        self.dispatch(&MOE_ROUTE, &p, &[logits, expert, weight], grid(rows.div_ceil(WG)))?;
        Ok(())
    }

    /// The int8 products of the slots whose expert is `only` with that expert's weight `w`
    /// (n rows of packed_cols(k)): rows of `out (slots x n)`; the other slots' rows are
    /// left alone. `x_per_token`: slot s reads activation row s / top_k (else row s).
    #[allow(clippy::too_many_arguments)]
    pub fn q8_expert(
        &mut self, out: &GpuBuffer, xq: &GpuBuffer, xs: &GpuBuffer, w: &GpuBuffer, ws: &GpuBuffer,
        expert: &GpuBuffer, (slots, n, k, top_k): (usize, usize, usize, usize), x_per_token: bool,
        only: usize,
    ) -> Result<(), ShaderError> {
        const OP: &str = "q8_expert";
        let pc = packed_cols(k);
        let block = rusting_brain_core::ops::q8::q8_block(OP, n, k, ws.len())
            .map_err(|e| ShaderError::Invalid(e.to_string()))?;
        let nb = k.div_ceil(block);
        let x_rows = if x_per_token { slots.div_ceil(top_k.max(1)) } else { slots };
        need(OP, "xq", xq, x_rows * super::q8::activation_words(k, nb))?;
        need(OP, "xs", xs, x_rows * nb)?;
        need(OP, "expert", expert, slots)?;
        need(OP, "out", out, slots * n)?;
        need(OP, "w", w, n * pc)?;
        if slots > MAX_GROUPS || n.div_ceil(WG) > MAX_GROUPS {
            return Err(ShaderError::Invalid(format!(
                "{OP}: {slots} slots x {n} outputs is over the grid's limits"
            )));
        }
        if slots == 0 || n == 0 {
            return Ok(());
        }
        let p = [
            u(slots, "slots")?,
            u(n, "n")?,
            u(pc, "packed cols")?,
            u(top_k, "top_k")?,
            x_per_token as u32,
            u(only, "expert")?,
            u(nb, "blocks")?,
            u(block, "block")?,
        ];
        self.dispatch(&Q8_EXPERT, &p, &[xq, xs, w, ws, expert, out], (n.div_ceil(WG) as u32, slots as u32))?;
        Ok(())
    }

    /// `x[t] += sum_s weight[t, s] * y[row_of_slot[t * top_k + s]]` over `rows` tokens of
    /// `dim` (`row_of_slot` as the identity when the expert outputs are in slot order).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_combine(
        &mut self, x: &GpuBuffer, row_of_slot: &GpuBuffer, weight: &GpuBuffer, y: &GpuBuffer, rows: usize,
        dim: usize, top_k: usize,
    ) -> Result<(), ShaderError> {
        need("moe_combine", "x", x, rows * dim)?;
        need("moe_combine", "row_of_slot", row_of_slot, rows * top_k)?;
        need("moe_combine", "weight", weight, rows * top_k)?;
        need("moe_combine", "y", y, rows * top_k * dim)?;
        if rows * dim == 0 {
            return Ok(());
        }
        let p = [u(rows, "rows")?, u(dim, "dim")?, u(top_k, "top_k")?];
        self.dispatch(&MOE_COMBINE, &p, &[row_of_slot, weight, y, x], grid((rows * dim).div_ceil(WG)))?;
        Ok(())
    }
}

impl MoeOps for WgpuBackend {
    fn moe_combine(
        &self, out: &mut GpuBuffer, y: &GpuBuffer, row_of_slot: &[u32], weight: &[f32], top_k: usize,
        dim: usize,
    ) -> Result<()> {
        let n = rusting_brain_core::ops::moe::check_combine(
            "moe_combine",
            out.len(),
            y.len(),
            row_of_slot,
            weight,
            top_k,
            dim,
        )?;
        self.record(|b, pools| {
            let rows = pools.stage(row_of_slot)?;
            let w = pools.stage_f32(weight)?;
            b.moe_combine(out, &rows, &w, y, n, dim, top_k)
        })
    }
    fn moe_combine_backward(
        &self, dy: &mut GpuBuffer, dout: &GpuBuffer, y: &GpuBuffer, row_of_slot: &[u32], weight: &[f32],
        top_k: usize, dim: usize,
    ) -> Result<Vec<f32>> {
        const OP: &str = "moe_combine_backward";
        let n = rusting_brain_core::ops::moe::check_combine(
            OP,
            dout.len(),
            y.len(),
            row_of_slot,
            weight,
            top_k,
            dim,
        )?;
        check_len(OP, "dy", dy.len(), y.len())?;
        let slots = row_of_slot.len();
        self.record(|b, pools| {
            let rows = pools.stage(row_of_slot)?;
            let w = pools.stage_f32(weight)?;
            let dweight = pools.scratch("moe weight gradients", slots)?;
            b.moe_combine_backward(dy, &dweight, &rows, &w, dout, y, (n, dim, top_k))
        })?;
        self.read_scratch("moe weight gradients", slots)
    }
    fn routes_on_device(&self) -> bool {
        // In a page nothing may wait for a read, and natively the read-back of the
        // router's logits would cost a submission per sparse block.
        true
    }
    fn moe_route(
        &self, expert: &mut GpuBuffer, weight: &mut GpuBuffer, logits: &GpuBuffer, n: usize,
        n_experts: usize, top_k: usize, renormalize: bool,
    ) -> Result<()> {
        const OP: &str = "moe_route";
        check_len(OP, "logits", logits.len(), n * n_experts)?;
        check_len(OP, "expert", expert.len(), n * top_k)?;
        check_len(OP, "weight", weight.len(), n * top_k)?;
        self.record(|b, _| b.moe_route(expert, weight, logits, n, n_experts, top_k, renormalize))
    }
    fn q8_matmul_routed(
        &self, out: &mut GpuBuffer, x: &GpuBuffer, experts: &[(&GpuBuffer, &GpuBuffer)], expert: &GpuBuffer,
        spec: &RoutedSpec,
    ) -> Result<()> {
        let lens: Vec<(usize, usize)> = experts.iter().map(|(p, s)| (p.len(), s.len())).collect();
        spec.check(out.len(), x.len(), expert.len(), &lens)?;
        let (rows, k) = (spec.x_rows(), spec.k);
        // Every expert's weight rounded alike (one activation rounding serves them all).
        let mut blocks = lens
            .iter()
            .map(|&(_, s)| rusting_brain_core::ops::q8::q8_block("q8_matmul_routed", spec.n, k, s));
        let block = blocks.next().transpose()?.unwrap_or(k);
        if blocks.any(|b| b.ok() != Some(block)) {
            return Err(CoreError::InvalidArgument {
                op: "q8_matmul_routed",
                message: "the experts' int8 weights are rounded differently (per row and per block)".into(),
            });
        }
        self.record(|b, pools| {
            // The activations are rounded once; each expert's dispatch fills its slots.
            let nb = k.div_ceil(block);
            let xq = pools.scratch("int8 activations", rows * super::q8::activation_words(k, nb))?;
            let xs = pools.scratch("int8 activation scales", rows * nb)?;
            b.quantize_activation_blocks(&xq, &xs, x, rows, k, block)?;
            for (e, (w, ws)) in experts.iter().enumerate() {
                b.q8_expert(
                    out,
                    &xq,
                    &xs,
                    w,
                    ws,
                    expert,
                    (spec.slots, spec.n, k, spec.top_k),
                    spec.x_per_token,
                    e,
                )?;
            }
            Ok(())
        })
    }
    fn moe_combine_slots(
        &self, out: &mut GpuBuffer, y: &GpuBuffer, weight: &GpuBuffer, top_k: usize, dim: usize,
    ) -> Result<()> {
        const OP: &str = "moe_combine_slots";
        if top_k == 0 || dim == 0 || !weight.len().is_multiple_of(top_k) {
            return Err(CoreError::InvalidDimension {
                op: OP,
                message: format!("{} weights for top_k {top_k}, dim {dim}", weight.len()),
            });
        }
        let n = weight.len() / top_k;
        check_len(OP, "out", out.len(), n * dim)?;
        check_len(OP, "y", y.len(), n * top_k * dim)?;
        let identity: Vec<u32> = (0..weight.len() as u32).collect();
        self.record(|b, pools| {
            let rows = pools.stage(&identity)?;
            b.moe_combine(out, &rows, weight, y, n, dim, top_k)
        })
    }
}

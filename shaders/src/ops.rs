//! Recording kernels into one command encoder: shapes are checked here, on the host,
//! before anything is queued, so a wrong size is an error and never a GPU fault.

use rusting_brain_core::ops::attention::AttentionSpec;
use rusting_brain_core::ops::q8::packed_cols;
use rusting_brain_core::ops::rope::RopeSpec;

use crate::{Gpu, GpuBuffer, Kernel, ShaderError};

/// Rows from which the int8 product takes the register-tiled kernel (a prefill); below,
/// one invocation per output reads each weight once, which is all a decode step needs.
pub const TILED_ROWS: usize = 8;

/// Workgroups one grid dimension may hold (WebGPU's minimum limit).
const MAX_GROUPS: usize = 65_535;
/// Invocations per workgroup in every kernel.
const WG: usize = 64;

/// The scratch row attention keeps its scores in: `batch * q_len * q_heads * kv_capacity`
/// words.
pub type AttentionScratch = GpuBuffer;

/// Kernels recorded into one command encoder and submitted together.
pub struct Batch<'g> {
    gpu: &'g Gpu,
    encoder: wgpu::CommandEncoder,
    /// Reused uniform buffers and bind groups, and the next dispatch's place in them.
    cache: Option<(&'g mut DispatchCache, usize)>,
}

/// The uniform buffers and bind groups of a sequence of dispatches that recurs (one decode
/// step after another): the i-th dispatch of a cached batch reuses the i-th entry when its
/// kernel and buffers are the same, and only writes its parameters if they changed. A
/// decode step then creates no GPU object at all.
#[derive(Default)]
pub struct DispatchCache {
    entries: Vec<CacheEntry>,
}

struct CacheEntry {
    kernel: Kernel,
    buffers: Vec<wgpu::Buffer>,
    params: Vec<u32>,
    uniform: wgpu::Buffer,
    group: wgpu::BindGroup,
}

impl DispatchCache {
    /// Entries held (one per dispatch of the longest batch so far).
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

fn u(v: usize, what: &str) -> Result<u32, ShaderError> {
    u32::try_from(v)
        .map_err(|_| ShaderError::Invalid(format!("{what} = {v} does not fit the GPU's 32-bit indices")))
}

fn need(op: &str, name: &str, buf: &GpuBuffer, words: usize) -> Result<(), ShaderError> {
    if buf.len < words {
        return Err(ShaderError::Invalid(format!(
            "{op}: {name} holds {} words, the shape needs {words}",
            buf.len
        )));
    }
    Ok(())
}

/// A 2-D grid, each side within the per-dimension limit.
fn grid2(x: usize, y: usize) -> Result<(u32, u32), ShaderError> {
    if x > MAX_GROUPS || y > MAX_GROUPS {
        return Err(ShaderError::Invalid(format!(
            "a {x} x {y} grid of workgroups is over the limit of {MAX_GROUPS}"
        )));
    }
    Ok((x as u32, y as u32))
}

/// A grid of `groups` workgroups as (x, y) within the per-dimension limit.
fn grid(groups: usize) -> (u32, u32) {
    let x = groups.clamp(1, MAX_GROUPS);
    (x as u32, groups.div_ceil(x).max(1) as u32)
}

impl Gpu {
    /// Starts recording kernels.
    pub fn batch(&self) -> Batch<'_> {
        Batch {
            gpu: self,
            encoder: self.device.create_command_encoder(&Default::default()),
            cache: None,
        }
    }

    /// Starts recording kernels that reuse `cache`'s bind groups (see [`DispatchCache`]).
    pub fn batch_cached<'g>(&'g self, cache: &'g mut DispatchCache) -> Batch<'g> {
        Batch {
            gpu: self,
            encoder: self.device.create_command_encoder(&Default::default()),
            cache: Some((cache, 0)),
        }
    }
}

impl Batch<'_> {
    fn dispatch(&mut self, kernel: Kernel, params: &[u32], buffers: &[&GpuBuffer], groups: (u32, u32)) {
        self.dispatch3(kernel, params, buffers, (groups.0, groups.1, 1));
    }

    fn dispatch3(&mut self, kernel: Kernel, params: &[u32], buffers: &[&GpuBuffer], groups: (u32, u32, u32)) {
        // The subgroup twin where the device has subgroups.
        let kernel = match kernel {
            Kernel::RmsNorm if self.gpu.subgroups => Kernel::RmsNormSg,
            Kernel::Q8Quantize if self.gpu.subgroups => Kernel::Q8QuantizeSg,
            k => k,
        };
        let Some(pipeline) = &self.gpu.pipelines[kernel as usize] else {
            unreachable!("only subgroup kernels are missing, and only where they are not picked")
        };
        let mut padded = params.to_vec();
        padded.resize(params.len().div_ceil(4).max(1) * 4, 0);
        let make = |gpu: &Gpu| {
            let uniform = gpu.params(&padded);
            let mut entries = vec![wgpu::BindGroupEntry {
                binding: 0,
                resource: uniform.as_entire_binding(),
            }];
            for (i, b) in buffers.iter().enumerate() {
                entries.push(wgpu::BindGroupEntry {
                    binding: i as u32 + 1,
                    resource: b.buf.as_entire_binding(),
                });
            }
            let group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(kernel.name()),
                layout: &pipeline.get_bind_group_layout(0),
                entries: &entries,
            });
            (uniform, group)
        };
        let group = match &mut self.cache {
            None => make(self.gpu).1,
            Some((cache, at)) => {
                let i = *at;
                *at += 1;
                let same = cache.entries.get(i).is_some_and(|e| {
                    e.kernel == kernel
                        && e.buffers.len() == buffers.len()
                        && e.buffers.iter().zip(buffers).all(|(a, b)| *a == b.buf)
                });
                if same {
                    let e = &mut cache.entries[i];
                    if e.params != padded {
                        // Queued writes land before the next submission's commands.
                        self.gpu.queue.write_buffer(
                            &e.uniform,
                            0,
                            &padded.iter().flat_map(|w| w.to_ne_bytes()).collect::<Vec<u8>>(),
                        );
                        e.params = padded.clone();
                    }
                    e.group.clone()
                } else {
                    let (uniform, group) = make(self.gpu);
                    let entry = CacheEntry {
                        kernel,
                        buffers: buffers.iter().map(|b| b.buf.clone()).collect(),
                        params: padded.clone(),
                        uniform,
                        group: group.clone(),
                    };
                    if i < cache.entries.len() {
                        cache.entries[i] = entry;
                    } else {
                        cache.entries.push(entry);
                    }
                    group
                }
            }
        };
        let mut pass = self.encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(kernel.name()),
            timestamp_writes: None,
        });
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups(groups.0, groups.1, groups.2);
    }

    /// `out = x / sqrt(mean(x^2) + eps) * weight` per row; `rstd` gets each row's factor.
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm(
        &mut self,
        out: &GpuBuffer,
        rstd: &GpuBuffer,
        inp: &GpuBuffer,
        weight: &GpuBuffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<(), ShaderError> {
        const OP: &str = "rmsnorm";
        let n = rows
            .checked_mul(dim)
            .ok_or_else(|| ShaderError::Invalid(format!("{OP}: size overflows")))?;
        need(OP, "inp", inp, n)?;
        need(OP, "out", out, n)?;
        need(OP, "weight", weight, dim)?;
        need(OP, "rstd", rstd, rows)?;
        if rows == 0 || dim == 0 {
            return Ok(());
        }
        let p = [u(rows, "rows")?, u(dim, "dim")?, eps.to_bits()];
        self.dispatch(Kernel::RmsNorm, &p, &[inp, weight, out, rstd], grid(rows));
        Ok(())
    }

    /// Each row of `x` (rows x cols) to int8 with its own scale: `xq` gets
    /// `rows * packed_cols(cols)` packed words, `xs` the scales.
    pub fn q8_quantize(
        &mut self,
        xq: &GpuBuffer,
        xs: &GpuBuffer,
        x: &GpuBuffer,
        rows: usize,
        cols: usize,
    ) -> Result<(), ShaderError> {
        const OP: &str = "q8_quantize";
        let pc = packed_cols(cols);
        need(OP, "x", x, rows * cols)?;
        need(OP, "xq", xq, rows * pc)?;
        need(OP, "xs", xs, rows)?;
        if rows == 0 {
            return Ok(());
        }
        let p = [u(rows, "rows")?, u(cols, "cols")?, u(pc, "packed cols")?];
        self.dispatch(Kernel::Q8Quantize, &p, &[x, xq, xs], grid(rows));
        Ok(())
    }

    /// `out (m x n) = xq . W^T + beta * out` with int8 activations (from
    /// [`Batch::q8_quantize`]) and int8 weights `w` (n x packed_cols(k)) with scales `ws`.
    #[allow(clippy::too_many_arguments)]
    pub fn q8_matmul(
        &mut self,
        out: &GpuBuffer,
        xq: &GpuBuffer,
        xs: &GpuBuffer,
        w: &GpuBuffer,
        ws: &GpuBuffer,
        m: usize,
        n: usize,
        k: usize,
        beta: f32,
    ) -> Result<(), ShaderError> {
        self.q8_matmul_cols(out, (n, 0), xq, xs, w, ws, m, n, k, beta)
    }

    /// [`Batch::q8_matmul`] into columns `j0 .. j0 + n` of an output with rows of `out_n`:
    /// one row slab of a weight split across bindings.
    #[allow(clippy::too_many_arguments)]
    pub fn q8_matmul_cols(
        &mut self,
        out: &GpuBuffer,
        (out_n, j0): (usize, usize),
        xq: &GpuBuffer,
        xs: &GpuBuffer,
        w: &GpuBuffer,
        ws: &GpuBuffer,
        m: usize,
        n: usize,
        k: usize,
        beta: f32,
    ) -> Result<(), ShaderError> {
        const OP: &str = "q8_matmul";
        let pc = packed_cols(k);
        need(OP, "xq", xq, m * pc)?;
        need(OP, "xs", xs, m)?;
        need(OP, "w", w, n * pc)?;
        need(OP, "ws", ws, n)?;
        if j0 + n > out_n {
            return Err(ShaderError::Invalid(format!(
                "{OP}: columns {j0}..{} of rows of {out_n}",
                j0 + n
            )));
        }
        need(OP, "out", out, m * out_n)?;
        if m > MAX_GROUPS || n.div_ceil(WG) > MAX_GROUPS {
            return Err(ShaderError::Invalid(format!(
                "{OP}: {m} rows x {n} outputs is over the grid's limits ({MAX_GROUPS} rows); split the batch"
            )));
        }
        if m == 0 || n == 0 {
            return Ok(());
        }
        let p = [
            u(m, "m")?,
            u(n, "n")?,
            u(pc, "packed cols")?,
            beta.to_bits(),
            u(out_n, "out_n")?,
            u(j0, "j0")?,
        ];
        if m >= TILED_ROWS {
            // Prefill: 32 x 32 register tiles, each loaded word used 32 times.
            let groups = grid2(n.div_ceil(32), m.div_ceil(32))?;
            self.dispatch(Kernel::Q8MatmulTiled, &p, &[xq, xs, w, ws, out], groups);
        } else {
            self.dispatch(
                Kernel::Q8Matmul,
                &p,
                &[xq, xs, w, ws, out],
                (n.div_ceil(WG) as u32, m as u32),
            );
        }
        Ok(())
    }

    /// `out = silu(gate) * up` over `len` values.
    pub fn swiglu(
        &mut self,
        out: &GpuBuffer,
        gate: &GpuBuffer,
        up: &GpuBuffer,
        len: usize,
    ) -> Result<(), ShaderError> {
        for (name, b) in [("out", out), ("gate", gate), ("up", up)] {
            need("swiglu", name, b, len)?;
        }
        if len == 0 {
            return Ok(());
        }
        self.dispatch(
            Kernel::Swiglu,
            &[u(len, "len")?],
            &[gate, up, out],
            grid(len.div_ceil(WG)),
        );
        Ok(())
    }

    /// `y += x` over `len` values.
    pub fn add(&mut self, y: &GpuBuffer, x: &GpuBuffer, len: usize) -> Result<(), ShaderError> {
        need("add", "y", y, len)?;
        need("add", "x", x, len)?;
        if len == 0 {
            return Ok(());
        }
        self.dispatch(Kernel::Add, &[u(len, "len")?], &[x, y], grid(len.div_ceil(WG)));
        Ok(())
    }

    /// Rotates `x` (batch, seq, heads, head_dim) in place; `table` holds cos/sin per
    /// position (see [`rope_table`]) up to at least `pos_offset + seq`. `inverse` rotates
    /// back (the backward pass).
    pub fn rope(
        &mut self,
        x: &GpuBuffer,
        table: &GpuBuffer,
        spec: &RopeSpec,
        inverse: bool,
    ) -> Result<(), ShaderError> {
        const OP: &str = "rope";
        let rows = spec.batch * spec.seq;
        spec.check(OP, rows * spec.heads * spec.head_dim)?;
        need(OP, "x", x, rows * spec.heads * spec.head_dim)?;
        need(OP, "table", table, (spec.pos_offset + spec.seq) * spec.head_dim)?;
        let pairs = rows * spec.heads * (spec.head_dim / 2);
        if pairs == 0 {
            return Ok(());
        }
        let sign: f32 = if inverse { -1.0 } else { 1.0 };
        let p = [
            u(rows, "rows")?,
            u(spec.seq, "seq")?,
            u(spec.heads, "heads")?,
            u(spec.head_dim, "head_dim")?,
            u(spec.pos_offset, "pos_offset")?,
            sign.to_bits(),
        ];
        self.dispatch(Kernel::Rope, &p, &[table, x], grid(pairs.div_ceil(WG)));
        Ok(())
    }

    /// Causal GQA attention over a cache (layouts of `rusting_brain_core::ops::attention`):
    /// writes `out` and the log-sum-exp `lse`; `scratch` holds the scores.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &mut self,
        out: &GpuBuffer,
        lse: &GpuBuffer,
        q: &GpuBuffer,
        k: &GpuBuffer,
        v: &GpuBuffer,
        scratch: &AttentionScratch,
        spec: &AttentionSpec,
    ) -> Result<(), ShaderError> {
        const OP: &str = "attention";
        let (nq, nkv, nl) = spec.check(OP)?;
        need(OP, "q", q, nq)?;
        need(OP, "out", out, nq)?;
        need(OP, "k", k, nkv)?;
        need(OP, "v", v, nkv)?;
        need(OP, "lse", lse, nl)?;
        need(OP, "scratch", scratch, nl * spec.kv_capacity)?;
        if nl == 0 {
            return Ok(());
        }
        let scale = 1.0 / (spec.head_dim as f32).sqrt();
        let p = [
            u(spec.batch, "batch")?,
            u(spec.q_len, "q_len")?,
            u(spec.kv_len, "kv_len")?,
            u(spec.kv_capacity, "kv_capacity")?,
            u(spec.q_heads, "q_heads")?,
            u(spec.kv_heads, "kv_heads")?,
            u(spec.head_dim, "head_dim")?,
            scale.to_bits(),
        ];
        self.dispatch(Kernel::Attention, &p, &[q, k, v, out, lse, scratch], grid(nl));
        Ok(())
    }

    /// `out[r] = table[ids[r]] * scales[ids[r]]` from an int8 table (vocab x dim). Ids
    /// from the host are checked when uploaded (see [`check_ids`]); an id the GPU made
    /// itself (the sampler's) is in range by construction, and a stray one reads as NaN.
    #[allow(clippy::too_many_arguments)]
    pub fn q8_embedding(
        &mut self,
        out: &GpuBuffer,
        ids: &GpuBuffer,
        table: &GpuBuffer,
        scales: &GpuBuffer,
        rows: usize,
        vocab: usize,
        dim: usize,
    ) -> Result<(), ShaderError> {
        self.q8_embedding_slab(out, ids, table, scales, rows, vocab, dim, (0, vocab))
    }

    /// [`Batch::q8_embedding`] from one row slab of a table split across bindings: `table`
    /// holds rows `id0 .. id0 + slab_rows`; other ids are left to the other slabs' calls.
    #[allow(clippy::too_many_arguments)]
    pub fn q8_embedding_slab(
        &mut self,
        out: &GpuBuffer,
        ids: &GpuBuffer,
        table: &GpuBuffer,
        scales: &GpuBuffer,
        rows: usize,
        vocab: usize,
        dim: usize,
        (id0, slab_rows): (usize, usize),
    ) -> Result<(), ShaderError> {
        const OP: &str = "q8_embedding";
        let pc = packed_cols(dim);
        need(OP, "ids", ids, rows)?;
        need(OP, "table", table, slab_rows * pc)?;
        need(OP, "scales", scales, slab_rows)?;
        need(OP, "out", out, rows * dim)?;
        if rows * dim == 0 {
            return Ok(());
        }
        let p = [
            u(rows, "rows")?,
            u(dim, "dim")?,
            u(pc, "packed cols")?,
            u(vocab, "vocab")?,
            u(id0, "id0")?,
            u(slab_rows, "slab rows")?,
        ];
        self.dispatch(
            Kernel::Q8Embedding,
            &p,
            &[ids, table, scales, out],
            grid((rows * dim).div_ceil(WG)),
        );
        Ok(())
    }

    /// `ids[r]` = the index of row r's largest value (ties: the lower index).
    pub fn argmax(
        &mut self,
        ids: &GpuBuffer,
        logits: &GpuBuffer,
        rows: usize,
        cols: usize,
    ) -> Result<(), ShaderError> {
        need("argmax", "logits", logits, rows * cols)?;
        need("argmax", "ids", ids, rows)?;
        if rows > MAX_GROUPS {
            return Err(ShaderError::Invalid(format!(
                "argmax: {rows} rows, over {MAX_GROUPS}"
            )));
        }
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        self.dispatch(
            Kernel::Argmax,
            &[u(rows, "rows")?, u(cols, "cols")?],
            &[logits, ids],
            (rows as u32, 1),
        );
        Ok(())
    }

    /// `c = alpha * op(a) op(b) + beta * c` in f32 over `batch` problems, the operands
    /// starting at word offsets `at = (a, b, c)` (a MatmulSpec's window). Shapes are
    /// checked by the caller (the backend runs `MatmulSpec::check`).
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(
        &mut self,
        c: &GpuBuffer,
        a: &GpuBuffer,
        b: &GpuBuffer,
        (m, n, k, batch): (usize, usize, usize, usize),
        (trans_a, trans_b): (bool, bool),
        (alpha, beta): (f32, f32),
        at: (usize, usize, usize),
    ) -> Result<(), ShaderError> {
        const OP: &str = "matmul";
        need(OP, "a", a, at.0 + batch * m * k)?;
        need(OP, "b", b, at.1 + batch * k * n)?;
        need(OP, "c", c, at.2 + batch * m * n)?;
        let (gx, gy) = (n.div_ceil(8), m.div_ceil(8));
        if gx > MAX_GROUPS || gy > MAX_GROUPS || batch > MAX_GROUPS {
            return Err(ShaderError::Invalid(format!(
                "{OP}: ({m} x {n}) x {batch} is over the grid's limits"
            )));
        }
        if m * n * batch == 0 {
            return Ok(());
        }
        let p = [
            u(m, "m")?,
            u(n, "n")?,
            u(k, "k")?,
            u(batch, "batch")?,
            trans_a as u32,
            trans_b as u32,
            alpha.to_bits(),
            beta.to_bits(),
            u(at.0, "a offset")?,
            u(at.1, "b offset")?,
            u(at.2, "c offset")?,
        ];
        self.dispatch3(
            Kernel::Matmul,
            &p,
            &[a, b, c],
            (gx as u32, gy as u32, batch as u32),
        );
        Ok(())
    }

    /// One of the dense layers' element-wise or per-row ops on `y` (see `dense.wgsl` for
    /// the roles of `x`); lengths are checked by the caller.
    pub fn dense(
        &mut self,
        op: DenseOp,
        x: [Option<&GpuBuffer>; 3],
        y: &GpuBuffer,
        rows: usize,
        cols: usize,
    ) -> Result<(), ShaderError> {
        let (code, alpha, inv) = op.codes();
        let invocations = match op {
            DenseOp::BiasBackward => cols,
            DenseOp::ActivationForward(5, _) | DenseOp::ActivationBackward(5, _) => rows,
            _ => rows * cols,
        };
        if invocations == 0 {
            return Ok(());
        }
        let spare = &self.gpu.spare[0];
        let [x0, x1, x2] = x.map(|b| b.unwrap_or(spare));
        let p = [
            op.index(),
            u(rows, "rows")?,
            u(cols, "cols")?,
            code,
            alpha.to_bits(),
            inv.to_bits(),
        ];
        self.dispatch(
            Kernel::Dense,
            &p,
            &[x0, x1, x2, y],
            grid(invocations.div_ceil(WG)),
        );
        Ok(())
    }

    /// An optimizer step over `len` values: `words` are `optim.wgsl`'s parameters; `m`
    /// and `v` are the moments (Adam) or `m` the velocity (SGD with momentum).
    pub fn optim(
        &mut self,
        words: &[u32; 16],
        param: &GpuBuffer,
        grad: &GpuBuffer,
        m: Option<&GpuBuffer>,
        v: Option<&GpuBuffer>,
    ) -> Result<(), ShaderError> {
        let len = words[1] as usize;
        need("optim", "param", param, len)?;
        need("optim", "grad", grad, len)?;
        if len == 0 {
            return Ok(());
        }
        let m = m.unwrap_or(&self.gpu.spare[0]);
        let v = v.unwrap_or(&self.gpu.spare[1]);
        self.dispatch(Kernel::Optim, words, &[param, grad, m, v], grid(len.div_ceil(WG)));
        Ok(())
    }

    /// Mixture-of-experts routing of `rows` tokens: softmax of `logits` (rows x n_experts),
    /// top-k, optional renormalization; writes `expert` (u32) and `weight` per slot
    /// (rows x top_k, rank order).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_route(
        &mut self,
        expert: &GpuBuffer,
        weight: &GpuBuffer,
        logits: &GpuBuffer,
        rows: usize,
        n_experts: usize,
        top_k: usize,
        renormalize: bool,
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
        let p = [
            u(rows, "rows")?,
            u(n_experts, "experts")?,
            u(top_k, "top_k")?,
            renormalize as u32,
        ];
        self.dispatch(
            Kernel::MoeRoute,
            &p,
            &[logits, expert, weight],
            grid(rows.div_ceil(WG)),
        );
        Ok(())
    }

    /// Each slot's int8 product with its expert's rows of the stacked weights `w`
    /// (n_experts * n rows of packed_cols(k)): `out (slots x n)`. `x_per_token`: slot s
    /// reads activation row s / top_k (else row s).
    #[allow(clippy::too_many_arguments)]
    pub fn q8_expert(
        &mut self,
        out: &GpuBuffer,
        xq: &GpuBuffer,
        xs: &GpuBuffer,
        w: &GpuBuffer,
        ws: &GpuBuffer,
        expert: &GpuBuffer,
        (slots, n, k, top_k): (usize, usize, usize, usize),
        x_per_token: bool,
    ) -> Result<(), ShaderError> {
        const OP: &str = "q8_expert";
        let pc = packed_cols(k);
        let x_rows = if x_per_token {
            slots.div_ceil(top_k.max(1))
        } else {
            slots
        };
        need(OP, "xq", xq, x_rows * pc)?;
        need(OP, "xs", xs, x_rows)?;
        need(OP, "expert", expert, slots)?;
        need(OP, "out", out, slots * n)?;
        if ws.len() < n || w.len() < ws.len() * pc {
            return Err(ShaderError::Invalid(format!(
                "{OP}: the stacked weights do not hold rows of {k}"
            )));
        }
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
        ];
        self.dispatch(
            Kernel::Q8Expert,
            &p,
            &[xq, xs, w, ws, expert, out],
            (n.div_ceil(WG) as u32, slots as u32),
        );
        Ok(())
    }

    /// `x[t] += sum_s weight[t, s] * y[t * top_k + s]` over `rows` tokens of `dim`.
    pub fn moe_combine(
        &mut self,
        x: &GpuBuffer,
        weight: &GpuBuffer,
        y: &GpuBuffer,
        rows: usize,
        dim: usize,
        top_k: usize,
    ) -> Result<(), ShaderError> {
        need("moe_combine", "x", x, rows * dim)?;
        need("moe_combine", "weight", weight, rows * top_k)?;
        need("moe_combine", "y", y, rows * top_k * dim)?;
        if rows * dim == 0 {
            return Ok(());
        }
        let p = [u(rows, "rows")?, u(dim, "dim")?, u(top_k, "top_k")?];
        self.dispatch(
            Kernel::MoeCombine,
            &p,
            &[weight, y, x],
            grid((rows * dim).div_ceil(WG)),
        );
        Ok(())
    }

    /// The repetition penalty on one row of `logits`, in place, at `n_ids` distinct ids
    /// (all inside the row; see [`context_ids`]).
    pub fn penalize(
        &mut self,
        logits: &GpuBuffer,
        ids: &GpuBuffer,
        n_ids: usize,
        penalty: f32,
    ) -> Result<(), ShaderError> {
        need("penalize", "ids", ids, n_ids)?;
        if n_ids == 0 || penalty == 1.0 {
            return Ok(());
        }
        self.dispatch(
            Kernel::Penalize,
            &[u(n_ids, "ids")?, penalty.to_bits()],
            &[ids, logits],
            grid(n_ids.div_ceil(WG)),
        );
        Ok(())
    }

    /// The `k` largest values of `logits` (one row of `cols`), most likely first, ties to
    /// the lower index: ids into `top_ids`, values into `top_vals`; `scratch` holds a copy.
    pub fn topk(
        &mut self,
        top_ids: &GpuBuffer,
        top_vals: &GpuBuffer,
        scratch: &GpuBuffer,
        logits: &GpuBuffer,
        cols: usize,
        k: usize,
    ) -> Result<(), ShaderError> {
        need("topk", "logits", logits, cols)?;
        need("topk", "scratch", scratch, cols)?;
        need("topk", "top_ids", top_ids, k)?;
        need("topk", "top_vals", top_vals, k)?;
        if k == 0 || cols == 0 {
            return Ok(());
        }
        self.dispatch(
            Kernel::TopK,
            &[u(cols, "cols")?, u(k, "k")?],
            &[logits, scratch, top_ids, top_vals],
            (1, 1),
        );
        Ok(())
    }

    /// Copies `n` words from `src[src_at..]` to `dst[dst_at..]` (the KV-cache append).
    pub fn copy(
        &mut self,
        dst: &GpuBuffer,
        dst_at: usize,
        src: &GpuBuffer,
        src_at: usize,
        n: usize,
    ) -> Result<(), ShaderError> {
        need("copy", "src", src, src_at + n)?;
        need("copy", "dst", dst, dst_at + n)?;
        if n > 0 {
            self.encoder.copy_buffer_to_buffer(
                &src.buf,
                src_at as u64 * 4,
                &dst.buf,
                dst_at as u64 * 4,
                n as u64 * 4,
            );
        }
        Ok(())
    }

    /// Queues everything recorded.
    pub fn submit(self) -> Result<(), ShaderError> {
        self.gpu.queue.submit([self.encoder.finish()]);
        self.gpu.check_errors()
    }
}

/// The ops of `dense.wgsl`. Activation codes: 0 identity, 1 ReLU, 2 leaky ReLU, 3 sigmoid,
/// 4 tanh, 5 softmax (per row); loss codes: 0 MSE, 1 binary, 2 categorical cross-entropy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DenseOp {
    /// `y[r, c] += x0[c]`.
    AddBias,
    /// `y[c] += sum_r x0[r, c]`.
    BiasBackward,
    /// `y = f(x0)`; (activation code, leaky slope).
    ActivationForward(u32, f32),
    /// `y = f'(x1) * x0` with the forward output in x2; (code, slope).
    ActivationBackward(u32, f32),
    /// `y = dloss/dpred(x0, x1) / divisor`; (loss code, 1 / divisor).
    LossBackward(u32, f32),
    /// `y = (x0 - x1) / divisor`; (1 / divisor).
    FusedOutputBackward(f32),
    /// `y = value`.
    Fill(f32),
    /// `y *= alpha`.
    Scale(f32),
    /// `y += alpha * x0`.
    Axpy(f32),
}

impl DenseOp {
    fn index(self) -> u32 {
        match self {
            DenseOp::AddBias => 0,
            DenseOp::BiasBackward => 1,
            DenseOp::ActivationForward(..) => 2,
            DenseOp::ActivationBackward(..) => 3,
            DenseOp::LossBackward(..) => 4,
            DenseOp::FusedOutputBackward(_) => 5,
            DenseOp::Fill(_) => 6,
            DenseOp::Scale(_) => 7,
            DenseOp::Axpy(_) => 8,
        }
    }
    /// (code, alpha, inv).
    fn codes(self) -> (u32, f32, f32) {
        match self {
            DenseOp::ActivationForward(c, a) | DenseOp::ActivationBackward(c, a) => (c, a, 0.0),
            DenseOp::LossBackward(c, inv) => (c, 0.0, inv),
            DenseOp::FusedOutputBackward(inv) => (0, 0.0, inv),
            DenseOp::Fill(a) | DenseOp::Scale(a) | DenseOp::Axpy(a) => (0, a, 0.0),
            DenseOp::AddBias | DenseOp::BiasBackward => (0, 0.0, 0.0),
        }
    }
}

/// cos/sin per position for [`Batch::rope`]: `positions` rows of (cos[half], sin[half]),
/// the f32 angles formed exactly as the CPU forms them.
pub fn rope_table(positions: usize, head_dim: usize, theta: f32) -> Vec<f32> {
    use rusting_brain_core::ops::rope::inv_freq;
    let half = head_dim / 2;
    let freqs: Vec<f32> = (0..half).map(|i| inv_freq(i, head_dim, theta)).collect();
    let mut t = vec![0.0f32; positions * head_dim];
    for (pos, row) in t.chunks_exact_mut(head_dim.max(1)).enumerate() {
        for i in 0..half {
            let angle = pos as f32 * freqs[i];
            row[i] = libm_cos(angle);
            row[half + i] = libm_sin(angle);
        }
    }
    t
}

fn libm_cos(x: f32) -> f32 {
    use rusting_brain_core::Real;
    Real::cos(x)
}

fn libm_sin(x: f32) -> f32 {
    use rusting_brain_core::Real;
    Real::sin(x)
}

/// The ids a repetition penalty applies to: each id of `context` inside the vocabulary,
/// once, in first-seen order (the core sampler skips ids outside the row, and penalizes
/// each id once however often it occurs).
pub fn context_ids(context: &[u32], vocab: usize) -> Vec<u32> {
    let mut seen = vec![false; vocab];
    context
        .iter()
        .copied()
        .filter(|&id| {
            seen.get_mut(id as usize)
                .is_some_and(|s| !std::mem::replace(s, true))
        })
        .collect()
}

/// What an argmax or top-k id means when it is not an index: NaN in the row.
pub const NAN_ROW: u32 = 0xffff_fffe;
/// A top-k slot with nothing left to rank (fewer finite values than k).
pub const NO_ID: u32 = 0xffff_ffff;

/// Token ids the host hands the GPU, checked against the vocabulary.
pub fn check_ids(ids: &[u32], vocab: usize) -> Result<(), ShaderError> {
    rusting_brain_core::ops::embedding::check_ids("gpu embedding", ids, vocab)?;
    Ok(())
}

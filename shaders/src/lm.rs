//! An int8 transformer language model on the device: the same forward pass as
//! `TransformerModel::forward_cached` on the CPU, kernel for kernel, with the weights,
//! the KV caches and every activation resident on the GPU. One command encoder per
//! forward pass; the draw (argmax, or the top-k ranking) runs on the device, so a greedy
//! token reads back 4 bytes. The reads are `async` and never block: natively they are
//! awaited with [`crate::block_on`] (the `rusting_brain` crate's `to_gpu`), in the browser
//! by the page's event loop (the `rusting_brain_web` crate).
//!
//! The int8 products are bit-identical to the CPU's (same int8 activations, exact i32
//! sums, the same two f32 multiplies); RMSNorm, RoPE, attention and SwiGLU differ from it
//! by float summation order and fused multiply-adds, so logits agree to ~1e-5 of their
//! range, and the greedy ids match (tests/tests/gpu_lm.rs).

use rusting_brain_core::models::transformer::{Swiglu, TransformerConfig, TransformerModel};
use rusting_brain_core::ops::attention::AttentionSpec;
use rusting_brain_core::ops::q8::packed_cols;
use rusting_brain_core::{Backend, CoreError, Sampler};

use crate::{
    context_ids, rope_table, Batch, DispatchCache, Gpu, GpuBuffer, GpuOptions, ShaderError, NAN_ROW, NO_ID,
};

type Result<T, E = ShaderError> = std::result::Result<T, E>;

/// An int8 matrix on the device: `n` rows of `k` values packed four to a word, and `n`
/// scales.
struct Q8 {
    /// Row slabs, each within the adapter's storage-binding limit: (first row, rows,
    /// packed values, scales). One slab unless the matrix is larger than a binding (a
    /// large vocabulary's embedding, on an adapter that binds 128 MiB).
    slabs: Vec<(usize, usize, GpuBuffer, GpuBuffer)>,
    n: usize,
    k: usize,
}

impl Q8 {
    /// The whole matrix in one binding (the stacked experts, which are never split).
    fn whole(&self) -> Result<(&GpuBuffer, &GpuBuffer)> {
        match &self.slabs[..] {
            [(_, _, w, s)] => Ok((w, s)),
            _ => Err(ShaderError::Invalid(
                "the stacked experts are larger than one storage binding on this adapter".into(),
            )),
        }
    }
}

struct Layer {
    attn_norm: GpuBuffer,
    ffn_norm: GpuBuffer,
    wq: Q8,
    wk: Q8,
    wv: Q8,
    wo: Q8,
    /// gate, up, down: the dense feed-forward, or a sparse block's shared expert.
    mlp: Option<[Q8; 3]>,
    moe: Option<Moe>,
}

/// One int8 matrix of the host model: packed values and scales.
type Leaf = Option<(Vec<f32>, Vec<f32>)>;

/// A sparse block on the device: the f32 router and every expert's int8 weights stacked
/// (expert e's gate rows are e * expert_d_ff ..), so one dispatch serves all routed slots.
struct Moe {
    router: GpuBuffer,
    gate: Q8,
    up: Q8,
    down: Q8,
}

/// Stacks the experts' int8 matrices (each `n x k`) into one.
fn stacked(
    gpu: &Gpu,
    name: &str,
    leaves: Vec<&Option<(Vec<f32>, Vec<f32>)>>,
    n: usize,
    k: usize,
) -> Result<Q8> {
    let leaves_len = leaves.len();
    let (mut w, mut s) = (Vec::new(), Vec::new());
    for (e, leaf) in leaves.into_iter().enumerate() {
        let (packed, scales) = leaf.as_ref().ok_or_else(|| {
            ShaderError::Invalid(format!("to_gpu: expert {e} of {name} has no int8 weights"))
        })?;
        w.extend_from_slice(packed);
        s.extend_from_slice(scales);
    }
    Ok(Q8 {
        slabs: vec![(0, n * leaves_len, gpu.upload(name, &w)?, gpu.upload(name, &s)?)],
        n,
        k,
    })
}

/// Scratch of a forward pass over up to `rows` positions.
struct Acts {
    rows: usize,
    x: GpuBuffer,
    h: GpuBuffer,
    rstd: GpuBuffer,
    /// int8 activations and their scales, for the widest input (d, q_dim or d_ff).
    xq: GpuBuffer,
    xs: GpuBuffer,
    q: GpuBuffer,
    k: GpuBuffer,
    v: GpuBuffer,
    att: GpuBuffer,
    lse: GpuBuffer,
    scores: GpuBuffer,
    gate: GpuBuffer,
    up: GpuBuffer,
    s: GpuBuffer,
    ids: GpuBuffer,
    /// Sparse blocks: router logits (rows x n_experts), each slot's expert and weight
    /// (rows x top_k), and the slots' hidden and output rows.
    router: GpuBuffer,
    expert: GpuBuffer,
    weight: GpuBuffer,
    egate: GpuBuffer,
    eup: GpuBuffer,
    es: GpuBuffer,
    ey: GpuBuffer,
    /// The identity slot-to-row table: the expert outputs are in slot order here.
    slot_rows: GpuBuffer,
}

/// The model on the device.
pub struct GpuLm {
    gpu: Gpu,
    cfg: TransformerConfig,
    embed: Q8,
    final_norm: GpuBuffer,
    layers: Vec<Layer>,
    rope: GpuBuffer,
    acts: Option<Acts>,
    last: GpuBuffer,
    logits: GpuBuffer,
    /// The argmax of the last logits.
    best: GpuBuffer,
    /// Bind groups and uniforms of the forward pass, reused from one token to the next.
    cache: DispatchCache,
    /// The sampler's buffers: penalized logits, the context's ids, the top-k ranking and
    /// its scratch copy, and their own dispatch cache.
    penalized: GpuBuffer,
    context: GpuBuffer,
    top_ids: GpuBuffer,
    top_vals: GpuBuffer,
    top_scratch: GpuBuffer,
    sample_cache: DispatchCache,
}

/// The largest top-k ranked on the device; a larger k reads the logits back.
const DEVICE_TOP_K: usize = 256;

/// Key/value caches of one sequence on the device: `max_seq_len` positions per layer,
/// allocated once.
pub struct GpuCache {
    k: Vec<GpuBuffer>,
    v: Vec<GpuBuffer>,
    len: usize,
}

impl GpuCache {
    /// Positions cached so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets every position (the buffers stay allocated for the next sequence).
    pub fn clear(&mut self) {
        self.len = 0;
    }
}

fn q8(gpu: &Gpu, name: &str, leaf: &Option<(Vec<f32>, Vec<f32>)>, n: usize, k: usize) -> Result<Q8> {
    let (packed, scales) = leaf
        .as_ref()
        .ok_or_else(|| ShaderError::Invalid(format!("to_gpu: {name} has no int8 weights")))?;
    let pc = packed_cols(k);
    // Rows per slab: as many as one binding holds (at least one; a single row over the
    // limit is refused by the upload with the sizes in the message).
    let per = ((gpu.max_binding() / (4 * pc.max(1) as u64)) as usize).max(1);
    let mut slabs = Vec::new();
    let mut row0 = 0;
    while row0 < n {
        let rows = per.min(n - row0);
        slabs.push((
            row0,
            rows,
            gpu.upload(name, &packed[row0 * pc..(row0 + rows) * pc])?,
            gpu.upload(name, &scales[row0..row0 + rows])?,
        ));
        row0 += rows;
    }
    Ok(Q8 { slabs, n, k })
}

impl GpuLm {
    /// Uploads an int8 model, dense or mixture-of-experts.
    pub async fn new<B: Backend<Buffer = Vec<f32>>>(
        model: &TransformerModel<B>,
        options: &GpuOptions,
    ) -> Result<GpuLm> {
        let c = &model.config;
        let quant = model.quantized.as_ref().ok_or_else(|| {
            ShaderError::Invalid("to_gpu runs int8 models: call quantize() first (or load a Q8 file)".into())
        })?;
        let gpu = Gpu::new(options).await?;
        let (d, q, kv) = (c.d_model, c.q_dim(), c.kv_dim());
        let mut layers = Vec::with_capacity(c.n_layers);
        for (l, (p, qp)) in model.params.layers.iter().zip(&quant.layers).enumerate() {
            let name = |w: &str| format!("model.layers.{l}.{w}");
            let mlp = match (&qp.mlp, c.mlp_width(l)) {
                (Some(m), Some(f)) => Some([
                    q8(&gpu, &name("mlp.gate_proj"), &m.gate, f, d)?,
                    q8(&gpu, &name("mlp.up_proj"), &m.up, f, d)?,
                    q8(&gpu, &name("mlp.down_proj"), &m.down, d, f)?,
                ]),
                _ => None,
            };
            let moe = match (&qp.moe, &p.moe, c.sparse(l)) {
                (Some(qe), Some(pe), Some(m)) => {
                    let fe = m.expert_d_ff;
                    let ex = &qe.experts;
                    let leaves = |pick: fn(&Swiglu<Leaf>) -> &Leaf| ex.iter().map(pick).collect::<Vec<_>>();
                    Some(Moe {
                        router: gpu.upload(&name("mlp.gate"), &pe.router)?,
                        gate: stacked(&gpu, &name("mlp.experts.gate_proj"), leaves(|e| &e.gate), fe, d)?,
                        up: stacked(&gpu, &name("mlp.experts.up_proj"), leaves(|e| &e.up), fe, d)?,
                        down: stacked(&gpu, &name("mlp.experts.down_proj"), leaves(|e| &e.down), d, fe)?,
                    })
                }
                _ => None,
            };
            if mlp.is_none() && moe.is_none() {
                return Err(ShaderError::Invalid(format!(
                    "to_gpu: block {l} has no feed-forward"
                )));
            }
            layers.push(Layer {
                attn_norm: gpu.upload("attn_norm", &p.attn_norm)?,
                ffn_norm: gpu.upload("ffn_norm", &p.ffn_norm)?,
                wq: q8(&gpu, &name("self_attn.q_proj"), &qp.wq, q, d)?,
                wk: q8(&gpu, &name("self_attn.k_proj"), &qp.wk, kv, d)?,
                wv: q8(&gpu, &name("self_attn.v_proj"), &qp.wv, kv, d)?,
                wo: q8(&gpu, &name("self_attn.o_proj"), &qp.wo, d, q)?,
                mlp,
                moe,
            });
        }
        let embed = q8(&gpu, "model.embed_tokens", &quant.embed, c.vocab_size, d)?;
        Ok(GpuLm {
            final_norm: gpu.upload("final_norm", &model.params.final_norm)?,
            rope: gpu.upload("rope", &rope_table(c.max_seq_len, c.head_dim, c.rope_theta))?,
            last: gpu.zeros("last", d)?,
            logits: gpu.zeros("logits", c.vocab_size)?,
            best: gpu.zeros("best", 1)?,
            acts: None,
            cache: DispatchCache::default(),
            penalized: gpu.zeros("penalized logits", c.vocab_size)?,
            context: gpu.zeros("context ids", 256)?,
            top_ids: gpu.zeros("top ids", DEVICE_TOP_K)?,
            top_vals: gpu.zeros("top values", DEVICE_TOP_K)?,
            top_scratch: gpu.zeros("top-k scratch", c.vocab_size)?,
            sample_cache: DispatchCache::default(),
            layers,
            embed,
            cfg: c.clone(),
            gpu,
        })
    }

    /// The adapter's copy bandwidth in GB/s over a buffer of `bytes` (native only).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn copy_bandwidth(&self, bytes: usize) -> Result<f64> {
        self.gpu.copy_bandwidth(bytes, 20)
    }

    /// The model's configuration.
    pub fn config(&self) -> &TransformerConfig {
        &self.cfg
    }

    /// The adapter's name and backend, e.g. "llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan)".
    pub fn adapter(&self) -> String {
        let i = self.gpu.adapter_info();
        format!("{} ({:?})", i.name, i.backend)
    }

    /// Empty KV caches for one sequence: `max_seq_len` positions per layer, allocated now.
    pub fn new_cache(&self) -> Result<GpuCache> {
        let n = self.cfg.max_seq_len * self.cfg.kv_dim();
        let layers = self.cfg.n_layers;
        Ok(GpuCache {
            k: (0..layers)
                .map(|_| self.gpu.zeros("k cache", n))
                .collect::<Result<_>>()?,
            v: (0..layers)
                .map(|_| self.gpu.zeros("v cache", n))
                .collect::<Result<_>>()?,
            len: 0,
        })
    }

    /// The most positions one forward pass takes: its largest per-row activation times
    /// the rows must fit one storage binding (and prefill pieces of 256 keep the scratch
    /// small on any adapter).
    fn max_rows(&self) -> usize {
        let c = &self.cfg;
        let f = (0..c.n_layers).filter_map(|l| c.mlp_width(l)).max().unwrap_or(0);
        let (e_n, k, fe) = c
            .moe
            .as_ref()
            .map_or((0, 1, 0), |m| (m.n_experts, m.top_k, m.expert_d_ff));
        let widest = c.d_model.max(c.q_dim()).max(f).max(fe);
        let per_row = [
            c.q_heads * c.max_seq_len,
            c.d_model,
            c.q_dim(),
            f,
            e_n,
            k * fe,
            k * c.d_model,
            k * packed_cols(widest),
        ]
        .into_iter()
        .max()
        .unwrap_or(1)
        .max(1);
        ((self.gpu.max_binding() / 4) as usize / per_row).clamp(1, 256)
    }

    fn acts(&mut self, rows: usize) -> Result<()> {
        if self.acts.as_ref().is_some_and(|a| a.rows >= rows) {
            return Ok(());
        }
        let c = &self.cfg;
        let (g, d, q, kv) = (&self.gpu, c.d_model, c.q_dim(), c.kv_dim());
        let f = (0..c.n_layers).filter_map(|l| c.mlp_width(l)).max().unwrap_or(0);
        let (e_n, k, fe) = c
            .moe
            .as_ref()
            .map_or((0, 0, 0), |m| (m.n_experts, m.top_k, m.expert_d_ff));
        let widest = d.max(q).max(f).max(fe);
        // int8 activation rows: one per position, or one per routed slot in a sparse block.
        let qrows = rows.max(rows * k);
        self.acts = Some(Acts {
            rows,
            x: g.zeros("x", rows * d)?,
            h: g.zeros("h", rows * d)?,
            rstd: g.zeros("rstd", rows)?,
            xq: g.zeros("xq", qrows * packed_cols(widest))?,
            xs: g.zeros("xs", qrows)?,
            q: g.zeros("q", rows * q)?,
            k: g.zeros("k", rows * kv)?,
            v: g.zeros("v", rows * kv)?,
            att: g.zeros("att", rows * q)?,
            lse: g.zeros("lse", rows * c.q_heads)?,
            scores: g.zeros("scores", rows * c.q_heads * c.max_seq_len)?,
            gate: g.zeros("gate", rows * f)?,
            up: g.zeros("up", rows * f)?,
            s: g.zeros("s", rows * f)?,
            ids: g.zeros("ids", rows)?,
            router: g.zeros("router logits", rows * e_n)?,
            expert: g.zeros("experts", rows * k)?,
            weight: g.zeros("routing weights", rows * k)?,
            egate: g.zeros("expert gate", rows * k * fe)?,
            eup: g.zeros("expert up", rows * k * fe)?,
            es: g.zeros("expert hidden", rows * k * fe)?,
            ey: g.zeros("expert out", rows * k * d)?,
            slot_rows: g.upload_u32("slot rows", &(0..(rows * k) as u32).collect::<Vec<_>>())?,
        });
        Ok(())
    }

    /// Encodes and submits a forward pass over `ids` after the cache's positions, leaving
    /// the last position's logits and their argmax on the device. Checks as the CPU does.
    pub fn forward(&mut self, ids: &[u32], cache: &mut GpuCache) -> Result<()> {
        let c = self.cfg.clone();
        let r = ids.len();
        if r == 0 {
            return Err(ShaderError::Invalid(
                "forward_cached needs at least one token id".into(),
            ));
        }
        if let Some(i) = ids.iter().position(|&t| t as usize >= c.vocab_size) {
            return Err(CoreError::TokenOutOfRange {
                what: "input",
                id: ids[i],
                row: 0,
                position: cache.len + i,
                vocab: c.vocab_size,
            }
            .into());
        }
        if cache.k.len() != c.n_layers {
            return Err(ShaderError::Invalid(
                "this KV cache was made for a model of another shape".into(),
            ));
        }
        if cache.len + r > c.max_seq_len {
            return Err(CoreError::InvalidDimension {
                op: "forward_cached",
                message: format!(
                    "{} cached + {r} new positions is over max_seq_len {}",
                    cache.len, c.max_seq_len
                ),
            }
            .into());
        }
        let most = self.max_rows();
        if r > most {
            // A long prompt in pieces, so every activation (the attention scores above
            // all: rows x heads x max_seq_len) fits one binding. Checked whole above, so a
            // refused prompt leaves the cache as it was.
            for piece in ids.chunks(most) {
                self.forward(piece, cache)?;
            }
            return Ok(());
        }
        self.acts(r)?;
        let a = self.acts.as_ref().expect("made above");
        let (d, kv) = (c.d_model, c.kv_dim());
        let pos = cache.len;
        let (rope_q, rope_k) = c.rope_specs(1, r, pos);
        let spec = AttentionSpec {
            batch: 1,
            q_len: r,
            kv_len: pos + r,
            kv_capacity: c.max_seq_len,
            q_heads: c.q_heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
        };
        self.gpu.write_u32(&a.ids, 0, ids)?;
        let g = &self.gpu;
        let mut b = g.batch_cached(&mut self.cache);
        for (row0, rows, ws, ss) in &self.embed.slabs {
            b.q8_embedding_slab(&a.x, &a.ids, ws, ss, r, c.vocab_size, d, (*row0, *rows))?;
        }
        // out = x . W^T + beta * out, with x rounded to int8 first, as the CPU's q8_matmul.
        let linear = |b: &mut Batch, out: &GpuBuffer, x: &GpuBuffer, w: &Q8, rows: usize, beta: f32| {
            b.q8_quantize(&a.xq, &a.xs, x, rows, w.k)?;
            for (row0, n, ws, ss) in &w.slabs {
                b.q8_matmul_cols(out, (w.n, *row0), &a.xq, &a.xs, ws, ss, rows, *n, w.k, beta)?;
            }
            Ok::<(), ShaderError>(())
        };
        for (l, w) in self.layers.iter().enumerate() {
            b.rmsnorm(&a.h, &a.rstd, &a.x, &w.attn_norm, r, d, c.norm_eps)?;
            linear(&mut b, &a.q, &a.h, &w.wq, r, 0.0)?;
            linear(&mut b, &a.k, &a.h, &w.wk, r, 0.0)?;
            linear(&mut b, &a.v, &a.h, &w.wv, r, 0.0)?;
            b.rope(&a.q, &self.rope, &rope_q, false)?;
            b.rope(&a.k, &self.rope, &rope_k, false)?;
            b.copy(&cache.k[l], pos * kv, &a.k, 0, r * kv)?;
            b.copy(&cache.v[l], pos * kv, &a.v, 0, r * kv)?;
            b.attention(&a.att, &a.lse, &a.q, &cache.k[l], &cache.v[l], &a.scores, &spec)?;
            linear(&mut b, &a.x, &a.att, &w.wo, r, 1.0)?;
            b.rmsnorm(&a.h, &a.rstd, &a.x, &w.ffn_norm, r, d, c.norm_eps)?;
            if let Some(mlp) = &w.mlp {
                let f = mlp[0].n;
                linear(&mut b, &a.gate, &a.h, &mlp[0], r, 0.0)?;
                linear(&mut b, &a.up, &a.h, &mlp[1], r, 0.0)?;
                b.swiglu(&a.s, &a.gate, &a.up, r * f)?;
                linear(&mut b, &a.x, &a.s, &mlp[2], r, 1.0)?;
            }
            if let (Some(moe), Some(m)) = (&w.moe, c.sparse(l)) {
                let (e_n, k, fe) = (m.n_experts, m.top_k, m.expert_d_ff);
                let ((gw, gs), (uw, us), (dw, ds)) = (moe.gate.whole()?, moe.up.whole()?, moe.down.whole()?);
                // The router in f32, as on the CPU; routing and top-k on the device.
                b.matmul(
                    &a.router,
                    &a.h,
                    &moe.router,
                    (r, e_n, d, 1),
                    (false, true),
                    (1.0, 0.0),
                    (0, 0, 0),
                )?;
                b.moe_route(&a.expert, &a.weight, &a.router, r, e_n, k, m.renormalize)?;
                b.q8_quantize(&a.xq, &a.xs, &a.h, r, d)?;
                b.q8_expert(&a.egate, &a.xq, &a.xs, gw, gs, &a.expert, (r * k, fe, d, k), true)?;
                b.q8_expert(&a.eup, &a.xq, &a.xs, uw, us, &a.expert, (r * k, fe, d, k), true)?;
                b.swiglu(&a.es, &a.egate, &a.eup, r * k * fe)?;
                b.q8_quantize(&a.xq, &a.xs, &a.es, r * k, fe)?;
                b.q8_expert(&a.ey, &a.xq, &a.xs, dw, ds, &a.expert, (r * k, d, fe, k), false)?;
                b.moe_combine(&a.x, &a.slot_rows, &a.weight, &a.ey, r, d, k)?;
            }
        }
        b.rmsnorm(&a.h, &a.rstd, &a.x, &self.final_norm, r, d, c.norm_eps)?;
        b.copy(&self.last, 0, &a.h, (r - 1) * d, d)?;
        // Only the last position's logits, through the tied int8 embedding.
        linear(&mut b, &self.logits, &self.last, &self.embed, 1, 0.0)?;
        b.submit()?;
        cache.len += r;
        Ok(())
    }

    /// The logits of the last forward pass (`vocab_size` values).
    pub async fn logits(&self) -> Result<Vec<f32>> {
        self.gpu.read(&self.logits).await
    }

    /// The next id from the last forward pass's logits, drawn as `sampler.sample` would
    /// draw it from them: greedy (with or without a repetition penalty) is an argmax on the
    /// device and reads back 4 bytes; temperature sampling with `top_k` up to 256 ranks the
    /// top k on the device and reads back those k pairs, the f64 draw then runs on the host
    /// (`Sampler::sample_ranked`), so the ids are the CPU's for the same seed; without
    /// `top_k` the logits come back and the core sampler draws from the whole row.
    pub async fn draw(&mut self, sampler: &mut Sampler, context: &[u32]) -> Result<u32> {
        sampler.validate()?;
        let vocab = self.cfg.vocab_size;
        let k = match (sampler.temperature == 0.0, sampler.top_k) {
            (true, _) => None,
            (false, Some(k)) if k <= DEVICE_TOP_K => Some(k.min(vocab)),
            (false, _) => return Ok(sampler.sample(&self.logits().await?, context)?),
        };
        let ids = if sampler.repetition_penalty != 1.0 {
            context_ids(context, vocab)
        } else {
            Vec::new()
        };
        if ids.len() > self.context.len() {
            self.context = self.gpu.zeros("context ids", ids.len().next_power_of_two())?;
        }
        self.gpu.write_u32(&self.context, 0, &ids)?;
        let mut b = self.gpu.batch_cached(&mut self.sample_cache);
        b.copy(&self.penalized, 0, &self.logits, 0, vocab)?;
        b.penalize(
            &self.penalized,
            &self.context,
            ids.len(),
            sampler.repetition_penalty,
        )?;
        match k {
            None => b.argmax(&self.best, &self.penalized, 1, vocab)?,
            Some(k) => b.topk(
                &self.top_ids,
                &self.top_vals,
                &self.top_scratch,
                &self.penalized,
                vocab,
                k,
            )?,
        }
        b.submit()?;
        let nan = || -> ShaderError {
            CoreError::NonFinite {
                op: "sampler",
                value: f64::NAN,
            }
            .into()
        };
        match k {
            None => {
                let id = self.gpu.read_u32(&self.best, 0, 1).await?[0];
                if id == NAN_ROW {
                    return Err(nan());
                }
                Ok(id)
            }
            Some(k) => {
                let ids = self.gpu.read_u32(&self.top_ids, 0, k).await?;
                let vals = self.gpu.read(&self.top_vals).await?;
                if ids.contains(&NAN_ROW) {
                    return Err(nan());
                }
                let ranked: Vec<(u32, f32)> = ids
                    .iter()
                    .zip(&vals)
                    .take_while(|(id, _)| **id != NO_ID)
                    .map(|(&id, &v)| (id, v))
                    .collect();
                Ok(sampler.sample_ranked(&ranked)?)
            }
        }
    }
}

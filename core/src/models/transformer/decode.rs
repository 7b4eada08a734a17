//! Cached decoding: the keys and values of every block, and one position (or a prompt's piece) at a time.

use super::*;

/// Keys and values of every block for one sequence being decoded, with room for
/// `max_seq_len` positions; `len` are filled. Made by
/// [`TransformerModel::new_kv_caches`].
pub struct KvCache<B: Backend> {
    pub(super) k: Vec<B::Buffer>,
    pub(super) v: Vec<B::Buffer>,
    pub(super) len: usize,
}

impl<B: Backend> KvCache<B> {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }
    /// No positions held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Forgets every position (the buffers stay allocated).
    pub fn clear(&mut self) {
        self.len = 0;
    }
}

/// The caches a cached forward pass appends to.
enum Caches<'m, 'c, B: Backend> {
    /// One sequence's, all of the pass's rows.
    One(&'m mut KvCache<B>),
    /// Several sequences' new rows one after another, `lens[i]` of them for `caches[i]`.
    Many(&'m mut [&'c mut KvCache<B>], &'m [usize]),
}

/// Scratch of a cached forward pass over `rows` new positions.
pub(super) struct DecodeArena<B: Backend> {
    pub(super) rows: usize,
    pub(super) x: B::Buffer,
    pub(super) h: B::Buffer,
    pub(super) rstd: B::Buffer,
    pub(super) h2: B::Buffer,
    pub(super) rstd2: B::Buffer,
    pub(super) q: B::Buffer,
    pub(super) k: B::Buffer,
    pub(super) v: B::Buffer,
    pub(super) qk: [B::Buffer; 4],
    pub(super) att: B::Buffer,
    pub(super) lse: B::Buffer,
    /// `(gate, up, s)` per feed-forward width.
    pub(super) ffn: Triples<B>,
    /// Shared by every sparse block (they route one after another).
    pub(super) moe: Option<MoeActs<B>>,
    /// Each block's `x A^T` with adapters attached or picked (scratch here, not kept),
    /// `lora_stride` values a row.
    pub(super) lora_t: Vec<Block<Option<B::Buffer>>>,
    pub(super) lora_stride: usize,
    pub(super) last: B::Buffer,
    pub(super) logits: B::Buffer,
    /// For passes over several sequences: one sequence's attention scratch, each
    /// sequence's last row `(sequences, d_model)` and logits `(sequences, vocab_size)`,
    /// made at the first such pass (the last two again when the count of sequences changes).
    pub(super) step: Option<(RowScratch<B>, B::Buffer, B::Buffer)>,
}

impl<B: Backend> TransformerModel<B> {
    /// Sets the longest sequence the model takes, for a published model whose context
    /// (131,072 positions for Llama 3.1) would make KV caches of many gigabytes: the caches
    /// are `n_layers x 2 x max_seq_len x kv_dim` values. Nothing learned depends on it; RoPE
    /// positions are absolute. Caches made before are refused afterwards (their shape no
    /// longer matches), so a conversation starts again.
    pub fn set_max_seq_len(&mut self, n: usize) -> Result<()> {
        if n == 0 {
            return Err(invalid("max_seq_len must be at least 1".into()));
        }
        self.config.max_seq_len = n;
        Ok(())
    }
    /// Empty key/value caches for one sequence of up to `max_seq_len` positions.
    pub fn new_kv_caches(&self) -> Result<KvCache<B>> {
        let n = self.config.max_seq_len * self.config.kv_dim();
        let b = &self.backend;
        Ok(KvCache {
            k: (0..self.config.n_layers).map(|_| b.zeros(n)).collect::<Result<_>>()?,
            v: (0..self.config.n_layers).map(|_| b.zeros(n)).collect::<Result<_>>()?,
            len: 0,
        })
    }
    /// Runs `ids` (one sequence, any number of new positions) after the `cache.len()`
    /// positions already in `cache`, appends their keys and values, and returns the logits
    /// of the last new position (`vocab_size` values). Prefill is one call with the whole
    /// prompt; decoding, one call per token.
    pub fn forward_cached(&mut self, ids: &[u32], cache: &mut KvCache<B>) -> Result<Vec<f32>> {
        self.forward_cached_on_device(ids, cache)?;
        let a = self.decode.as_ref().expect("the pass made it");
        self.backend.download(&a.logits)
    }
    /// [`TransformerModel::forward_cached`], leaving the logits in the backend's buffer
    /// (`vocab_size` values) for a sampler that runs where they are: on a GPU, a greedy
    /// token then reads back one id, and nothing in the pass waits for the device (an
    /// int8 model's experts are routed there too, see [`MoeOps::routes_on_device`](crate::backend::MoeOps::routes_on_device)).
    /// Refused input changes nothing: every id and the cache's room are checked first.
    pub fn forward_cached_on_device(&mut self, ids: &[u32], cache: &mut KvCache<B>) -> Result<&B::Buffer> {
        self.cached_on_device(ids, cache, None)
    }
    /// [`TransformerModel::forward_cached`] with the named adapters `pick` (an index from
    /// [`TransformerModel::add_named_lora`]) on this sequence, or as the model stands with
    /// `None`.
    pub fn forward_cached_picked(
        &mut self, ids: &[u32], cache: &mut KvCache<B>, pick: Option<usize>,
    ) -> Result<Vec<f32>> {
        self.cached_on_device(ids, cache, pick)?;
        let a = self.decode.as_ref().expect("the pass made it");
        self.backend.download(&a.logits)
    }
    fn cached_on_device(
        &mut self, ids: &[u32], cache: &mut KvCache<B>, pick: Option<usize>,
    ) -> Result<&B::Buffer> {
        self.check_cached(ids, cache)?;
        self.check_picks(&[pick])?;
        // A long prompt in pieces (see piece_limit); the pieces give the same values.
        for piece in ids.chunks(self.piece_limit()) {
            self.cached_pass(piece, Caches::One(cache), &[pick])?;
        }
        Ok(&self.decode.as_ref().expect("the pass made it").logits)
    }
    /// One decode step for several sequences at once: `ids[i]` follows what `caches[i]`
    /// holds and is appended to it. Returns the logits `(ids.len(), vocab_size)`, row `i`
    /// for sequence `i`. The weight products run once over all the rows (what a server
    /// batching its requests wants); RoPE and attention run a sequence at a time over its
    /// own cache. Each row's sums do not depend on the other rows, so a sequence gets the
    /// logits [`TransformerModel::forward_cached`] gives it alone, bit for bit, whatever
    /// shares its step. Refused input changes nothing: every id and cache is checked first.
    pub fn forward_cached_rows(&mut self, ids: &[u32], caches: &mut [&mut KvCache<B>]) -> Result<Vec<f32>> {
        self.forward_cached_rows_picked(ids, caches, &alloc::vec![None; ids.len()])
    }
    /// [`TransformerModel::forward_cached_rows`] with each sequence's own adapters:
    /// `picks[i]` names the adapters of sequence `i` (an index from
    /// [`TransformerModel::add_named_lora`]), `None` the model as it stands. The base
    /// products still run once over every row; each sequence's adapter products run on its
    /// row alone, so a row's logits are what [`TransformerModel::forward_cached_picked`]
    /// gives that sequence alone whatever the others pick (bit for bit on an int8 base).
    /// Adapters that adapt routed experts are picked for a whole pass only, and named
    /// adapters only on a model with none attached.
    pub fn forward_cached_rows_picked(
        &mut self, ids: &[u32], caches: &mut [&mut KvCache<B>], picks: &[Option<usize>],
    ) -> Result<Vec<f32>> {
        if ids.len() != caches.len() {
            return Err(batch_err(format!(
                "{} ids for {} KV caches: one id a cache",
                ids.len(),
                caches.len()
            )));
        }
        let pieces: Vec<&[u32]> = ids.chunks(1).collect();
        self.forward_cached_many(&pieces, caches, picks)
    }
    /// Several sequences' new positions in one pass: `pieces[i]` (any number of ids)
    /// follows what `caches[i]` holds and is appended to it, with the named adapters
    /// `picks[i]` (`None`: the model as it stands). Returns the logits of each piece's last
    /// position, `(pieces.len(), vocab_size)`. A server's joining prompts prefill together
    /// this way, and its decode step is the case of one id a piece. The products run once
    /// over every row; RoPE runs a sequence at a time, and attention a position at a time
    /// over its sequence's cache. On an int8 model each row's sums depend neither on the
    /// other rows nor on how a sequence's positions are split between passes, so a
    /// sequence gets the logits its own pass gives it, bit for bit, and a prompt continued
    /// from a copied prefix ([`TransformerModel::copy_kv_prefix`]) those of its whole
    /// prefill; in f32 the same holds for passes of at most 32 rows (longer products sum in
    /// blocks of the batch's size). [`TransformerModel::forward_cached_picked`] agrees to
    /// rounding (its attention may be tiled over a prompt's positions). A piece longer than
    /// [`TransformerModel::piece_limit`] is refused (prefill it alone, which splits it).
    /// Refused input changes nothing: every piece and cache is checked first.
    pub fn forward_cached_many(
        &mut self, pieces: &[&[u32]], caches: &mut [&mut KvCache<B>], picks: &[Option<usize>],
    ) -> Result<Vec<f32>> {
        if pieces.is_empty() {
            return Err(batch_err("a cached pass over several sequences needs at least one".into()));
        }
        if pieces.len() != caches.len() {
            return Err(batch_err(format!(
                "{} pieces for {} KV caches: one piece a cache",
                pieces.len(),
                caches.len()
            )));
        }
        if picks.len() != pieces.len() {
            return Err(batch_err(format!("{} adapter picks for {} sequences", picks.len(), pieces.len())));
        }
        let most = self.piece_limit();
        for (i, (piece, cache)) in pieces.iter().zip(caches.iter()).enumerate() {
            self.check_cached(piece, cache)?;
            if piece.len() > most {
                return Err(batch_err(format!(
                    "piece {i} has {} positions, over the {most} a pass takes for one sequence: prefill it alone",
                    piece.len()
                )));
            }
        }
        self.check_picks(picks)?;
        let ids: Vec<u32> = pieces.iter().flat_map(|p| p.iter().copied()).collect();
        let lens: Vec<usize> = pieces.iter().map(|p| p.len()).collect();
        self.cached_pass(&ids, Caches::Many(caches, &lens), picks)?;
        let a = self.decode.as_ref().expect("the pass made it");
        self.backend.download(&a.step.as_ref().expect("the pass made it").2)
    }
    /// The most new positions of one sequence a cached pass takes: its attention scores
    /// over the whole cache (positions x q_heads x max_seq_len) stay within 2^25 values
    /// (128 MiB, the storage binding every WebGPU adapter offers) and within the backend's
    /// binding; [`TransformerModel::forward_cached`] splits a longer prompt into pieces of
    /// this size.
    pub fn piece_limit(&self) -> usize {
        let c = &self.config;
        let room = (1usize << 25).min(self.backend.max_binding_len());
        (room / (c.q_heads * c.max_seq_len).max(1)).clamp(1, 256)
    }
    /// Makes `to` hold the first `n` positions `from` holds (and nothing after): a prompt
    /// that starts as an earlier one did (a chat's system prompt) reuses those positions'
    /// keys and values instead of computing them again. On an int8 model the values are the
    /// bits a prefill of the whole prompt computes, and a continuation through
    /// [`TransformerModel::forward_cached_many`] gives that prefill's logits; in f32 they
    /// agree to rounding. Refused (nothing changes) when `from` holds fewer than `n` or
    /// either cache is of another shape.
    pub fn copy_kv_prefix(&self, from: &KvCache<B>, to: &mut KvCache<B>, n: usize) -> Result<()> {
        if n > from.len {
            return Err(invalid(format!("the cache holds {} positions; {n} cannot be copied", from.len)));
        }
        let c = &self.config;
        let want = c.max_seq_len * c.kv_dim();
        let b = &self.backend;
        if [from, &*to]
            .iter()
            .any(|k| k.k.len() != c.n_layers || k.k.iter().chain(&k.v).any(|x| b.len(x) != want))
        {
            return Err(invalid("this KV cache was made for a model of another shape".into()));
        }
        for l in 0..c.n_layers {
            b.copy_range(&mut to.k[l], 0, &from.k[l], 0, n * c.kv_dim())?;
            b.copy_range(&mut to.v[l], 0, &from.v[l], 0, n * c.kv_dim())?;
        }
        to.len = n;
        Ok(())
    }
    /// The logits the last cached forward pass left in the backend's buffer, if any.
    pub fn cached_logits(&self) -> Option<&B::Buffer> {
        self.decode.as_ref().map(|a| &a.logits)
    }
    /// Adapter picks the cached passes refuse: an index not held, a pick on a model with
    /// adapters attached, per-sequence picks that adapt routed experts.
    fn check_picks(&self, picks: &[Option<usize>]) -> Result<()> {
        let held = self.named_lora.len();
        for k in picks.iter().flatten() {
            if *k >= held {
                return Err(invalid(format!("adapter index {k} is not held ({held} are)")));
            }
            if self.lora.is_some() {
                return Err(invalid(
                    "named adapters are picked on a base with none attached; merge_lora() or start from the base".into(),
                ));
            }
        }
        let experts = |k: &usize| {
            self.named_lora[*k]
                .config
                .targets
                .iter()
                .any(|t| ["gate_proj", "up_proj", "down_proj"].contains(&t.as_str()))
        };
        let sparse = (0..self.config.n_layers).any(|l| self.config.sparse(l).is_some());
        let first = picks.first().copied().flatten();
        if sparse
            && picks.len() > 1
            && picks.iter().flatten().any(experts)
            && picks.iter().any(|p| *p != first)
        {
            return Err(invalid(
                "adapters on routed experts serve a whole step: decode the sequences that pick different ones in separate steps".into(),
            ));
        }
        Ok(())
    }
    /// What [`TransformerModel::forward_cached`] refuses.
    pub(super) fn check_cached(&self, ids: &[u32], cache: &KvCache<B>) -> Result<()> {
        let c = &self.config;
        let r = ids.len();
        if r == 0 {
            return Err(batch_err("forward_cached needs at least one token id".into()));
        }
        if let Some(i) = ids.iter().position(|&t| t as usize >= c.vocab_size) {
            return Err(CoreError::TokenOutOfRange {
                what: "input",
                id: ids[i],
                row: 0,
                position: cache.len + i,
                vocab: c.vocab_size,
            });
        }
        let want = c.max_seq_len * c.kv_dim();
        if cache.k.len() != c.n_layers
            || cache.k.iter().chain(&cache.v).any(|buf| self.backend.len(buf) != want)
        {
            return Err(invalid("this KV cache was made for a model of another shape".into()));
        }
        if cache.len + r > c.max_seq_len {
            return Err(CoreError::InvalidDimension {
                op: "forward_cached",
                message: format!(
                    "{} cached + {r} new positions is over max_seq_len {}",
                    cache.len, c.max_seq_len
                ),
            });
        }
        Ok(())
    }
    /// The decode arena for passes of `r` new rows, made anew when the row count changes.
    fn decode_arena(&mut self, r: usize) -> Result<()> {
        let c = &self.config;
        let (d, q, kv) = (c.d_model, c.q_dim(), c.kv_dim());
        let b = &self.backend;
        if self.decode.as_ref().is_none_or(|a| a.rows != r) {
            self.decode = None;
            let cover = self.lora_cover();
            let mut lens: Vec<usize> =
                (0..c.n_layers).filter_map(|l| c.mlp_width(l)).map(|f| r * f).collect();
            lens.dedup();
            self.decode = Some(DecodeArena {
                rows: r,
                x: b.zeros(r * d)?,
                h: b.zeros(r * d)?,
                rstd: b.zeros(r)?,
                h2: b.zeros(r * d)?,
                rstd2: b.zeros(r)?,
                q: b.zeros(r * q)?,
                k: b.zeros(r * kv)?,
                v: b.zeros(r * kv)?,
                qk: qk_scratch(b, c, r)?,
                att: b.zeros(r * q)?,
                lse: b.zeros(r * c.q_heads)?,
                ffn: Triples::new(b, lens)?,
                moe: match &c.moe {
                    Some(m) => Some(MoeActs::new(b, r, d, m)?),
                    None => None,
                },
                lora_t: lora_t_for(b, c, cover.as_ref(), r)?,
                lora_stride: cover.as_ref().map_or(0, |l| l.rank),
                last: b.zeros(d)?,
                logits: b.zeros(c.vocab_size)?,
                step: None,
            });
        }
        Ok(())
    }
    /// The adapters' `x A^T` scratch covers every adapter the model holds: the largest
    /// rank, every projection any of them targets.
    fn lora_cover(&self) -> Option<LoraConfig> {
        let all: Vec<&LoraConfig> =
            self.lora.iter().map(|l| &l.config).chain(self.named_lora.iter().map(|n| &n.config)).collect();
        let rank = all.iter().map(|c| c.rank).max()?;
        let targets: Vec<&str> = all.iter().flat_map(|c| c.targets.iter().map(String::as_str)).collect();
        Some(LoraConfig::new(rank).targets(&targets))
    }
    /// A cached forward pass over `ids`: one sequence's new positions, or one new position
    /// for each of several sequences (row `i` for `caches[i]`), `picks` naming each
    /// sequence's adapters (checked by the caller). The logits are left in the decode
    /// arena: the last position's, or every row's.
    fn cached_pass(
        &mut self, ids: &[u32], mut caches: Caches<'_, '_, B>, picks: &[Option<usize>],
    ) -> Result<()> {
        let r = ids.len();
        self.decode_arena(r)?;
        let c = &self.config;
        let d = c.d_model;
        let b = &self.backend;
        let a = self.decode.as_mut().expect("made above");
        if let Caches::Many(_, lens) = &caches {
            let s = lens.len();
            match &mut a.step {
                Some((_, _, logits)) if b.len(logits) == s * c.vocab_size => {}
                Some((_, last, logits)) => {
                    *last = b.zeros(s * d)?;
                    *logits = b.zeros(s * c.vocab_size)?;
                }
                None => {
                    a.step = Some((RowScratch::new(b, c, 1)?, b.zeros(s * d)?, b.zeros(s * c.vocab_size)?))
                }
            }
        }
        let prec = self.precision;
        let mm = |m, nn, k| MatmulSpec::new(m, nn, k).precision(prec);
        let pos = match &caches {
            Caches::One(cache) => cache.len,
            Caches::Many(..) => 0,
        };
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
        let quantized = self.quantized.as_ref();
        let experts_adapted = self.lora.as_ref().is_some_and(|l| {
            l.config.targets.iter().any(|t| ["gate_proj", "up_proj", "down_proj"].contains(&t.as_str()))
        });
        let routed_here = quantized.is_some() && b.routes_on_device() && !experts_adapted;
        match quantized.map(|q| &q.embed) {
            Some(Some((packed, scales))) => b.q8_embedding(&mut a.x, packed, scales, ids, c.vocab_size, d)?,
            _ => b.embedding_forward(&mut a.x, &self.params.embed, ids, c.vocab_size, d)?,
        }
        self.expert_usage.clear();
        let lora_ctx = LoraCtx::of(self.lora.as_ref(), prec);
        let named = &self.named_lora;
        // Each sequence's rows of the pass (first, count).
        let spans: Vec<(usize, usize)> = match &caches {
            Caches::One(_) => alloc::vec![(0, r)],
            Caches::Many(_, lens) => lens
                .iter()
                .scan(0, |at, &n| {
                    *at += n;
                    Some((*at - n, n))
                })
                .collect(),
        };
        for l in 0..c.n_layers {
            let w = block_view(&self.params, quantized, l)?;
            let lora = if picks.iter().all(Option::is_none) {
                block_lora(self.lora.as_ref(), lora_ctx, l, &mut a.lora_t, r)
            } else {
                let groups = picks
                    .iter()
                    .enumerate()
                    .filter_map(|(i, k)| {
                        let n = &named[(*k)?];
                        let ctx = LoraCtx { rank: n.config.rank, scale: n.config.scale(), prec };
                        let (first, rows) = spans[i];
                        Some(Rows { w: &n.weights.layers[l], ctx, first, rows })
                    })
                    .collect();
                Some(BlockLora { groups, t: &mut a.lora_t[l], stride: a.lora_stride })
            };
            let ffn = match c.mlp_width(l) {
                Some(f) => {
                    let [gate, up, s] = a.ffn.get(r * f)?;
                    Some([gate, up, s])
                }
                None => None,
            };
            let acts = BlockActs {
                h: &mut a.h,
                rstd1: &mut a.rstd,
                q: &mut a.q,
                k: &mut a.k,
                v: &mut a.v,
                qk: &mut a.qk,
                att: &mut a.att,
                lse: &mut a.lse,
                h2: &mut a.h2,
                rstd2: &mut a.rstd2,
                ffn,
                moe: a.moe.as_mut(),
                saved: None,
            };
            let keys = match &mut caches {
                Caches::One(cache) => Keys::Cache { k: &mut cache.k[l], v: &mut cache.v[l], pos },
                Caches::Many(many, lens) => Keys::Rows {
                    rows: many
                        .iter_mut()
                        .zip(lens.iter())
                        .map(|(m, &n)| (&mut m.k[l], &mut m.v[l], m.len, n))
                        .collect(),
                    one: &mut a.step.as_mut().expect("made above").0,
                },
            };
            let p = &self.params.layers[l];
            block_forward(b, c, l, p, &w, &mut a.x, acts, keys, (&rope_q, &rope_k, &spec), r, prec, lora)?;
            // Routed on the device, the counts stay there: no usage is reported.
            if let (Some(_), Some(acts), false) = (c.sparse(l), &a.moe, routed_here) {
                self.expert_usage.push(acts.routing.usage());
            }
        }
        b.rmsnorm_forward(&mut a.h, &mut a.rstd, &a.x, &self.params.final_norm, r, d, c.norm_eps)?;
        let head = match quantized.map(|q| q.head()) {
            Some(Some((packed, scales))) => Mat::Q8(packed, scales),
            _ => Mat::F32(self.params.head()),
        };
        match caches {
            Caches::One(cache) => {
                b.copy_range(&mut a.last, 0, &a.h, (r - 1) * d, d)?;
                // Only the last position's logits: one (1, d) x (d, vocab) product.
                head.apply(b, &mut a.logits, &a.last, mm(1, c.vocab_size, d))?;
                cache.len += r;
            }
            Caches::Many(many, lens) => {
                // Each sequence's last row's logits: one (sequences, d) x (d, vocab) product
                // (over the stream itself when every sequence has one row).
                let s = lens.len();
                let (_, last, logits) = a.step.as_mut().expect("made above");
                let rows = if s == r {
                    &a.h
                } else {
                    for (i, &(first, n)) in spans.iter().enumerate() {
                        b.copy_range(last, i * d, &a.h, (first + n - 1) * d, d)?;
                    }
                    &*last
                };
                head.apply(b, logits, rows, mm(s, c.vocab_size, d))?;
                for (m, &n) in many.iter_mut().zip(lens.iter()) {
                    m.len += n;
                }
            }
        }
        Ok(())
    }
}

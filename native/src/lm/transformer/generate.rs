//! Generation: KV caches, `forward_cached`, `generate` and the step-by-step `Decoder`.

use super::*;

impl TransformerLm {
    /// Empty key/value caches for one sequence of up to `max_seq_len` positions. They are
    /// allocated on the model's device at the first `forward_cached`, which reports a
    /// failed allocation.
    pub fn new_kv_caches(&self) -> KvCaches {
        KvCaches { inner: None }
    }
    /// The caches' buffers on the model's device.
    pub(super) fn make_caches(&self) -> Result<CacheEngine> {
        Ok(match &self.engine {
            LmEngine::Cpu(m) => CacheEngine::Cpu(m.new_kv_caches()?),
            #[cfg(feature = "gpu")]
            LmEngine::Wgpu(w) => CacheEngine::Wgpu(
                w.device.new_kv_caches()?,
                Box::new(rusting_brain_shaders::DeviceSampler::new(
                    &w.device.backend,
                    w.device.config.vocab_size,
                )?),
            ),
            #[cfg(feature = "cuda-backend")]
            LmEngine::Cuda(c) => CacheEngine::Cuda(c.device.new_kv_caches()?),
        })
    }
    /// The caches' buffers, made on the model's device the first time they are used.
    pub(super) fn caches<'c>(&self, caches: &'c mut KvCaches) -> Result<&'c mut CacheEngine> {
        Ok(match &mut caches.inner {
            Some(c) => c,
            empty => empty.insert(self.make_caches()?),
        })
    }
    /// Runs `ids` after what `caches` holds and returns the logits of the last new position
    /// (`vocab_size` values): prefill with the whole prompt, then one call per token.
    pub fn forward_cached(&mut self, ids: &[u32], caches: &mut KvCaches) -> Result<Vec<f32>> {
        self.forward_cached_with(ids, caches, None)
    }
    /// [`TransformerLm::forward_cached`] with the adapters loaded under `adapter` by
    /// [`TransformerLm::load_named_lora`] on this sequence (`None`: the model as it stands).
    pub fn forward_cached_with(
        &mut self, ids: &[u32], caches: &mut KvCaches, adapter: Option<&str>,
    ) -> Result<Vec<f32>> {
        let pick = self.pick_lora(adapter)?;
        let inner = self.caches(caches)?;
        match (&mut self.engine, inner) {
            (LmEngine::Cpu(m), CacheEngine::Cpu(c)) => Ok(m.forward_cached_picked(ids, c, pick)?),
            #[cfg(feature = "cuda-backend")]
            (LmEngine::Cuda(m), CacheEngine::Cuda(c)) => Ok(m.device.forward_cached_picked(ids, c, pick)?),
            #[cfg(feature = "gpu")]
            (LmEngine::Wgpu(m), CacheEngine::Wgpu(c, _)) => Ok(m.device.forward_cached_picked(ids, c, pick)?),
            #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
            _ => Err(NetworkError::InvalidInput(
                "these KV caches belong to another device; make them with new_kv_caches() after the model moved"
                    .into(),
            )),
        }
    }
    /// One decode step for several sequences at once: `ids[i]` follows what `caches[i]`
    /// holds. Returns the logits `(ids.len(), vocab_size)`, row `i` for sequence `i`. The
    /// weight products run once over all the rows (one GEMM a weight for the whole step, as
    /// a server batching its requests wants); RoPE and attention run a sequence at a time
    /// over its own cache. Each row's sums do not depend on the others: a sequence gets the
    /// logits `forward_cached` gives it alone, bit for bit, whatever shares its step (in
    /// f32 up to 32 sequences a step, on the CPU). Refused input (an id out of range, a full cache, caches of another device
    /// or model) changes no cache.
    pub fn forward_cached_rows(&mut self, ids: &[u32], caches: &mut [&mut KvCaches]) -> Result<Vec<f32>> {
        self.forward_cached_rows_with(ids, caches, &vec![None; ids.len()])
    }
    /// [`TransformerLm::forward_cached_rows`] with each sequence's own adapters:
    /// `adapters[i]` names what [`TransformerLm::load_named_lora`] loaded for sequence `i`,
    /// `None` the base. The base products run once over every row and each sequence's
    /// adapter products on its own row, so requests for different adapters and for the
    /// base share one step, and each row's logits are what `forward_cached_with` gives that
    /// sequence alone (bit for bit on an int8 base).
    pub fn forward_cached_rows_with(
        &mut self, ids: &[u32], caches: &mut [&mut KvCaches], adapters: &[Option<&str>],
    ) -> Result<Vec<f32>> {
        if ids.len() != caches.len() {
            return Err(NetworkError::InvalidInput(format!(
                "{} ids for {} KV caches: one id a cache",
                ids.len(),
                caches.len()
            )));
        }
        let pieces: Vec<&[u32]> = ids.chunks(1).collect();
        self.forward_cached_many(&pieces, caches, adapters)
    }
    /// Several sequences' new positions in one pass: `pieces[i]` (any number of ids, at
    /// most [`TransformerLm::piece_limit`]) follows what `caches[i]` holds, with the
    /// adapters `adapters[i]` names (`None`: the base). Returns the logits of each piece's
    /// last position, `(pieces.len(), vocab_size)`: a server's joining prompts prefill in
    /// one pass this way, the weight products once over all their rows, attention a
    /// position at a time. On an int8 model a position's sums depend neither on the other
    /// sequences nor on how its own are split between passes: each sequence gets the bits
    /// its own pass gives it, and a prompt continued from [`TransformerLm::copy_kv_prefix`]
    /// those of its whole prefill (f32 for passes of at most 32 rows). `forward_cached`
    /// agrees to rounding. Refused input changes no cache.
    pub fn forward_cached_many(
        &mut self, pieces: &[&[u32]], caches: &mut [&mut KvCaches], adapters: &[Option<&str>],
    ) -> Result<Vec<f32>> {
        let picks = adapters.iter().map(|a| self.pick_lora(*a)).collect::<Result<Vec<_>>>()?;
        for c in caches.iter_mut() {
            self.caches(c)?;
        }
        let other = || {
            NetworkError::InvalidInput(
                "these KV caches belong to another device; make them with new_kv_caches() after the model moved"
                    .into(),
            )
        };
        match &mut self.engine {
            LmEngine::Cpu(m) => {
                let mut inner = caches
                    .iter_mut()
                    .map(|c| match c.inner.as_mut() {
                        Some(CacheEngine::Cpu(k)) => Ok(k),
                        #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
                        _ => Err(other()),
                        #[cfg(not(any(feature = "gpu", feature = "cuda-backend")))]
                        None => Err(other()),
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(m.forward_cached_many(pieces, &mut inner, &picks)?)
            }
            #[cfg(feature = "gpu")]
            LmEngine::Wgpu(m) => {
                let mut inner = caches
                    .iter_mut()
                    .map(|c| match c.inner.as_mut() {
                        Some(CacheEngine::Wgpu(k, _)) => Ok(k),
                        _ => Err(other()),
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(m.device.forward_cached_many(pieces, &mut inner, &picks)?)
            }
            #[cfg(feature = "cuda-backend")]
            LmEngine::Cuda(m) => {
                let mut inner = caches
                    .iter_mut()
                    .map(|c| match c.inner.as_mut() {
                        Some(CacheEngine::Cuda(k)) => Ok(k),
                        _ => Err(other()),
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(m.device.forward_cached_many(pieces, &mut inner, &picks)?)
            }
        }
    }
    /// Makes `to` hold the first `n` positions `from` holds: a prompt that starts as an
    /// earlier one did (a chat's system prompt) continues from those keys and values
    /// instead of computing them again. On an int8 model a continuation through
    /// [`TransformerLm::forward_cached_many`] gives the bits of the whole prompt's pass; in
    /// f32 it agrees to rounding. Refused (nothing changes) when
    /// `from` holds fewer than `n` positions or the caches belong to another model or
    /// device.
    pub fn copy_kv_prefix(&mut self, from: &KvCaches, to: &mut KvCaches, n: usize) -> Result<()> {
        if n > from.len() {
            return Err(NetworkError::InvalidInput(format!(
                "the cache holds {} positions; {n} cannot be copied",
                from.len()
            )));
        }
        if n == 0 {
            return Ok(());
        }
        let inner = self.caches(to)?;
        match (&self.engine, from.inner.as_ref(), inner) {
            (LmEngine::Cpu(m), Some(CacheEngine::Cpu(f)), CacheEngine::Cpu(t)) => Ok(m.copy_kv_prefix(f, t, n)?),
            #[cfg(feature = "cuda-backend")]
            (LmEngine::Cuda(m), Some(CacheEngine::Cuda(f)), CacheEngine::Cuda(t)) => {
                Ok(m.device.copy_kv_prefix(f, t, n)?)
            }
            #[cfg(feature = "gpu")]
            (LmEngine::Wgpu(m), Some(CacheEngine::Wgpu(f, _)), CacheEngine::Wgpu(t, _)) => {
                Ok(m.device.copy_kv_prefix(f, t, n)?)
            }
            _ => Err(NetworkError::InvalidInput(
                "these KV caches belong to another device; make them with new_kv_caches() after the model moved"
                    .into(),
            )),
        }
    }
    /// The most new positions of one sequence [`TransformerLm::forward_cached_many`] takes
    /// (`forward_cached` splits a longer prompt into pieces of this size).
    pub fn piece_limit(&self) -> usize {
        match &self.engine {
            LmEngine::Cpu(m) => m.piece_limit(),
            #[cfg(feature = "gpu")]
            LmEngine::Wgpu(m) => m.device.piece_limit(),
            #[cfg(feature = "cuda-backend")]
            LmEngine::Cuda(m) => m.device.piece_limit(),
        }
    }
    /// Runs `ids` and leaves the logits where they are: on wgpu, only the argmax is read
    /// back when the sampler is greedy.
    pub(super) fn advance(&mut self, ids: &[u32], caches: &mut KvCaches) -> Result<Pending> {
        let inner = self.caches(caches)?;
        match (&mut self.engine, inner) {
            #[cfg(feature = "gpu")]
            (LmEngine::Wgpu(m), CacheEngine::Wgpu(c, _)) => {
                m.device.forward_cached_on_device(ids, c)?;
                Ok(Pending::Device)
            }
            (LmEngine::Cpu(_), _) if ids.len() == 1 => {
                // A decode step: split over the thread team or on this thread alone,
                // whichever has lately been faster for this model (cpu::team::DecodeSteps).
                let step = self.decode_steps.begin();
                let logits = self.forward_cached(ids, caches);
                self.decode_steps.end(step);
                Ok(Pending::Host(logits?))
            }
            _ => Ok(Pending::Host(self.forward_cached(ids, caches)?)),
        }
    }
    /// The next id from the pending logits.
    pub(super) fn draw(
        &mut self, pending: &Pending, sampler: &mut Sampler, context: &[u32], caches: &mut KvCaches,
    ) -> Result<u32> {
        #[cfg(not(feature = "gpu"))]
        let _ = caches;
        match pending {
            Pending::Host(logits) => Ok(sampler.sample(logits, context)?),
            #[cfg(feature = "gpu")]
            Pending::Device => match (&self.engine, &mut caches.inner) {
                (LmEngine::Wgpu(m), Some(CacheEngine::Wgpu(_, draw))) => {
                    let logits = m.device.cached_logits().ok_or_else(left)?;
                    Ok(rusting_brain_shaders::block_on(draw.draw(
                        &m.device.backend,
                        logits,
                        sampler,
                        context,
                    ))?)
                }
                _ => Err(left()),
            },
        }
    }
    /// Prefills a fresh cache with `prompt`, then decodes up to `max_new` tokens; returns the
    /// new ids.
    pub fn generate(&mut self, prompt: &[u32], max_new: usize, sampler: &mut Sampler) -> Result<Vec<u32>> {
        self.generate_with(prompt, max_new, sampler, |_| true)
    }
    /// [`TransformerLm::generate`], handing each id to `on_token` as it is decoded; returning
    /// `false` stops (the id that stopped it is kept).
    pub fn generate_with(
        &mut self, prompt: &[u32], max_new: usize, sampler: &mut Sampler,
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<Vec<u32>> {
        let mut decoder = self.decoder();
        decoder.feed(prompt)?;
        // Core's reply loop (the browser engine's too); the last id is not read, as
        // nothing follows it.
        let mut reply = Reply::new(max_new, None);
        while reply.before_draw().is_none() {
            let id = decoder.draw(sampler)?;
            match reply.drawn(&mut decoder.conversation, id, &mut on_token) {
                Turn::Feed { stop: false } => decoder.feed(&[id])?,
                Turn::Feed { stop: true } | Turn::Done(_) => break,
            }
        }
        Ok(reply.into_ids())
    }
    /// A decoding session that keeps its caches between calls: feed a turn, draw tokens,
    /// feed the next turn, and only the new tokens are read.
    pub fn decoder(&mut self) -> Decoder<'_> {
        let caches = self.new_kv_caches();
        Decoder { conversation: Conversation::new(self.config()), model: self, caches, pending: None }
    }
}

pub(super) enum CacheEngine {
    Cpu(KvCache<CpuBackend>),
    #[cfg(feature = "cuda-backend")]
    Cuda(KvCache<crate::backend::cuda::CudaBackend>),
    /// With the draw's buffers, which live beside the logits.
    #[cfg(feature = "gpu")]
    Wgpu(KvCache<rusting_brain_shaders::WgpuBackend>, Box<rusting_brain_shaders::DeviceSampler>),
}

/// The error for logits that are gone: the model moved while a decoder waited.
#[cfg(feature = "gpu")]
pub(super) fn left() -> NetworkError {
    NetworkError::InvalidInput("the model left the GPU during decoding".into())
}

/// The logits of a decoder's last position, not yet sampled: on the host, or on the device.
pub(super) enum Pending {
    Host(Vec<f32>),
    #[cfg(feature = "gpu")]
    Device,
}

/// Key/value caches of one sequence; see [`TransformerLm::new_kv_caches`].
pub struct KvCaches {
    /// `None` until the first use allocates them on the model's device.
    pub(super) inner: Option<CacheEngine>,
}

impl KvCaches {
    /// Positions held.
    pub fn len(&self) -> usize {
        let Some(inner) = &self.inner else { return 0 };
        match inner {
            CacheEngine::Cpu(c) => c.len(),
            #[cfg(feature = "cuda-backend")]
            CacheEngine::Cuda(c) => c.len(),
            #[cfg(feature = "gpu")]
            CacheEngine::Wgpu(c, _) => c.len(),
        }
    }
    /// No messages.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A conversation's decoding state: the caches and every id fed or drawn so far.
pub struct Decoder<'a> {
    pub(super) model: &'a mut TransformerLm,
    pub(super) caches: KvCaches,
    /// The ids so far and the checks a feed passes (core's, as the browser engine's).
    pub(super) conversation: Conversation,
    /// Logits after the last position, waiting for `next`.
    pub(super) pending: Option<Pending>,
}

impl Decoder<'_> {
    /// Reads `ids` after everything so far (a prompt, a user's turn). Checked whole
    /// first (ids inside the vocabulary, room in the cache), so a refused call changes
    /// nothing.
    pub fn feed(&mut self, ids: &[u32]) -> Result<()> {
        self.conversation.check_feed(ids)?;
        self.pending = None;
        let pending = self.model.advance(ids, &mut self.caches)?;
        self.conversation.fed(ids);
        self.pending = Some(pending);
        Ok(())
    }

    /// Draws the next token and reads it, so the following call continues from it.
    pub fn next(&mut self, sampler: &mut Sampler) -> Result<u32> {
        let id = self.draw(sampler)?;
        if self.conversation.drawn(id) {
            self.feed(&[id])?;
        }
        Ok(id)
    }

    /// Draws the next token without reading it; the logits are used up only when the
    /// draw succeeds.
    pub(super) fn draw(&mut self, sampler: &mut Sampler) -> Result<u32> {
        let pending = self
            .pending
            .as_ref()
            .ok_or_else(|| NetworkError::InvalidInput("Decoder::next before any feed".into()))?;
        let id = self.model.draw(pending, sampler, self.conversation.context(), &mut self.caches)?;
        self.pending = None;
        Ok(id)
    }

    /// Whether there are logits to draw from: false before the first feed, and once the
    /// cache is full (`max_seq_len` positions).
    pub fn has_next(&self) -> bool {
        self.pending.is_some()
    }

    /// Every id fed or drawn so far.
    pub fn context(&self) -> &[u32] {
        self.conversation.context()
    }
    /// Positions in the cache.
    pub fn position(&self) -> usize {
        self.caches.len()
    }
    /// The model decoding (its configuration, its device and `TransformerLm::gpu_counters`, feature `gpu`).
    pub fn model(&self) -> &TransformerLm {
        self.model
    }
    /// The most positions the cache can hold (`max_seq_len`).
    pub fn capacity(&self) -> usize {
        self.model.config().max_seq_len
    }
    /// The logits the next draw will use, if any (on a GPU this reads them back).
    pub fn logits(&mut self) -> Result<Option<&[f32]>> {
        #[cfg(feature = "gpu")]
        if let Some(Pending::Device) = self.pending {
            if let LmEngine::Wgpu(m) = &self.model.engine {
                let logits = m.device.cached_logits().ok_or_else(left)?;
                self.pending = Some(Pending::Host(rusting_brain_core::backend::Memory::download(
                    &m.device.backend,
                    logits,
                )?));
            }
        }
        Ok(match &self.pending {
            Some(Pending::Host(l)) => Some(l),
            _ => None,
        })
    }
}

//! The draw on the device: the next token from logits a [`WgpuBackend`] left in its own
//! buffer (`TransformerModel::forward_cached_on_device`), drawn as `Sampler::sample` would
//! draw it, reading back as little as the sampler allows. Every read is `async`, so the
//! same code runs in a page (awaited by the event loop) and natively (with
//! [`crate::block_on`]).

use rusting_brain_core::{CoreError, Sampler};

use crate::{context_ids, GpuBuffer, ShaderError, WgpuBackend, NAN_ROW, NO_ID};

type Result<T, E = ShaderError> = std::result::Result<T, E>;

/// The largest top-k ranked on the device; a larger k reads the logits back.
pub const DEVICE_TOP_K: usize = 256;

/// Buffers of the draw for one vocabulary size, made once and reused every token.
pub struct DeviceSampler {
    vocab: usize,
    /// The logits after the repetition penalty.
    penalized: GpuBuffer,
    /// The context's distinct ids, for the penalty.
    context: GpuBuffer,
    top_ids: GpuBuffer,
    top_vals: GpuBuffer,
    top_scratch: GpuBuffer,
    /// The argmax.
    best: GpuBuffer,
}

impl DeviceSampler {
    /// A sampler for a vocabulary of `vocab` ids, its buffers on `backend`'s device.
    pub fn new(backend: &WgpuBackend, vocab: usize) -> Result<DeviceSampler> {
        let gpu = backend.gpu();
        Ok(DeviceSampler {
            vocab,
            penalized: gpu.zeros("penalized logits", vocab)?,
            context: gpu.zeros("context ids", 256)?,
            top_ids: gpu.zeros("top ids", DEVICE_TOP_K)?,
            top_vals: gpu.zeros("top values", DEVICE_TOP_K)?,
            top_scratch: gpu.zeros("top-k scratch", vocab)?,
            best: gpu.zeros("best", 1)?,
        })
    }

    /// The next id from `logits` (`vocab` values on `backend`), drawn as `sampler.sample`
    /// would draw it from them: greedy (with or without a repetition penalty) is an argmax
    /// on the device and reads back 4 bytes; temperature sampling with `top_k` up to 256
    /// ranks the top k on the device and reads back those k pairs, the f64 draw then runs
    /// on the host (`Sampler::sample_ranked`), so the ids are the CPU's for the same seed;
    /// without `top_k` the logits come back and the core sampler draws from the whole row.
    pub async fn draw(
        &mut self, backend: &WgpuBackend, logits: &GpuBuffer, sampler: &mut Sampler, context: &[u32],
    ) -> Result<u32> {
        sampler.validate()?;
        let vocab = self.vocab;
        if logits.len() != vocab {
            return Err(ShaderError::Invalid(format!(
                "the draw was made for {vocab} logits and was given {}",
                logits.len()
            )));
        }
        let gpu = backend.gpu();
        let k = match (sampler.temperature == 0.0, sampler.top_k) {
            (true, _) => None,
            (false, Some(k)) if k <= DEVICE_TOP_K => Some(k.min(vocab)),
            (false, _) => {
                // The pass that wrote the logits goes first.
                backend.flush()?;
                return Ok(sampler.sample(&gpu.read(logits).await?, context)?);
            }
        };
        let ids = if sampler.repetition_penalty != 1.0 { context_ids(context, vocab) } else { Vec::new() };
        if ids.len() > self.context.len() {
            self.context = gpu.zeros("context ids", ids.len().next_power_of_two())?;
        }
        gpu.write_u32(&self.context, 0, &ids)?;
        // Recorded after the pass that wrote the logits, and submitted with the read of
        // the result: one submission a token.
        backend.record_after(|b| {
            // Without a penalty the logits are ranked where they are.
            let ranked = if ids.is_empty() {
                logits
            } else {
                b.copy(&self.penalized, 0, logits, 0, vocab)?;
                b.penalize(&self.penalized, &self.context, ids.len(), sampler.repetition_penalty)?;
                &self.penalized
            };
            match k {
                None => b.argmax(&self.best, ranked, 1, vocab),
                Some(k) => b.topk(&self.top_ids, &self.top_vals, &self.top_scratch, ranked, vocab, k),
            }
        })?;
        let work = backend.take_pending();
        let nan = || -> ShaderError { CoreError::NonFinite { op: "sampler", value: f64::NAN }.into() };
        match k {
            None => {
                let id = gpu.read_words_after(work, &self.best, 0, 1).await?[0];
                if id == NAN_ROW {
                    return Err(nan());
                }
                Ok(id)
            }
            Some(k) => {
                let ids = gpu.read_words_after(work, &self.top_ids, 0, k).await?;
                let vals = gpu.read(&self.top_vals).await?;
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

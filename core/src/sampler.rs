//! Choosing the next token from a row of logits: greedy, or temperature sampling with
//! top-k, top-p (nucleus) and a repetition penalty, in Hugging Face's order (penalty,
//! temperature, top-k, top-p). The generator is this crate's [`Rng`], so a seed gives the
//! same ids on every platform, the browser included.

use alloc::vec::Vec;

use crate::{CoreError, Result, Rng};

/// How the next token is picked; see the module docs.
#[derive(Debug, Clone)]
pub struct Sampler {
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// Keep only the k most likely tokens.
    pub top_k: Option<usize>,
    /// Keep the most likely tokens whose probabilities add up to at least p.
    pub top_p: Option<f32>,
    /// The CTRL / Hugging Face penalty over tokens already in the context: positive logits
    /// are divided by it, negative ones multiplied. 1 is none.
    pub repetition_penalty: f32,
    rng: Rng,
}

fn invalid(message: alloc::string::String) -> CoreError {
    CoreError::InvalidArgument { op: "sampler", message }
}

/// A seed from the operating system where there is one; a fixed one without `std`.
fn fresh_seed() -> u64 {
    #[cfg(feature = "std")]
    {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(0x5eed);
        h.finish()
    }
    #[cfg(not(feature = "std"))]
    {
        0x5eed_5eed_5eed_5eed
    }
}

impl Sampler {
    /// Always the most likely token (after the repetition penalty, if one is set).
    pub fn greedy() -> Sampler {
        Sampler { temperature: 0.0, top_k: None, top_p: None, repetition_penalty: 1.0, rng: Rng::new(0) }
    }
    /// Sampling from `softmax(logits / temperature)`; `None` seeds from the operating
    /// system (from a fixed seed in a `no_std` build).
    pub fn temperature(temperature: f32, seed: Option<u64>) -> Sampler {
        Sampler {
            temperature,
            top_k: None,
            top_p: None,
            repetition_penalty: 1.0,
            rng: Rng::new(seed.unwrap_or_else(fresh_seed)),
        }
    }
    /// Keep only the `k` most likely tokens.
    pub fn top_k(mut self, k: usize) -> Self {
        self.top_k = Some(k);
        self
    }
    /// Keep the most likely tokens whose probabilities add up to at least `p`.
    pub fn top_p(mut self, p: f32) -> Self {
        self.top_p = Some(p);
        self
    }
    /// Sets the repetition penalty (1 is none).
    pub fn repetition_penalty(mut self, penalty: f32) -> Self {
        self.repetition_penalty = penalty;
        self
    }

    /// Checks the settings (what `sample` checks first).
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(invalid(alloc::format!("temperature {} must be finite and >= 0", self.temperature)));
        }
        if self.top_k == Some(0) {
            return Err(invalid("top_k must be at least 1".into()));
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(invalid(alloc::format!("top_p {p} must be in (0, 1]")));
            }
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(invalid(alloc::format!(
                "repetition penalty {} must be finite and > 0",
                self.repetition_penalty
            )));
        }
        Ok(())
    }

    /// The logits after the repetition penalty over `context`.
    pub fn penalized(&self, logits: &[f32], context: &[u32]) -> Vec<f32> {
        let mut l = logits.to_vec();
        if self.repetition_penalty != 1.0 {
            let mut seen = alloc::vec![false; l.len()];
            for &id in context {
                if let Some(s) = seen.get_mut(id as usize) {
                    if !*s {
                        *s = true;
                        let x = &mut l[id as usize];
                        *x = if *x > 0.0 {
                            *x / self.repetition_penalty
                        } else {
                            *x * self.repetition_penalty
                        };
                    }
                }
            }
        }
        l
    }

    /// The candidate tokens and their probabilities after temperature, top-k and top-p,
    /// most likely first (ties: lower id first). Empty for greedy.
    pub fn candidates(&self, penalized: &[f32]) -> Vec<(u32, f64)> {
        let mut order: Vec<u32> =
            (0..penalized.len() as u32).filter(|&i| penalized[i as usize] > f32::NEG_INFINITY).collect();
        order.sort_by(|&a, &b| penalized[b as usize].total_cmp(&penalized[a as usize]).then(a.cmp(&b)));
        if let Some(k) = self.top_k {
            order.truncate(k);
        }
        let ranked: Vec<(u32, f32)> = order.iter().map(|&i| (i, penalized[i as usize])).collect();
        self.weigh(&ranked)
    }

    /// Temperature and top-p over candidates already ranked and cut to `top_k`: the f64
    /// part of [`Sampler::candidates`], shared with [`Sampler::sample_ranked`].
    fn weigh(&self, ranked: &[(u32, f32)]) -> Vec<(u32, f64)> {
        let t = self.temperature as f64;
        let max = ranked.first().map_or(0.0, |&(_, v)| v as f64);
        let weights: Vec<f64> = ranked.iter().map(|&(_, v)| libm::exp((v as f64 - max) / t)).collect();
        let total: f64 = weights.iter().sum();
        let mut out: Vec<(u32, f64)> =
            ranked.iter().zip(&weights).map(|(&(i, _), &w)| (i, w / total)).collect();
        if let Some(p) = self.top_p {
            let mut cum = 0.0;
            let mut keep = out.len();
            for (n, &(_, q)) in out.iter().enumerate() {
                cum += q;
                if cum >= p as f64 {
                    keep = n + 1;
                    break;
                }
            }
            out.truncate(keep);
            let s: f64 = out.iter().map(|c| c.1).sum();
            out.iter_mut().for_each(|c| c.1 /= s);
        }
        out
    }

    /// The draw from candidates a device ranked: `ranked` holds the `top_k` (or fewer)
    /// largest penalized logits as (id, logit), most likely first, ties by lower id, `-inf`
    /// ones left out. The same id as [`Sampler::sample`] on the whole row, with the same
    /// generator state, so a GPU reads back k pairs instead of the vocabulary.
    pub fn sample_ranked(&mut self, ranked: &[(u32, f32)]) -> Result<u32> {
        self.validate()?;
        if let Some(&(_, v)) = ranked.iter().find(|(_, v)| v.is_nan()) {
            return Err(CoreError::NonFinite { op: "sampler", value: v as f64 });
        }
        let ranked = &ranked[..ranked.len().min(self.top_k.unwrap_or(usize::MAX))];
        if self.temperature == 0.0 {
            return ranked.first().map(|c| c.0).ok_or_else(|| invalid("every logit is -inf".into()));
        }
        let cands = self.weigh(ranked);
        self.draw(&cands)
    }

    fn draw(&mut self, cands: &[(u32, f64)]) -> Result<u32> {
        if cands.is_empty() {
            return Err(invalid("every logit is -inf".into()));
        }
        let u = self.rng.next_f64();
        let mut cum = 0.0;
        for &(id, q) in cands {
            cum += q;
            if u < cum {
                return Ok(id);
            }
        }
        Ok(cands[cands.len() - 1].0)
    }

    /// Picks the next id from one row of logits, given the ids already in the context.
    pub fn sample(&mut self, logits: &[f32], context: &[u32]) -> Result<u32> {
        self.validate()?;
        if logits.is_empty() {
            return Err(invalid("no logits to sample from".into()));
        }
        // Any NaN, branch-free so it vectorizes: the scan is a few percent of a small
        // model's decode step otherwise.
        if logits.iter().fold(false, |any, v| any | v.is_nan()) {
            return Err(CoreError::NonFinite { op: "sampler", value: f64::NAN });
        }
        if self.temperature == 0.0 && self.repetition_penalty == 1.0 {
            return Ok(first_max(logits) as u32);
        }
        let l = self.penalized(logits, context);
        if self.temperature == 0.0 {
            return Ok(first_max(&l) as u32);
        }
        let cands = self.candidates(&l);
        self.draw(&cands)
    }
}

/// The index of the first largest value of `x` (not empty, no NaN): the greedy pick. The
/// largest value comes from sixteen running maxima (a loop that vectorizes), then the
/// first index that holds it.
fn first_max(x: &[f32]) -> usize {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut chunks = x.chunks_exact(16);
    for c in chunks.by_ref() {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = if v > *m { v } else { *m };
        }
    }
    let top =
        chunks.remainder().iter().chain(&lanes).fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    x.iter().position(|&v| v == top).unwrap_or(0)
}

//! What the tests of the workspace share (a dev-only crate): one comparison that fails on
//! NaN and on a length mismatch and names the worst element, NaN-poisoned outputs, a
//! temporary folder that removes itself, and the small language model trained on a
//! learnable rule that the quantization, decoding and GPU tests start from.

pub mod sweep;

#[cfg(feature = "native")]
pub mod dense;
pub use sweep::backend_sweep;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

#[cfg(feature = "native")]
use rusting_brain::{Optimizer, TransformerLm, TransformerLmBuilder};
use rusting_brain_core::models::transformer::TokenBatch;
use rusting_brain_core::{Backend, Rng};

/// Asserts `|got - want| <= atol + rtol * |want|` element by element. Fails on a length
/// mismatch and on any NaN, in `got` or in `want` (a NaN the reference shares would hide
/// an output neither side wrote), and names the worst element relative to its bound.
/// Returns the worst element's distance as a fraction of its bound (at most 1), for tests
/// that report how close to their tolerance they ran.
#[track_caller]
pub fn assert_close(name: &str, got: &[f32], want: &[f32], rtol: f64, atol: f64) -> f64 {
    check_close(name, got, want, rtol, atol).unwrap_or_else(|why| panic!("{why}"))
}

/// [`assert_close`] as a `Result`, for harnesses that collect failures instead of
/// panicking (the CUDA device tests): the same rule, the same message.
pub fn check_close(name: &str, got: &[f32], want: &[f32], rtol: f64, atol: f64) -> Result<f64, String> {
    if got.len() != want.len() {
        return Err(format!("{name}: {} values, the reference has {}", got.len(), want.len()));
    }
    let mut worst = (0.0f64, 0usize);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ratio = if g.is_nan() || w.is_nan() {
            f64::INFINITY
        } else if g == w {
            0.0
        } else {
            (g as f64 - w as f64).abs() / (atol + rtol * (w as f64).abs()).max(f64::MIN_POSITIVE)
        };
        if ratio.is_nan() || ratio > worst.0 {
            worst = (if ratio.is_nan() { f64::INFINITY } else { ratio }, i);
        }
    }
    if worst.0 <= 1.0 {
        return Ok(worst.0);
    }
    Err(format!(
        "{name}: element {} is {} but the reference has {} ({:.3}x the bound atol {atol:e} + rtol {rtol:e} * |ref|)",
        worst.1,
        got[worst.1],
        want[worst.1],
        worst.0
    ))
}

/// [`assert_close`] for tensors: the shapes must match too.
#[track_caller]
pub fn assert_close_shaped(
    name: &str, (got_shape, got): (&[usize], &[f32]), (want_shape, want): (&[usize], &[f32]), rtol: f64,
    atol: f64,
) -> f64 {
    assert_eq!(got_shape, want_shape, "{name}: shape");
    assert_close(name, got, want, rtol, atol)
}

/// The largest |a - b|, NaN-propagating: a NaN on either side gives NaN, which fails any
/// `<=` check (an `f32::max` fold would silently skip it).
pub fn worst_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "worst_abs_diff: lengths {} and {}", a.len(), b.len());
    a.iter().zip(b).fold(0.0f32, |m, (x, y)| {
        let d = (x - y).abs();
        if d.is_nan() || m.is_nan() {
            f32::NAN
        } else {
            m.max(d)
        }
    })
}

/// `f32::max` for folds over differences, except that a NaN wins (and then fails the
/// bound it is compared with); `f32::max` drops a NaN and would let it pass.
pub fn nan_max(m: f32, d: f32) -> f32 {
    if d > m || d.is_nan() {
        d
    } else {
        m
    }
}

/// max |got - want| / max |want|: the error relative to the values' scale, for outputs
/// whose small elements carry no meaning of their own (a GPU reduction's near-zero sums).
/// A length mismatch or a non-finite value on either side fails the test, naming the
/// element: an output left as NaN poison is never skipped.
#[track_caller]
pub fn rel_to_scale(name: &str, got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "{name}: {} values, the reference has {}", got.len(), want.len());
    let mut scale = 1e-30f32;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.is_finite() && w.is_finite(),
            "{name}: element {i} is {g}, the reference has {w} (not finite: an unwritten output or an overflow)"
        );
        scale = scale.max(w.abs());
    }
    got.iter().zip(want).map(|(g, w)| (g - w).abs() / scale).fold(0.0f32, nan_max)
}

/// Mean KL divergence (nats) from `theirs`' next-token distributions to `ours`, row by row
/// (`vocab` logits a row, f64 log-softmax), and how often the two top tokens agree: the
/// yardstick of a quantized or foreign model against a reference (`llama-perplexity
/// --kl-divergence` sums it the same way).
pub fn kl_and_agreement(ours: &[f32], theirs: &[f32], vocab: usize) -> (f64, f64) {
    assert_eq!(ours.len(), theirs.len(), "kl_and_agreement: {} logits against {}", ours.len(), theirs.len());
    let log_softmax = |row: &[f32]| -> Vec<f64> {
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
        let lse = max + row.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
        row.iter().map(|&v| v as f64 - lse).collect()
    };
    let argmax = |r: &[f64]| r.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i);
    let (mut kl, mut same, mut n) = (0.0, 0usize, 0usize);
    for (p, q) in theirs.chunks_exact(vocab).zip(ours.chunks_exact(vocab)) {
        let (lp, lq) = (log_softmax(p), log_softmax(q));
        kl += lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum::<f64>();
        same += usize::from(argmax(&lp) == argmax(&lq));
        n += 1;
    }
    (kl / n as f64, same as f64 / n as f64)
}

/// A model's logits at every position of `ids` (`ids.len() x vocab`): a training batch
/// predicts each next token, so one more (any) id makes its rows every position's.
#[cfg(feature = "native")]
pub fn every_position_logits(model: &mut TransformerLm, ids: &[u32]) -> Vec<f32> {
    let batch =
        TokenBatch::new([ids.iter().copied().chain([0]).collect::<Vec<u32>>()]).expect("one sequence");
    model.forward_batch(&batch).expect("the forward pass")
}

/// `q8_matmul_many`'s products of one input `(m, k)`: output `i` is `outs[i]` `(m, n_i)`,
/// its weight `weights[i]` (packed values, row scales), `beta` for all.
pub fn q8_products<'a>(
    outs: &'a mut [Vec<f32>], weights: &'a [(Vec<f32>, Vec<f32>)], (m, k, beta): (usize, usize, f32),
) -> Vec<rusting_brain_core::backend::Q8Product<'a, Vec<f32>>> {
    use rusting_brain_core::backend::{MatmulSpec, Q8Product};
    outs.iter_mut()
        .zip(weights)
        .map(|(out, (packed, scales))| Q8Product {
            // n from the output (m x n), whatever the weight's layout (int8 or 4-bit).
            spec: MatmulSpec::new(m, out.len() / m.max(1), k).trans_b(true).beta(beta),
            out,
            packed,
            scales,
        })
        .collect()
}

/// A GPU that may be missing, as every GPU test meets it: `Some(value)` where it opened;
/// `None` (skip, printing why) where `no_adapter` says the error is "no adapter here" and
/// `RB_REQUIRE_GPU` is not 1 (CI sets it: there, a pass that tested nothing is a failure);
/// a panic naming `what` on any other error.
pub fn gpu_or_skip<T, E: core::fmt::Display>(
    what: &str, r: Result<T, E>, no_adapter: impl Fn(&E) -> bool,
) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) if no_adapter(&e) && std::env::var("RB_REQUIRE_GPU").as_deref() != Ok("1") => {
            eprintln!("SKIPPED, no GPU adapter here: {e}");
            None
        }
        Err(e) => panic!("{what}: {e}"),
    }
}

/// An output buffer of `n` NaNs: an element the code under test forgets to write stays
/// NaN and fails the comparison.
pub fn poisoned(n: usize) -> Vec<f32> {
    vec![f32::NAN; n]
}

/// [`poisoned`] on any backend (a device buffer uploaded from NaNs).
pub fn poisoned_on<B: Backend>(backend: &B, n: usize) -> B::Buffer {
    backend
        .upload(&poisoned(n))
        .unwrap_or_else(|e| panic!("allocating {n} poisoned values on {}: {e}", backend.name()))
}

/// A folder under the system's temporary directory, unique to this process and tag,
/// created empty and removed with everything in it when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static COUNT: AtomicUsize = AtomicUsize::new(0);
        let n = COUNT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("rb_{tag}_{}_{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        TempDir(dir)
    }
    /// The folder.
    pub fn path(&self) -> &Path {
        &self.0
    }
    /// A path inside the folder.
    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Sequences of `len` tokens following `next = (mul * prev + add) mod vocab` from random
/// starts: a rule a small model learns in a hundred steps, so trained models are
/// confident and tests measure the code, not noise.
pub fn rule_seqs(rng: &mut Rng, rows: usize, len: usize, vocab: u32, mul: u32, add: u32) -> Vec<Vec<u32>> {
    (0..rows)
        .map(|_| {
            let mut t = rng.below(vocab as u64) as u32;
            (0..len)
                .map(|_| {
                    let c = t;
                    t = (mul * t + add) % vocab;
                    c
                })
                .collect()
        })
        .collect()
}

/// [`rule_seqs`] of the rule `next = (5 * prev + 3) mod 64` as a batch.
pub fn rule_batch(rng: &mut Rng, rows: usize, len: usize) -> TokenBatch {
    TokenBatch::new(rule_seqs(rng, rows, len, 64, 5, 3)).expect("rule sequences form a batch")
}

#[cfg(feature = "native")]
/// The rule model's shape: vocabulary 64, width 64, two layers, GQA 4/2 of 16, Adam 3e-3,
/// seed 5; `d_ff` and `max_seq_len` as the test needs.
pub fn rule_model(d_ff: usize, max_seq_len: usize) -> TransformerLmBuilder {
    TransformerLm::builder()
        .shape(64, 64, 2, (4, 2, 16), d_ff, max_seq_len)
        .optimizer(Optimizer::adam(3e-3))
        .seed(5)
}

#[cfg(feature = "native")]
/// Trains `model` for `steps` batches of 8 rule sequences of 25 tokens (data seed 6).
pub fn train_on_rule(model: &mut TransformerLm, steps: usize) {
    let mut rng = Rng::new(6);
    for _ in 0..steps {
        model.train_step_batch(&rule_batch(&mut rng, 8, 25)).expect("a training step on the rule");
    }
}

/// What the fuzz targets (`fuzz/`) and their seed corpus (`native/tests/fuzz_seeds.rs`)
/// share, so the seeds always match the targets.
#[cfg(feature = "native")]
pub mod fuzz {
    use rusting_brain::{LoraConfig, Optimizer, TransformerLm};

    /// One input as two files: a little-endian u16 gives the length of the first, the
    /// rest is the second.
    pub fn split(data: &[u8]) -> (&[u8], &[u8]) {
        if data.len() < 2 {
            return (data, &[]);
        }
        let n = (u16::from_le_bytes([data[0], data[1]]) as usize).min(data.len() - 2);
        data[2..].split_at(n)
    }

    /// The inverse of [`split`].
    pub fn join(a: &[u8], b: &[u8]) -> Vec<u8> {
        let n = u16::try_from(a.len()).expect("the first file of a seed fits in u16");
        let mut out = n.to_le_bytes().to_vec();
        out.extend_from_slice(a);
        out.extend_from_slice(b);
        out
    }

    /// The model optimizer states and adapters are loaded onto (vocabulary 64, width 16,
    /// two layers).
    pub fn tiny_lm() -> TransformerLm {
        TransformerLm::builder()
            .shape(64, 16, 2, (2, 1, 8), 24, 8)
            .optimizer(Optimizer::adam(1e-3))
            .seed(7)
            .build()
            .expect("the fuzz model's configuration is valid")
    }

    /// The adapters of the `.rbl` and PEFT seeds.
    pub fn tiny_lora() -> LoraConfig {
        LoraConfig::new(2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_values_pass() {
        assert_close("near", &[1.0, 2.0, 0.0], &[1.0 + 1e-7, 2.0, 1e-9], 1e-6, 1e-8);
    }

    #[test]
    #[should_panic(expected = "element 1")]
    fn a_value_past_its_bound_fails_and_is_named() {
        assert_close("far", &[1.0, 2.1], &[1.0, 2.0], 1e-3, 0.0);
    }

    #[test]
    #[should_panic(expected = "NaN")]
    fn a_nan_fails() {
        assert_close("nan", &[1.0, f32::NAN], &[1.0, 2.0], 1.0, 1.0);
    }

    #[test]
    #[should_panic(expected = "NaN")]
    fn a_nan_shared_with_the_reference_fails_too() {
        assert_close("nan both", &[f32::NAN], &[f32::NAN], 1.0, 1.0);
    }

    #[test]
    #[should_panic(expected = "2 values, the reference has 3")]
    fn a_length_mismatch_fails() {
        assert_close("short", &[1.0, 2.0], &[1.0, 2.0, 3.0], 1.0, 1.0);
    }

    #[test]
    fn worst_abs_diff_propagates_nan() {
        assert!(worst_abs_diff(&[0.0, f32::NAN, 0.0], &[0.0, 0.0, 5.0]).is_nan());
        assert_eq!(worst_abs_diff(&[0.0, 1.0], &[0.5, 1.0]), 0.5);
    }

    #[test]
    fn nan_max_keeps_a_nan() {
        assert!([1.0, f32::NAN, 3.0].into_iter().fold(0.0, nan_max).is_nan());
        assert_eq!([1.0, 3.0, 2.0].into_iter().fold(0.0, nan_max), 3.0);
    }

    #[test]
    fn rel_to_scale_is_relative_to_the_largest_reference_value() {
        assert_eq!(rel_to_scale("scale", &[0.5, 4.0], &[0.0, 4.0]), 0.125);
    }

    #[test]
    #[should_panic(expected = "element 1 is NaN")]
    fn rel_to_scale_fails_on_poison_left() {
        rel_to_scale("poison", &[1.0, f32::NAN], &[1.0, 2.0]);
    }

    #[test]
    #[should_panic(expected = "not finite")]
    fn rel_to_scale_fails_on_a_non_finite_reference() {
        rel_to_scale("inf", &[1.0, 2.0], &[1.0, f32::INFINITY]);
    }

    #[test]
    #[should_panic(expected = "1 values, the reference has 2")]
    fn rel_to_scale_fails_on_a_length_mismatch() {
        rel_to_scale("short", &[1.0], &[1.0, 2.0]);
    }
}

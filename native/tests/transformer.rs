//! `TransformerLm` on the CPU: configuration errors, parameter counts, learning (overfit a
//! batch; held-out loss on a synthetic rule), gradient accumulation, clipping, masks and
//! the errors a training loop must see.

use rusting_brain::core::Rng;
use rusting_brain::{NetworkError, Optimizer, Schedule, TokenBatch, TransformerLm};

use rusting_brain_test_support::nan_max;

/// Every weight's bits, for "nothing changed" checks.
fn bits(m: &TransformerLm) -> Vec<Vec<u32>> {
    m.named_parameters().unwrap().into_iter().map(|(_, v)| v.iter().map(|x| x.to_bits()).collect()).collect()
}

fn tiny(seed: u64) -> TransformerLm {
    TransformerLm::builder()
        .shape(32, 32, 2, (4, 2, 8), 64, 32)
        .optimizer(Optimizer::adam(3e-3))
        .seed(seed)
        .build()
        .unwrap()
}

#[test]
fn invalid_configurations_are_clear_errors() {
    let base = || TransformerLm::builder().shape(100, 64, 2, (4, 2, 16), 128, 16);
    assert!(base().build().is_ok());
    let e = base().heads(6, 4, 16).build().err().unwrap().to_string();
    assert!(e.contains("6 query heads are not a multiple of 4"), "{e}");
    let e = base().heads(4, 2, 15).build().err().unwrap().to_string();
    assert!(e.contains("head_dim 15 is odd"), "{e}");
    let e = base().d_ff(0).build().err().unwrap().to_string();
    assert!(e.contains("d_ff must be at least 1"), "{e}");
    let e = base().vocab_size(0).build().err().unwrap().to_string();
    assert!(e.contains("vocab_size"), "{e}");
    assert!(base().optimizer(Optimizer::adam(f32::NAN)).build().is_err());
}

#[test]
fn parameter_counts_match_the_count_by_hand() {
    // The README's configuration without experts: 16,384,000 embedding + 8 x 2,819,072
    // per block + 512 final norm.
    let model = TransformerLm::builder().shape(32_000, 512, 8, (8, 2, 64), 1408, 16).build().unwrap();
    let c = model.parameter_counts();
    assert_eq!((c.total, c.embedding, c.per_layer), (38_937_088, 16_384_000, 2_819_072));
    assert_eq!(c.to_string(), "38.9M total, 38.9M active");
}

#[test]
fn a_tiny_model_overfits_a_fixed_batch() {
    let mut model = tiny(1);
    let mut rng = Rng::new(2);
    let seqs: Vec<Vec<u32>> = (0..4).map(|_| (0..17).map(|_| rng.below(32) as u32).collect()).collect();
    let first = model.train_step(&seqs).unwrap().lm_loss;
    assert!((first - (32f32).ln()).abs() < 0.3, "starts near ln(vocab): {first}");
    let mut last = first;
    for _ in 0..300 {
        last = model.train_step(&seqs).unwrap().lm_loss;
    }
    assert!(last < 0.05, "loss after 300 steps {last}");
    assert_eq!(model.steps(), 301);
}

/// Sequences following `next = (3 * prev + 1) mod 32` from a random start.
fn rule_batch(rng: &mut Rng, rows: usize) -> TokenBatch {
    TokenBatch::new(rusting_brain_test_support::rule_seqs(rng, rows, 17, 32, 3, 1)).unwrap()
}

#[test]
fn held_out_loss_falls_on_a_learnable_rule() {
    let mut model = tiny(3);
    let mut rng = Rng::new(4);
    let held_out = rule_batch(&mut Rng::new(999), 8);
    let before = model.evaluate(&held_out).unwrap();
    for _ in 0..150 {
        let b = rule_batch(&mut rng, 8);
        model.train_step_batch(&b).unwrap();
    }
    let after = model.evaluate(&held_out).unwrap();
    assert!(
        before.lm_loss > 3.0 && after.lm_loss < 0.5,
        "held-out loss {} -> {}",
        before.lm_loss,
        after.lm_loss
    );
    assert!(after.perplexity() < 1.7);
    assert_eq!(after.tokens, 8 * 16);
    // evaluate changed nothing
    assert_eq!(model.evaluate(&held_out).unwrap(), after);
}

#[test]
fn two_half_batches_accumulated_equal_one_full_batch() {
    let mut rng = Rng::new(5);
    let seqs: Vec<Vec<u32>> = (0..4).map(|_| (0..9).map(|_| rng.below(32) as u32).collect()).collect();
    // SGD: the update is linear in the gradient, so the only difference left is the f32
    // summation order of the two halves (Adam would amplify it where a gradient is ~0).
    let mut a = tiny(7);
    a.optimizer = Optimizer::sgd(0.1);
    a.train_step(&seqs).unwrap();
    let mut b = tiny(7);
    b.optimizer = Optimizer::sgd(0.1);
    b.zero_grad().unwrap();
    b.accumulate_step(&TokenBatch::new(&seqs[..2]).unwrap()).unwrap();
    b.accumulate_step(&TokenBatch::new(&seqs[2..]).unwrap()).unwrap();
    b.step(0.5).unwrap();
    for ((name, pa), (_, pb)) in a.named_parameters().unwrap().iter().zip(b.named_parameters().unwrap()) {
        let worst = pa.iter().zip(&pb).map(|(x, y)| (x - y).abs()).fold(0.0f32, nan_max);
        assert!(worst < 1e-6, "{name}: accumulated and full-batch steps differ by {worst}");
    }
}

#[test]
fn step_clipped_returns_the_pre_clip_norm_and_clips() {
    let mut rng = Rng::new(6);
    let seqs: Vec<Vec<u32>> = (0..2).map(|_| (0..9).map(|_| rng.below(32) as u32).collect()).collect();
    let batch = TokenBatch::new(&seqs).unwrap();
    let mut m = tiny(8);
    m.optimizer = Optimizer::sgd(0.1);
    m.zero_grad().unwrap();
    m.accumulate_step(&batch).unwrap();
    let before = m.named_parameters().unwrap();
    let norm = m.step_clipped(1.0, 1e-3).unwrap();
    assert!(norm > 1e-3, "the gradient norm {norm} should be above the clip");
    // With plain SGD the whole update now has norm lr * max_norm.
    let moved: f64 = m
        .named_parameters()
        .unwrap()
        .iter()
        .zip(&before)
        .flat_map(|((_, a), (_, b))| a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)))
        .sum::<f64>()
        .sqrt();
    assert!((moved - 0.1 * 1e-3).abs() < 1e-6, "update norm {moved}");
    assert!(m.step_clipped(1.0, 0.0).is_err());
}

#[test]
fn supervised_batches_count_only_response_tokens() {
    let b = TokenBatch::supervised(&[(vec![1, 2, 3], vec![4, 5]), (vec![6], vec![7])]).unwrap();
    assert_eq!((b.batch, b.seq), (2, 4));
    assert_eq!(b.inputs, vec![1, 2, 3, 4, 6, 0, 0, 0]);
    assert_eq!(b.targets, vec![2, 3, 4, 5, 7, 0, 0, 0]);
    assert_eq!(b.mask, vec![false, false, true, true, true, false, false, false]);
    let b2 = b.clone().with_loss_mask(vec![true; 8]).unwrap();
    assert_eq!(b2.counted(), 8);
    assert!(b.with_loss_mask(vec![true; 3]).is_err());
    assert!(TokenBatch::new(&[vec![1, 2, 3], vec![1, 2]])
        .err()
        .unwrap()
        .to_string()
        .contains("sequence 1 has 2 tokens"));
    assert!(TokenBatch::new(&[vec![1]]).is_err());
    assert!(TokenBatch::new(&[]).is_err());
    assert!(TokenBatch::supervised(&[(vec![], vec![1])]).is_err());
    // Fine-tuning on such a batch works and its loss is over 3 positions.
    let mut m = tiny(9);
    let sft = TokenBatch::supervised(&[(vec![1, 2, 3], vec![4, 5]), (vec![6], vec![7])]).unwrap();
    assert_eq!(m.train_step_batch(&sft).unwrap().tokens, 3);
}

#[test]
fn bad_ids_lengths_and_blow_ups_are_errors_naming_the_place() {
    let mut m = tiny(10);
    let e = m.train_step(&[vec![1, 2, 40, 3]]).unwrap_err().to_string();
    assert_eq!(e, "token id 40 at batch row 0, position 2 (input) is outside the vocabulary (32)");
    let e = m.train_step(&[vec![1, 2, 3, 4], vec![1, 2, 3, 33]]).unwrap_err().to_string();
    assert_eq!(e, "token id 33 at batch row 1, position 2 (target) is outside the vocabulary (32)");
    let long: Vec<u32> = (0..40).map(|i| i % 32).collect();
    let e = m.train_step(&[long]).unwrap_err().to_string();
    assert!(e.contains("over max_seq_len 32"), "{e}");
    let all_masked = TokenBatch::new(&[vec![1, 2, 3]]).unwrap().with_loss_mask(vec![false, false]).unwrap();
    assert!(m.train_step_batch(&all_masked).is_err());
    assert_eq!(m.steps(), 0, "no failed call took a step");
    // A learning rate that blows the weights up: the error names the step, and the step
    // that failed did not change the weights.
    m.optimizer = Optimizer::sgd(1e35);
    let seqs = vec![vec![1u32, 2, 3, 4, 5]];
    let mut failure = None;
    for _ in 0..5 {
        let (before, steps) = (bits(&m), m.steps());
        if let Err(e) = m.train_step(&seqs) {
            assert!(bits(&m) == before, "the failed step changed the weights");
            assert_eq!(m.steps(), steps, "the failed step was counted");
            failure = Some(e);
            break;
        }
    }
    match failure {
        Some(NetworkError::Step { step, .. }) => assert!(step >= 1),
        other => panic!("expected a step error, got {other:?}"),
    }
}

#[test]
fn warmup_cosine_schedule_and_set_learning_rate() {
    let s = Schedule::warmup_cosine(1e-3, 10, 110).floor(0.2);
    assert!((s.rate(0) - 1e-4).abs() < 1e-9);
    assert!((s.rate(9) - 1e-3).abs() < 1e-9);
    assert!((s.rate(60) - 6e-4).abs() < 1e-9, "halfway down the cosine: {}", s.rate(60));
    assert!((s.rate(500) - 2e-4).abs() < 1e-9);
    let mut m = tiny(11);
    m.optimizer = Optimizer::adam(1e-3).betas(0.9, 0.95).weight_decay(0.1);
    m.optimizer.set_learning_rate(s.rate(60));
    assert_eq!(m.optimizer, Optimizer::adam(s.rate(60)).betas(0.9, 0.95).weight_decay(0.1));
}

#[test]
fn mixed_precision_rounds_gemm_operands_and_still_trains() {
    let mut rng = Rng::new(12);
    let seqs: Vec<Vec<u32>> = (0..4).map(|_| (0..17).map(|_| rng.below(32) as u32).collect()).collect();
    let batch = TokenBatch::new(&seqs).unwrap();
    let (mut full, mut mixed) = (tiny(13), tiny(13));
    mixed.set_mixed_precision(true);
    let (a, b) = (full.forward_batch(&batch).unwrap(), mixed.forward_batch(&batch).unwrap());
    let scale = a.iter().map(|v| v.abs()).fold(0.0f32, nan_max);
    let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, nan_max);
    // bf16 keeps 8 mantissa bits: differences of ~1e-2 of the logits' scale, never zero.
    assert!(diff > 0.0 && diff < 3e-2 * scale, "bf16 vs f32 logits differ by {diff} (scale {scale})");
    let first = mixed.train_step_batch(&batch).unwrap().lm_loss;
    let mut last = first;
    for _ in 0..200 {
        last = mixed.train_step_batch(&batch).unwrap().lm_loss;
    }
    assert!(last < 0.1 * first, "mixed precision loss {first} -> {last}");
}

#[test]
fn token_batch_takes_rows_owned_or_borrowed() {
    let rows = vec![vec![1u32, 2, 3], vec![4, 5, 6]];
    let borrowed = TokenBatch::new(&rows).unwrap();
    let sliced = TokenBatch::new(&rows[1..]).unwrap();
    let owned = TokenBatch::new(rows).unwrap();
    assert_eq!(owned.inputs, borrowed.inputs);
    assert_eq!(owned.targets, vec![2, 3, 5, 6]);
    assert_eq!((sliced.batch, sliced.inputs.clone()), (1, vec![4, 5]));
    assert!(TokenBatch::new(Vec::<Vec<u32>>::new()).is_err());
}

/// A weight that overflows the forward pass (finite itself, so `set_parameter` takes it):
/// every entry point returns an error instead of training on, or emitting, non-finite
/// values, and nothing it refused changed the model.
#[test]
fn an_overflowing_weight_is_an_error_at_every_entry_point() {
    let mut m = tiny(12);
    m.set_parameter("model.norm.weight", &[3e38; 32]).unwrap();
    let before = bits(&m);
    let seqs = vec![vec![1u32, 2, 3, 4, 5]];
    match m.train_step(&seqs) {
        Err(NetworkError::Step { step: 1, .. }) => {}
        other => panic!("train_step: expected an error naming step 1, got {other:?}"),
    }
    m.zero_grad().unwrap();
    let tb = TokenBatch::new(&seqs).unwrap();
    match m.accumulate_step(&tb) {
        Err(NetworkError::Step { step: 1, .. }) => {}
        other => panic!("accumulate_step: expected an error naming step 1, got {other:?}"),
    }
    // step_clipped with a non-finite scale (the gradient norm turns NaN) names the step;
    // a non-finite clip is refused before anything runs.
    match m.step_clipped(f32::NAN, 1.0) {
        Err(NetworkError::Step { step: 1, .. }) => {}
        other => panic!("step_clipped(NaN, 1): expected an error naming step 1, got {other:?}"),
    }
    assert!(m.step_clipped(1.0, f32::INFINITY).is_err(), "step_clipped with an infinite clip");
    assert!(m.evaluate(&tb).is_err(), "evaluate returned a non-finite loss");
    let e = m.generate(&[1, 2, 3], 4, &mut rusting_brain::Sampler::greedy()).unwrap_err().to_string();
    eprintln!("generate: {e}");
    assert!(e.to_lowercase().contains("finite") || e.contains("NaN") || e.contains("inf"), "{e}");
    assert!(bits(&m) == before, "a refused call changed the weights");
    assert_eq!(m.steps(), 0);
}

#[test]
fn shape_sets_the_six_sizes_as_their_own_calls_do() {
    let a = TransformerLm::builder().shape(48, 32, 3, (4, 2, 8), 80, 20).seed(1).build().unwrap();
    let b = TransformerLm::builder();
    let b = b.vocab_size(48).d_model(32).n_layers(3).heads(4, 2, 8).d_ff(80).max_seq_len(20);
    let b = b.seed(1).build().unwrap();
    assert_eq!(a.config(), b.config());
    assert_eq!(a.named_parameters().unwrap(), b.named_parameters().unwrap());
}

//! The page's language-model training, run natively: steps on the portable backend track
//! native `TransformerLm` steps from the same seed on the same batches; the exported `.rbw`
//! is what native `save_bin` writes for those weights, loads with `load_bin`, and the web
//! engine (int8, as the page generates) gives native int8's greedy ids; the tokenizer trains
//! from text; bad batches are errors that leave the weights alone.
//!
//! Tolerances: the portable backend and the native CPU backend differ in the order of f32
//! sums (the shared backend sweep holds them within 2e-5). Over six Adam steps at 3e-3 every
//! loss and gradient norm agreed within 2e-7 relative (checked at 1e-4); the weights within
//! 2.6e-4 of their scale (checked at 1e-3): Adam's m / sqrt(v) turns the rounding of a
//! near-zero gradient into a visible part of a step, worst in the second block's MLP.

use rusting_brain::core::Rng;
use rusting_brain::{Optimizer, Sampler, TransformerLm};
use rusting_brain_shaders::block_on;
use rusting_brain_test_support::{gpu_or_skip, rel_to_scale, TempDir};
use rusting_brain_web::core::models::transformer::TransformerConfig;
use rusting_brain_web::{train_tokenizer, DeviceChoice, Engine, LmTrainer, WebError};

/// The page's trainer on `choice`, or None (skip, with the reason) for the GPU where there
/// is no adapter and CI did not ask for one.
fn trainer(optimizer: Optimizer, seed: u64, choice: DeviceChoice) -> Option<LmTrainer> {
    let built = block_on(LmTrainer::new(config(), optimizer, seed, choice));
    let t = gpu_or_skip(&format!("building on {choice:?} failed"), built, WebError::is_no_adapter)?;
    eprintln!("{}: {}", t.device(), t.reason());
    Some(t)
}

const VOCAB: usize = 96;

fn native_model() -> TransformerLm {
    TransformerLm::builder()
        .shape(VOCAB, 32, 2, (4, 2, 8), 64, 24)
        .optimizer(Optimizer::adam(3e-3))
        .seed(9)
        .build()
        .unwrap()
}

fn config() -> TransformerConfig {
    native_model().config().clone()
}

/// Rows of `next = (7 * prev + 5) mod VOCAB`, a rule the model can learn quickly.
fn batch(rng: &mut Rng) -> Vec<Vec<u32>> {
    (0..6)
        .map(|_| {
            let mut t = rng.below(VOCAB as u64) as u32;
            (0..25)
                .map(|_| {
                    let c = t;
                    t = (7 * t + 5) % VOCAB as u32;
                    c
                })
                .collect()
        })
        .collect()
}

#[test]
fn page_steps_track_native_steps_and_the_file_loads_natively() {
    for choice in [DeviceChoice::Cpu, DeviceChoice::WebGpu] {
        let Some(mut page) = trainer(Optimizer::adam(3e-3), 9, choice) else {
            continue;
        };
        let what = page.device();
        let mut native = native_model();
        let mut rng = Rng::new(4);
        for step in 0..6 {
            let b = batch(&mut rng);
            native.zero_grad().unwrap();
            let want = native.accumulate_step(&rusting_brain::TokenBatch::new(&b).unwrap()).unwrap();
            let want_norm = native.step_clipped(1.0, 1.0).unwrap();
            let got = block_on(page.train_step(&b, Some(1.0))).unwrap();
            let l = rel_to_scale("loss", &[got.loss as f32], &[want.lm_loss]);
            let n = rel_to_scale("gradient norm", &[got.grad_norm as f32], &[want_norm]);
            eprintln!(
                "{what} step {step}: loss {:.5} (native {:.5}, {l:.1e}), norm {n:.1e}",
                got.loss, want.lm_loss
            );
            assert!(l <= 1e-4 && n <= 1e-4, "{what} step {step}: loss {l:e}, norm {n:e}");
            assert_eq!(got.tokens, 6 * 24);
        }
        let dir = TempDir::new("web_lm");
        let path = dir.join("page.rbw");
        let bytes = block_on(page.to_bytes()).unwrap();
        std::fs::write(&path, &bytes).unwrap();
        let loaded = TransformerLm::load_bin(&path).unwrap();
        let mut worst = 0.0f32;
        for ((name, got), (_, want)) in
            loaded.named_parameters().unwrap().iter().zip(native.named_parameters().unwrap())
        {
            worst = worst.max(rel_to_scale(name, got, &want));
        }
        eprintln!("{what}: weights after six steps {worst:.1e} of their scale from native");
        assert!(worst <= 1e-3, "{what}: {worst:e}");
        // Saved again natively: the same bytes (the header's keys are sorted, so a file is
        // a function of its tensors and configuration).
        let again = dir.join("again.rbw");
        loaded.save_bin(&again, rusting_brain::Precision::F32).unwrap();
        assert!(std::fs::read(&again).unwrap() == bytes, "native save_bin writes the page's bytes");

        // Greedy decoding of the exported file: the page's engine (int8, the CPU path) and
        // native int8 give the same ids.
        let mut native_q8 = TransformerLm::load_bin(&path).unwrap();
        native_q8.quantize().unwrap();
        let prompt = [3u32, 26, 87];
        let want = native_q8.generate(&prompt, 12, &mut Sampler::greedy()).unwrap();
        let mut engine = block_on(Engine::load(&bytes, DeviceChoice::Cpu)).unwrap();
        let got = block_on(engine.generate(&prompt, 12, &mut Sampler::greedy(), None, |_| true, || async {}))
            .unwrap()
            .ids;
        assert_eq!(got, want, "{what}");
    }
}

#[test]
fn a_short_run_learns_the_rule() {
    let mut page = trainer(Optimizer::adam(1e-2), 3, DeviceChoice::Cpu).unwrap();
    let mut rng = Rng::new(8);
    let held = batch(&mut Rng::new(99));
    let (first, _) = block_on(page.evaluate(&held)).unwrap();
    for _ in 0..60 {
        block_on(page.train_step(&batch(&mut rng), Some(1.0))).unwrap();
    }
    let (last, tokens) = block_on(page.evaluate(&held)).unwrap();
    eprintln!("held-out loss {first:.3} -> {last:.3} over {tokens} tokens");
    assert!(last < 0.5 * first, "held-out loss {first} -> {last}");
}

#[test]
fn the_tokenizer_trains_and_bad_input_is_an_error() {
    let text = "fn main() {\n    println!(\"hello\");\n}\n".repeat(40);
    let tok = train_tokenizer(&text, 300).unwrap();
    // The text runs out of pairs seen twice before 300 entries.
    let n = tok.get_vocab_size(true);
    assert!(n > 258 && n <= 300, "{n} entries");
    let ids = tok.encode("fn main() {", false).unwrap().get_ids().to_vec();
    assert!(ids.len() < "fn main() {".len(), "merges were learned: {ids:?}");
    assert_eq!(tok.decode(&ids, false).unwrap(), "fn main() {");
    assert!(tok.token_to_id("<|end|>").is_some());
    let err = |r: Result<tokenizers::Tokenizer, WebError>| r.err().unwrap().to_string();
    assert!(err(train_tokenizer(&text, 100)).contains("258"));
    assert!(err(train_tokenizer("  ", 300)).contains("empty"));

    for choice in [DeviceChoice::Cpu, DeviceChoice::WebGpu] {
        let Some(mut page) = trainer(Optimizer::adam(1e-3), 1, choice) else {
            continue;
        };
        let before = block_on(page.to_bytes()).unwrap();
        let mut rng = Rng::new(1);
        let mut b = batch(&mut rng);
        let e = |r: Result<_, WebError>| r.err().unwrap().to_string();
        b[2][5] = VOCAB as u32;
        assert!(e(block_on(page.train_step(&b, None))).contains("outside the vocabulary"));
        b[2][5] = 1;
        b[3].pop();
        assert!(e(block_on(page.train_step(&b, None))).contains("equal lengths"));
        let long = vec![vec![1u32; 40]];
        let m = e(block_on(page.train_step(&long, None)));
        assert!(m.contains("max_seq_len 24"), "{m}");
        assert!(e(block_on(page.train_step(&[], None))).contains("no sequences"));
        assert!(e(block_on(page.train_step(&batch(&mut rng), Some(0.0)))).contains("clip"));
        assert!(block_on(page.to_bytes()).unwrap() == before, "refused batches left the weights alone");
        assert_eq!(page.steps(), 0);
        // After the refusals the model still trains.
        block_on(page.train_step(&batch(&mut rng), None)).unwrap();
        assert_eq!(page.steps(), 1);
    }
}

//! Mixture-of-experts `TransformerLm` on the CPU: configuration errors, parameter counts by
//! hand, dropless routing under total imbalance, the load-balancing loss recovering a
//! collapsed router, KV-cached decoding, int8, checkpoints and exact resume.
//! (Parity of the math with PyTorch: tests/tests/transformer_vs_torch.rs.)

use rusting_brain::core::Rng;
use rusting_brain::{Optimizer, Precision, Sampler, TokenBatch, TransformerLm};

use rusting_brain_test_support::nan_max;

fn builder() -> rusting_brain::TransformerLmBuilder {
    TransformerLm::builder()
        .shape(64, 32, 3, (4, 2, 8), 64, 48)
        .experts(4, 2)
        .moe_layers([1, 2])
        .expert_d_ff(32)
        .optimizer(Optimizer::adam(3e-3))
        .seed(3)
}

use rusting_brain_test_support::rule_batch;

fn trained(shared: bool) -> TransformerLm {
    let mut m = builder().shared_expert(shared).build().unwrap();
    let mut rng = Rng::new(6);
    for _ in 0..150 {
        m.train_step_batch(&rule_batch(&mut rng, 8, 25)).unwrap();
    }
    m
}

use rusting_brain_test_support::TempDir as Dir;

#[test]
fn invalid_mixture_configurations_are_clear_errors() {
    assert!(builder().build().is_ok());
    let err = |b: rusting_brain::TransformerLmBuilder| b.build().err().unwrap().to_string();
    let e = err(builder().experts(4, 5));
    assert!(e.contains("top_k 5 must be between 1 and the number of experts (4)"), "{e}");
    let e = err(builder().experts(0, 0));
    assert!(e.contains("at least 1 expert"), "{e}");
    let e = err(builder().moe_layers(2..5));
    assert!(e.contains("moe layer 3 does not exist: the model has 3 layers"), "{e}");
    let e = err(builder().moe_layers([]));
    assert!(e.contains("no layer is sparse"), "{e}");
    let e = err(builder().expert_d_ff(0));
    assert!(e.contains("expert_d_ff must be at least 1"), "{e}");
    let e = err(builder().load_balance_coef(-1.0));
    assert!(e.contains("load_balance_coef -1 must be finite and >= 0"), "{e}");
    let e = err(builder().router_z_coef(f32::NAN));
    assert!(e.contains("router_z_coef"), "{e}");
    let dense = || {
        TransformerLm::builder().vocab_size(64).d_model(32).n_layers(2).heads(4, 2, 8).d_ff(64).max_seq_len(8)
    };
    let e = err(dense().moe_layers(0..1));
    assert!(e.contains("without .experts(n_experts, top_k)"), "{e}");
    // A set given out of order, with a repeat, is the set.
    let m = builder().moe_layers([2, 0, 2]).build().unwrap();
    assert_eq!(m.config().moe.as_ref().unwrap().layers, vec![0, 2]);
}

#[test]
fn parameter_counts_match_the_count_by_hand() {
    // The README's example: vocab 32000, d_model 512, 8 layers, heads 8/2/64, d_ff 1408,
    // 8 experts top-2 in layers 2..8. By hand:
    //   embedding (tied, once)          32000 * 512                        = 16,384,000
    //   attention + 2 norms, per block  512*512*2 + 2*512*128 + 2*512      =    656,384
    //   SwiGLU, per dense block / expert 3 * 512 * 1408                    =  2,162,688
    //   router, per sparse block        8 * 512                            =      4,096
    //   final norm                                                         =        512
    // total  = 16,384,000 + 8*656,384 + 2*2,162,688 + 6*(4,096 + 8*2,162,688) + 512
    //        = 129,794,560
    // active = 16,384,000 + 8*656,384 + 2*2,162,688 + 6*(4,096 + 2*2,162,688) + 512
    //        = 51,937,792
    let m = TransformerLm::builder()
        .vocab_size(32_000)
        .d_model(512)
        .n_layers(8)
        .heads(8, 2, 64)
        .d_ff(1408)
        .experts(8, 2)
        .moe_layers(2..8)
        .max_seq_len(16)
        .build()
        .unwrap();
    let c = m.parameter_counts();
    assert_eq!((c.total, c.active), (129_794_560, 51_937_792));
    assert_eq!(c.per_layer, 656_384 + 2_162_688);
    assert_eq!(c.per_sparse_layer, 656_384 + 4_096 + 8 * 2_162_688);
    assert_eq!(c.per_sparse_layer_active, 656_384 + 4_096 + 2 * 2_162_688);
    assert_eq!(c.to_string(), "129.8M total, 51.9M active");
    assert_eq!(m.named_parameters().unwrap().iter().map(|(_, v)| v.len()).sum::<usize>(), c.total);

    // A shared expert of width 704 in every layer, 4 experts top-1 of width 704.
    let m = TransformerLm::builder()
        .vocab_size(1000)
        .d_model(64)
        .n_layers(2)
        .heads(4, 4, 16)
        .d_ff(128)
        .experts(4, 1)
        .shared_expert(true)
        .expert_d_ff(96)
        .max_seq_len(16)
        .build()
        .unwrap();
    let attn = 4 * 64 * 64 + 2 * 64;
    let swiglu = 3 * 64 * 96;
    let block_total = attn + 4 * 64 + 4 * swiglu + swiglu;
    let block_active = attn + 4 * 64 + swiglu + swiglu;
    let c = m.parameter_counts();
    assert_eq!(c.total, 64_000 + 2 * block_total + 64);
    assert_eq!(c.active, 64_000 + 2 * block_active + 64);
}

/// A model whose every token, in every sparse layer, sends both its slots to experts 0
/// and 1: the embedding's column 0 is `column` for every token (so every normalized input
/// has a positive component 0), attention writes nothing (o_proj = 0), and the router rows
/// read that component with weights `gain` times (1, 0.9, -1, -1). With a large column the
/// inputs are all nearly that component and the routing is as one-sided as it gets; with a
/// small one the tokens still differ, as in a router that collapsed during training.
fn collapsed(column: f32, gain: f32) -> TransformerLm {
    let mut m = builder().load_balance_coef(0.1).build().unwrap();
    let params = m.named_parameters().unwrap();
    let (d, vocab, experts) = (32, 64, 4);
    for (name, mut v) in params {
        if name == "model.embed_tokens.weight" {
            for t in 0..vocab {
                v[t * d] = column;
            }
        } else if name.ends_with("o_proj.weight") {
            v.iter_mut().for_each(|x| *x = 0.0);
        } else if name.ends_with("mlp.gate.weight") {
            for e in 0..experts {
                v[e * d] = gain * [1.0, 0.9, -1.0, -1.0][e];
            }
        } else {
            continue;
        }
        m.set_parameter(&name, &v).unwrap();
    }
    m
}

#[test]
fn every_token_is_computed_when_all_prefer_the_same_experts() {
    let mut m = collapsed(10.0, 6.0);
    let batch = rule_batch(&mut Rng::new(1), 6, 17);
    let loss = m.evaluate(&batch).unwrap();
    for usage in m.expert_usage() {
        assert_eq!(usage, vec![0.5, 0.5, 0.0, 0.0], "every slot went to experts 0 and 1");
    }
    // n_experts * sum f_i P_i with f = (1/2, 1/2, 0, 0) and P ~ (p, 1 - p, 0, 0): the
    // maximum, n_experts / top_k = 2.
    assert!(
        (loss.load_balance_loss - 2.0).abs() < 1e-3,
        "load balance {} at total imbalance",
        loss.load_balance_loss
    );
    // Dropless: zeroing expert 0 of the last layer changes the output of every one of the
    // 96 tokens, so each of them went through it (a capacity limit would have skipped most).
    let before = m.forward_batch(&batch).unwrap();
    let name = "model.layers.2.mlp.experts.0.down_proj.weight";
    m.set_parameter(name, &vec![0.0; 32 * 32]).unwrap();
    let after = m.forward_batch(&batch).unwrap();
    let changed = before
        .chunks(64)
        .zip(after.chunks(64))
        .filter(|(a, b)| a.iter().zip(*b).any(|(x, y)| (x - y).abs() > 1e-6))
        .count();
    assert_eq!(changed, 6 * 16, "tokens whose output expert 0 changed");
}

#[test]
fn the_load_balancing_loss_spreads_a_collapsed_router() {
    // From the collapsed router above, train on the rule task: the balancing term (0.1)
    // pushes probability toward the idle experts until they get tokens.
    let mut m = collapsed(0.3, 2.0);
    let mut rng = Rng::new(4);
    let mut history = Vec::new();
    for step in 0..120 {
        let loss = m.train_step_batch(&rule_batch(&mut rng, 8, 17)).unwrap();
        let idle = m
            .expert_usage()
            .iter()
            .map(|u| u.iter().cloned().fold(f64::INFINITY, f64::min))
            .fold(f64::INFINITY, f64::min);
        history.push((step, loss.load_balance_loss, idle));
        if step % 20 == 0 || step == 119 {
            println!("{step} {:.3} {:?}", loss.load_balance_loss, m.expert_usage());
        }
    }
    let (first, last) = (history[0], history[history.len() - 1]);
    println!(
        "load balance {:.3} -> {:.3}; least-used expert's share {:.3} -> {:.3}",
        first.1, last.1, first.2, last.2
    );
    assert!(first.1 > 1.9 && first.2 == 0.0, "starts collapsed: {first:?}");
    // Loosely: the loss falls most of the way to 1 (an even split) and every expert works.
    assert!(last.1 < 1.3, "load balance still {:.3} after 120 steps", last.1);
    assert!(last.2 > 0.05, "an expert still idle: least share {:.3}", last.2);
}

#[test]
fn kv_cache_decode_matches_full_forward_with_experts() {
    for shared in [false, true] {
        let mut m = builder().shared_expert(shared).build().unwrap();
        let mut rng = Rng::new(2);
        for _ in 0..5 {
            m.train_step_batch(&rule_batch(&mut rng, 2, 17)).unwrap();
        }
        let seq: Vec<u32> = (0..30).map(|_| rng.below(64) as u32).collect();
        let mut padded = seq.clone();
        padded.push(0);
        let full = m.forward_batch(&TokenBatch::new(&[padded]).unwrap()).unwrap();
        let full: Vec<&[f32]> = full.chunks(64).collect();
        let check = |what: &str, got: &[f32], want: &[f32]| {
            let scale = want.iter().map(|v| v.abs()).fold(0.0f32, nan_max);
            let diff = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0f32, nan_max);
            // Same bound as the dense model's decode test: only summation order differs
            // (a token routes identically alone or in a batch).
            assert!(diff <= 1e-5 * scale, "{what}: {diff} of {scale}");
        };
        let mut caches = m.new_kv_caches();
        let first = m.forward_cached(&seq[..5], &mut caches).unwrap();
        check("prefill", &first, full[4]);
        for t in 5..20 {
            let got = m.forward_cached(&seq[t..t + 1], &mut caches).unwrap();
            check(&format!("step {t}"), &got, full[t]);
        }
        // Across Decoder turns: feed two turns, the logits after each are the full pass's.
        let mut dec = m.decoder();
        dec.feed(&seq[..12]).unwrap();
        let after_first = dec.logits().unwrap().unwrap().to_vec();
        dec.feed(&seq[12..25]).unwrap();
        let after_second = dec.logits().unwrap().unwrap().to_vec();
        drop(dec);
        check("turn 1", &after_first, full[11]);
        check("turn 2", &after_second, full[24]);
    }
}

#[test]
fn q8_moe_keeps_logits_and_the_greedy_continuation_and_round_trips() {
    let dir = Dir::new("moe_q8");
    let mut m = trained(true);
    let held = rule_batch(&mut Rng::new(77), 4, 25);
    let f32_loss = m.evaluate(&held).unwrap().lm_loss;
    assert!(f32_loss < 0.5, "the model learned the rule: {f32_loss}");
    let want = m.forward_batch(&held).unwrap();
    let prompt = [9u32, 48];
    let f32_ids = m.generate(&prompt, 20, &mut Sampler::greedy()).unwrap();
    m.save_bin(dir.join("m.rbw"), Precision::F32).unwrap();
    m.save_bin(dir.join("m.q8.rbw"), Precision::Q8).unwrap();
    m.quantize().unwrap();
    let got = m.forward_batch(&held).unwrap();
    let scale = want.iter().map(|v| v.abs()).fold(0.0f32, nan_max);
    let worst = want.iter().zip(&got).map(|(a, b)| (a - b).abs()).fold(0.0f32, nan_max);
    let rows: Vec<f32> = want
        .chunks(64)
        .zip(got.chunks(64))
        .map(|(a, b)| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, nan_max) / scale)
        .collect();
    let within = rows.iter().filter(|&&r| r < 0.01).count();
    let q8_loss = m.evaluate(&held).unwrap().lm_loss;
    println!(
        "q8 moe logits: worst |difference| {worst:.4} of a logit scale {scale:.2}; {within} of {} rows within 1%; loss {f32_loss:.4} -> {q8_loss:.4}",
        rows.len()
    );
    // Most rows move as a dense model's do (within 1% of the logit range; measured median
    // 0.4%, 93 of 96 rows under 0.8%). A few move more: the routers stay f32, but their
    // input carries int8 noise, and a token whose two best experts were that close swaps
    // one (measured: 3 rows, 2.3-4.9%). That costs nothing in loss.
    assert!(within * 10 >= rows.len() * 9, "only {within} of {} rows within 1%", rows.len());
    assert!(worst < 0.1 * scale, "q8 logits differ by {worst} (scale {scale})");
    assert!((q8_loss - f32_loss).abs() < 0.05, "held-out loss {f32_loss} -> {q8_loss}");
    let q8_ids = m.generate(&prompt, 20, &mut Sampler::greedy()).unwrap();
    let same = f32_ids.iter().zip(&q8_ids).filter(|(a, b)| a == b).count();
    assert!(same >= 18, "greedy: {same} of 20 unchanged");
    // Both files load back: F32 exactly, Q8 into the same quantized model.
    let mut f = TransformerLm::load_bin(dir.join("m.rbw")).unwrap();
    assert_eq!(f.forward_batch(&held).unwrap(), want);
    assert_eq!(f.config(), m.config());
    let mut q = TransformerLm::load_bin(dir.join("m.q8.rbw")).unwrap();
    assert!(q.is_quantized());
    assert_eq!(q.forward_batch(&held).unwrap(), got);
    // The tensor bytes, without the safetensors header: this tiny model has 80 tensors
    // (plus 64 scales in Q8) and 32-wide rows, so names and per-row scales weigh more than
    // they do at any real size. int8 plus one f32 scale per 32 values is (1 + 4/32) / 4 =
    // 0.281 of f32, and the f32 norms and routers add a little.
    let payload = |name: &str| {
        let bytes = std::fs::read(dir.join(name)).unwrap();
        let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        (bytes.len() - 8 - header) as f64
    };
    let ratio = payload("m.q8.rbw") / payload("m.rbw");
    println!("Q8 tensor bytes are {ratio:.3} of F32");
    assert!(ratio < 0.3, "Q8 tensor bytes are {ratio:.3} of F32");
}

#[test]
fn resuming_a_moe_run_is_bitwise_identical_to_not_stopping() {
    let dir = Dir::new("moe_resume");
    let batch = |step: u64| rule_batch(&mut Rng::new(100 + step), 4, 13);
    let mut straight = builder().shared_expert(true).build().unwrap();
    for s in 0..7 {
        straight.train_step_batch(&batch(s)).unwrap();
    }
    let mut first = builder().shared_expert(true).build().unwrap();
    for s in 0..4 {
        first.train_step_batch(&batch(s)).unwrap();
    }
    first.save_bin(dir.join("w.rbw"), Precision::F32).unwrap();
    first.save_optimizer_state(dir.join("w.opt")).unwrap();
    let mut resumed = TransformerLm::load_bin(dir.join("w.rbw")).unwrap();
    resumed.load_optimizer_state(dir.join("w.opt")).unwrap();
    for s in 4..7 {
        resumed.train_step_batch(&batch(s)).unwrap();
    }
    let bits = |m: &TransformerLm| -> Vec<(String, Vec<u32>)> {
        m.named_parameters()
            .unwrap()
            .into_iter()
            .map(|(n, v)| (n, v.iter().map(|x| x.to_bits()).collect()))
            .collect()
    };
    assert!(bits(&straight) == bits(&resumed), "weights differ after resuming");
    // An optimizer state of a dense model of the same shape is refused.
    let mut dense = TransformerLm::builder().shape(64, 32, 3, (4, 2, 8), 64, 48).build().unwrap();
    let e = dense.load_optimizer_state(dir.join("w.opt")).unwrap_err().to_string();
    assert!(e.contains("another configuration"), "{e}");
}

#[test]
fn set_parameter_checks_its_input() {
    let mut m = builder().build().unwrap();
    let e = m.set_parameter("model.layers.0.mlp.gate.weight", &[0.0; 128]).unwrap_err().to_string();
    assert!(e.contains("no parameter named `model.layers.0.mlp.gate.weight`"), "{e}");
    let e = m.set_parameter("model.layers.1.mlp.gate.weight", &[0.0; 3]).unwrap_err().to_string();
    assert!(e.contains("shape [4, 32] (128 values); got 3"), "{e}");
    let e = m.set_parameter("model.layers.1.mlp.gate.weight", &[f32::NAN; 128]).unwrap_err().to_string();
    assert!(e.contains("NaN"), "{e}");
    m.quantize().unwrap();
    // Routers stay f32 in an int8 model; matrices are int8 and refuse.
    m.set_parameter("model.layers.1.mlp.gate.weight", &[0.0; 128]).unwrap();
    assert!(m.set_parameter("model.layers.1.mlp.experts.0.up_proj.weight", &[0.0; 1024]).is_err());
}

#[test]
fn bad_moe_checkpoints_are_errors() {
    let dir = Dir::new("moe_bad");
    let m = builder().shared_expert(true).build().unwrap();
    m.save_bin(dir.join("good.rbw"), Precision::F32).unwrap();
    m.save_bin(dir.join("good.q8.rbw"), Precision::Q8).unwrap();
    let err = |name: &str, bytes: &[u8]| {
        std::fs::write(dir.join(name), bytes).unwrap();
        TransformerLm::load_bin(dir.join(name)).err().expect("should fail").to_string()
    };
    for (file, drop) in [
        ("good.rbw", "model.layers.2.mlp.experts.3.down_proj.weight"),
        ("good.rbw", "model.layers.1.mlp.gate.weight"),
        ("good.q8.rbw", "model.layers.1.mlp.shared_expert.up_proj.weight.scale"),
    ] {
        let good = std::fs::read(dir.join(file)).unwrap();
        let st = safetensors::SafeTensors::deserialize(&good).unwrap();
        let (_, meta) = safetensors::SafeTensors::read_metadata(&good).unwrap();
        let kept: Vec<_> = st.tensors().into_iter().filter(|(n, _)| n != drop).collect();
        let bytes = safetensors::tensor::serialize(kept, meta.metadata().clone()).unwrap();
        let e = err("missing.rbw", &bytes);
        assert!(e.contains(drop) && e.contains("missing tensor"), "{e}");
    }
    // A config that says 5 experts where the file has 4, and one with top_k over n_experts.
    let good = std::fs::read(dir.join("good.rbw")).unwrap();
    let header_len = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&good[8..8 + header_len]).unwrap();
    for (from, to, want) in [
        ("\\\"n_experts\\\":4", "\\\"n_experts\\\":5", "model.layers.1.mlp.gate.weight"),
        ("\\\"top_k\\\":2", "\\\"top_k\\\":7", "top_k 7"),
        ("\\\"layers\\\":[1,2]", "\\\"layers\\\":[1,9]", "moe layer 9 does not exist"),
    ] {
        let edited = header.replace(from, to);
        assert_ne!(edited, header, "the test edits {from}");
        let mut bytes = (edited.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(edited.as_bytes());
        bytes.extend_from_slice(&good[8 + header_len..]);
        let e = err("edited.rbw", &bytes);
        assert!(e.contains(want), "{e}");
    }
}

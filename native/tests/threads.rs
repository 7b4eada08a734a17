//! Determinism across thread counts: the same training run on a rayon pool of 1 and of 2
//! threads (and 3, more than this machine's cores) gives the same bits: every weight after
//! the steps, the losses, the logits and a cached decode. The CPU backend splits its
//! reductions at fixed sizes and its GEMMs over output tiles only, so the thread count
//! changes who computes a value, never the order of its sum.

use rusting_brain::{LoraConfig, Optimizer, Sampler, TokenBatch, TransformerLm};

/// (per-step losses, every weight's bits, logits' bits, greedy ids) of a short run.
type Run = (Vec<u32>, Vec<Vec<u32>>, Vec<u32>, Vec<u32>);

fn run(threads: usize, moe: bool, lora: bool) -> Run {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| {
        let mut b = TransformerLm::builder()
            .vocab_size(256)
            .d_model(128)
            .n_layers(2)
            .heads(4, 2, 32)
            .d_ff(256)
            .max_seq_len(80)
            .optimizer(Optimizer::adam(1e-3).weight_decay(0.1))
            .seed(21);
        if moe {
            b = b.experts(4, 2).expert_d_ff(96).shared_expert(true);
        }
        let mut m = b.build().unwrap();
        if lora {
            m.add_lora(LoraConfig::new(8).alpha(16.0)).unwrap();
        }
        let rows: Vec<Vec<u32>> = (0..4u32)
            .map(|r| (0..65u32).map(|t| (t * 7 + r * 13 + t * t) % 256).collect())
            .collect();
        let tb = TokenBatch::new(&rows).unwrap();
        let mut losses = Vec::new();
        for _ in 0..3 {
            m.zero_grad().unwrap();
            losses.push(m.accumulate_step(&tb).unwrap().lm_loss.to_bits());
            m.step_clipped(1.0, 1.0).unwrap();
        }
        let weights = m
            .named_parameters()
            .unwrap()
            .into_iter()
            .chain(m.lora_parameters().unwrap())
            .map(|(_, v)| v.iter().map(|x| x.to_bits()).collect())
            .collect();
        let logits = m
            .forward_batch(&tb)
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect();
        let ids = m.generate(&rows[0][..40], 16, &mut Sampler::greedy()).unwrap();
        (losses, weights, logits, ids)
    })
}

#[test]
fn training_and_decoding_are_bitwise_the_same_on_1_2_and_3_threads() {
    for (moe, lora) in [(false, false), (true, false), (false, true)] {
        let one = run(1, moe, lora);
        for threads in [2, 3] {
            let other = run(threads, moe, lora);
            let tag = format!("moe={moe} lora={lora}, 1 vs {threads} threads");
            assert_eq!(one.0, other.0, "{tag}: losses");
            assert!(one.1 == other.1, "{tag}: weights after 3 steps");
            assert!(one.2 == other.2, "{tag}: logits");
            assert_eq!(one.3, other.3, "{tag}: greedy ids");
        }
    }
}

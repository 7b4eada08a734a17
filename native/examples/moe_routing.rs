//! Expert routing while a mixture-of-experts model trains: the load-balancing loss pulling
//! a collapsed router back to an even split.
//!
//!     cargo run --release -p rusting_brain --example moe_routing
//!
//! A small model (2 sparse layers of 4 experts, top-2) learns four arithmetic rules at once
//! (`next = a * prev + b mod 64`, one rule per sequence). It starts from a collapsed
//! router -- every token sends both its slots to experts 0 and 1, the state unbalanced
//! training drifts into -- set up with `set_parameter`: all token embeddings share one
//! direction and the router rows read it as (+1, +0.9, -1, -1). Two runs from that start,
//! with the load-balancing loss at 0.1 and switched off, print the loss, the
//! load-balancing loss (1 = even, 2 = everything on two experts) and each layer's share of
//! routed tokens per expert.

use rusting_brain::core::Rng;
use rusting_brain::{Optimizer, TokenBatch, TransformerLm};

const VOCAB: usize = 64;
const D: usize = 32;
const RULES: [(u32, u32); 4] = [(5, 3), (7, 1), (3, 11), (9, 5)];

fn batch(rng: &mut Rng) -> TokenBatch {
    let seqs: Vec<Vec<u32>> = (0..8)
        .map(|_| {
            let (a, b) = RULES[rng.below(RULES.len() as u64) as usize];
            let mut t = rng.below(VOCAB as u64) as u32;
            (0..25)
                .map(|_| {
                    let c = t;
                    t = (a * t + b) % VOCAB as u32;
                    c
                })
                .collect()
        })
        .collect();
    TokenBatch::new(&seqs).expect("equal lengths")
}

fn collapsed(load_balance_coef: f32) -> Result<TransformerLm, rusting_brain::NetworkError> {
    let mut m = TransformerLm::builder()
        .vocab_size(VOCAB)
        .d_model(D)
        .n_layers(3)
        .heads(4, 2, 8)
        .d_ff(64)
        .experts(4, 2)
        .moe_layers(1..3)
        .expert_d_ff(32)
        .load_balance_coef(load_balance_coef)
        .max_seq_len(32)
        .optimizer(Optimizer::adam(3e-3))
        .seed(3)
        .build()?;
    for (name, mut v) in m.named_parameters()? {
        if name == "model.embed_tokens.weight" {
            (0..VOCAB).for_each(|t| v[t * D] = 0.3);
        } else if name.ends_with("o_proj.weight") {
            v.iter_mut().for_each(|x| *x = 0.0);
        } else if name.ends_with("mlp.gate.weight") {
            (0..4).for_each(|e| v[e * D] = 2.0 * [1.0, 0.9, -1.0, -1.0][e]);
        } else {
            continue;
        }
        m.set_parameter(&name, &v)?;
    }
    Ok(m)
}

fn shares(usage: &[Vec<f64>]) -> String {
    usage
        .iter()
        .map(|layer| {
            let cells: Vec<String> = layer.iter().map(|u| format!("{:>3.0}", 100.0 * u)).collect();
            format!("[{}]", cells.join(" "))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for coef in [0.1f32, 0.0] {
        println!("\nload_balance_coef {coef}");
        println!(
            "{:>5} {:>8} {:>13} {:>8}   expert shares % (layer 1, layer 2)",
            "step", "lm loss", "load balance", "z-loss"
        );
        let mut model = collapsed(coef)?;
        let mut rng = Rng::new(4);
        for step in 0..=200 {
            let loss = model.train_step_batch(&batch(&mut rng))?;
            if step % 25 == 0 {
                println!(
                    "{step:>5} {:>8.3} {:>13.3} {:>8.2}   {}",
                    loss.lm_loss,
                    loss.load_balance_loss,
                    loss.router_z_loss,
                    shares(&model.expert_usage())
                );
            }
        }
    }
    Ok(())
}

//! Chapter 11: causal attention by hand, the pieces of a Llama block (RMSNorm, RoPE, SwiGLU,
//! grouped-query attention), a whole model's forward pass by hand checked against the
//! library, its parameter count, and a check that it is causal.

// ANCHOR: imports
use std::collections::HashMap;
use std::error::Error;

use rusting_brain::core::models::transformer::TransformerConfig;
use rusting_brain::{NetworkError, Optimizer, TokenBatch, TransformerLm};
// ANCHOR_END: imports

// ANCHOR: attention
/// Turns scores into weights that are positive and sum to one. Subtracting the largest
/// score first changes nothing mathematically and keeps `exp` from overflowing; a score of
/// minus infinity becomes a weight of exactly zero.
fn softmax(scores: &[f32]) -> Vec<f32> {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    exps.iter().map(|e| e / sum).collect()
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Causal scaled dot-product attention for one head. `q`, `k` and `v` hold one row per
/// position, each `head_dim` long. Returns the attention weights (`seq x seq`) and the
/// outputs (`seq x head_dim`).
fn causal_attention(q: &[Vec<f32>], k: &[Vec<f32>], v: &[Vec<f32>]) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let head_dim = q[0].len();
    // Without the scale, dot products of random vectors grow like sqrt(head_dim) and the
    // softmax saturates: one weight near 1, gradients near 0.
    let scale = 1.0 / (head_dim as f32).sqrt();
    let mut weights = Vec::new();
    let mut outputs = Vec::new();
    for (t, q_t) in q.iter().enumerate() {
        // The mask: position t may read positions 0..=t, never the future.
        let scores: Vec<f32> =
            (0..k.len()).map(|j| if j <= t { scale * dot(q_t, &k[j]) } else { f32::NEG_INFINITY }).collect();
        let w = softmax(&scores);
        let mut out = vec![0.0; head_dim];
        for (w_j, v_j) in w.iter().zip(v) {
            for (o, x) in out.iter_mut().zip(v_j) {
                *o += w_j * x;
            }
        }
        weights.push(w);
        outputs.push(out);
    }
    (weights, outputs)
}
// ANCHOR_END: attention

// ANCHOR: rmsnorm
/// RMSNorm: divide by the root mean square, then scale each feature by a learned weight.
/// Unlike LayerNorm it neither subtracts the mean nor adds a bias.
fn rms_norm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let mean_square = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let s = 1.0 / (mean_square + eps).sqrt();
    x.iter().zip(weight).map(|(v, w)| v * s * w).collect()
}
// ANCHOR_END: rmsnorm

// ANCHOR: rope
/// Rotary position embedding, "rotate-half" layout: feature pair (i, i + D/2) of a head at
/// `position` turns by the angle `position * theta^(-2i/D)`.
fn rope(head: &mut [f32], position: usize, theta: f32) {
    let half = head.len() / 2;
    for i in 0..half {
        let freq = 1.0 / theta.powf((2 * i) as f32 / head.len() as f32);
        let (sin, cos) = (position as f32 * freq).sin_cos();
        let (x1, x2) = (head[i], head[i + half]);
        head[i] = x1 * cos - x2 * sin;
        head[i + half] = x2 * cos + x1 * sin;
    }
}
// ANCHOR_END: rope

// ANCHOR: ffn
/// SiLU, the gate's activation: x * sigmoid(x).
fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `w` is `(rows, x.len())` row-major, PyTorch's `nn.Linear.weight` layout: y = W x.
fn linear(w: &[f32], x: &[f32]) -> Vec<f32> {
    w.chunks(x.len()).map(|row| dot(row, x)).collect()
}
// ANCHOR_END: ffn

// ANCHOR: by_hand
/// The model's logits at every position of `ids`, computed from its named weights.
fn forward_by_hand(
    p: &HashMap<String, Vec<f32>>, c: &TransformerConfig, ids: &[u32],
) -> Result<Vec<Vec<f32>>, Box<dyn Error>> {
    let w = |name: String| p.get(&name).ok_or(format!("no tensor named {name}"));
    let (d, hd) = (c.d_model, c.head_dim);
    let group = c.q_heads / c.kv_heads;
    let embed = w("model.embed_tokens.weight".into())?;
    // The residual stream: one d_model vector per position, which every block adds to.
    let mut x: Vec<Vec<f32>> =
        ids.iter().map(|&id| embed[id as usize * d..(id as usize + 1) * d].to_vec()).collect();
    for l in 0..c.n_layers {
        let at = |name: &str| w(format!("model.layers.{l}.{name}.weight"));
        let (mut qs, mut ks, mut vs) = (Vec::new(), Vec::new(), Vec::new());
        for (t, x_t) in x.iter().enumerate() {
            let h = rms_norm(x_t, at("input_layernorm")?, c.norm_eps);
            let (mut q, mut k) = (linear(at("self_attn.q_proj")?, &h), linear(at("self_attn.k_proj")?, &h));
            q.chunks_mut(hd).for_each(|head| rope(head, t, c.rope_theta));
            k.chunks_mut(hd).for_each(|head| rope(head, t, c.rope_theta));
            qs.push(q);
            ks.push(k);
            vs.push(linear(at("self_attn.v_proj")?, &h));
        }
        // Each query head attends on its own; a group of query heads shares one key/value head.
        let mut att = vec![vec![0.0; c.q_heads * hd]; x.len()];
        for head in 0..c.q_heads {
            let kv = head / group;
            let slice = |rows: &[Vec<f32>], h: usize| -> Vec<Vec<f32>> {
                rows.iter().map(|r| r[h * hd..(h + 1) * hd].to_vec()).collect()
            };
            let (_, out) = causal_attention(&slice(&qs, head), &slice(&ks, kv), &slice(&vs, kv));
            for (a, o) in att.iter_mut().zip(out) {
                a[head * hd..(head + 1) * hd].copy_from_slice(&o);
            }
        }
        for (x_t, a_t) in x.iter_mut().zip(&att) {
            let attended = linear(at("self_attn.o_proj")?, a_t);
            x_t.iter_mut().zip(attended).for_each(|(x, y)| *x += y);
            let h = rms_norm(x_t, at("post_attention_layernorm")?, c.norm_eps);
            let gate = linear(at("mlp.gate_proj")?, &h);
            let up = linear(at("mlp.up_proj")?, &h);
            let hidden: Vec<f32> = gate.iter().zip(&up).map(|(g, u)| silu(*g) * u).collect();
            let ffn = linear(at("mlp.down_proj")?, &hidden);
            x_t.iter_mut().zip(ffn).for_each(|(x, y)| *x += y);
        }
    }
    let final_norm = w("model.norm.weight".into())?;
    // The head is tied: the logit of token i is the dot product with embedding row i.
    Ok(x.iter().map(|x_t| linear(embed, &rms_norm(x_t, final_norm, c.norm_eps))).collect())
}
// ANCHOR_END: by_hand

// ANCHOR: tiny
fn attention_by_hand() {
    // Three positions, one head of size 2. Position 2's query points the way of key 0.
    let q = vec![vec![1.0, 0.0], vec![0.0, 1.0], vec![2.0, 0.0]];
    let k = vec![vec![1.0, 0.0], vec![0.0, 1.0], vec![-1.0, 0.0]];
    let v = vec![vec![1.0, 0.0], vec![0.0, 1.0], vec![0.5, 0.5]];
    let (weights, outputs) = causal_attention(&q, &k, &v);
    for (t, (w, o)) in weights.iter().zip(&outputs).enumerate() {
        println!("position {t}: weights {w:.3?} output {o:.3?}");
    }
    for (t, w) in weights.iter().enumerate() {
        assert!((w.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(w[t + 1..].iter().all(|&x| x == 0.0), "position {t} reads the future");
    }
    // Position 0 can only read itself, so its output is its own value.
    assert_eq!(outputs[0], v[0]);
    assert!(weights[2][0] > weights[2][1] && weights[2][1] > weights[2][2]);
}
// ANCHOR_END: tiny

// ANCHOR: relative
/// RoPE turns the query at position m and the key at position n by angles proportional to
/// m and n, so their dot product depends on m - n only.
fn rope_is_relative() {
    let (q0, k0) = ([0.3f32, -1.2, 0.8, 0.5], [1.1f32, 0.4, -0.7, 0.9]);
    let score = |m: usize, n: usize| {
        let (mut q, mut k) = (q0, k0);
        rope(&mut q, m, 10_000.0);
        rope(&mut k, n, 10_000.0);
        dot(&q, &k)
    };
    println!(
        "q.k at positions (5, 3) {:.5}, (9, 7) {:.5}, (5, 4) {:.5}",
        score(5, 3),
        score(9, 7),
        score(5, 4)
    );
    assert!((score(5, 3) - score(9, 7)).abs() < 1e-5);
    assert!((score(5, 3) - score(5, 4)).abs() > 1e-3);
}
// ANCHOR_END: relative

// ANCHOR: build
fn tiny_model() -> Result<TransformerLm, NetworkError> {
    TransformerLm::builder()
        .vocab_size(32)
        .d_model(16)
        .n_layers(2)
        .heads(4, 2, 4) // 4 query heads, 2 key/value heads, head size 4
        .d_ff(32)
        .max_seq_len(16)
        .optimizer(Optimizer::adam(1e-2))
        .seed(11)
        .build()
}
// ANCHOR_END: build

// ANCHOR: count
/// The parameters counted from the configuration, against the library's count and
/// against what the model actually holds.
fn count_parameters(model: &TransformerLm) -> Result<(), Box<dyn Error>> {
    let c = model.config();
    let (d, q_dim, kv_dim) = (c.d_model, c.q_heads * c.head_dim, c.kv_heads * c.head_dim);
    let embedding = c.vocab_size * d; // one row per token; the output head reuses it (tied)
    let attention = d * q_dim + 2 * d * kv_dim + q_dim * d; // q_proj; k_proj, v_proj; o_proj
    let feed_forward = 3 * d * c.d_ff; // gate_proj, up_proj, down_proj
    let norms = 2 * d; // input_layernorm, post_attention_layernorm
    let per_layer = attention + feed_forward + norms;
    let total = embedding + c.n_layers * per_layer + d; // + the final norm
    let counts = model.parameter_counts();
    println!("{counts}: embedding {}, per layer {}", counts.embedding, counts.per_layer);
    assert_eq!(counts.embedding, embedding);
    assert_eq!(counts.per_layer, per_layer);
    assert_eq!((counts.total, counts.active), (total, total));
    let named = model.named_parameters()?;
    for (name, values) in named.iter().filter(|(n, _)| !n.starts_with("model.layers.1.")) {
        println!("  {name:<48} {:>4}", values.len());
    }
    assert_eq!(named.iter().map(|(_, w)| w.len()).sum::<usize>(), total);
    Ok(())
}
// ANCHOR_END: count

// ANCHOR: check
/// The largest |a - b|: infinite when the lengths differ, NaN when a value is NaN (`max`
/// would skip it), so a check that it is small fails on either.
fn max_difference(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return f32::INFINITY;
    }
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, |worst, d| if d > worst || d.is_nan() { d } else { worst })
}

/// Logits at every position of `ids`: `(ids.len(), vocab)` row-major. `forward_batch` reads
/// every id of a row but the last, which is only a target, so one more id goes at the end.
fn logits(model: &mut TransformerLm, ids: &[u32]) -> Result<Vec<f32>, Box<dyn Error>> {
    Ok(model.forward_batch(&TokenBatch::new([[ids, &[0]].concat()])?)?)
}

fn check_by_hand(model: &mut TransformerLm, ids: &[u32]) -> Result<(), Box<dyn Error>> {
    // A few steps move every weight off its initial value (norm weights start at one), so
    // a misplaced tensor in the hand-written pass would show.
    let pattern: Vec<Vec<u32>> =
        (0..4u32).map(|r| (0..12u32).map(|t| (r * 5 + t * 3) % 32).collect()).collect();
    for _ in 0..5 {
        model.train_step(&pattern)?;
    }
    let library = logits(model, ids)?;
    let params: HashMap<String, Vec<f32>> = model.named_parameters()?.into_iter().collect();
    let by_hand = forward_by_hand(&params, model.config(), ids)?;
    let worst = max_difference(&by_hand.concat(), &library);
    println!("by hand against forward_batch: largest difference {worst:.1e}");
    assert!(worst < 1e-5);
    Ok(())
}
// ANCHOR_END: check

// ANCHOR: causal
fn check_causal(model: &mut TransformerLm, ids: &[u32]) -> Result<(), Box<dyn Error>> {
    // Change the last token: the logits before it must not move, not even in the last bit.
    let last = ids.len() - 1;
    let mut changed = ids.to_vec();
    changed[last] = (changed[last] + 1) % model.config().vocab_size as u32;
    let (before, after) = (logits(model, ids)?, logits(model, &changed)?);
    let v = model.config().vocab_size;
    let (earlier, moved) = (
        max_difference(&before[..last * v], &after[..last * v]),
        max_difference(&before[last * v..], &after[last * v..]),
    );
    assert!(
        before[..last * v] == after[..last * v],
        "an earlier position saw a later token: its logits moved by {earlier}"
    );
    println!("positions 0-{} unchanged; position {last}'s logits moved by up to {moved:.3}", last - 1);
    assert!(moved > 1e-3);

    // Causality is what lets generation cache keys and values: feeding one token at a
    // time gives the logits of the whole sequence at once.
    let mut caches = model.new_kv_caches();
    for (t, &id) in ids.iter().enumerate() {
        let one = model.forward_cached(&[id], &mut caches)?;
        assert!(max_difference(&one, &before[t * v..(t + 1) * v]) < 1e-5);
    }
    println!("forward_cached, one token at a time, agrees with forward_batch");
    Ok(())
}
// ANCHOR_END: causal

// ANCHOR: main
pub fn main() -> Result<(), Box<dyn Error>> {
    attention_by_hand();
    rope_is_relative();

    let mut model = tiny_model()?;
    count_parameters(&model)?;

    let ids = [3, 14, 15, 9, 2, 6, 5, 3];
    check_by_hand(&mut model, &ids)?;

    // The causality check runs wherever the model is; a machine without an adapter says why.
    match model.to_gpu() {
        Ok(()) => println!("moved to the wgpu adapter {}", model.device().unwrap_or_default()),
        Err(e) => println!("staying on the CPU: {e}"),
    }
    check_causal(&mut model, &ids)
}
// ANCHOR_END: main

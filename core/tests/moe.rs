//! Mixture-of-experts routing (`ops::moe`): top-k choices, weights, grouping, the two
//! auxiliary losses by hand, and the router gradient against central finite differences.

// The checks index several arrays with one loop variable, as the formulas do.
#![allow(clippy::needless_range_loop)]

use rusting_brain_core::ops::moe::{
    moe_combine, moe_combine_backward, q8_matmul_routed, route_slots, RoutedSpec, Routing,
};
use rusting_brain_core::ops::q8::{q8_matmul, quantize_rows};
use rusting_brain_core::Rng;

fn softmax(x: &[f32]) -> Vec<f64> {
    let m = x.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
    let e: Vec<f64> = x.iter().map(|&v| (v as f64 - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

#[test]
fn top_k_choices_weights_and_grouping() {
    // 3 tokens, 4 experts, top-2.
    let logits = [
        0.0, 2.0, 1.0, -1.0, // chooses 1, 2
        3.0, 0.0, 0.0, 2.5, // chooses 0, 3
        0.5, 0.5, 0.0, 1.0, // chooses 3, then 0 (tie with 1 goes to the lower index)
    ];
    let mut r = Routing::default();
    r.route(&logits, 3, 4, 2, true).unwrap();
    assert_eq!(r.expert, vec![1, 2, 0, 3, 3, 0]);
    for t in 0..3 {
        let p = softmax(&logits[t * 4..t * 4 + 4]);
        let (a, b) = (r.expert[2 * t] as usize, r.expert[2 * t + 1] as usize);
        let s = p[a] + p[b];
        assert!((r.weight[2 * t] as f64 - p[a] / s).abs() < 1e-6);
        assert!((r.weight[2 * t + 1] as f64 - p[b] / s).abs() < 1e-6);
        assert!((r.weight[2 * t] + r.weight[2 * t + 1] - 1.0).abs() < 1e-6);
    }
    // Expert 0 gets tokens 1, 2; expert 1 token 0; expert 2 token 0; expert 3 tokens 1, 2.
    assert_eq!(r.offsets, vec![0, 2, 3, 4, 6]);
    assert_eq!(r.token_of_row, vec![1, 2, 0, 0, 1, 2]);
    for (slot, &row) in r.row_of_slot.iter().enumerate() {
        assert_eq!(r.token_of_row[row as usize] as usize, slot / 2, "slot {slot}");
    }
    assert_eq!(r.usage(), vec![2.0 / 6.0, 1.0 / 6.0, 1.0 / 6.0, 2.0 / 6.0]);

    // Without renormalization the weights are the probabilities themselves.
    r.route(&logits, 3, 4, 2, false).unwrap();
    let p = softmax(&logits[0..4]);
    assert!((r.weight[0] as f64 - p[1]).abs() < 1e-6);
    assert!((r.weight[1] as f64 - p[2]).abs() < 1e-6);
}

#[test]
fn auxiliary_losses_by_hand() {
    let logits = [1.0f32, 0.0, 0.0, 0.0, 2.0, 0.5];
    let mut r = Routing::default();
    r.route(&logits, 2, 3, 1, false).unwrap();
    // Token 0 -> expert 0, token 1 -> expert 1: f = (1/2, 1/2, 0).
    let (p0, p1) = (softmax(&logits[0..3]), softmax(&logits[3..6]));
    let lb = 3.0 * (0.5 * (p0[0] + p1[0]) / 2.0 + 0.5 * (p0[1] + p1[1]) / 2.0);
    assert!((r.load_balance - lb).abs() < 1e-9, "{} vs {lb}", r.load_balance);
    let lse = |x: &[f32]| x.iter().map(|&v| (v as f64).exp()).sum::<f64>().ln();
    let z = (lse(&logits[0..3]).powi(2) + lse(&logits[3..6]).powi(2)) / 2.0;
    assert!((r.z_loss - z).abs() < 1e-9);
}

#[test]
fn all_tokens_preferring_one_expert_are_all_routed_and_the_balance_loss_is_at_its_maximum() {
    // Dropless: 64 tokens all want expert 2 first and expert 0 second; every one of them
    // gets both, with no capacity limit.
    let (n, e, k) = (64, 4, 2);
    let mut logits = vec![-20.0f32; n * e];
    for t in 0..n {
        logits[t * e + 2] = 20.0;
        logits[t * e] = 19.0;
    }
    let mut r = Routing::default();
    r.route(&logits, n, e, k, true).unwrap();
    assert_eq!(r.rows(2), (r.offsets[2], n));
    assert_eq!(r.rows(0).1, n);
    assert_eq!(r.rows(1).1 + r.rows(3).1, 0);
    let mut seen = vec![0; n];
    for &t in &r.token_of_row {
        seen[t as usize] += 1;
    }
    assert!(seen.iter().all(|&c| c == k), "every token reaches its {k} experts");
    // The maximum of n_experts * sum f_i P_i is n_experts / top_k (all probability on the
    // top_k experts that get every slot); a perfectly even split gives 1.
    assert!((r.load_balance - e as f64 / k as f64).abs() < 1e-6, "{}", r.load_balance);
    let even: Vec<f32> = (0..n * e).map(|i| if i % e == (i / e) % e { 5.0 } else { 0.0 }).collect();
    r.route(&even, n, e, 1, false).unwrap();
    assert!(r.usage().iter().all(|&u| (u - 0.25).abs() < 1e-12));
}

#[test]
fn bad_routing_input_is_an_error() {
    let mut r = Routing::default();
    assert!(r.route(&[0.0; 6], 2, 3, 0, true).is_err(), "top_k 0");
    assert!(r.route(&[0.0; 6], 2, 3, 4, true).is_err(), "top_k > experts");
    assert!(r.route(&[0.0; 5], 2, 3, 1, true).is_err(), "short logits");
    assert!(r.route(&[0.0, f32::NAN, 0.0], 1, 3, 1, true).is_err(), "NaN logits");
}

/// The objective `sum_slots c_slot * weight_slot + a * load_balance + b * z_loss` as a
/// function of the router logits, with `routing` choices held fixed (as autograd does).
#[allow(clippy::too_many_arguments)]
fn objective(logits: &[f32], n: usize, e: usize, k: usize, renorm: bool, c: &[f32], a: f32, b: f32) -> f64 {
    let mut r = Routing::default();
    r.route(logits, n, e, k, renorm).unwrap();
    let s: f64 = r.weight.iter().zip(c).map(|(&w, &c)| w as f64 * c as f64).sum();
    s + a as f64 * r.load_balance + b as f64 * r.z_loss
}

#[test]
fn router_gradient_matches_finite_differences() {
    // Logits far apart enough that a step of h never changes a top-k choice.
    let mut rng = Rng::new(7);
    for &(n, e, k, renorm) in &[(5, 4, 2, true), (5, 4, 2, false), (6, 3, 1, false), (4, 6, 3, true)] {
        let mut logits: Vec<f32> = Vec::new();
        for _ in 0..n {
            let mut order: Vec<usize> = (0..e).collect();
            for i in (1..e).rev() {
                order.swap(i, rng.below(i as u64 + 1) as usize);
            }
            for j in 0..e {
                logits.push(order[j] as f32 * 0.7 + 0.05 * rng.normal() as f32);
            }
        }
        let c: Vec<f32> = (0..n * k).map(|_| rng.normal() as f32).collect();
        let (a, b) = (0.3f32, 0.2f32);
        let mut r = Routing::default();
        r.route(&logits, n, e, k, renorm).unwrap();
        let mut grad = vec![0.0f32; n * e];
        r.backward(&mut grad, &c, a, b).unwrap();
        let h = 1e-2f32;
        for i in 0..n * e {
            let mut plus = logits.clone();
            plus[i] += h;
            let mut minus = logits.clone();
            minus[i] -= h;
            let fd = (objective(&plus, n, e, k, renorm, &c, a, b)
                - objective(&minus, n, e, k, renorm, &c, a, b))
                / (2.0 * h as f64);
            // f32 weights and a step of 1e-2: central differences carry ~h^2 and 1e-6 / h.
            assert!(
                (grad[i] as f64 - fd).abs() < 2e-4 + 1e-3 * fd.abs(),
                "n={n} e={e} k={k} renorm={renorm} logit {i}: analytic {} vs finite difference {fd}",
                grad[i]
            );
        }
    }
}

#[test]
fn combine_and_its_backward_in_f64() {
    let mut rng = Rng::new(9);
    let (n, e, k, dim) = (5, 3, 2, 4);
    let logits: Vec<f32> = (0..n * e).map(|_| rng.normal() as f32).collect();
    let mut r = Routing::default();
    r.route(&logits, n, e, k, true).unwrap();
    let y: Vec<f64> = (0..n * k * dim).map(|_| rng.normal()).collect();
    let dout: Vec<f64> = (0..n * dim).map(|_| rng.normal()).collect();
    let mut out = vec![0.0f64; n * dim];
    moe_combine(&mut out, &y, &r.row_of_slot, &r.weight, k, dim).unwrap();
    // By hand: token t's output is the weighted sum of the rows its slots went to.
    for t in 0..n {
        for c in 0..dim {
            let want: f64 = (0..k)
                .map(|j| r.weight[t * k + j] as f64 * y[r.row_of_slot[t * k + j] as usize * dim + c])
                .sum();
            assert!((out[t * dim + c] - want).abs() < 1e-12);
        }
    }
    // d/dy and d/dweight of sum(dout * out), against finite differences of y.
    let mut dy = vec![0.0f64; n * k * dim];
    let dw = moe_combine_backward(&mut dy, &dout, &y, &r.row_of_slot, &r.weight, k, dim).unwrap();
    let f = |y: &[f64]| {
        let mut o = vec![0.0f64; n * dim];
        moe_combine(&mut o, y, &r.row_of_slot, &r.weight, k, dim).unwrap();
        o.iter().zip(&dout).map(|(a, b)| a * b).sum::<f64>()
    };
    for i in 0..y.len() {
        let (mut p, mut m) = (y.clone(), y.clone());
        p[i] += 1e-6;
        m[i] -= 1e-6;
        let fd = (f(&p) - f(&m)) / 2e-6;
        assert!((dy[i] - fd).abs() < 1e-7, "dy[{i}]");
    }
    for slot in 0..n * k {
        let row = r.row_of_slot[slot] as usize;
        let t = slot / k;
        let want: f64 = (0..dim).map(|c| dout[t * dim + c] * y[row * dim + c]).sum();
        assert!((dw[slot] as f64 - want).abs() < 1e-5, "dweight[{slot}]");
    }
}

#[test]
fn leaves_and_named_leaves_come_in_one_order() {
    use rusting_brain_core::models::transformer::{MoeConfig, TransformerConfig};
    let c = TransformerConfig {
        moe: Some(MoeConfig {
            n_experts: 3,
            top_k: 2,
            layers: vec![0, 2],
            shared_expert: true,
            expert_d_ff: 5,
            load_balance_coef: 0.01,
            router_z_coef: 0.001,
            renormalize: true,
        }),
        ..TransformerConfig::llama(11, 4, 3, (2, 1, 2), 6, 8)
    };
    // Checkpoints pair names with leaves by position, and the optimizer pairs leaves of
    // four trees by position: both walks must agree.
    let named: Vec<_> = c.layout().into_named().into_iter().map(|(_, t)| t).collect();
    assert_eq!(named, c.layout().into_leaves());
    let names: Vec<String> = c.layout().into_named().into_iter().map(|(n, _)| n).collect();
    assert!(names.contains(&"model.layers.2.mlp.shared_expert.down_proj.weight".to_string()));
    assert!(names.contains(&"model.layers.1.mlp.up_proj.weight".to_string()));
    assert!(names.contains(&"model.layers.0.mlp.experts.2.gate_proj.weight".to_string()));
    assert_eq!(names.len(), 1 + 3 * 6 + 2 * (1 + 3 * 3 + 3) + 3 + 1);
}

#[test]
fn slot_routing_and_routed_int8_products_match_the_grouped_path() {
    // 5 tokens, 3 experts, top-2; awkward widths (k = 7 packs into two words, one padded).
    let (n, e_n, top_k, f, d) = (5, 3, 2, 6, 7);
    let mut rng = Rng::new(11);
    let logits: Vec<f32> = (0..n * e_n).map(|_| rng.normal() as f32).collect();
    let mut r = Routing::default();
    r.route(&logits, n, e_n, top_k, true).unwrap();
    let (mut expert, mut weight) = (vec![0.0f32; n * top_k], vec![0.0f32; n * top_k]);
    route_slots(&mut expert, &mut weight, &logits, n, e_n, top_k, true).unwrap();
    let ids: Vec<u32> = expert.iter().map(|e| e.to_bits()).collect();
    assert_eq!(ids, r.expert);
    assert_eq!(weight, r.weight);

    let x: Vec<f32> = (0..n * d).map(|_| rng.normal() as f32).collect();
    let weights: Vec<(Vec<f32>, Vec<f32>)> = (0..e_n)
        .map(|_| {
            let w: Vec<f32> = (0..f * d).map(|_| rng.normal() as f32).collect();
            quantize_rows(&w, f, d).unwrap()
        })
        .collect();
    let views: Vec<(&[f32], &[f32])> = weights.iter().map(|(p, s)| (&p[..], &s[..])).collect();
    let spec = RoutedSpec { slots: n * top_k, n: f, k: d, top_k, x_per_token: true };
    let mut got = vec![f32::NAN; n * top_k * f];
    q8_matmul_routed(&mut got, &x, &views, &expert, &spec).unwrap();
    // The grouped path: each expert's product over the rows routed to it.
    for slot in 0..n * top_k {
        let (t, e) = (slot / top_k, r.expert[slot] as usize);
        let mut want = vec![0.0f32; f];
        q8_matmul(&mut want, &x[t * d..(t + 1) * d], &weights[e].0, &weights[e].1, 1, f, d, 0.0).unwrap();
        assert_eq!(&got[slot * f..(slot + 1) * f], &want[..], "slot {slot}");
    }
    // A slot naming an expert that is not there, and a short output, are errors.
    let mut bad = expert.clone();
    bad[3] = f32::from_bits(7);
    assert!(q8_matmul_routed(&mut got, &x, &views, &bad, &spec).is_err());
    let mut short = vec![0.0f32; 3];
    assert!(q8_matmul_routed(&mut short, &x, &views, &expert, &spec).is_err());
}

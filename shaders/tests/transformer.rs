//! Core's `TransformerModel` on `WgpuBackend` against the same model on the reference
//! backend: the one model definition, run by two backends. Training (three AdamW steps,
//! dense and mixture-of-experts), evaluation, and cached decoding.
//!
//! Tolerance: per-tensor relative L2 1e-5 after three steps. The GPU's kernels sum in the
//! reference's order where a thread owns a sum, but the row reductions (RMSNorm, softmax,
//! cross-entropy) are trees and multiply-adds may fuse, so single values differ by a few
//! ULP; Adam turns a few ULP on a near-zero gradient into a visible step, which the L2
//! measure averages out (the worst measured values are printed).

mod common;
use common::gpu;

use rusting_brain_core::backend::Memory;
use rusting_brain_core::models::transformer::{MoeConfig, TokenBatch, TransformerConfig, TransformerModel};
use rusting_brain_core::{Backend, Optimizer, ReferenceBackend};
use rusting_brain_shaders::{block_on, DeviceSampler};

fn config(moe: bool) -> TransformerConfig {
    TransformerConfig {
        moe: moe.then(|| MoeConfig {
            n_experts: 4,
            top_k: 2,
            layers: vec![1, 2],
            shared_expert: true,
            expert_d_ff: 12,
            load_balance_coef: 0.01,
            router_z_coef: 0.001,
            renormalize: true,
        }),
        ..TransformerConfig::llama(67, 24, 3, (4, 2, 6), 40, 32)
    }
}

fn batch(step: u64) -> TokenBatch {
    let seqs: Vec<Vec<u32>> =
        (0..3u64).map(|r| (0..9u64).map(|t| ((r * 31 + t * 7 + step * 5) % 67) as u32).collect()).collect();
    TokenBatch::new(&seqs).unwrap()
}

/// The largest per-tensor relative L2 difference between two models' tensors.
fn worst_l2<A: Backend, B: Backend>(a: &TransformerModel<A>, b: &TransformerModel<B>) -> (f64, String) {
    let (pa, pb) = (a.named_parameters().unwrap(), b.named_parameters().unwrap());
    assert_eq!(pa.len(), pb.len());
    let mut worst = (0.0f64, String::new());
    for ((name, x), (_, y)) in pa.iter().zip(&pb) {
        assert_eq!(x.len(), y.len(), "{name}");
        assert!(x.iter().all(|v| v.is_finite()), "{name} has a non-finite value");
        let diff: f64 = x.iter().zip(y).map(|(p, q)| ((p - q) as f64).powi(2)).sum::<f64>().sqrt();
        let norm: f64 = y.iter().map(|q| (*q as f64).powi(2)).sum::<f64>().sqrt().max(1e-30);
        if diff / norm > worst.0 {
            worst = (diff / norm, name.clone());
        }
    }
    worst
}

fn trains_like_the_reference(moe: bool) {
    let Some(g) = gpu() else { return };
    let mut dev = TransformerModel::new(g.clone(), config(moe), 7).unwrap();
    let mut host = TransformerModel::new(ReferenceBackend, config(moe), 7).unwrap();
    let opt = Optimizer::adam(3e-3).betas(0.9, 0.95).weight_decay(0.1);
    let mut step_cost = Vec::new();
    for step in 0..3 {
        let tb = batch(step);
        let before = g.counters();
        dev.zero_grad().unwrap();
        let a = dev.accumulate(&tb).unwrap();
        dev.step(&opt, 1.0).unwrap();
        step_cost.push(g.counters() - before);
        host.zero_grad().unwrap();
        let b = host.accumulate(&tb).unwrap();
        host.step(&opt, 1.0).unwrap();
        assert_eq!(a.count, b.count);
        assert!((a.sum - b.sum).abs() <= 1e-5 * b.sum.abs(), "step {step} loss {} vs {}", a.sum, b.sum);
        assert!((a.load_balance - b.load_balance).abs() <= 1e-5 * b.load_balance.abs().max(1.0));
    }
    let (worst, name) = worst_l2(&dev, &host);
    eprintln!("moe {moe}: worst per-tensor relative L2 after 3 AdamW steps {worst:e} ({name})");
    assert!(worst <= 1e-5, "{name}: {worst:e}");
    // The first step makes the arena, bind groups and staging; the later ones reuse them.
    eprintln!("per step: {step_cost:?}");
    for c in &step_cost[1..] {
        assert_eq!((c.buffers, c.bind_groups), (0, 0), "a steady-state step allocated: {c:?}");
    }
    let tb = batch(9);
    let (a, b) = (dev.evaluate(&tb).unwrap(), host.evaluate(&tb).unwrap());
    assert!((a.sum - b.sum).abs() <= 1e-5 * b.sum.abs());
}

#[test]
fn dense_transformer_trains_on_wgpu_as_on_the_reference() {
    trains_like_the_reference(false);
}

#[test]
fn moe_transformer_trains_on_wgpu_as_on_the_reference() {
    trains_like_the_reference(true);
}

/// The first largest logit's id (the greedy choice).
fn argmax(l: &[f32]) -> u32 {
    l.iter().enumerate().fold((0, f32::MIN), |m, (i, &v)| if v > m.1 { (i, v) } else { m }).0 as u32
}

#[test]
fn cached_decoding_on_wgpu_gives_the_reference_logits_and_ids() {
    let Some(g) = gpu() else { return };
    for moe in [false, true] {
        let mut dev = TransformerModel::new(g.clone(), config(moe), 3).unwrap();
        let mut host = TransformerModel::new(ReferenceBackend, config(moe), 3).unwrap();
        let (mut cd, mut ch) = (dev.new_kv_caches().unwrap(), host.new_kv_caches().unwrap());
        let prompt = [5u32, 9, 1, 60, 2];
        let (mut ld, mut lh) =
            (dev.forward_cached(&prompt, &mut cd).unwrap(), host.forward_cached(&prompt, &mut ch).unwrap());
        let mut costs = Vec::new();
        for _ in 0..20 {
            let range = lh.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            assert_eq!(ld.len(), lh.len());
            for (a, b) in ld.iter().zip(&lh) {
                assert!((a - b).abs() <= 1e-5 * range, "{a} vs {b}");
            }
            let (nd, nh) = (argmax(&ld), argmax(&lh));
            assert_eq!(nd, nh);
            let before = g.counters();
            ld = dev.forward_cached(&[nd], &mut cd).unwrap();
            costs.push(g.counters() - before);
            lh = host.forward_cached(&[nh], &mut ch).unwrap();
        }
        // From the second decode step on, nothing is created; a dense model's step is one
        // submission for the pass and one for the logits' read-back.
        for c in &costs[1..] {
            assert_eq!((c.buffers, c.bind_groups), (0, 0), "moe {moe}: {c:?}");
            if !moe {
                assert_eq!(c.submits, 2, "{c:?}");
            }
        }
        eprintln!("moe {moe}: a decode step costs {:?}", costs[1]);
    }
}

/// Sequences of `next = (5 * prev + 3) mod 67`: learnable, so a trained model's greedy
/// choices are clear and do not hang on near-ties.
fn rule_batch(step: u64) -> TokenBatch {
    let seqs: Vec<Vec<u32>> = (0..4u64)
        .map(|r| {
            let mut t = (r * 13 + step * 7) % 67;
            (0..12)
                .map(|_| {
                    let c = t as u32;
                    t = (5 * t + 3) % 67;
                    c
                })
                .collect()
        })
        .collect();
    TokenBatch::new(seqs).unwrap()
}

#[test]
fn int8_decoding_on_wgpu_gives_the_reference_ids() {
    let Some(g) = gpu() else { return };
    // Tolerance 2e-3 of the logits' range: the int8 products are exact on both sides, but
    // a value one ULP off before a product can round to the neighbouring int8 step there.
    for moe in [false, true] {
        let mut host = TransformerModel::new(ReferenceBackend, config(moe), 5).unwrap();
        let opt = Optimizer::adam(1e-2);
        for step in 0..60 {
            host.zero_grad().unwrap();
            host.accumulate(&rule_batch(step)).unwrap();
            host.step(&opt, 1.0).unwrap();
        }
        let params = host.params.as_ref().try_map(|_, h| g.upload(h)).unwrap();
        let mut dev = TransformerModel::from_params(g.clone(), config(moe), params).unwrap();
        host.quantize().unwrap();
        dev.quantize().unwrap();
        let (mut cd, mut ch) = (dev.new_kv_caches().unwrap(), host.new_kv_caches().unwrap());
        let (mut ld, mut lh) =
            (dev.forward_cached(&[4, 23], &mut cd).unwrap(), host.forward_cached(&[4, 23], &mut ch).unwrap());
        let mut worst = 0.0f32;
        let mut ids = Vec::new();
        for _ in 0..20 {
            let range = lh.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for (a, b) in ld.iter().zip(&lh) {
                assert!(a.is_finite());
                worst = worst.max((a - b).abs() / range);
            }
            let (nd, nh) = (argmax(&ld), argmax(&lh));
            assert_eq!(nd, nh, "moe {moe}: ids so far {ids:?}");
            ids.push(nd);
            ld = dev.forward_cached(&[nd], &mut cd).unwrap();
            lh = host.forward_cached(&[nh], &mut ch).unwrap();
        }
        eprintln!("moe {moe}: int8 ids {ids:?}, worst logit difference {worst:e} of the range");
        assert!(worst <= 2e-3, "moe {moe}: {worst:e}");

        // The logits left on the device and drawn there: the pass itself submits nothing
        // and reads nothing back (the experts are routed on the device too), and creates
        // nothing from its second step on; the greedy draw is the host's argmax, recorded
        // after the pass and submitted with the read of its id: one submission a token.
        let mut draw = DeviceSampler::new(&g, config(moe).vocab_size).unwrap();
        let mut greedy = rusting_brain_core::Sampler::greedy();
        let mut next = ids[ids.len() - 1];
        let (mut costs, mut steps) = (Vec::new(), Vec::new());
        for _ in 0..4 {
            let before = g.counters();
            let logits = dev.forward_cached_on_device(&[next], &mut cd).unwrap();
            costs.push(g.counters() - before);
            let got = block_on(draw.draw(&g, logits, &mut greedy, &[])).unwrap();
            steps.push(g.counters() - before);
            lh = host.forward_cached(&[next], &mut ch).unwrap();
            let want = greedy.sample(&lh, &[]).unwrap();
            assert_eq!(got, want, "moe {moe}");
            next = got;
        }
        for (c, s) in costs[1..].iter().zip(&steps[1..]) {
            assert_eq!((c.buffers, c.bind_groups, c.submits), (0, 0, 0), "moe {moe}: {c:?}");
            assert_eq!(
                (s.buffers, s.bind_groups, s.submits),
                (0, 0, 1),
                "moe {moe}, the step with its draw: {s:?}"
            );
        }
        eprintln!("moe {moe}: an int8 decode step records {} dispatches", costs[1].dispatches);
    }
}

//! The transformer LM against PyTorch: logits, losses, every gradient, and every weight
//! after 3 AdamW steps, on the CPU backend and on the wgpu backend (the software adapter:
//! lavapipe in CI, which sets `RB_REQUIRE_GPU=1`; elsewhere a machine without one skips) —
//! one model definition, two backends, one fixture. `tests/fixtures/gen_transformer.py`: two dense
//! configurations (the second with 6 query heads over 2 key/value heads);
//! `tests/fixtures/gen_moe.py`: three with mixture-of-experts layers (see its docstring).
//!
//! Tolerance: 1e-4 relative, plus an absolute 1e-4 times the tensor's RMS for
//! elements near zero. f32 rounding error follows the size of the terms summed, not of the
//! result, so a logit of 0.004 among logits of size 3 carries the same ~3e-6 absolute error
//! as its neighbours (seen in the second configuration). PyTorch's side is float64.

use rusting_brain::cpu::CpuBackend;
use rusting_brain::gpu::{Gpu, GpuOptions, WgpuBackend};
use rusting_brain_core::models::transformer::{MoeConfig, TokenBatch, TransformerConfig, TransformerModel};
use rusting_brain_core::{Backend, Optimizer};
use rusting_brain_tests::*;

/// rtol 1e-4, atol 1e-4 * rms(expected).
fn close(name: &str, got: &[f32], want: &Tensor) -> f64 {
    assert_close(name, got, want, Tolerance::new(1e-4, 1e-4 * rms(want))).worst_ratio
}

#[derive(serde::Deserialize)]
struct Cfg {
    vocab: usize,
    d: usize,
    layers: usize,
    hq: usize,
    hkv: usize,
    hd: usize,
    ff: usize,
    batch: usize,
    seq: usize,
    theta: f32,
    eps: f32,
    // Mixture of experts (gen_moe.py only).
    experts: Option<usize>,
    top_k: Option<usize>,
    moe_layers: Option<Vec<usize>>,
    shared: Option<bool>,
    expert_ff: Option<usize>,
    renormalize: Option<bool>,
    lb_coef: Option<f32>,
    z_coef: Option<f32>,
}

/// The fixture's optimizer settings.
#[derive(serde::Deserialize)]
struct AdamW {
    lr: f32,
    betas: (f32, f32),
    eps: f32,
    weight_decay: f32,
    steps: usize,
}

impl Cfg {
    fn config(&self) -> TransformerConfig {
        let moe = self.experts.map(|n_experts| MoeConfig {
            n_experts,
            top_k: self.top_k.unwrap(),
            layers: self.moe_layers.clone().unwrap(),
            shared_expert: self.shared.unwrap(),
            expert_d_ff: self.expert_ff.unwrap(),
            load_balance_coef: self.lb_coef.unwrap(),
            router_z_coef: self.z_coef.unwrap(),
            renormalize: self.renormalize.unwrap(),
        });
        TransformerConfig {
            rope_theta: self.theta,
            norm_eps: self.eps,
            moe,
            ..TransformerConfig::llama(
                self.vocab,
                self.d,
                self.layers,
                (self.hq, self.hkv, self.hd),
                self.ff,
                self.seq,
            )
        }
    }
}

/// The fixture's weights for configuration `c`, every tensor found by its name in the
/// model's own layout (so a tensor the model has and the fixture lacks fails here).
fn load<B: Backend>(b: B, f: &Fixture, c: usize, cfg: &Cfg) -> TransformerModel<B> {
    let config = cfg.config();
    let params = config
        .layout()
        .try_map(|name, _| {
            let t = f.get(&format!("c{c}.{name}"))?;
            Ok::<_, ParityError>(b.upload(&t.to_f32()).unwrap())
        })
        .unwrap();
    TransformerModel::from_params(b, config, params).unwrap()
}

/// Logits, the losses, every gradient and every weight after 3 AdamW steps of each
/// configuration in `fixture`, against PyTorch; returns the worst element's share of the
/// tolerance.
fn compare<B: Backend + Clone>(fixture: &str, backend: B) -> f64 {
    let f = Fixture::named(fixture).unwrap();
    let cfgs: Vec<Cfg> = serde_json::from_str(&f.metadata("configs").unwrap()).unwrap();
    let adamw: AdamW = serde_json::from_str(&f.metadata("adamw").unwrap()).unwrap();
    let mut worst: f64 = 0.0;
    for (c, cfg) in cfgs.iter().enumerate() {
        let ids = f.get(&format!("c{c}.ids")).unwrap();
        let rows: Vec<Vec<u32>> =
            ids.data.chunks(cfg.seq + 1).map(|r| r.iter().map(|&v| v as u32).collect()).collect();
        assert_eq!(rows.len(), cfg.batch);
        let batch = TokenBatch::new(&rows).unwrap();
        let mut model = load(backend.clone(), &f, c, cfg);
        let logits = model.forward_logits(&batch).unwrap();
        worst = worst.max(close(&format!("c{c} logits"), &logits, &f.get(&format!("c{c}.logits")).unwrap()));
        model.zero_grad().unwrap();
        let loss = model.accumulate(&batch).unwrap();
        let mean = loss.sum / loss.count as f64;
        worst =
            worst.max(close(&format!("c{c} loss"), &[mean as f32], &f.get(&format!("c{c}.loss")).unwrap()));
        if cfg.experts.is_some() {
            for (what, got) in [("load_balance", loss.load_balance), ("router_z", loss.router_z)] {
                let want = f.get(&format!("c{c}.{what}")).unwrap();
                worst = worst.max(close(&format!("c{c} {what}"), &[got as f32], &want));
            }
        }
        for (name, g) in model.named_gradients().unwrap() {
            worst = worst.max(close(
                &format!("c{c} grad {name}"),
                &g,
                &f.get(&format!("c{c}.grad.{name}")).unwrap(),
            ));
        }
        let opt = Optimizer::adam(adamw.lr)
            .betas(adamw.betas.0, adamw.betas.1)
            .epsilon(adamw.eps)
            .weight_decay(adamw.weight_decay);
        model.step(&opt, 1.0).unwrap();
        for _ in 1..adamw.steps {
            model.zero_grad().unwrap();
            model.accumulate(&batch).unwrap();
            model.step(&opt, 1.0).unwrap();
        }
        for (name, p) in model.named_parameters().unwrap() {
            worst = worst.max(close(
                &format!("c{c} after 3 steps {name}"),
                &p,
                &f.get(&format!("c{c}.after.{name}")).unwrap(),
            ));
        }
    }
    worst
}

/// The software adapter's backend, or None (skip) when this machine has no adapter.
fn wgpu() -> Option<WgpuBackend> {
    match Gpu::new_blocking(&GpuOptions { software: true, ..Default::default() }) {
        Ok(g) => Some(WgpuBackend::new(std::sync::Arc::new(g))),
        Err(e) if std::env::var("RB_REQUIRE_GPU").as_deref() != Ok("1") => {
            eprintln!("SKIPPED, no GPU adapter here: {e}");
            None
        }
        Err(e) => panic!("the GPU did not open: {e}"),
    }
}

#[test]
fn logits_gradients_and_three_adamw_steps_match_pytorch() {
    let worst = compare("transformer_lm.safetensors", CpuBackend::new());
    println!("worst element: {worst:.3} of the tolerance");
}

#[test]
fn on_wgpu_logits_gradients_and_three_adamw_steps_match_pytorch() {
    let Some(b) = wgpu() else { return };
    let worst = compare("transformer_lm.safetensors", b);
    println!("worst element: {worst:.3} of the tolerance");
}

#[test]
fn on_wgpu_mixture_of_experts_matches_pytorch() {
    let Some(b) = wgpu() else { return };
    let worst = compare("moe_lm.safetensors", b);
    println!("worst element: {worst:.3} of the tolerance");
}

/// Sparse and dense layers mixed, with and without a shared expert, top-2 renormalized and
/// not, and top-1: the router's gradient (through the routing weights, the load-balancing
/// loss and the z-loss) included.
#[test]
fn mixture_of_experts_matches_pytorch() {
    let worst = compare("moe_lm.safetensors", CpuBackend::new());
    println!("worst element: {worst:.3} of the tolerance");
}

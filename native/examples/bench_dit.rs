//! One denoising step of the diffusion transformers on the CPU next to diffusers
//! (`bench/torch_dit.py`) in one run, as ratios: the tiny FLUX.2-klein test pipeline's
//! transformer, and small FLUX.2, FLUX.1 and SD3 models of 8 blocks at width 256 on a
//! 256 x 256 picture (256 image tokens) with 128 prompt tokens. Random weights (the time
//! does not depend on the values); both sides build the model from the same config.json
//! values. The small FLUX.2 step is then broken down by primitive. With `--published`,
//! instead, the published widths (`tests/fixtures/real_configs/`) with fewer blocks (all of
//! them in f32 would not fit this machine's 24 GiB twice): FLUX.2-klein-4B's transformer
//! (width 3072, 24 heads of 128, Qwen3's 7680-wide prompt of 512 tokens) at 512 x 512 and
//! 1024 x 1024, SD3.5-medium's (width 1536, 24 heads of 64, 333 prompt tokens) at 1024 x
//! 1024. Each side at f32 and in mixed precision: ours with `set_mixed_precision(true)`,
//! diffusers under bf16 autocast where the CPU has native bf16.
//!
//!     RB_PYTHON=~/venv-fixtures/bin/python cargo run --release -p rusting_brain --example bench_dit [-- REPS] [--published]
//!
//! PyTorch runs through `$RB_PYTHON` (default `python3`) with the same thread count;
//! without torch and diffusers there, only our side is printed.

#[path = "common/bench.rs"]
mod bench;

use std::collections::BTreeMap;
use std::time::Instant;

use bench::{best, commit, cpu_model};

use rusting_brain::cpu::CpuBackend;
use rusting_brain::dit::dit_config;
use rusting_brain::profile::Profiled;
use rusting_brain_core::models::dit::{DitConfig, DitInput, DitKind, DitLatent, DitModel};
use rusting_brain_core::{Backend, Rng};
use serde_json::{json, Value};

/// One benchmark case: a diffusers class and config, the token grid and prompt length.
struct Case {
    name: String,
    class: &'static str,
    config: Value,
    grid: (usize, usize),
    text: usize,
}

/// Parses `config` as our loader parses a `config.json`.
fn parse(class: &str, config: &Value) -> Result<DitConfig, Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("rb_bench_dit_{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut c = config.clone();
    c["_class_name"] = json!(class);
    let path = dir.join("config.json");
    std::fs::write(&path, serde_json::to_vec(&c)?)?;
    let parsed = dit_config(&path);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(parsed?)
}

fn model<B: Backend<Buffer = Vec<f32>>>(
    be: B, config: &DitConfig, rng: &mut Rng,
) -> Result<DitModel<B>, Box<dyn std::error::Error>> {
    Ok(DitModel::new(be, config.clone(), weights(config, rng))?)
}

fn weights(config: &DitConfig, rng: &mut Rng) -> BTreeMap<String, Vec<f32>> {
    config
        .layout()
        .tensors
        .iter()
        .map(|(n, s)| (n.clone(), rng.normal_vec(s.iter().product(), 0.02)))
        .collect()
}

/// The inputs of one step at batch 1.
struct Inputs {
    latent: Vec<f32>,
    ids: Vec<f32>,
    context: Vec<f32>,
    context_ids: Vec<f32>,
    pooled: Vec<f32>,
}

fn inputs(config: &DitConfig, case: &Case, rng: &mut Rng) -> Inputs {
    let (gh, gw) = case.grid;
    let axes = config.axes_dims_rope.len();
    let mut ids = vec![0f32; gh * gw * axes];
    if axes > 0 {
        for r in 0..gh {
            for c in 0..gw {
                ids[(r * gw + c) * axes + 1] = r as f32;
                ids[(r * gw + c) * axes + 2] = c as f32;
            }
        }
    }
    let p = config.patch_size;
    let latent_len = match config.kind {
        DitKind::Sd3 => config.in_channels * gh * p * gw * p,
        _ => gh * gw * config.in_channels,
    };
    Inputs {
        latent: rng.normal_vec(latent_len, 1.0),
        ids,
        context: rng.normal_vec(case.text * config.joint_attention_dim, 1.0),
        context_ids: vec![0.0; case.text * axes],
        pooled: rng.normal_vec(config.pooled_projection_dim, 1.0),
    }
}

fn step<B: Backend<Buffer = Vec<f32>>>(dit: &DitModel<B>, x: &Inputs, case: &Case) -> Vec<f32> {
    let config = dit.config();
    let (gh, gw) = case.grid;
    let p = config.patch_size;
    let latent = match config.kind {
        DitKind::Sd3 => DitLatent::Image { data: &x.latent, height: gh * p, width: gw * p },
        _ => DitLatent::Tokens { data: &x.latent, ids: &x.ids },
    };
    let guidance = [3.5f32];
    let (timestep, t_sd3) = ([0.5f32], [500.0f32]);
    let input = DitInput {
        batch: 1,
        latent,
        context: &x.context,
        context_ids: &x.context_ids,
        pooled: (config.kind != DitKind::Flux2).then_some(&x.pooled[..]),
        timestep: if config.kind == DitKind::Sd3 { &t_sd3 } else { &timestep },
        guidance: config.guidance_embeds.then_some(&guidance[..]),
    };
    dit.forward(&input).expect("dit forward")
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let reps: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(2);
    let published = std::env::args().any(|a| a == "--published");
    let be = CpuBackend::new();
    let threads = be.threads();
    println!(
        "bench_dit: commit {}, {}, {threads} threads, {}, best of {reps}",
        commit(),
        cpu_model(),
        be.isa()
    );
    let small_cases = [
        Case {
            name: "FLUX.2 tiny (klein test pipeline)".into(),
            class: "Flux2Transformer2DModel",
            config: json!({"patch_size": 1, "in_channels": 4, "num_layers": 1, "num_single_layers": 1,
                "attention_head_dim": 16, "num_attention_heads": 2, "joint_attention_dim": 32,
                "timestep_guidance_channels": 256, "axes_dims_rope": [4, 4, 4, 4], "guidance_embeds": false}),
            grid: (8, 8),
            text: 64,
        },
        Case {
            name: "FLUX.2 small (4+4 blocks, 256 wide)".into(),
            class: "Flux2Transformer2DModel",
            config: json!({"patch_size": 1, "in_channels": 128, "num_layers": 4, "num_single_layers": 4,
                "attention_head_dim": 128, "num_attention_heads": 2, "joint_attention_dim": 768,
                "timestep_guidance_channels": 256, "axes_dims_rope": [32, 32, 32, 32], "guidance_embeds": false}),
            grid: (16, 16),
            text: 128,
        },
        Case {
            name: "FLUX.1 small (4+4 blocks, 256 wide)".into(),
            class: "FluxTransformer2DModel",
            config: json!({"patch_size": 1, "in_channels": 64, "num_layers": 4, "num_single_layers": 4,
                "attention_head_dim": 128, "num_attention_heads": 2, "joint_attention_dim": 256,
                "pooled_projection_dim": 128, "axes_dims_rope": [16, 56, 56], "guidance_embeds": true}),
            grid: (16, 16),
            text: 128,
        },
        Case {
            name: "SD3 small (8 blocks, 256 wide)".into(),
            class: "SD3Transformer2DModel",
            config: json!({"sample_size": 32, "patch_size": 2, "in_channels": 16, "num_layers": 8,
                "attention_head_dim": 64, "num_attention_heads": 4, "joint_attention_dim": 256,
                "caption_projection_dim": 256, "pooled_projection_dim": 128, "out_channels": 16,
                "pos_embed_max_size": 32, "qk_norm": "rms_norm", "dual_attention_layers": [0, 1, 2]}),
            grid: (16, 16),
            text: 128,
        },
    ];
    let real = |family: &str| -> Result<Value, Box<dyn std::error::Error>> {
        let path = format!(
            "{}/../tests/fixtures/real_configs/{family}/transformer/config.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let v: Value = serde_json::from_slice(&std::fs::read(path)?)?;
        // diffusers' constructor takes the configuration's fields, not the file's bookkeeping.
        Ok(Value::Object(
            v.as_object()
                .into_iter()
                .flatten()
                .filter(|(k, _)| !k.starts_with('_'))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ))
    };
    let klein = |double: usize, single: usize| -> Result<Value, Box<dyn std::error::Error>> {
        let mut c = real("flux2-klein-4b")?;
        (c["num_layers"], c["num_single_layers"]) = (json!(double), json!(single));
        Ok(c)
    };
    let mut sd35 = real("sd3.5-medium")?;
    (sd35["num_layers"], sd35["dual_attention_layers"]) = (json!(2), json!([0, 1]));
    let cases: Vec<Case> = if published {
        vec![
            Case {
                name: "FLUX.2-klein 4B, 1+4 of 5+20 blocks, 512x512".into(),
                class: "Flux2Transformer2DModel",
                config: klein(1, 4)?,
                grid: (32, 32),
                text: 512,
            },
            Case {
                name: "FLUX.2-klein 4B, 1+1 of 5+20 blocks, 1024x1024".into(),
                class: "Flux2Transformer2DModel",
                config: klein(1, 1)?,
                grid: (64, 64),
                text: 512,
            },
            Case {
                name: "SD3.5-medium, 2 of 24 blocks, 1024x1024".into(),
                class: "SD3Transformer2DModel",
                config: sd35,
                grid: (64, 64),
                text: 333,
            },
        ]
    } else {
        small_cases.into_iter().collect()
    };
    // The step broken down by primitive: the small FLUX.2, or klein at 512 x 512.
    let profiled_case = if published { 0 } else { 1 };

    let mut rng = Rng::new(0);
    let mut ours = Vec::new();
    let mut breakdown = String::new();
    for (i, case) in cases.iter().enumerate() {
        let config = parse(case.class, &case.config)?;
        let x = inputs(&config, case, &mut rng);
        // The heap's peak from the weights on: the model and its steps' activations.
        let (peak, dit) = bench::peak_extra(|| -> Result<_, Box<dyn std::error::Error>> {
            let mut dit = model(be, &config, &mut rng)?;
            step(&dit, &x, case);
            dit.set_mixed_precision(true);
            step(&dit, &x, case);
            Ok(dit)
        });
        let mut dit = dit?;
        let mut time = |mixed: bool| {
            dit.set_mixed_precision(mixed);
            best(reps, || {
                step(&dit, &x, case);
            })
        };
        let (t32, t16) = (time(false), time(true));
        drop(dit);
        // The fastest path: `Precision::Q8`'s matrices (int8, one scale a row) in mixed
        // precision.
        let (w, q8) = bench::int8_rows(weights(&config, &mut rng), &config.layout(), false);
        let mut dit = DitModel::with_q8(be, config.clone(), w, q8)?;
        dit.set_mixed_precision(true);
        step(&dit, &x, case);
        let tq = best(reps, || {
            step(&dit, &x, case);
        });
        drop(dit);
        ours.push(bench::Ours {
            params: config.layout().parameter_count(),
            f32_s: t32,
            bf16_s: t16,
            q8_s: Some(tq),
            peak_bytes: peak,
        });
        if i == profiled_case {
            let mut profiled = model(Profiled::new(be), &config, &mut Rng::new(1))?;
            for mixed in [false, true] {
                profiled.set_mixed_precision(mixed);
                profiled.backend().reset();
                let t = Instant::now();
                step(&profiled, &x, case);
                let label = if mixed { "mixed precision (bf16 operands)" } else { "f32" };
                breakdown += &format!(
                    "{label}:\n{}",
                    profiled.backend().breakdown(1, t.elapsed().as_secs_f64(), false)
                );
            }
        }
    }

    let python = bench::python();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/torch_dit.py");
    let spec: Vec<Value> = cases
        .iter()
        .map(|c| json!({"class": c.class, "config": c.config, "batch": 1, "grid": [c.grid.0, c.grid.1], "text": c.text}))
        .collect();
    // One process a case: a process's peak resident memory only ever rises.
    let runs: Vec<Option<Value>> =
        spec.iter().map(|case| bench::torch_cases(&python, script, threads, reps, &json!([case]))).collect();
    bench::print_torch_line(runs.first().cloned().flatten().as_ref(), &python, script);
    let rows = bench::precision_rows(cases.iter().map(|c| c.name.as_str()), &ours, &runs);
    bench::print_precision_table("one step (batch 1)", &rows);
    println!("{}, one step by primitive, {breakdown}", cases[profiled_case].name);
    Ok(())
}

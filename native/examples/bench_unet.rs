//! One sampling step of Stable Diffusion's UNet (classifier-free guidance: batch 2) on the
//! CPU next to diffusers (`bench/torch_unet.py`) in one run, as ratios: the tiny SD test
//! pipeline's UNet at 16 x 16 pixels, and a small SD 1.5-shaped UNet (widths 64-256, 8
//! heads, CLIP-L's 768-wide prompt) at 256 x 256 and 512 x 512; with `--published`,
//! instead, SD 1.5's own UNet (`tests/fixtures/real_configs/sd1.5`, 860 M parameters) at
//! 512 x 512. Random weights; both sides build the model from the same config.json values.
//! Each side at f32 and in mixed precision: ours with `set_mixed_precision(true)` (bf16
//! operands, f32 sums), diffusers under `torch.autocast("cpu", dtype=torch.bfloat16)`
//! where the CPU has native bf16; ours also at `Precision::Q8` (int8 matrices and
//! convolutions, W8A8) with mixed precision, the fastest path; and OpenVINO
//! (`bench/openvino_unet.py`: diffusers' model converted and compiled for the CPU, f32 and
//! bf16) where `openvino` is installed. Memory: ours the heap's peak from the weights on (a
//! counting allocator), PyTorch's its process's peak resident set.
//!
//!     RB_PYTHON=~/venv-fixtures/bin/python cargo run --release -p rusting_brain --example bench_unet [-- REPS] [--published]

#[path = "common/bench.rs"]
mod bench;

use std::collections::BTreeMap;
use std::time::Instant;

use bench::{best, commit, cpu_model};

use rusting_brain::cpu::CpuBackend;
use rusting_brain::profile::Profiled;
use rusting_brain::unet::unet_config;
use rusting_brain_core::models::unet::{UnetInput, UnetModel};
use rusting_brain_core::Rng;
use serde_json::{json, Value};

struct Case {
    name: &'static str,
    config: Value,
    latent: usize,
    tokens: usize,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let reps: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(2);
    let published = std::env::args().any(|a| a == "--published");
    let be = CpuBackend::new();
    let threads = be.threads();
    println!(
        "bench_unet: commit {}, {}, {threads} threads, {}, best of {reps}",
        commit(),
        cpu_model(),
        be.isa()
    );
    let small = json!({"sample_size": 64, "block_out_channels": [64, 128, 256, 256], "attention_head_dim": 8,
        "cross_attention_dim": 768, "norm_num_groups": 32});
    let sd15: Value = serde_json::from_slice(&std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/real_configs/sd1.5/unet/config.json"
    ))?)?;
    // diffusers' constructor takes the configuration's fields, not its file bookkeeping.
    let sd15 = Value::Object(
        sd15.as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| !k.starts_with('_'))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    );
    let small_cases = [
        Case {
            name: "SD tiny (the test pipeline's), 16x16",
            config: json!({"block_out_channels": [8, 16], "layers_per_block": 1, "sample_size": 8,
                "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D"],
                "up_block_types": ["CrossAttnUpBlock2D", "UpBlock2D"], "cross_attention_dim": 32,
                "norm_num_groups": 4, "attention_head_dim": 2}),
            latent: 8,
            tokens: 77,
        },
        Case { name: "SD small (widths 64-256), 256x256", config: small.clone(), latent: 32, tokens: 77 },
        Case { name: "SD small (widths 64-256), 512x512", config: small, latent: 64, tokens: 77 },
    ];
    let published_cases = [Case { name: "SD 1.5, 512x512", config: sd15, latent: 64, tokens: 77 }];
    let cases: &[Case] = if published { &published_cases } else { &small_cases };
    // The step broken down by primitive: the small model at 256 x 256, or the published one.
    let profiled_case = if published { 0 } else { 1 };
    let mut rng = Rng::new(0);
    let mut ours = Vec::new();
    let mut breakdown = String::new();
    for (ci, case) in cases.iter().enumerate() {
        let dir = std::env::temp_dir().join(format!("rb_bench_unet_{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("config.json");
        std::fs::write(&path, serde_json::to_vec(&case.config)?)?;
        let config = unet_config(&path);
        let _ = std::fs::remove_dir_all(&dir);
        let config = config?;
        let n = case.latent;
        let sample = rng.normal_vec(2 * config.in_channels * n * n, 1.0);
        let context = rng.normal_vec(2 * case.tokens * config.cross_attention_dim, 1.0);
        let input = UnetInput {
            sample: &sample,
            batch: 2,
            h: n,
            w: n,
            timestep: &[500.0, 500.0],
            context: &context,
            text_embeds: None,
            time_ids: None,
        };
        let weights = |rng: &mut Rng| -> BTreeMap<String, Vec<f32>> {
            config
                .layout()
                .tensors
                .iter()
                .map(|(n, s)| (n.clone(), rng.normal_vec(s.iter().product(), 0.02)))
                .collect()
        };
        // The heap's peak from the weights on: the model and its step's activations.
        let (peak, unet) = bench::peak_extra(|| -> Result<_, Box<dyn std::error::Error>> {
            let mut unet = UnetModel::new(be, config.clone(), weights(&mut rng))?;
            unet.forward(&input)?;
            unet.set_mixed_precision(true);
            unet.forward(&input)?;
            Ok(unet)
        });
        let mut unet = unet?;
        let mut step = |mixed: bool| {
            unet.set_mixed_precision(mixed);
            best(reps, || {
                unet.forward(&input).expect("unet forward");
            })
        };
        let (t32, t16) = (step(false), step(true));
        drop(unet);
        // The fastest path: `Precision::Q8`'s matrices and convolutions (int8, one scale a
        // row) in mixed precision (the attention in bf16).
        let (w, q8) = bench::int8_rows(weights(&mut rng), &config.layout(), true);
        let mut unet = UnetModel::with_q8(be, config.clone(), w, q8)?;
        unet.set_mixed_precision(true);
        unet.forward(&input)?;
        let tq = best(reps, || {
            unet.forward(&input).expect("unet forward");
        });
        drop(unet);
        ours.push(bench::Ours {
            params: config.layout().parameter_count(),
            f32_s: t32,
            bf16_s: t16,
            q8_s: Some(tq),
            peak_bytes: peak,
        });
        if ci == profiled_case {
            // Fresh weights (the values do not change the time) rather than a copy kept
            // through the timing, which would count in the peak.
            let mut profiled = UnetModel::new(Profiled::new(be), config.clone(), weights(&mut rng))?;
            for mixed in [false, true] {
                profiled.set_mixed_precision(mixed);
                profiled.backend().reset();
                let t = Instant::now();
                profiled.forward(&input)?;
                let label = if mixed { "mixed precision (bf16 operands)" } else { "f32" };
                breakdown += &format!(
                    "{label}:\n{}",
                    profiled.backend().breakdown(1, t.elapsed().as_secs_f64(), false)
                );
            }
            drop(profiled);
            let (w, q8) = bench::int8_rows(weights(&mut rng), &config.layout(), true);
            let mut profiled = UnetModel::with_q8(Profiled::new(be), config.clone(), w, q8)?;
            profiled.set_mixed_precision(true);
            profiled.forward(&input)?;
            profiled.backend().reset();
            let t = Instant::now();
            profiled.forward(&input)?;
            breakdown += &format!(
                "Q8 + mixed precision (int8 matrices and convolutions, bf16 attention):\n{}",
                profiled.backend().breakdown(1, t.elapsed().as_secs_f64(), false)
            );
        }
    }

    let python = bench::python();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/torch_unet.py");
    let spec: Vec<Value> =
        cases.iter().map(|c| json!({"config": c.config, "latent": c.latent, "tokens": c.tokens})).collect();
    // One process a case: a process's peak resident memory only ever rises.
    let runs: Vec<Option<Value>> =
        spec.iter().map(|case| bench::torch_cases(&python, script, threads, reps, &json!([case]))).collect();
    let torch = runs.first().cloned().flatten();
    bench::print_torch_line(torch.as_ref(), &python, script);
    let rows = bench::precision_rows(cases.iter().map(|c| c.name), &ours, &runs);
    bench::print_precision_table("one step, batch 2", &rows);
    openvino(&python, threads, reps, cases, &spec, &ours);
    println!("{}, one step by primitive, {breakdown}", cases[profiled_case].name);
    Ok(())
}

/// OpenVINO's runs of the same UNets (`bench/openvino_unet.py`: diffusers' model converted
/// and compiled for the CPU at f32 and with the bf16 hint), one process a case, beside our
/// f32, bf16 and Q8 steps: speed-ups are OpenVINO's time over ours.
fn openvino(python: &str, threads: usize, reps: usize, cases: &[Case], spec: &[Value], ours: &[bench::Ours]) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/openvino_unet.py");
    let runs: Vec<Option<Value>> =
        spec.iter().map(|case| bench::torch_cases(python, script, threads, reps, &json!([case]))).collect();
    let Some(first) = runs.iter().flatten().next() else {
        println!("\nOpenVINO: not run ({python} {script} failed; `pip install openvino` in RB_PYTHON's environment)");
        return;
    };
    println!(
        "\nOpenVINO {} ({} threads), diffusers' UNet converted and compiled for the CPU:",
        first["version"].as_str().unwrap_or("?"),
        first["threads"]
    );
    println!(
        "{:<34} {:>9} {:>9} {:>10} {:>10} {:>10} {:>10}",
        "one step, batch 2", "ov f32", "ov bf16", "ours f32", "ours bf16", "ours Q8", "ov memory"
    );
    println!(
        "{:<34} {:>9} {:>9} {:>10} {:>10} {:>10} {:>10}",
        "", "ms", "ms", "speed-up", "speed-up", "over bf16", "rise MB"
    );
    for ((case, o), run) in cases.iter().zip(ours).zip(&runs) {
        let get = |k: &str| run.as_ref().and_then(|v| v[k][0].as_f64());
        let (ov32, ov16) = (get("step"), get("step_bf16"));
        let ms = |t: Option<f64>| t.map_or("-".into(), |t| format!("{:.1}", t * 1e3));
        let ratio = |a: Option<f64>, b: f64| a.map_or("-".into(), |a| format!("{:.2}x", a / b));
        let rise = get("rise_mib").map_or("-".into(), |m| format!("{:.0}", m * 1.048576));
        println!(
            "{:<34} {:>9} {:>9} {:>10} {:>10} {:>10} {:>10}",
            case.name,
            ms(ov32),
            ms(ov16),
            ratio(ov32, o.f32_s),
            ratio(ov16, o.bf16_s),
            o.q8_s.map_or("-".into(), |q| ratio(ov16, q)),
            rise
        );
    }
}

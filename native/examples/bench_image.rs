//! The image primitives and the VAE decode on the CPU next to PyTorch (`bench/torch_image.py`)
//! in one run, as ratios: the VAE's 3x3 convolutions at the sizes a 256 x 256 decode runs
//! them, the whole decode of Stable Diffusion's autoencoder configuration (random weights,
//! latent 32 x 32 to 256 x 256), and attention over 4,608 tokens (FLUX at 1024 x 1024:
//! 24 heads of 128) with the memory it allocates beside what a (T, T) score matrix costs.
//!
//!     RB_PYTHON=~/venv-fixtures/bin/python cargo run --release -p rusting_brain --example bench_image [-- REPS]
//!
//! With `--published`, instead, the decode at the sizes pictures are made at: latents of
//! 64 x 64 and 128 x 128 to 512 x 512 and 1024 x 1024 pixels, ours at f32 and in mixed
//! precision beside diffusers' f32 and bf16 autocast (`bench/torch_vae.py`, one process a
//! size), with the memory each side's decode takes.
//!
//! With `--attention`, ours alone: attention at SD 1.5's 64 x 64 (batch 2, 4,096 tokens, 8
//! heads of 40) and FLUX's 1024 x 1024 (4,608 tokens, 24 heads of 128), f32 and mixed
//! precision, GFLOP/s of the two products (4 T^2 d a head).
//!
//! PyTorch runs through `$RB_PYTHON` (default `python3`) with the same thread count;
//! without torch and diffusers there, only our side is printed.

#[path = "common/bench.rs"]
mod bench;

use std::collections::BTreeMap;
use std::time::Instant;

use bench::{best, commit, cpu_model};

use rusting_brain::cpu::CpuBackend;
use rusting_brain::profile::Profiled;
use rusting_brain_core::backend::ConvOps;
use rusting_brain_core::backend::SdpaOps;
use rusting_brain_core::backend::{Conv2dSpec, SdpaSpec, Unary};
use rusting_brain_core::models::vae::{AutoencoderKl, VaeConfig};
use rusting_brain_core::Rng;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let reps: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(2);
    let be = CpuBackend::new();
    let threads = be.threads();
    let mut rng = Rng::new(0);
    println!(
        "bench_image: commit {}, {}, {threads} threads, {}, best of {reps}",
        commit(),
        cpu_model(),
        be.isa()
    );

    if std::env::args().any(|a| a == "--published") {
        return published(be, reps, &mut rng);
    }
    if std::env::args().any(|a| a == "--attention") {
        return attention(be, reps, &mut rng);
    }

    // The 3x3 convolutions of a 256 x 256 decode (SD's VAE: 512 channels at 32 and 64,
    // 256 at 128, 128 at 256).
    let convs: [[usize; 6]; 4] = [
        [1, 512, 512, 32, 32, 3],
        [1, 512, 512, 64, 64, 3],
        [1, 256, 256, 128, 128, 3],
        [1, 128, 128, 256, 256, 3],
    ];
    let mut ours_conv = Vec::new();
    for &[b, cin, cout, h, w, k] in &convs {
        let spec = Conv2dSpec::new(b, cin, cout, h, w, k).padding(k / 2);
        let (ni, nw, no, _) = spec.check()?;
        let (x, wt, bias) = (rng.normal_vec(ni, 1.0), rng.normal_vec(nw, 0.02), rng.normal_vec(cout, 1.0));
        let mut y = vec![0.0; no];
        let t = best(reps, || be.conv2d(&mut y, &x, &wt, Some(&bias), &spec).expect("conv2d"));
        ours_conv.push((spec.flops(), t));
    }

    let config = sd_vae();
    let layout = config.layout();
    let weights: BTreeMap<String, Vec<f32>> =
        layout.tensors.iter().map(|(n, s)| (n.clone(), rng.normal_vec(s.iter().product(), 0.02))).collect();
    let profiled = AutoencoderKl::new(Profiled::new(be), config.clone(), weights.clone())?;
    let vae = AutoencoderKl::new(be, config, weights)?;
    let latent = 32;
    let z = rng.normal_vec(4 * latent * latent, 1.0);
    let t_vae = best(reps, || {
        vae.decode(&z, 1, latent, latent).expect("decode");
    });

    // Where the decode's time goes, by primitive (one more decode, timed op by op).
    let t = Instant::now();
    profiled.decode(&z, 1, latent, latent)?;
    let by_op = profiled.backend().breakdown(1, t.elapsed().as_secs_f64(), false);

    // Attention at 4,608 tokens, and the most it allocates beyond its inputs and output.
    let (tokens, heads, d) = (4608, 24, 128);
    let spec = SdpaSpec::new(1, tokens, heads, d);
    let n = tokens * heads * d;
    let (q, k, v) = (rng.normal_vec(n, 1.0), rng.normal_vec(n, 1.0), rng.normal_vec(n, 1.0));
    let mut o = vec![0.0; n];
    // The first call allocates the per-thread score tiles (kept for later calls), so its
    // peak is the one to report; the second is timed.
    let (extra, first) = bench::peak_extra(|| be.sdpa(&mut o, &q, &k, &v, None, None, &spec));
    first?;
    let t = Instant::now();
    be.sdpa(&mut o, &q, &k, &v, None, None, &spec)?;
    let t_sdpa = t.elapsed().as_secs_f64();
    let score_matrix = tokens * tokens * 4;

    let python = bench::python();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/torch_image.py");
    let args = [
        ("--threads", threads.to_string()),
        ("--reps", reps.to_string()),
        ("--convs", serde_json::to_string(&convs)?),
        ("--latent", latent.to_string()),
        ("--tokens", tokens.to_string()),
        ("--heads", heads.to_string()),
        ("--head-dim", d.to_string()),
    ]
    .into_iter()
    .flat_map(|(k, v)| [k.to_string(), v])
    .collect::<Vec<_>>();
    let torch = bench::python_json(&python, script, &args);
    let theirs = |key: &str, i: Option<usize>| -> Option<f64> {
        let v = &torch.as_ref()?[key];
        match i {
            Some(i) => v[i].as_f64(),
            None => v.as_f64(),
        }
    };
    bench::print_torch_line(torch.as_ref(), &python, script);
    println!("{:<38} {:>10} {:>10} {:>10} {:>12}", "", "ours ms", "torch ms", "ours/torch", "ours GFLOP/s");
    let row = |name: String, ours: f64, torch: Option<f64>, flops: Option<f64>| {
        let (tm, ratio) = match torch {
            Some(t) => (format!("{:.1}", t * 1e3), format!("{:.2}", ours / t)),
            None => ("-".into(), "-".into()),
        };
        let g = flops.map_or("-".into(), |f| format!("{:.1}", f / ours / 1e9));
        println!("{name:<38} {:>10.1} {tm:>10} {ratio:>10} {g:>12}", ours * 1e3);
    };
    for (i, (&[_, cin, cout, h, w, k], &(flops, t))) in convs.iter().zip(&ours_conv).enumerate() {
        row(format!("conv2d {cin}->{cout} {k}x{k} at {h}x{w}"), t, theirs("conv", Some(i)), Some(flops));
    }
    row(
        format!(
            "VAE decode {latent}x{latent} -> {}x{} ({:.1} M params)",
            latent * 8,
            latent * 8,
            layout.parameter_count() as f64 / 1e6
        ),
        t_vae,
        theirs("vae_decode", None),
        None,
    );
    row(
        format!("sdpa {tokens} tokens x {heads} heads x {d}"),
        t_sdpa,
        theirs("sdpa", None),
        Some(spec.flops()),
    );
    println!("VAE decode by primitive:\n{by_op}");
    println!(
        "sdpa memory at {tokens} tokens: {:.1} MB allocated beyond q/k/v/out ({:.1} MB is the output-sized \
         result blocks, {:.1} MB the score tiles of {threads} threads); one head's (T, T) scores would be \
         {:.1} MB, all {heads} heads' {:.1} MB",
        extra as f64 / 1e6,
        (n * 4) as f64 / 1e6,
        (threads * rusting_brain::cpu::sdpa::tile_floats(&spec) * 4) as f64 / 1e6,
        score_matrix as f64 / 1e6,
        (score_matrix * heads) as f64 / 1e6
    );
    Ok(())
}

/// SD's autoencoder configuration (the weights are random: the time does not depend on
/// the values).
fn sd_vae() -> VaeConfig {
    VaeConfig {
        in_channels: 3,
        out_channels: 3,
        latent_channels: 4,
        block_out_channels: vec![128, 256, 512, 512],
        decoder_block_out_channels: vec![128, 256, 512, 512],
        layers_per_block: 2,
        norm_num_groups: 32,
        act: Unary::Silu,
        scaling_factor: 0.18215,
        shift_factor: 0.0,
        use_quant_conv: true,
        use_post_quant_conv: true,
        mid_block_add_attention: true,
        latent_bn: None,
    }
}

/// `--published`: the decode from latents of 64 and 128 to 512 x 512 and 1024 x 1024, ours
/// at f32 and in mixed precision beside diffusers' f32 and bf16 autocast, one PyTorch
/// process a size (a process's peak only rises).
fn published(be: CpuBackend, reps: usize, rng: &mut Rng) -> Result<(), Box<dyn std::error::Error>> {
    let config = sd_vae();
    let layout = config.layout();
    let params = layout.parameter_count();
    let latents = [64usize, 128];
    let names: Vec<String> =
        latents.iter().map(|l| format!("VAE decode {l}x{l} -> {}x{}", l * 8, l * 8)).collect();
    let mut ours = Vec::new();
    for &latent in &latents {
        let weights: BTreeMap<String, Vec<f32>> = layout
            .tensors
            .iter()
            .map(|(n, s)| (n.clone(), rng.normal_vec(s.iter().product(), 0.02)))
            .collect();
        let z = rng.normal_vec(4 * latent * latent, 1.0);
        // The heap's peak from the weights on: the model and its decodes.
        let (peak, vae) = bench::peak_extra(|| -> Result<_, Box<dyn std::error::Error>> {
            let mut vae = AutoencoderKl::new(be, config.clone(), weights)?;
            vae.decode(&z, 1, latent, latent)?;
            vae.set_mixed_precision(true);
            vae.decode(&z, 1, latent, latent)?;
            Ok(vae)
        });
        let mut vae = vae?;
        let mut time = |mixed: bool| {
            vae.set_mixed_precision(mixed);
            best(reps, || {
                vae.decode(&z, 1, latent, latent).expect("decode");
            })
        };
        let (t32, t16) = (time(false), time(true));
        ours.push(bench::Ours { params, f32_s: t32, bf16_s: t16, q8_s: None, peak_bytes: peak });
    }
    let python = bench::python();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/torch_vae.py");
    let runs: Vec<Option<serde_json::Value>> = latents
        .iter()
        .map(|l| {
            let args = [
                "--threads",
                &be.threads().to_string(),
                "--reps",
                &reps.to_string(),
                "--latent",
                &l.to_string(),
            ]
            .map(String::from);
            bench::python_json(&python, script, &args)
        })
        .collect();
    bench::print_torch_line(runs.iter().flatten().next(), &python, script);
    // The table's PyTorch columns read `step`, `step_bf16` and `peak_mib` as lists.
    let torch: Vec<Option<serde_json::Value>> = runs
        .iter()
        .map(|r| {
            r.as_ref().map(|v| {
                serde_json::json!({"step": [v["decode"]], "step_bf16": [v["decode_bf16"]], "peak_mib": [v["peak_mib"]]})
            })
        })
        .collect();
    let rows = bench::precision_rows(names.iter().map(String::as_str), &ours, &torch);
    bench::print_precision_table("SD's autoencoder, batch 1", &rows);
    Ok(())
}

/// `--attention`: the attention shapes of SD 1.5 at 512 x 512 and FLUX at 1024 x 1024, f32
/// and bf16, best of `reps` calls after one.
fn attention(be: CpuBackend, reps: usize, rng: &mut Rng) -> Result<(), Box<dyn std::error::Error>> {
    use rusting_brain_core::backend::OperandPrecision;
    println!("{:<36} {:>9} {:>9} {:>9} {:>9}", "attention", "f32 ms", "GFLOP/s", "bf16 ms", "GFLOP/s");
    for (name, batch, tokens, heads, d) in [
        ("SD 1.5 64x64: 2 x 4096 x 8 x 40", 2, 4096, 8, 40),
        ("FLUX 1024^2: 4608 x 24 x 128", 1, 4608, 24, 128),
    ] {
        let n = batch * tokens * heads * d;
        let (q, k, v) = (rng.normal_vec(n, 1.0), rng.normal_vec(n, 1.0), rng.normal_vec(n, 1.0));
        let mut o = vec![0.0; n];
        let flops = 4.0 * (batch * heads) as f64 * (tokens * tokens * d) as f64;
        let mut row = Vec::new();
        for precision in [OperandPrecision::F32, OperandPrecision::Bf16] {
            let spec = SdpaSpec::new(batch, tokens, heads, d).precision(precision);
            be.sdpa(&mut o, &q, &k, &v, None, None, &spec)?;
            let t = best(reps, || be.sdpa(&mut o, &q, &k, &v, None, None, &spec).unwrap());
            row.push((t * 1e3, flops / t / 1e9));
        }
        println!("{name:<36} {:>9.1} {:>9.1} {:>9.1} {:>9.1}", row[0].0, row[0].1, row[1].0, row[1].1);
    }
    Ok(())
}

//! A picture from a prompt with a published FLUX.1, FLUX.2-klein, SD3, SD 1.x/2.x or SD-XL
//! pipeline folder.
//!
//! ```sh
//! cargo run --release --features images --example text_to_image -- \
//!     models/FLUX.2-klein-4B "a lighthouse in fog" out.png [--steps N] [--size WxH] \
//!     [--seed S] [--q8 | --q4] [--bf16] [--guidance G] [--layers 9,18,27] \
//!     [--image in.png --strength S]
//! ```
//!
//! `--bf16` turns on mixed precision (`set_mixed_precision(true)`: bf16 products and
//! attention where the CPU has the instructions); with `--q8` it is the fastest path.
//!
//! A progress bar follows the denoising steps; each part's time and the process's peak
//! resident memory are printed at the end. `--image` starts from a picture (img2img),
//! `--strength` (default 0.6) saying how far back up the schedule it is pushed.

use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use rusting_brain::image_pipeline::Noise;
use rusting_brain::{vae, ImagePipeline, Precision};

struct Args {
    dir: String,
    prompt: String,
    out: String,
    steps: Option<usize>,
    size: (usize, usize),
    seed: u64,
    precision: Precision,
    mixed: bool,
    guidance: Option<f32>,
    layers: Option<Vec<usize>>,
    image: Option<String>,
    strength: f32,
}

fn usage() -> String {
    "usage: text_to_image <pipeline dir> \"<prompt>\" <out.png> [--steps N] [--size WxH] [--seed S] [--q8 | --q4] \
     [--bf16] [--guidance G] [--layers a,b,c] [--image in.png --strength S]"
        .to_string()
}

fn parse() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut positional = Vec::new();
    let mut args = Args {
        dir: String::new(),
        prompt: String::new(),
        out: String::new(),
        steps: None,
        size: (1024, 1024),
        seed: 0,
        precision: Precision::F32,
        mixed: false,
        guidance: None,
        layers: None,
        image: None,
        strength: 0.6,
    };
    let mut seed = None;
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value\n{}", usage()));
        match a.as_str() {
            "--steps" => args.steps = Some(value("--steps")?.parse().map_err(|e| format!("--steps: {e}"))?),
            "--size" => {
                let v = value("--size")?;
                let (w, h) = v.split_once('x').ok_or_else(|| format!("--size {v}: expected WxH"))?;
                args.size = (
                    w.parse().map_err(|e| format!("--size width: {e}"))?,
                    h.parse().map_err(|e| format!("--size height: {e}"))?,
                );
            }
            "--seed" => seed = Some(value("--seed")?.parse().map_err(|e| format!("--seed: {e}"))?),
            "--q8" => args.precision = Precision::Q8,
            "--q4" => args.precision = Precision::Q4,
            "--bf16" => args.mixed = true,
            "--guidance" => {
                args.guidance = Some(value("--guidance")?.parse().map_err(|e| format!("--guidance: {e}"))?)
            }
            "--layers" => {
                let v = value("--layers")?;
                let layers: Result<Vec<usize>, _> = v.split(',').map(str::parse).collect();
                args.layers = Some(layers.map_err(|e| format!("--layers {v}: {e}"))?);
            }
            "--image" => args.image = Some(value("--image")?),
            "--strength" => {
                args.strength = value("--strength")?.parse().map_err(|e| format!("--strength: {e}"))?
            }
            s if s.starts_with("--") => return Err(format!("unknown option {s}\n{}", usage())),
            _ => positional.push(a),
        }
    }
    let [dir, prompt, out] = <[String; 3]>::try_from(positional).map_err(|_| usage())?;
    (args.dir, args.prompt, args.out) = (dir, prompt, out);
    args.seed = seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
    });
    Ok(args)
}

fn human_bytes(b: usize) -> String {
    match b {
        b if b >= 1_000_000_000 => format!("{:.2} GB", b as f64 / 1e9),
        b if b >= 1_000_000 => format!("{:.1} MB", b as f64 / 1e6),
        b => format!("{:.1} kB", b as f64 / 1e3),
    }
}

#[path = "common/rss.rs"]
mod rss;
use rss::peak_rss_mib;

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let t = Instant::now();
    let precision = args.precision;
    let mut pipeline = ImagePipeline::load_at(&args.dir, precision)?;
    if let Some(s) = args.steps {
        pipeline.config.steps = s;
    }
    if let Some(g) = args.guidance {
        pipeline.config.guidance_scale = g;
    }
    if let Some(l) = args.layers {
        pipeline.config.text_encoder_layers = l;
    }
    pipeline.set_mixed_precision(args.mixed);
    let load_s = t.elapsed().as_secs_f64();
    println!(
        "loaded {} ({:?}, {precision:?}) in {load_s:.1} s: {} of weights",
        args.dir,
        pipeline.family(),
        human_bytes(pipeline.weight_bytes())
    );

    let t = Instant::now();
    let cond = pipeline.condition(&args.prompt)?;
    // The prompt is encoded; the encoders' memory goes back before the denoiser runs.
    pipeline.drop_encoders();
    let condition_s = t.elapsed().as_secs_f64();

    let init = match &args.image {
        Some(path) => Some(vae::load_image(path)?),
        None => None,
    };
    let (width, height) = match &init {
        Some(img) => (img.width, img.height),
        None => args.size,
    };
    let bar = ProgressBar::new(pipeline.config.steps as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} step {pos}/{len}  {elapsed_precise} elapsed, {msg}")
            .map_err(|e| e.to_string())?,
    );
    let t = Instant::now();
    let mut last = Instant::now();
    let progress = |step: usize, total: usize| {
        bar.set_length(total as u64);
        bar.set_position(step as u64);
        bar.set_message(format!("{:.2} s/step", last.elapsed().as_secs_f64()));
        last = Instant::now();
        true
    };
    let latent = match &init {
        Some(img) => {
            pipeline.sample_latent_from_image(&cond, img, args.strength, Noise::Seed(args.seed), progress)?
        }
        None => pipeline.sample_latent(&cond, width, height, Noise::Seed(args.seed), progress)?,
    };
    bar.finish();
    if !bar.is_hidden() {
        eprintln!();
    }
    let sample_s = t.elapsed().as_secs_f64();
    pipeline.drop_denoiser();

    let t = Instant::now();
    let image = pipeline.decode(&latent)?;
    let decode_s = t.elapsed().as_secs_f64();
    vae::save_png(&image, &args.out)?;
    let steps = bar.length().unwrap_or(1).max(1) as f64;
    println!(
        "{}x{} seed {}: prompt {condition_s:.2} s, denoise {sample_s:.2} s ({:.2} s/step), decode {decode_s:.2} s -> {}",
        image.width,
        image.height,
        args.seed,
        sample_s / steps,
        args.out
    );
    match peak_rss_mib() {
        Some(m) => println!("peak resident memory {m:.0} MiB"),
        None => println!("peak resident memory: not known on this system"),
    }
    Ok(())
}

fn main() {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

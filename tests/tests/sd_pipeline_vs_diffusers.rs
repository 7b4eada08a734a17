//! Stable Diffusion 1.x and XL runs against diffusers' pipelines
//! (`tests/fixtures/gen_sd_pipelines.py`): a prompt and a seed in, a picture out, with
//! classifier-free guidance, for each solver `PipelineConfig::solver` offers (DDIM, the
//! folder's; Euler, Euler ancestral and DPM-Solver++ 2M over the same training schedule,
//! as diffusers' `from_config` swaps them), SD 1.x img2img at strength 0.5, and SD-XL with
//! its two towers, size conditioning and zeros for the empty negative prompt, with each
//! solver over its folder's Euler schedule.
//!
//! Tolerance: 1e-3 absolute on pixels in [0, 1], both sides in float32; the worst
//! difference is printed.

use rusting_brain::image_pipeline::Family;
use rusting_brain::vae::Image;
use rusting_brain::{ImagePipeline, Precision, Solver};
use rusting_brain_tests::*;

fn expected(name: &str) -> Fixture {
    Fixture::open(fixture_path("pipelines").join(format!("{name}_expected.safetensors"))).unwrap()
}

fn meta<T: serde::de::DeserializeOwned>(f: &Fixture, key: &str) -> T {
    serde_json::from_str(&f.metadata(key).unwrap_or_else(|| panic!("metadata {key}"))).unwrap()
}

fn pipeline(folder: &str, f: &Fixture) -> ImagePipeline {
    let mut p = ImagePipeline::load(fixture_path("pipelines").join(folder))
        .unwrap_or_else(|e| panic!("{folder}: {e}"));
    p.config.steps = meta(f, "steps");
    p.config.guidance_scale = meta(f, "guidance");
    assert!(p.uses_cfg());
    p
}

#[test]
fn sd_every_solver_gives_diffusers_picture() {
    let f = expected("sd");
    let mut p = pipeline("sd_tiny", &f);
    assert_eq!(p.family(), Family::Sd);
    assert_eq!(p.config.solver, Solver::Ddim, "the folder's DDIMScheduler");
    let (prompt, seed, size): (String, u64, usize) = (meta(&f, "prompt"), meta(&f, "seed"), meta(&f, "size"));
    for (solver, key) in [
        (Solver::Ddim, "ddim"),
        (Solver::Euler, "euler"),
        (Solver::EulerAncestral, "euler_ancestral"),
        (Solver::DpmPlusPlus2M, "dpm"),
    ] {
        p.config.solver = solver;
        let image =
            p.generate(&prompt, size, size, Some(seed), |_, _| true).unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_same_picture(&format!("sd {key}"), &image, &f.get(key).unwrap());
    }
}

#[test]
fn sd_img2img_matches_diffusers() {
    let f = expected("sd");
    let mut p = pipeline("sd_tiny", &f);
    p.config.steps = meta(&f, "img2img_steps");
    let t = f.get("init_image").unwrap();
    let image = Image {
        channels: t.shape[1],
        height: t.shape[2],
        width: t.shape[3],
        data: t.data.iter().map(|&v| (v * 2.0 - 1.0) as f32).collect(),
    };
    let mut steps = 0;
    let out = p
        .generate_from_image(
            &image,
            0.5,
            &meta::<String>(&f, "prompt"),
            Some(meta(&f, "img2img_seed")),
            |_, n| {
                steps = n;
                true
            },
        )
        .unwrap();
    assert_eq!(steps, 2, "int(4 * 0.5) steps");
    assert_same_picture("sd img2img 0.5", &out, &f.get("img2img_0.5").unwrap());
}

#[test]
fn sdxl_gives_diffusers_picture() {
    let f = expected("sdxl");
    let mut p = pipeline("sdxl_tiny", &f);
    assert_eq!(p.family(), Family::Sdxl);
    assert_eq!(p.config.solver, Solver::Euler);
    let (prompt, seed, size): (String, u64, usize) = (meta(&f, "prompt"), meta(&f, "seed"), meta(&f, "size"));
    // The empty negative prompt is zeros (force_zeros_for_empty_prompt).
    let cond = p.condition(&prompt).unwrap();
    let negative = cond.negative.as_ref().unwrap();
    assert!(
        negative.states.iter().all(|&v| v == 0.0)
            && negative.pooled.as_ref().unwrap().iter().all(|&v| v == 0.0)
    );
    for (solver, key) in [
        (Solver::Euler, "euler"),
        (Solver::EulerAncestral, "euler_ancestral"),
        (Solver::Ddim, "ddim"),
        (Solver::DpmPlusPlus2M, "dpm"),
    ] {
        p.config.solver = solver;
        let image = p.generate(&prompt, size, size, Some(seed), |_, _| true).unwrap();
        assert_same_picture(&format!("sdxl {key}"), &image, &f.get(key).unwrap());
    }
}

#[test]
fn quantized_and_mixed_pictures_stay_within_their_bounds() {
    // The UNet's matrices and convolutions int8 with int8 activation rows (Q8, W8A8), the
    // matrices 4-bit with the same int8 convolutions (Q4), the CLIP towers int8 in blocks;
    // or bf16 operands with f32 sums (mixed precision): each picture against diffusers'
    // f32 one, the folder's solver. Measured (max abs, relative L2): int8 sd 0.027 and
    // 1.2e-2, sdxl 0.049 and 1.7e-2; 4-bit 0.065 and 2.3e-2, 0.066 and 3.2e-2; mixed
    // precision 0.0070 and 3.4e-3, 0.0083 and 4.1e-3. The bounds are 1.6 times the worst
    // of each.
    for (name, folder, key) in [("sd", "sd_tiny", "ddim"), ("sdxl", "sdxl_tiny", "euler")] {
        let f = expected(name);
        let (prompt, seed, size): (String, u64, usize) =
            (meta(&f, "prompt"), meta(&f, "seed"), meta(&f, "size"));
        let want = f.get(key).unwrap();
        for (label, precision, mixed, bound) in [
            ("int8", Precision::Q8, false, 0.078),
            ("4-bit", Precision::Q4, false, 0.106),
            ("mixed precision", Precision::F32, true, 0.0133),
        ] {
            let mut p = ImagePipeline::load_at(fixture_path("pipelines").join(folder), precision).unwrap();
            p.config.steps = meta(&f, "steps");
            p.config.guidance_scale = meta(&f, "guidance");
            p.set_mixed_precision(mixed);
            let image = p.generate(&prompt, size, size, Some(seed), |_, _| true).unwrap();
            let what = format!("{name} {label}");
            assert_picture_within(&what, &image, &want, bound);
            let ours: Vec<f32> = image.data.iter().map(|v| (v / 2.0 + 0.5).clamp(0.0, 1.0)).collect();
            let rel = relative_l2(&ours, &want);
            println!("{what} relative L2 {rel:.3e}");
            // The f32 pictures match to about 1e-6: an error this small would mean the
            // precision never reached the products.
            assert!(rel > 1e-4, "{what}: relative L2 {rel:e}, as small as f32's");
        }
    }
}

#[test]
fn solver_and_noise_errors() {
    let f = expected("sd");
    let mut p = pipeline("sd_tiny", &f);
    let cond = p.condition("x").unwrap();
    p.config.solver = Solver::EulerAncestral;
    let e = p
        .sample_latent(&cond, 16, 16, rusting_brain::Noise::Given(vec![0.0; 4 * 8 * 8]), |_, _| true)
        .err()
        .unwrap();
    assert!(e.to_string().contains("Noise::Seed"), "{e}");
    assert!(p.generate("x", 14, 16, Some(0), |_, _| true).is_err(), "14 is not a multiple of 4");
    // The flow-matching pipelines take Euler only.
    let mut flux = ImagePipeline::load(fixture_path("pipelines").join("flux_tiny")).unwrap();
    flux.config.solver = Solver::Ddim;
    assert!(flux.generate("x", 16, 16, Some(0), |_, _| true).is_err());
}

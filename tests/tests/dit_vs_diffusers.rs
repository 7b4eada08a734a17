//! The diffusion transformers against diffusers (`tests/fixtures/gen_dit.py`): FLUX.1 (with
//! and without the guidance embedding), FLUX.2 (klein-style) and SD3 (SD3.5-medium-style
//! with q/k norms and a dual-attention block, and the plain SD3-medium style), each folder
//! written by `save_pretrained`, run on fixed inputs at batch 2 with two timesteps.
//! The same weights in the original spellings (BFL's for FLUX with one, two or no
//! `model.diffusion_model.` prefixes; Stability AI's for SD3; fused q/k/v, swapped adaLN
//! halves) give the same outputs to the bit.
//!
//! Tolerance: rtol 1e-4 with an absolute floor of 1e-4 * rms (`assert_close_rms`). The
//! expected values come from diffusers in float64, except the rotary tables and the
//! sinusoidal timestep features, which diffusers itself rounds to f32; our run is f32
//! throughout, through about a dozen matmuls, norms and attentions.

use std::path::PathBuf;

use rusting_brain::core::models::dit::{DitInput, DitKind, DitLatent};
use rusting_brain::dit::{dit_config, Spelling};
use rusting_brain::{Dit, Precision};
use rusting_brain_tests::*;

fn folder(name: &str) -> PathBuf {
    fixture_path("dit").join(name)
}

/// The model's output for the fixture's inputs.
fn run(dit: &Dit, io: &Fixture) -> Vec<f32> {
    let timestep = io.get("timestep").unwrap().to_f32();
    let context = io.get("context").unwrap().to_f32();
    let pooled = io.get("pooled").ok().map(|t| t.to_f32());
    let guidance = io.get("guidance").ok().map(|t| t.to_f32());
    let batch = timestep.len();
    if dit.config().kind == DitKind::Sd3 {
        let latent = io.get("latent").unwrap();
        let data = latent.to_f32();
        let input = DitInput {
            batch,
            latent: DitLatent::Image { data: &data, height: latent.shape[2], width: latent.shape[3] },
            context: &context,
            context_ids: &[],
            pooled: pooled.as_deref(),
            timestep: &timestep,
            guidance: None,
        };
        return dit.forward(&input).unwrap();
    }
    let hidden = io.get("hidden").unwrap().to_f32();
    let img_ids = io.get("img_ids").unwrap().to_f32();
    let txt_ids = io.get("txt_ids").unwrap().to_f32();
    let input = DitInput {
        batch,
        latent: DitLatent::Tokens { data: &hidden, ids: &img_ids },
        context: &context,
        context_ids: &txt_ids,
        pooled: pooled.as_deref(),
        timestep: &timestep,
        guidance: guidance.as_deref(),
    };
    dit.forward(&input).unwrap()
}

fn parity(name: &str) -> Vec<f32> {
    let io = Fixture::open(folder(name).join("io.safetensors")).unwrap();
    let dit = Dit::load(folder(name).join("transformer")).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(*dit.spelling(), Spelling::Diffusers);
    let want: usize = io.metadata("parameters").unwrap().parse().unwrap();
    assert_eq!(dit.parameter_count(), want, "{name}: parameter count");
    let got = run(&dit, &io);
    assert_close_rms(&format!("{name} forward"), &got, &io.get("out").unwrap(), 1e-4);
    got
}

#[test]
fn flux_dev_matches_diffusers() {
    parity("flux");
}

#[test]
fn flux_schnell_matches_diffusers() {
    parity("flux_schnell");
}

#[test]
fn flux2_matches_diffusers() {
    parity("flux2");
}

#[test]
fn sd35_with_qk_norm_and_dual_attention_matches_diffusers() {
    parity("sd3");
}

#[test]
fn sd3_plain_matches_diffusers() {
    parity("sd3_plain");
}

#[test]
fn original_spellings_give_the_same_outputs() {
    for (name, spellings) in [
        ("flux", &["bfl_prefixed"][..]),
        ("flux2", &["bfl_prefixed", "bfl_doubled", "bfl_root"][..]),
        ("sd3", &["sai_prefixed"][..]),
    ] {
        let io = Fixture::open(folder(name).join("io.safetensors")).unwrap();
        let reference = run(&Dit::load(folder(name).join("transformer")).unwrap(), &io);
        for spelling in spellings {
            let dit =
                Dit::load(folder(name).join(spelling)).unwrap_or_else(|e| panic!("{name}/{spelling}: {e}"));
            let want_prefix = match *spelling {
                "bfl_prefixed" | "sai_prefixed" => "model.diffusion_model.",
                "bfl_doubled" => "model.diffusion_model.model.diffusion_model.",
                _ => "",
            };
            assert_eq!(
                *dit.spelling(),
                Spelling::Original { prefix: want_prefix.into() },
                "{name}/{spelling}"
            );
            let got = run(&dit, &io);
            let same = got.iter().zip(&reference).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same && got.len() == reference.len(), "{name}/{spelling}: outputs differ");
        }
    }
}

#[test]
fn q8_stays_close_to_f32() {
    // Int8 rows (one scale a row) round each weight by at most half a step of
    // max|row| / 127, and each activation row the same way (W8A8); through these few
    // layers the whole output moves by 1-2% (l2): measured flux 0.0180, flux2 0.0204,
    // sd3 0.0123, the bound 1.5 times the worst.
    for name in ["flux", "flux2", "sd3"] {
        let io = Fixture::open(folder(name).join("io.safetensors")).unwrap();
        let dit = Dit::load_at(folder(name).join("transformer"), Precision::Q8).unwrap();
        let got = run(&dit, &io);
        let err = relative_l2(&got, &io.get("out").unwrap());
        println!("{name}: int8 relative l2 error {err:.4}");
        assert!(err < 0.03, "{name}: int8 error {err}");
    }
}

#[test]
fn bad_inputs_are_errors() {
    let io = Fixture::open(folder("flux").join("io.safetensors")).unwrap();
    let dit = Dit::load(folder("flux").join("transformer")).unwrap();
    let hidden = io.get("hidden").unwrap().to_f32();
    let img_ids = io.get("img_ids").unwrap().to_f32();
    let txt_ids = io.get("txt_ids").unwrap().to_f32();
    let context = io.get("context").unwrap().to_f32();
    let pooled = io.get("pooled").unwrap().to_f32();
    let good = DitInput {
        batch: 2,
        latent: DitLatent::Tokens { data: &hidden, ids: &img_ids },
        context: &context,
        context_ids: &txt_ids,
        pooled: Some(&pooled),
        timestep: &[0.5, 0.5],
        guidance: Some(&[3.0, 3.0]),
    };
    assert!(dit.forward(&good).is_ok());
    let cases: Vec<(&str, DitInput)> = vec![
        ("no guidance", DitInput { guidance: None, ..good }),
        ("no pooled", DitInput { pooled: None, ..good }),
        ("one timestep", DitInput { timestep: &[0.5], ..good }),
        ("short context", DitInput { context: &context[1..], ..good }),
        ("short context ids", DitInput { context_ids: &txt_ids[3..], ..good }),
        (
            "short latent",
            DitInput { latent: DitLatent::Tokens { data: &hidden[4..], ids: &img_ids }, ..good },
        ),
        (
            "an image for FLUX",
            DitInput { latent: DitLatent::Image { data: &hidden, height: 4, width: 4 }, ..good },
        ),
        ("batch 0", DitInput { batch: 0, ..good }),
    ];
    for (what, input) in cases {
        let e = dit.forward(&input).err().unwrap_or_else(|| panic!("{what}: accepted"));
        println!("{what}: {e}");
    }
}

#[test]
fn bad_folders_are_errors() {
    let t = rusting_brain_test_support::TempDir::new("dit-bad");
    let dir = t.path();
    // No config.
    assert!(Dit::load(dir).is_err());
    let src = folder("flux2").join("transformer");
    std::fs::copy(src.join("config.json"), dir.join("config.json")).unwrap();
    // No weights.
    let e = Dit::load(dir).err().unwrap().to_string();
    assert!(e.contains("safetensors"), "{e}");
    // Two unnamed files: which one?
    let bfl = folder("flux2").join("bfl_root").join("flux2-tiny.safetensors");
    std::fs::copy(&bfl, dir.join("a.safetensors")).unwrap();
    std::fs::copy(&bfl, dir.join("b.safetensors")).unwrap();
    let e = Dit::load(dir).err().unwrap().to_string();
    assert!(e.contains("2 .safetensors files"), "{e}");
    std::fs::remove_file(dir.join("b.safetensors")).unwrap();
    assert!(Dit::load(dir).is_ok());
    // A config that does not match the weights: the tensor is named.
    let cfg = std::fs::read_to_string(src.join("config.json")).unwrap();
    std::fs::write(dir.join("config.json"), cfg.replace("\"num_layers\": 2", "\"num_layers\": 3")).unwrap();
    let e = Dit::load(dir).err().unwrap().to_string();
    assert!(e.contains("double_blocks.2"), "{e}");
    std::fs::write(dir.join("config.json"), cfg.replace("\"num_layers\": 2", "\"num_layers\": 1")).unwrap();
    let e = Dit::load(dir).err().unwrap().to_string();
    assert!(e.contains("not part of the transformer"), "{e}");
    // A truncated file.
    let bytes = std::fs::read(&bfl).unwrap();
    std::fs::write(dir.join("a.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    std::fs::write(dir.join("config.json"), &cfg).unwrap();
    let e = Dit::load(dir).err().unwrap().to_string();
    println!("truncated: {e}");
    // An unknown class.
    std::fs::write(dir.join("config.json"), cfg.replace("Flux2Transformer2DModel", "HunyuanDiT2DModel"))
        .unwrap();
    let e = dit_config(&dir.join("config.json")).err().unwrap().to_string();
    assert!(e.contains("HunyuanDiT2DModel"), "{e}");
}

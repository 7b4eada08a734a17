//! `AutoencoderKL` against diffusers (`tests/fixtures/gen_vae.py`): folders written by
//! `save_pretrained` (SD-style F32, the same BF16 and sharded, FLUX.1-style F32) load, and
//! encode and decode agree with diffusers' float64 run on the stored weights.
//!
//! Tolerance: rtol 1e-4 + atol 1e-4 * rms (`assert_close_rms`: the atol covers values near
//! zero, whose f32 error follows the size of the terms summed, ~1, not their own). The f32 path stacks about 20 convolutions, norms and an attention; the worst
//! measured ratio is printed.

use std::path::PathBuf;

use rusting_brain::vae::Vae;
use rusting_brain_tests::*;

fn folder(name: &str) -> PathBuf {
    fixture_path("vae").join(name)
}

fn close(name: &str, got: &[f32], want: &Tensor) {
    assert_close_rms(name, got, want, 1e-4);
}

fn parity(name: &str) {
    let io = Fixture::open(folder(name).join("io.safetensors")).unwrap();
    let vae = Vae::load(folder(name).join("vae")).unwrap_or_else(|e| panic!("{name}: {e}"));
    let want_params: usize = io.metadata("parameters").unwrap().parse().unwrap();
    assert_eq!(vae.parameter_count(), want_params, "{name}: parameter count");

    let image = io.get("image").unwrap();
    let [b, _, h, w] = image.shape[..] else { panic!("image shape") };
    let dist = vae.encode(&image.to_f32(), b, h, w).unwrap();
    let mean = io.get("mean").unwrap();
    assert_eq!([dist.batch, dist.channels, dist.h, dist.w], mean.shape[..], "{name}: latent shape");
    close(&format!("{name} encode mean"), &dist.mean, &mean);
    close(&format!("{name} encode logvar"), &dist.logvar, &io.get("logvar").unwrap());

    let latent = io.get("latent").unwrap();
    let [b, _, h, w] = latent.shape[..] else { panic!("latent shape") };
    let decoded = vae.decode(&latent.to_f32(), b, h, w).unwrap();
    close(&format!("{name} decode"), &decoded, &io.get("decoded").unwrap());
}

#[test]
fn sd_style_f32_matches_diffusers() {
    parity("sd");
}

#[test]
fn bf16_sharded_folder_matches_diffusers() {
    parity("sd_bf16");
}

#[test]
fn flux_style_without_quant_convs_matches_diffusers() {
    parity("flux");
    let vae = Vae::load(folder("flux").join("vae")).unwrap();
    assert_eq!(vae.config().downscale(), 4);
    // (z - shift) * scale and back.
    let mut z = vec![0.5f32, -1.0];
    vae.config().to_denoiser(&mut z);
    assert!((z[0] - (0.5 - 0.1159) * 0.3611).abs() < 1e-7, "{z:?}");
    vae.config().from_denoiser(&mut z);
    assert!((z[0] - 0.5).abs() < 1e-6 && (z[1] + 1.0).abs() < 1e-6, "{z:?}");
}

/// A copy of fixture folder `name`'s `vae/` in a fresh temporary folder.
fn copy(name: &str, tag: &str) -> rusting_brain_test_support::TempDir {
    let t = rusting_brain_test_support::TempDir::new(tag);
    for e in std::fs::read_dir(folder(name).join("vae")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), t.join(e.file_name())).unwrap();
    }
    t
}

fn refusal(dir: &std::path::Path) -> String {
    match Vae::load(dir) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[track_caller]
fn says(message: &str, parts: &[&str]) {
    for p in parts {
        assert!(message.contains(p), "`{message}` does not say `{p}`");
    }
}

#[test]
fn bad_folders_are_errors_naming_file_and_key() {
    // A tensor the configuration needs is missing (one more layer a block).
    let d = copy("sd", "vae-layers");
    edit_config(d.path(), |v| v["layers_per_block"] = 3.into());
    says(&refusal(d.path()), &["diffusion_pytorch_model.safetensors", "resnets.2", "missing"]);

    // The file has a tensor the configuration has no place for.
    let d = copy("sd", "vae-extra");
    edit_config(d.path(), |v| v["mid_block_add_attention"] = false.into());
    says(&refusal(d.path()), &["attentions.0", "not part of the model config.json describes"]);

    // A shape the configuration does not give.
    let d = copy("sd", "vae-shape");
    edit_config(d.path(), |v| v["latent_channels"] = 8.into());
    says(&refusal(d.path()), &["encoder.conv_out.weight", "shape [8, 16, 3, 3]", "[16, 16, 3, 3]"]);

    // Another model class, another block type, groups that do not divide the channels.
    let d = copy("sd", "vae-class");
    edit_config(d.path(), |v| v["_class_name"] = "AutoencoderTiny".into());
    says(&refusal(d.path()), &["config.json", "_class_name", "AutoencoderKLFlux2"]);
    let d = copy("sd", "vae-block");
    edit_config(d.path(), |v| v["down_block_types"][1] = "AttnDownEncoderBlock2D".into());
    says(&refusal(d.path()), &["down_block_types", "AttnDownEncoderBlock2D"]);
    let d = copy("sd", "vae-groups");
    edit_config(d.path(), |v| v["norm_num_groups"] = 3.into());
    says(&refusal(d.path()), &["norm_num_groups", "not a positive multiple"]);
    let d = copy("sd", "vae-count");
    edit_config(d.path(), |v| v["block_out_channels"] = serde_json::json!([8, 16, 16]));
    says(&refusal(d.path()), &["down_block_types", "2 blocks, but block_out_channels has 3"]);

    // A truncated weight file, a missing shard, no config at all.
    let d = copy("sd", "vae-cut");
    let w = d.join("diffusion_pytorch_model.safetensors");
    let bytes = std::fs::read(&w).unwrap();
    std::fs::write(&w, &bytes[..bytes.len() - 100]).unwrap();
    says(&refusal(d.path()), &["diffusion_pytorch_model.safetensors", "not a valid safetensors file"]);
    let d = copy("sd_bf16", "vae-shard");
    std::fs::remove_file(d.join("diffusion_pytorch_model-00002-of-00003.safetensors")).unwrap();
    says(
        &refusal(d.path()),
        &["index.json", "shard diffusion_pytorch_model-00002-of-00003.safetensors is missing"],
    );
    let d = copy("sd", "vae-noconfig");
    std::fs::remove_file(d.join("config.json")).unwrap();
    says(&refusal(d.path()), &["config.json"]);

    // Inputs that do not fit: an image side not a multiple of the downscale, a short buffer.
    let vae = Vae::load(folder("sd").join("vae")).unwrap();
    says(&vae.encode(&vec![0.0; 3 * 31 * 31], 1, 31, 31).unwrap_err().to_string(), &["multiples of 2"]);
    says(
        &vae.decode(&[0.0; 10], 1, 4, 4).unwrap_err().to_string(),
        &["`input` has 10 elements but the shape needs 64"],
    );
}

/// FLUX.2's autoencoder (`AutoencoderKLFlux2`): its own decoder widths, and the latent
/// statistics the pipeline normalizes the 2x2-patchified latents with, both ways.
#[test]
fn flux2_autoencoder_and_its_latent_normalization_match_diffusers() {
    let io = Fixture::open(folder("flux2").join("io.safetensors")).unwrap();
    let vae = Vae::load(folder("flux2").join("vae")).unwrap();
    let want_params: usize = io.metadata("parameters").unwrap().parse().unwrap();
    assert_eq!(vae.parameter_count(), want_params, "parameter count");
    let image = io.get("image").unwrap();
    let dist = vae.encode(&image.to_f32(), 1, 32, 32).unwrap();
    close("flux2 encode mean", &dist.mean, &io.get("mean").unwrap());
    let (z, c, h, w) = vae.to_denoiser(&dist.mean, 1, dist.h, dist.w).unwrap();
    assert_eq!((c, h, w), (16, 8, 8));
    close("flux2 to_denoiser", &z, &io.get("to_denoiser").unwrap());

    let side = io.get("side").unwrap();
    let (z, h, w) = vae.from_denoiser(&side.to_f32(), 1, 8, 8).unwrap();
    assert_eq!((h, w), (16, 16));
    // The round trip is the identity (to rounding).
    let (back, ..) = vae.to_denoiser(&z, 1, h, w).unwrap();
    rusting_brain_test_support::assert_close(
        "to_denoiser(from_denoiser(z))",
        &back,
        &side.to_f32(),
        1e-5,
        1e-5,
    );
    close(
        "flux2 decode from denoiser",
        &vae.decode(&z, 1, h, w).unwrap(),
        &io.get("decoded_from_denoiser").unwrap(),
    );

    let e = vae.to_denoiser(&vec![0.0; 4 * 15 * 16], 1, 15, 16).unwrap_err().to_string();
    assert!(e.contains("multiples of 2"), "{e}");
    let e = vae.from_denoiser(&[0.0; 10], 1, 8, 8).unwrap_err().to_string();
    assert!(e.contains("`z` has 10 elements but the shape needs 1024"), "{e}");
}

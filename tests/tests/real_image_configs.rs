//! The published FLUX.2-klein-4B, FLUX.1-dev, SD3.5-medium, SD 1.5, SD 2.1 and SD-XL
//! pipelines sized from their
//! configuration files alone (`tests/fixtures/gen_real_configs.py`; the folders hold no
//! weights, so nothing can be allocated): every component's parameter count equals what
//! PyTorch counts on the same model built on the meta device, and the table printed gives
//! the memory of the weights in f32 and as `load_at(Precision::Q8)` and
//! `load_at(Precision::Q4)` hold them.
//!
//! `cargo test -p rusting_brain_tests --test real_image_configs -- --nocapture` prints it.

use rusting_brain::component_sizes;
use serde_json::Value;

fn gb(bytes: usize) -> String {
    format!("{:.2}", bytes as f64 / 1e9)
}

#[test]
fn published_pipelines_are_sized_from_their_configs() {
    let root = rusting_brain_tests::fixture_path("real_configs");
    let expected: Value =
        serde_json::from_slice(&std::fs::read(root.join("expected.json")).unwrap()).unwrap();
    let pipelines = expected["parameters"].as_object().unwrap();
    assert_eq!(pipelines.len(), 6);
    println!(
        "{:<16} {:<16} {:<30} {:>15} {:>8} {:>8} {:>8}",
        "pipeline", "component", "class", "parameters", "f32 GB", "int8 GB", "4-bit GB"
    );
    for (name, want) in pipelines {
        let sizes = component_sizes(root.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let want = want.as_object().unwrap();
        assert_eq!(sizes.len(), want.len(), "{name}: components");
        let (mut f32_total, mut q8_total, mut q4_total) = (0, 0, 0);
        for s in &sizes {
            let n = want[&s.name].as_u64().unwrap() as usize;
            assert_eq!(s.parameters, n, "{name}/{}: parameters", s.name);
            assert!(s.q8_bytes <= s.f32_bytes, "{name}/{}", s.name);
            assert!(
                s.q4_bytes <= s.q8_bytes,
                "{name}/{}: 4-bit {} bytes, int8 {}",
                s.name,
                s.q4_bytes,
                s.q8_bytes
            );
            println!(
                "{:<16} {:<16} {:<30} {:>15} {:>8} {:>8} {:>8}",
                name,
                s.name,
                s.class,
                s.parameters,
                gb(s.f32_bytes),
                gb(s.q8_bytes),
                gb(s.q4_bytes)
            );
            f32_total += s.f32_bytes;
            q8_total += s.q8_bytes;
            q4_total += s.q4_bytes;
        }
        println!(
            "{:<16} {:<16} {:<30} {:>15} {:>8} {:>8} {:>8}",
            name,
            "all",
            "",
            "",
            gb(f32_total),
            gb(q8_total),
            gb(q4_total)
        );
        // The transformers and encoders are almost all matrices, so int8 is close to a
        // quarter of f32 (the denoiser's: a byte a weight and a scale a row; the
        // encoders': a byte a weight and a 4-byte scale per 32, 1.125 bytes against 4);
        // what stays f32 is the autoencoder, T5's embedding table (0.53 GB) and SD3's
        // 384 x 384 position table (0.91 GB), which puts SD3.5-medium at 0.32. A
        // UNet's convolutions are int8 rows as its matrices are, and the SD pipelines'
        // autoencoders stay f32: 0.30 (SD-XL) to 0.34 (SD 1.5).
        let ratio = q8_total as f64 / f32_total as f64;
        println!("{name}: int8 holds {ratio:.3} of the f32 bytes");
        let unet = sizes.iter().any(|s| s.class == "UNet2DConditionModel");
        let bound = if unet { 0.36 } else { 0.34 };
        assert!(ratio < bound, "{name}: int8 holds {ratio} of f32");
        // 4 bits: half a byte a weight and two f32s a block of 32 (0.75 bytes against the
        // denoiser's int8 1.0 and the encoders' 1.125), what stays f32 as above, a UNet's
        // convolutions int8 as at Q8: 0.735 to 0.756 of int8's bytes where the matrices
        // dominate (the DiT pipelines), 0.80 to 0.93 for the UNets.
        let q4_ratio = q4_total as f64 / q8_total as f64;
        println!(
            "{name}: 4-bit holds {:.3} of the f32 bytes, {q4_ratio:.3} of int8's",
            q4_total as f64 / f32_total as f64
        );
        let bound = if unet { 0.95 } else { 0.78 };
        assert!(q4_ratio < bound, "{name}: 4-bit holds {q4_ratio} of int8's bytes");
    }
}

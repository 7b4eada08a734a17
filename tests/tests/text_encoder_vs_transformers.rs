//! A LLaMA-family decoder read as a prompt encoder (`TextEncoder`), against transformers
//! (`tests/fixtures/gen_qwen3_encoder.py`): a tiny Qwen3 (grouped heads, q/k norms), two
//! rows with the second right-padded and masked, the states after layers 1 and 2 stacked
//! per token as FLUX.2-klein's pipeline stacks layers 9, 18 and 27.
//!
//! Tolerance: rtol 1e-4 + atol 1e-4 * rms, as for the other encoders. The padded positions
//! are compared too: the pipeline feeds them to the denoiser.

use rusting_brain::{Precision, TextEncoder};
use rusting_brain_tests::*;

fn dir() -> std::path::PathBuf {
    fixture_path("qwen3_encoder")
}

fn inputs(io: &Fixture) -> (Vec<u32>, Vec<bool>) {
    let ids = io.get("ids").unwrap().data.iter().map(|&v| v as u32).collect();
    let mask = io.get("mask").unwrap().data.iter().map(|&v| v != 0.0).collect();
    (ids, mask)
}

#[test]
fn chosen_layers_stacked_match_transformers() {
    let io = Fixture::open(dir().join("io.safetensors")).unwrap();
    let (ids, mask) = inputs(&io);
    let mut enc = TextEncoder::load(dir(), &[1, 2]).unwrap();
    assert_eq!(enc.width(), 32);
    assert_close_rms(
        "stacked [h1 | h2]",
        &enc.encode(&ids, 2, Some(&mask)).unwrap(),
        &io.get("stacked").unwrap(),
        1e-4,
    );
    let mut one = TextEncoder::load(dir(), &[2]).unwrap();
    assert_close_rms(
        "hidden_states[2]",
        &one.encode(&ids, 2, Some(&mask)).unwrap(),
        &io.get("hidden_2").unwrap(),
        1e-4,
    );
}

/// Without the mask the padded positions attend to the earlier pads as well: they must
/// come out different (the real ones, before any pad, do not change), which is why the
/// mask is passed.
#[test]
fn the_mask_changes_the_padded_positions_only() {
    let io = Fixture::open(dir().join("io.safetensors")).unwrap();
    let (ids, mask) = inputs(&io);
    let mut enc = TextEncoder::load(dir(), &[2]).unwrap();
    let with = enc.encode(&ids, 2, Some(&mask)).unwrap();
    let without = enc.encode(&ids, 2, None).unwrap();
    let d = 16;
    let row = |v: &[f32], t: usize| v[t * d..(t + 1) * d].to_vec();
    for (t, &real) in mask.iter().enumerate() {
        let (a, b) = (row(&with, t), row(&without, t));
        if real {
            assert_eq!(a, b, "real token {t} changed with the mask");
        } else if t > 12 + 8 {
            // The first pad sees no earlier pad; later ones do.
            assert_ne!(a, b, "padded token {t} did not change with the mask");
        }
    }
}

#[test]
fn int8_encoder_stays_close() {
    let io = Fixture::open(dir().join("io.safetensors")).unwrap();
    let (ids, mask) = inputs(&io);
    let mut enc = TextEncoder::load_at(dir(), Precision::Q8, &[1, 2]).unwrap();
    // Int8 weights (one scale a row) on 16-wide layers: a few percent, measured 2e-2.
    assert_close_rms(
        "int8 stacked",
        &enc.encode(&ids, 2, Some(&mask)).unwrap(),
        &io.get("stacked").unwrap(),
        5e-2,
    );
}

#[test]
fn bad_layers_and_ids_are_errors() {
    let e = TextEncoder::load(dir(), &[0]).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("layer 0") && e.contains("layers 1..=3"), "{e}");
    let e = TextEncoder::load(dir(), &[4]).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("layer 4"), "{e}");
    let e = TextEncoder::load(dir(), &[]).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("no layers"), "{e}");
    let mut enc = TextEncoder::load(dir(), &[1]).unwrap();
    let e = enc.encode(&[5, 1000], 1, None).unwrap_err().to_string();
    assert!(e.contains("1000"), "{e}");
    let e = enc.encode(&[5, 6, 7], 2, None).unwrap_err().to_string();
    assert!(e.contains("3 ids do not make 2 rows"), "{e}");
    let e = enc.encode(&[5, 6], 1, Some(&[true])).unwrap_err().to_string();
    assert!(e.contains("`mask` has 1 elements"), "{e}");
}

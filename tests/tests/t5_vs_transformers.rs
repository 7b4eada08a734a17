//! T5's encoder against transformers (`tests/fixtures/gen_t5.py`): a tiny v1.1
//! `T5EncoderModel` as `save_pretrained` wrote it, two rows of 40 tokens (the second
//! padded and masked), and the relative-position buckets of 200 positions.
//!
//! Tolerance: rtol 1e-4 + atol 1e-4 * rms (`assert_close_rms`; the floor covers values
//! near zero). The buckets must be equal: a bucket off by one is a different
//! learned bias.

use rusting_brain::T5Encoder;
use rusting_brain_tests::*;

fn dir() -> std::path::PathBuf {
    fixture_path("t5").join("encoder")
}

#[test]
fn relative_position_buckets_are_transformers_own() {
    let enc = T5Encoder::load(dir()).unwrap();
    let want = Fixture::open(fixture_path("t5").join("buckets.safetensors")).unwrap().get("buckets").unwrap();
    let n = want.shape[0];
    for q in 0..n {
        for k in 0..n {
            assert_eq!(enc.config().bucket(q, k) as f64, want.data[q * n + k], "query {q}, key {k}");
        }
    }
}

#[test]
fn encoder_matches_transformers() {
    let io = Fixture::open(dir().join("io.safetensors")).unwrap();
    let enc = T5Encoder::load(dir()).unwrap();
    let ids_t = io.get("ids").unwrap();
    let ids: Vec<u32> = ids_t.data.iter().map(|&v| v as u32).collect();
    let mask: Vec<bool> = io.get("mask").unwrap().data.iter().map(|&v| v != 0.0).collect();
    let got = enc.encode(&ids, ids_t.shape[0], Some(&mask)).unwrap();
    let want = io.get("last_hidden_state").unwrap();
    assert_close_rms("t5 last_hidden_state", &got, &want, 1e-4);
}

#[test]
fn bad_input_and_folders_are_errors() {
    let enc = T5Encoder::load(dir()).unwrap();
    let e = enc.encode(&[5, 1000], 1, None).unwrap_err().to_string();
    assert!(e.contains("id 1000 at position 1 is outside the vocabulary (1000)"), "{e}");
    let e = enc.encode(&[5, 6, 7], 2, None).unwrap_err().to_string();
    assert!(e.contains("3 ids do not make 2 rows"), "{e}");

    let t = rusting_brain_test_support::TempDir::new("t5-bad");
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(dir().join(f), t.join(f)).unwrap();
    }
    let edit = |f: &dyn Fn(&mut serde_json::Value)| rusting_brain_tests::edit_config(t.path(), f);
    let refused = |want: &str| {
        let e = T5Encoder::load(t.path()).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains(want), "`{e}` does not say `{want}`");
    };
    edit(&|v| v["feed_forward_proj"] = "relu".into());
    refused("feed_forward_proj: relu: only T5 v1.1's gated-gelu");
    edit(&|v| {
        v["feed_forward_proj"] = "gated-gelu".into();
        v["architectures"] = serde_json::json!(["T5ForConditionalGeneration"]);
    });
    refused("T5ForConditionalGeneration: this loader reads T5EncoderModel");
    edit(&|v| {
        v["architectures"] = serde_json::json!(["T5EncoderModel"]);
        v["num_layers"] = 4.into();
    });
    refused("encoder.block.3.layer.0.SelfAttention.q.weight: missing tensor");
    edit(&|v| {
        v["num_layers"] = 3.into();
        v["d_ff"] = 40.into();
    });
    refused("shape [37, 32], config.json gives [40, 32]");
}

/// T5 with its attention and feed-forward matrices int8: close to transformers' states,
/// and not the f32 path in disguise.
#[test]
fn int8_encoder_stays_close() {
    let io = Fixture::open(dir().join("io.safetensors")).unwrap();
    let ids: Vec<u32> = io.get("ids").unwrap().data.iter().map(|&v| v as u32).collect();
    let mask: Vec<bool> = io.get("mask").unwrap().data.iter().map(|&v| v != 0.0).collect();
    let got = T5Encoder::load_at(dir(), rusting_brain::Precision::Q8)
        .unwrap()
        .encode(&ids, 2, Some(&mask))
        .unwrap();
    let exact = T5Encoder::load(dir()).unwrap().encode(&ids, 2, Some(&mask)).unwrap();
    assert_ne!(got, exact, "int8 gave the f32 result");
    // As for CLIP: judged as a whole (relative L2) with a looser bound per element.
    let want = io.get("last_hidden_state").unwrap();
    let rel = relative_l2(&got, &want);
    let r = assert_close("t5 int8", &got, &want, Tolerance::new(0.0, 0.15 * rms(&want)));
    println!("t5 int8: relative L2 {rel:.2e}, worst element {:.3} of 0.15 rms", r.worst_ratio);
    assert!(rel < 3e-2, "t5 int8: relative L2 error {rel}");
}

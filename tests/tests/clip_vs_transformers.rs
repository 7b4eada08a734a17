//! CLIP text towers against transformers (`tests/fixtures/gen_clip.py`): a `CLIPTextModel`
//! (quick GELU, the largest-id pooling rule, a padding mask) and a
//! `CLIPTextModelWithProjection` (GELU, pooling at the first end token, projection), as
//! `save_pretrained` wrote them.
//!
//! Tolerance: rtol 1e-4 + atol 1e-4 * rms (`assert_close_rms`: an absolute floor for values
//! near zero, whose f32 error follows the size of the summed terms). PyTorch ran in
//! float64 on the stored f32 weights.

use rusting_brain::ClipTextEncoder;
use rusting_brain_tests::*;

fn parity(name: &str) {
    let dir = fixture_path("clip").join(name);
    let io = Fixture::open(dir.join("io.safetensors")).unwrap();
    let enc = ClipTextEncoder::load(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    let ids_t = io.get("ids").unwrap();
    let ids: Vec<u32> = ids_t.data.iter().map(|&v| v as u32).collect();
    let batch = ids_t.shape[0];
    let mask: Option<Vec<bool>> = io.get("mask").ok().map(|m| m.data.iter().map(|&v| v != 0.0).collect());
    let out = enc.encode(&ids, batch, mask.as_deref()).unwrap();
    assert_close_rms(
        &format!("{name} last_hidden_state"),
        &out.last_hidden_state,
        &io.get("last_hidden_state").unwrap(),
        1e-4,
    );
    assert_eq!(out.hidden_states.len(), enc.config().num_hidden_layers + 1);
    for (i, h) in out.hidden_states.iter().enumerate() {
        assert_close_rms(
            &format!("{name} hidden_states[{i}]"),
            h,
            &io.get(&format!("hidden_{i}")).unwrap(),
            1e-4,
        );
    }
    assert_close_rms(&format!("{name} pooled"), &out.pooled, &io.get("pooled").unwrap(), 1e-4);
    match (&out.text_embeds, io.get("text_embeds")) {
        (Some(got), Ok(want)) => {
            assert_close_rms(&format!("{name} text_embeds"), got, &want, 1e-4);
        }
        (None, Err(_)) => {}
        (got, want) => panic!("{name}: text_embeds {} here, {} in the fixture", got.is_some(), want.is_ok()),
    }
    // SD 2.x's prompt: the penultimate state through the final norm; the last state normed
    // is last_hidden_state itself.
    let last = &out.hidden_states[out.hidden_states.len() - 1];
    assert_close_rms(
        &format!("{name} final_norm(last)"),
        &enc.final_norm(last).unwrap(),
        &io.get("last_hidden_state").unwrap(),
        1e-4,
    );
}

#[test]
fn clip_text_model_matches_transformers() {
    parity("text");
}

/// The same weights under `text_model.` (transformers 4's names, the published ones).
#[test]
fn both_spellings_of_the_tower_load() {
    parity("text_prefixed");
}

#[test]
fn clip_text_model_with_projection_matches_transformers() {
    parity("projection");
}

#[test]
fn bad_input_and_folders_are_errors() {
    let enc = ClipTextEncoder::load(fixture_path("clip").join("text")).unwrap();
    let says = |r: Result<rusting_brain_core::models::clip::ClipTextOutput, rusting_brain::NetworkError>,
                want: &str| {
        let e = r.map(|_| ()).unwrap_err().to_string();
        assert!(e.contains(want), "`{e}` does not say `{want}`");
    };
    says(enc.encode(&[5, 1000, 2], 1, None), "id 1000 at position 1 is outside the vocabulary (1000)");
    says(enc.encode(&vec![5; 78], 1, None), "78 tokens a row; the model has 77 positions");
    says(enc.encode(&[5, 6, 7], 2, None), "3 ids do not make 2 rows");
    says(enc.encode(&[5, 6], 1, Some(&[true])), "`mask` has 1 elements");
    let proj = ClipTextEncoder::load(fixture_path("clip").join("projection")).unwrap();
    says(proj.encode(&[9, 10, 11], 1, None), "row 0 has no end-of-text token (7)");

    let t = rusting_brain_test_support::TempDir::new("clip-bad");
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture_path("clip").join("text").join(f), t.join(f)).unwrap();
    }
    let edit = |f: &dyn Fn(&mut serde_json::Value)| rusting_brain_tests::edit_config(t.path(), f);
    let refused = |want: &str| {
        let e = ClipTextEncoder::load(t.path()).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains(want), "`{e}` does not say `{want}`");
    };
    edit(&|v| v["num_hidden_layers"] = 6.into());
    refused("model.safetensors: encoder.layers.5.self_attn.q_proj.weight: missing tensor");
    edit(&|v| {
        v["num_hidden_layers"] = 5.into();
        v["hidden_size"] = 36.into();
    });
    refused("shape [1000, 32], config.json gives [1000, 36]");
    edit(&|v| {
        v["hidden_size"] = 32.into();
        v["architectures"] = serde_json::json!(["CLIPVisionModel"]);
    });
    refused("CLIPVisionModel: this loader reads CLIPTextModel");
    edit(&|v| {
        v["architectures"] = serde_json::json!(["CLIPTextModel"]);
        v["hidden_act"] = "relu6".into();
    });
    refused("hidden_act: relu6 is not supported");
    edit(&|v| {
        v["hidden_act"] = "quick_gelu".into();
        v["num_attention_heads"] = 5.into();
    });
    refused("not a multiple of num_attention_heads");
}

/// The towers with their projection and feed-forward matrices int8 (`load_at(.., Q8)`):
/// close to transformers' f32 states, and not the f32 path in disguise.
#[test]
fn int8_towers_stay_close() {
    for name in ["text", "projection"] {
        let dir = fixture_path("clip").join(name);
        let io = Fixture::open(dir.join("io.safetensors")).unwrap();
        let ids: Vec<u32> = io.get("ids").unwrap().data.iter().map(|&v| v as u32).collect();
        let mask: Option<Vec<bool>> = io.get("mask").ok().map(|m| m.data.iter().map(|&v| v != 0.0).collect());
        let q8 = ClipTextEncoder::load_at(&dir, rusting_brain::Precision::Q8).unwrap();
        let f32 = ClipTextEncoder::load(&dir).unwrap();
        let got = q8.encode(&ids, 2, mask.as_deref()).unwrap();
        let exact = f32.encode(&ids, 2, mask.as_deref()).unwrap();
        assert_ne!(got.last_hidden_state, exact.last_hidden_state, "{name}: int8 gave the f32 result");
        // Int8 weights and activations, one scale a row, through five 32-wide layers and a
        // final LayerNorm: the error is judged as a whole (relative L2), where rounding
        // noise averages, with a looser bound on the single worst element.
        let want = io.get("last_hidden_state").unwrap();
        let rel = relative_l2(&got.last_hidden_state, &want);
        let r = assert_close(
            &format!("{name} int8"),
            &got.last_hidden_state,
            &want,
            Tolerance::new(0.0, 0.15 * rms(&want)),
        );
        println!("{name} int8: relative L2 {rel:.2e}, worst element {:.3} of 0.15 rms", r.worst_ratio);
        assert!(rel < 3e-2, "{name} int8: relative L2 error {rel}");
    }
}

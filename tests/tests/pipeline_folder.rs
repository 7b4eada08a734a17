//! A pipeline folder written by diffusers' `FluxPipeline.save_pretrained`
//! (`tests/fixtures/gen_flux_pipeline.py`, tiny and random): the index read, every
//! component present, the parts this library computes loaded from it (a sharded T5, a
//! CLIP tokenizer with only vocab.json and merges.txt), and a broken index refused by key.

use rusting_brain::PipelineFolder;
use rusting_brain_test_support::TempDir;
use rusting_brain_tests::fixture_path;

fn dir() -> std::path::PathBuf {
    fixture_path("pipelines").join("flux_tiny")
}

#[test]
fn a_flux_folder_opens_and_its_parts_load() {
    let p = PipelineFolder::open(dir()).unwrap();
    assert_eq!(p.class_name(), "FluxPipeline");
    let names: Vec<&str> = p.components().keys().map(String::as_str).collect();
    assert_eq!(
        names,
        ["scheduler", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "transformer", "vae"],
        "the [null, null] entries (image_encoder, feature_extractor) are skipped"
    );
    assert_eq!(p.component("transformer").unwrap().class, "FluxTransformer2DModel");

    let vae = p.vae().unwrap();
    assert_eq!((vae.config().latent_channels, vae.config().shift_factor), (1, 0.0609));
    let latent = vec![0.25f32; 32 * 32];
    let pixels = vae.decode(&latent, 1, 32, 32).unwrap();
    assert_eq!(pixels.len(), 3 * 32 * 32);
    assert!(pixels.iter().all(|v| v.is_finite()));

    // The pooled CLIP vector and the per-token T5 states of one prompt, as FLUX.1 reads them.
    let (ids, _) = p.clip_tokenizer("tokenizer").unwrap().encode("a lighthouse in fog").unwrap();
    let clip = p.clip("text_encoder").unwrap();
    let out = clip.encode(&ids, 1, None).unwrap();
    assert_eq!(out.pooled.len(), 32);
    let (ids, mask) = p.prompt_tokenizer("tokenizer_2").unwrap().encode("a lighthouse in fog", 16).unwrap();
    let states = p.t5("text_encoder_2").unwrap().encode(&ids, 1, Some(&mask)).unwrap();
    assert_eq!(states.len(), 16 * 32);
    assert!(states.iter().all(|v| v.is_finite()));

    // Asking a component for the wrong kind of model says what it is.
    let e = p.t5("text_encoder").map(|_| ()).unwrap_err().to_string();
    assert!(
        e.contains("text_encoder is a transformers CLIPTextModel; this loader reads T5EncoderModel"),
        "{e}"
    );
    let e = p.clip("image_encoder").map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("model_index.json names no image_encoder"), "{e}");
}

#[test]
fn broken_indexes_are_refused_by_key() {
    let t = TempDir::new("pipeline");
    let write = |text: &str| std::fs::write(t.join("model_index.json"), text).unwrap();
    let refused = |want: &str| {
        let e = PipelineFolder::open(t.path()).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains(want), "`{e}` does not say `{want}`");
    };
    refused("model_index.json");
    write("{ nope");
    refused("model_index.json: json");
    write(r#"{"vae": ["diffusers", "AutoencoderKL"]}"#);
    refused("_class_name: missing");
    write(r#"{"_class_name": "FluxPipeline", "vae": ["diffusers", "AutoencoderKL"]}"#);
    refused("vae: diffusers AutoencoderKL: the folder");
    write(r#"{"_class_name": "FluxPipeline", "vae": ["diffusers"]}"#);
    refused("vae: [\"diffusers\"] is not [library, class]");
    write(r#"{"_class_name": "FluxPipeline", "../up": ["diffusers", "AutoencoderKL"]}"#);
    refused("../up: not a folder name inside the pipeline");
    std::fs::create_dir(t.join("vae")).unwrap();
    write(
        r#"{"_class_name": "FluxPipeline", "vae": ["diffusers", "AutoencoderKL"], "force_zeros_for_empty_prompt": true}"#,
    );
    let p = PipelineFolder::open(t.path()).unwrap();
    let e = p.vae().map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("config.json"), "an empty vae folder: {e}");
}

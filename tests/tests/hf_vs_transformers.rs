//! Hugging Face directories written by `transformers` (tests/fixtures/gen_hf.py) loaded with
//! `TransformerLm::from_pretrained`: logits and greedy continuations against what
//! transformers computed from the same files, on the CPU and on wgpu (lavapipe in CI);
//! `save_pretrained` round trips; and the refusals, each naming its file and key.
//!
//! Tolerance: rtol 1e-4 plus atol 1e-4 x rms(expected), as in transformer_vs_torch.rs. Both
//! sides are f32 here (transformers runs the model in float32 on the CPU), so the measured
//! worst error is a few 1e-6 of the logits' size; the bf16 directory is compared with the
//! same files upcast to f32, which is exact, so it gets the same tolerance.

use std::path::{Path, PathBuf};

use rusting_brain::{Precision, Sampler, TokenBatch, TransformerLm};
use rusting_brain_tests::*;

/// The directories the model definition computes today.
const SUPPORTED: [&str; 11] = [
    "llama",
    "llama_tied",
    "llama_bf16",
    "llama_sharded",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "llama_rope_llama3",
    "qwen2_rope_linear",
];

fn dir(name: &str) -> PathBuf {
    fixture_path("hf").join(name)
}

fn expected(name: &str) -> Fixture {
    Fixture::open(dir(name).join("expected.safetensors")).expect("fixture")
}

fn ids(t: &Tensor) -> Vec<u32> {
    t.data.iter().map(|&v| v as u32).collect()
}

fn rows(t: &Tensor) -> Vec<Vec<u32>> {
    let all = ids(t);
    all.chunks(t.shape[1]).map(<[u32]>::to_vec).collect()
}

fn close(name: &str, got: &[f32], want: &Tensor) -> f64 {
    let rms = (want.data.iter().map(|v| v * v).sum::<f64>() / want.data.len().max(1) as f64).sqrt();
    assert_close(name, got, want, Tolerance::new(1e-4, 1e-4 * rms)).worst_ratio
}

/// Logits of the fixture's batch and the greedy continuation of its prompt, against
/// transformers'. Returns the worst error as a fraction of the allowance.
fn check(name: &str, model: &mut TransformerLm) -> f64 {
    let e = expected(name);
    let batch = TokenBatch::new(rows(&e.get("ids").unwrap())).unwrap();
    let logits = model.forward_batch(&batch).unwrap();
    // Our batch is (batch * seq, vocab) over the inputs: every position but the last.
    let want = e.get("logits").unwrap();
    let (b, t, v) = (want.shape[0], want.shape[1], want.shape[2]);
    let inputs = Tensor {
        shape: vec![b, t - 1, v],
        data: (0..b).flat_map(|i| want.data[i * t * v..(i * t + t - 1) * v].to_vec()).collect(),
    };
    let worst = close(&format!("{name} logits"), &logits, &inputs);
    let prompt = ids(&e.get("prompt").unwrap());
    let greedy = ids(&e.get("greedy").unwrap());
    let new = greedy.len() - prompt.len();
    let got = model.generate(&prompt, new, &mut Sampler::greedy()).unwrap();
    let margin = e.get("margin").unwrap();
    assert_eq!(
        got,
        greedy[prompt.len()..],
        "{name}: greedy continuation differs (transformers' smallest top-2 gap {:e})",
        margin.data.iter().cloned().fold(f64::INFINITY, f64::min)
    );
    worst
}

/// Our name of a tensor as the files spell it (Mixtral's sparse blocks differ).
fn file_name(name: &str, arch: &str) -> String {
    if arch != "mixtral" {
        return name.to_string();
    }
    name.replace(".mlp.gate.", ".block_sparse_moe.gate.")
        .replace(".mlp.experts.", ".block_sparse_moe.experts.")
        .replace("gate_proj.", "w1.")
        .replace("down_proj.", "w2.")
        .replace("up_proj.", "w3.")
}

/// The loss of the fixture's batch and every gradient, against transformers' backward.
fn check_gradients(name: &str, model: &mut TransformerLm) -> f64 {
    let e = expected(name);
    let batch = TokenBatch::new(rows(&e.get("ids").unwrap())).unwrap();
    model.zero_grad().unwrap();
    let loss = model.accumulate_step(&batch).unwrap();
    let want = e.get("loss").unwrap().data[0];
    assert!(
        ((loss.lm_loss as f64) - want).abs() <= 1e-5 * want.abs(),
        "{name}: loss {} vs transformers' {want}",
        loss.lm_loss
    );
    let grads = model.named_gradients().unwrap();
    assert_eq!(grads.len(), model.named_parameters().unwrap().len());
    let mut worst = 0f64;
    for (n, g) in &grads {
        let want = e.get(&format!("grad.{}", file_name(n, name))).unwrap();
        worst = worst.max(close(&format!("{name} grad {n}"), g, &want));
    }
    worst
}

#[test]
fn gradients_match_transformers_on_the_cpu_and_wgpu() {
    for name in SUPPORTED {
        let mut model = TransformerLm::from_pretrained(dir(name)).unwrap();
        let worst = check_gradients(name, &mut model);
        eprintln!("{name}: worst gradient error {worst:.3} of the allowance");
        if to_wgpu(&mut model) {
            let worst = check_gradients(name, &mut model);
            eprintln!("{name} on wgpu: worst gradient error {worst:.3} of the allowance");
        }
    }
}

#[test]
fn every_architecture_matches_transformers_on_the_cpu() {
    for name in SUPPORTED {
        let mut model = TransformerLm::from_pretrained(dir(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let worst = check(name, &mut model);
        eprintln!("{name}: worst logit error {worst:.3} of the allowance");
    }
}

#[test]
fn every_architecture_matches_transformers_on_wgpu() {
    for name in SUPPORTED {
        let mut model = TransformerLm::from_pretrained(dir(name)).unwrap();
        if !to_wgpu(&mut model) {
            return;
        }
        let worst = check(name, &mut model);
        eprintln!("{name} on {}: worst logit error {worst:.3} of the allowance", model.device().unwrap());
    }
}

/// transformers 4 wrote `rope_theta` at the top level and the scaling in `rope_scaling`
/// (`type` before `rope_type`); each spelling is the same model.
#[test]
fn rope_scaling_reads_in_either_spelling() {
    for (name, key) in [("llama_rope_llama3", "rope_type"), ("qwen2_rope_linear", "type")] {
        let d = scratch(&format!("legacy_{name}"));
        copy_dir(&dir(name), &d);
        edit_config(&d, |v| {
            let mut p = v.as_object_mut().unwrap().remove("rope_parameters").unwrap();
            let p = p.as_object_mut().unwrap();
            v["rope_theta"] = p.remove("rope_theta").unwrap();
            let kind = p.remove("rope_type").unwrap();
            p.insert(key.into(), kind);
            v["rope_scaling"] = serde_json::Value::Object(p.clone());
        });
        let mut model = TransformerLm::from_pretrained(&d).unwrap();
        check(name, &mut model);
        std::fs::remove_dir_all(&d).unwrap();
    }
}

/// The new parts of the model definition (q/k/v biases, q/k norms, scaled RoPE) survive
/// this library's own checkpoints, f32 and int8, and an f32 checkpoint resumes training.
#[test]
fn checkpoints_keep_biases_norms_and_scaled_rope() {
    for name in ["qwen2_rope_linear", "qwen3", "llama_rope_llama3", "qwen3_moe"] {
        let mut m = TransformerLm::from_pretrained(dir(name)).unwrap();
        let e = expected(name);
        let batch = TokenBatch::new(rows(&e.get("ids").unwrap())).unwrap();
        let want = m.forward_batch(&batch).unwrap();
        let out = scratch(&format!("ckpt_{name}"));
        std::fs::create_dir_all(&out).unwrap();
        m.save_bin(out.join("m.rbw"), Precision::F32).unwrap();
        let mut back = TransformerLm::load_bin(out.join("m.rbw")).unwrap();
        assert_eq!(back.config(), m.config(), "{name}");
        assert_eq!(back.forward_batch(&batch).unwrap(), want, "{name} f32");
        // One step on each (both start AdamW afresh): the same weights after it.
        back.train_step_batch(&batch).unwrap();
        m.train_step_batch(&batch).unwrap();
        assert_eq!(
            back.forward_batch(&batch).unwrap(),
            m.forward_batch(&batch).unwrap(),
            "{name} after a step"
        );
        m.quantize().unwrap();
        m.save_bin(out.join("q.rbw"), Precision::Q8).unwrap();
        let mut q = TransformerLm::load_bin(out.join("q.rbw")).unwrap();
        assert_eq!(q.forward_batch(&batch).unwrap(), m.forward_batch(&batch).unwrap(), "{name} int8");
        std::fs::remove_dir_all(&out).unwrap();
    }
}

/// int8 on wgpu (the browser's path): biases and norms stay f32 beside int8 matrices, and
/// the greedy ids and logits are the CPU int8 model's.
#[test]
fn int8_models_decode_on_wgpu_as_on_the_cpu() {
    for name in ["qwen2_rope_linear", "qwen3", "qwen3_moe", "llama_rope_llama3"] {
        let mut cpu = TransformerLm::from_pretrained_at(dir(name), Precision::Q8).unwrap();
        let mut gpu = TransformerLm::from_pretrained_at(dir(name), Precision::Q8).unwrap();
        if !to_wgpu(&mut gpu) {
            return;
        }
        let e = expected(name);
        let prompt = ids(&e.get("prompt").unwrap());
        let a = cpu.generate(&prompt, 12, &mut Sampler::greedy()).unwrap();
        let b = gpu.generate(&prompt, 12, &mut Sampler::greedy()).unwrap();
        assert_eq!(a, b, "{name}: int8 greedy ids, cpu vs wgpu");
        let batch = TokenBatch::new(rows(&e.get("ids").unwrap())).unwrap();
        let want = cpu.forward_batch(&batch).unwrap();
        let got = gpu.forward_batch(&batch).unwrap();
        let range =
            want.iter().cloned().fold(f32::MIN, f32::max) - want.iter().cloned().fold(f32::MAX, f32::min);
        // Both sides round activations to int8 and sum those products exactly in i32; only
        // the f32 parts (norms, attention, scales) differ in summation order. 2e-3 of the
        // logits' range is the int8 decoding tests' allowance (shaders/tests/transformer.rs).
        let report = assert_close(
            &format!("{name} int8 logits on wgpu"),
            &got,
            &Tensor { shape: vec![want.len()], data: want.iter().map(|&v| v as f64).collect() },
            Tolerance::new(0.0, 2e-3 * range as f64),
        );
        eprintln!("{name}: int8 on wgpu, worst logit error {:.2e} of the range", report.worst_ratio * 2e-3);
    }
}

/// A published context can be cut for memory: sequences past it are refused, decoding
/// within it is unchanged, and save_pretrained keeps the directory's context.
#[test]
fn the_context_can_be_cut_and_the_directory_keeps_its_own() {
    let name = "llama_rope_llama3";
    let mut full = TransformerLm::from_pretrained(dir(name)).unwrap();
    let mut short = TransformerLm::from_pretrained(dir(name)).unwrap();
    assert!(short.set_max_seq_len(0).is_err());
    short.set_max_seq_len(12).unwrap();
    assert_eq!(short.config().max_seq_len, 12);
    let prompt = [3u32, 9, 27, 17, 51];
    let a = full.generate(&prompt, 7, &mut Sampler::greedy()).unwrap();
    let b = short.generate(&prompt, 7, &mut Sampler::greedy()).unwrap();
    assert_eq!(a, b);
    let long = TokenBatch::new(vec![(0..20u32).collect::<Vec<_>>()]).unwrap();
    let err = short.forward_batch(&long).unwrap_err().to_string();
    assert!(err.contains("max_seq_len 12"), "{err}");
    let out = scratch("context");
    short.save_pretrained(&out).unwrap();
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(v["max_position_embeddings"], 64);
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn int8_at_load_is_the_f32_model_quantized() {
    for name in ["llama", "llama_bf16", "mixtral", "qwen2", "qwen3_moe"] {
        let mut q = TransformerLm::from_pretrained_at(dir(name), Precision::Q8).unwrap();
        let mut f = TransformerLm::from_pretrained(dir(name)).unwrap();
        f.quantize().unwrap();
        assert!(q.is_quantized());
        let e = expected(name);
        let batch = TokenBatch::new(rows(&e.get("ids").unwrap())).unwrap();
        assert_eq!(q.forward_batch(&batch).unwrap(), f.forward_batch(&batch).unwrap(), "{name}");
    }
}

fn scratch(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("rb-hf-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    p
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[test]
fn load_save_load_is_bitwise_and_keeps_the_directory() {
    for name in SUPPORTED {
        let a = TransformerLm::from_pretrained(dir(name)).unwrap();
        let out = scratch(name);
        a.save_pretrained(&out).unwrap();
        let mut b = TransformerLm::from_pretrained(&out).unwrap();
        assert_eq!(
            named_bits(&a.named_parameters().unwrap()),
            named_bits(&b.named_parameters().unwrap()),
            "{name}"
        );
        check(name, &mut b);
        let config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
        let source: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir(name).join("config.json")).unwrap()).unwrap();
        assert_eq!(config["architectures"], source["architectures"], "{name}");
        assert_eq!(config["eos_token_id"], source["eos_token_id"], "{name}");
        assert!(out.join("generation_config.json").is_file());
        // The weights are as readable as the JSON beside them (safetensors alone would
        // leave them owner-only).
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |f: &str| std::fs::metadata(out.join(f)).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode("model.safetensors"), mode("config.json"), "{name}");
        }

        // Into the same directory again, sharded, beside a file of the user's: the old
        // single file goes, the shards and the user's file stay.
        std::fs::write(out.join("tokenizer.json"), "{}").unwrap();
        a.save_pretrained_sharded(&out, 20_000).unwrap();
        assert!(out.join("tokenizer.json").is_file());
        assert!(!out.join("model.safetensors").exists(), "{name}: stale single file kept");
        assert!(out.join("model.safetensors.index.json").is_file());
        let c = TransformerLm::from_pretrained(&out).unwrap();
        assert_eq!(
            named_bits(&a.named_parameters().unwrap()),
            named_bits(&c.named_parameters().unwrap()),
            "{name} sharded"
        );
        std::fs::remove_dir_all(&out).unwrap();
    }
}

#[test]
fn a_model_built_here_saves_as_llama_or_mixtral() {
    let build = |moe: bool, tied: bool| {
        let mut b = TransformerLm::builder().shape(40, 16, 2, (4, 2, 4), 24, 16).tie_embeddings(tied).seed(7);
        if moe {
            b = b.experts(4, 2).expert_d_ff(12).renormalize_top_k(true);
        }
        b.build().unwrap()
    };
    for (moe, tied, arch) in [
        (false, true, "LlamaForCausalLM"),
        (false, false, "LlamaForCausalLM"),
        (true, false, "MixtralForCausalLM"),
    ] {
        let mut m = build(moe, tied);
        m.train_step(&[vec![1, 2, 3, 4, 5], vec![6, 7, 8, 9, 10]]).unwrap();
        let out = scratch(arch);
        m.save_pretrained(&out).unwrap();
        let config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
        assert_eq!(config["architectures"][0], arch);
        let mut back = TransformerLm::from_pretrained(&out).unwrap();
        assert_eq!(named_bits(&m.named_parameters().unwrap()), named_bits(&back.named_parameters().unwrap()));
        let batch = TokenBatch::new(&[vec![3, 1, 4, 1, 5]]).unwrap();
        assert_eq!(m.forward_batch(&batch).unwrap(), back.forward_batch(&batch).unwrap());
        std::fs::remove_dir_all(&out).unwrap();
    }
    // A shared expert has no class to go to.
    let m = TransformerLm::builder()
        .shape(40, 16, 1, (2, 2, 8), 24, 8)
        .experts(2, 1)
        .shared_expert(true)
        .build()
        .unwrap();
    let out = scratch("shared");
    let err = m.save_pretrained(&out).unwrap_err().to_string();
    assert!(err.contains("shared expert"), "{err}");
    assert!(!out.exists(), "a refused save left {}", out.display());
}

/// The error text of loading `dir`, which must fail.
fn refusal(dir: &Path) -> String {
    match TransformerLm::from_pretrained(dir) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

fn assert_names(err: &str, parts: &[&str]) {
    for p in parts {
        assert!(err.contains(p), "`{err}` does not name {p}");
    }
}

/// A NaN anywhere in a weight is refused by file and tensor, in f32 and in int8 at load,
/// F32 and BF16 files alike.
#[test]
fn a_nan_in_a_weight_is_refused_at_either_precision() {
    for (from, nan) in [("llama", f32::NAN.to_le_bytes().to_vec()), ("llama_bf16", vec![0xc0, 0x7f])] {
        let d = scratch(&format!("nan_{from}"));
        copy_dir(&dir(from), &d);
        let file = d.join("model.safetensors");
        let mut bytes = std::fs::read(&file).unwrap();
        let name = "model.layers.1.mlp.up_proj.weight";
        let at = {
            let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            let data = st.tensor(name).unwrap().data().as_ptr() as usize;
            // Row 47 (the last), column 2: (48, 32) in this configuration.
            data - bytes.as_ptr() as usize + (48 * 32 - 30) * nan.len()
        };
        bytes[at..at + nan.len()].copy_from_slice(&nan);
        std::fs::write(&file, &bytes).unwrap();
        for q8 in [false, true] {
            let err = match if q8 {
                TransformerLm::from_pretrained_at(&d, Precision::Q8)
            } else {
                TransformerLm::from_pretrained(&d)
            } {
                Ok(_) => panic!("{from}: a NaN loaded (q8 {q8})"),
                Err(e) => e.to_string(),
            };
            assert_names(&err, &["model.safetensors", name, "NaN"]);
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
}

#[test]
fn bad_directories_are_refused_by_file_and_key() {
    let case = |tag: &str, from: &str| {
        let d = scratch(tag);
        copy_dir(&dir(from), &d);
        d
    };
    // Features the model does not compute: an output-projection bias, Qwen2-MoE's gate.
    let d = case("o_bias", "qwen3");
    edit_config(&d, |v| v["attention_bias"] = serde_json::json!(true));
    assert_names(&refusal(&d), &["config.json", "attention_bias", "output projection"]);
    let d = case("mlp_bias", "llama_tied");
    edit_config(&d, |v| v["mlp_bias"] = serde_json::json!(true));
    assert_names(&refusal(&d), &["config.json", "mlp_bias", "feed-forward biases"]);
    let d = case("qwen2_moe", "qwen3_moe");
    edit_config(&d, |v| v["architectures"] = serde_json::json!(["Qwen2MoeForCausalLM"]));
    assert_names(&refusal(&d), &["config.json", "shared_expert", "gate"]);

    let d = case("arch", "llama");
    edit_config(&d, |v| v["architectures"] = serde_json::json!(["GPT2LMHeadModel"]));
    assert_names(&refusal(&d), &["config.json", "architectures", "GPT2LMHeadModel"]);

    let d = case("yarn", "llama");
    edit_config(&d, |v| {
        v["rope_parameters"] = serde_json::json!({"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0})
    });
    assert_names(&refusal(&d), &["config.json", "rope_parameters", "yarn"]);
    let d = case("llama3_bands", "llama_rope_llama3");
    edit_config(&d, |v| v["rope_parameters"]["high_freq_factor"] = serde_json::json!(0.5));
    assert_names(&refusal(&d), &["config.json", "rope_parameters", "high_freq_factor"]);
    let d = case("linear_factor", "qwen2_rope_linear");
    edit_config(&d, |v| {
        v["rope_parameters"].as_object_mut().unwrap().remove("factor");
    });
    assert_names(&refusal(&d), &["config.json", "rope_parameters.factor", "missing"]);
    let d = case("partial", "llama");
    edit_config(&d, |v| v["partial_rotary_factor"] = serde_json::json!(0.5));
    assert_names(&refusal(&d), &["config.json", "partial_rotary_factor", "0.5"]);

    let d = case("window", "mistral");
    edit_config(&d, |v| v["sliding_window"] = serde_json::json!(16));
    assert_names(&refusal(&d), &["config.json", "sliding_window", "16"]);

    let d = case("shape", "llama");
    edit_config(&d, |v| v["intermediate_size"] = serde_json::json!(40));
    assert_names(
        &refusal(&d),
        &["model.safetensors", "model.layers.0.mlp.gate_proj.weight", "[48, 32]", "[40, 32]"],
    );

    let d = case("missing_key", "llama");
    edit_config(&d, |v| {
        v.as_object_mut().unwrap().remove("hidden_size");
    });
    assert_names(&refusal(&d), &["config.json", "hidden_size", "missing"]);

    // A tensor the configuration has no place for is not dropped without a word.
    let d = case("extra", "qwen3");
    edit_config(&d, |v| v["architectures"] = serde_json::json!(["LlamaForCausalLM"]));
    assert_names(&refusal(&d), &["model.safetensors", "self_attn.", "_norm.weight", "not part of the model"]);

    // Shards: one missing, one truncated, an index that climbs out of the directory.
    let d = case("no_shard", "llama_sharded");
    std::fs::remove_file(d.join("model-00002-of-00002.safetensors")).unwrap();
    assert_names(
        &refusal(&d),
        &["model.safetensors.index.json", "weight_map.", "model-00002-of-00002.safetensors", "missing"],
    );

    let d = case("truncated", "llama_sharded");
    let shard = d.join("model-00001-of-00002.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() - 100]).unwrap();
    assert_names(
        &refusal(&d),
        &["model-00001-of-00002.safetensors", "header", "not a valid safetensors file"],
    );

    let d = case("outside", "llama_sharded");
    let index = d.join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index).unwrap();
    std::fs::write(&index, text.replacen("model-00001-of-00002", "../model-00001-of-00002", 1)).unwrap();
    assert_names(
        &refusal(&d),
        &["model.safetensors.index.json", "weight_map.", "../model-00001", "not a file in this directory"],
    );

    let d = case("empty_map", "llama_sharded");
    std::fs::write(d.join("model.safetensors.index.json"), r#"{"weight_map": {}}"#).unwrap();
    assert_names(&refusal(&d), &["model.safetensors.index.json", "weight_map", "empty"]);
    let d = case("partial_str", "llama_rope_llama3");
    edit_config(&d, |v| v["rope_parameters"]["partial_rotary_factor"] = serde_json::json!("half"));
    assert_names(&refusal(&d), &["config.json", "rope_parameters.partial_rotary_factor", "not a number"]);

    let d = case("empty", "llama");
    std::fs::remove_file(d.join("model.safetensors")).unwrap();
    assert_names(&refusal(&d), &["no model.safetensors"]);
    std::fs::remove_file(d.join("config.json")).unwrap();
    assert_names(&refusal(&d), &["config.json"]);

    for tag in [
        "empty_map",
        "partial_str",
        "llama3_bands",
        "linear_factor",
        "partial",
        "arch",
        "yarn",
        "window",
        "shape",
        "missing_key",
        "extra",
        "no_shard",
        "truncated",
        "outside",
        "empty",
    ] {
        let _ = std::fs::remove_dir_all(scratch(tag));
    }
}

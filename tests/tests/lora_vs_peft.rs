//! LoRA against PEFT (tests/fixtures/gen_lora.py: a rank-4 adapter on every projection of
//! the tiny Llama of hf/llama, A and B random): logits with the adapter, the gradient of
//! every A and B, three AdamW steps in which only the adapters move; merge, save and load
//! round trips; the adapter's gradients against the full model's on a mixture of experts;
//! an int8 base; dense and expert adapters trained on wgpu (lavapipe in CI) as on the CPU;
//! and the refusals.
//!
//! Tolerances: logits and gradients as in hf_vs_transformers.rs (rtol 1e-4 plus atol 1e-4 x
//! rms: both sides f32, measured a few 1e-6). After AdamW steps the adapters are compared
//! with rtol 1e-4 plus atol 1e-5 (the learning rate is 1e-2: Adam normalizes each step, so
//! an element whose gradient rounds differently moves by up to lr x 1e-3 differently).

use std::path::{Path, PathBuf};

use rusting_brain::{LoraConfig, NetworkError, Optimizer, TokenBatch, TransformerLm};
use rusting_brain_tests::*;

fn base_dir() -> PathBuf {
    fixture_path("hf").join("llama")
}

fn peft_dir() -> PathBuf {
    fixture_path("lora").join("peft_adapter")
}

fn expected() -> Fixture {
    Fixture::open(fixture_path("lora").join("expected.safetensors")).expect("fixture")
}

fn batch(e: &Fixture) -> TokenBatch {
    let t = e.get("ids").unwrap();
    let ids: Vec<u32> = t.data.iter().map(|&v| v as u32).collect();
    TokenBatch::new(ids.chunks(t.shape[1]).map(<[u32]>::to_vec).collect::<Vec<_>>()).unwrap()
}

fn rms(want: &Tensor) -> f64 {
    (want.data.iter().map(|v| v * v).sum::<f64>() / want.data.len().max(1) as f64).sqrt()
}

fn close(name: &str, got: &[f32], want: &Tensor) -> f64 {
    assert_close(name, got, want, Tolerance::new(1e-4, 1e-4 * rms(want))).worst_ratio
}

/// The fixture's logits at the inputs' positions (every position but the last of a row).
fn input_logits(want: &Tensor) -> Tensor {
    let (b, t, v) = (want.shape[0], want.shape[1], want.shape[2]);
    Tensor {
        shape: vec![b, t - 1, v],
        data: (0..b).flat_map(|i| want.data[i * t * v..(i * t + t - 1) * v].to_vec()).collect(),
    }
}

fn peft_config() -> LoraConfig {
    LoraConfig::new(4).alpha(8.0)
}

fn scratch(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("rb-lora-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

#[test]
fn a_fresh_adapter_changes_nothing_and_freezes_the_base() {
    let mut model = TransformerLm::from_pretrained(base_dir()).unwrap();
    let e = expected();
    let tb = batch(&e);
    let before = model.forward_batch(&tb).unwrap();
    let total = model.parameter_counts().total;
    assert_eq!(model.trainable_parameters(), total);
    model.add_lora(peft_config()).unwrap();
    let after = model.forward_batch(&tb).unwrap();
    assert_eq!(
        before.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        after.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        "B starts at zero: the logits are bit for bit the base's"
    );
    // 2 layers x (4 attention + 3 feed-forward) projections, r x (d_in + d_out) each.
    let (d, q, kv, f, r) = (32, 32, 16, 48, 4);
    let per_layer = r * ((d + q) + 2 * (d + kv) + (q + d) + 2 * (d + f) + (f + d));
    assert_eq!(model.trainable_parameters(), 2 * per_layer);
    // A is Kaiming-uniform as PEFT draws it: within 1/sqrt(d_in), spread over that range
    // (a uniform's std is bound / sqrt(3)); every B is zero.
    for (n, v) in model.lora_parameters().unwrap() {
        if n.contains("lora_B") {
            assert!(v.iter().all(|&x| x == 0.0), "{n}");
            continue;
        }
        let d_in = v.len() / 4;
        let bound = 1.0 / (d_in as f32).sqrt();
        assert!(v.iter().all(|x| x.abs() <= bound), "{n} outside the bound");
        let std = (v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32).sqrt();
        let want = bound / 3f32.sqrt();
        assert!((std - want).abs() < 0.25 * want, "{n}: std {std}, uniform's {want}");
    }
    // The base has no gradients left; attaching twice is refused.
    assert!(model.named_gradients().unwrap().iter().all(|(_, g)| g.is_empty()));
    let err = model.add_lora(peft_config()).unwrap_err().to_string();
    assert!(err.contains("attached already"), "{err}");
}

#[test]
fn peft_adapter_logits_gradients_and_three_adamw_steps_match() {
    let e = expected();
    let tb = batch(&e);
    let mut model = TransformerLm::from_pretrained(base_dir()).unwrap();
    model.load_lora(peft_dir()).unwrap();
    assert_eq!(model.lora_config(), Some(&peft_config()));
    let base_before = named_bits(&model.named_parameters().unwrap());

    let worst = close("logits", &model.forward_batch(&tb).unwrap(), &input_logits(&e.get("logits").unwrap()));
    eprintln!("logits: worst {worst:.3} of the allowance");

    model.zero_grad().unwrap();
    let loss = model.accumulate_step(&tb).unwrap();
    let want = e.get("loss").unwrap().data[0];
    assert!(((loss.lm_loss as f64) - want).abs() <= 1e-5 * want, "loss {} vs {want}", loss.lm_loss);
    let grads = model.lora_gradients().unwrap();
    assert_eq!(grads.len(), 28, "an A and a B on 7 projections of 2 layers");
    let mut worst = 0f64;
    for (n, g) in &grads {
        worst = worst.max(close(&format!("grad {n}"), g, &e.get(&format!("grad.{n}")).unwrap()));
    }
    eprintln!("adapter gradients: worst {worst:.3} of the allowance");

    model.optimizer = Optimizer::adam(1e-2).betas(0.9, 0.95).epsilon(1e-8).weight_decay(0.1);
    for i in 0..3 {
        let l = model.train_step_batch(&tb).unwrap();
        let want = e.get(&format!("loss.{i}")).unwrap().data[0];
        assert!(((l.lm_loss as f64) - want).abs() <= 1e-5 * want, "step {i}: loss {} vs {want}", l.lm_loss);
    }
    for (n, v) in model.lora_parameters().unwrap() {
        let want = e.get(&format!("after.{n}")).unwrap();
        assert_close(&format!("after 3 steps {n}"), &v, &want, Tolerance::new(1e-4, 1e-5));
    }
    assert_eq!(named_bits(&model.named_parameters().unwrap()), base_before, "the base moved");
    assert_eq!(model.steps(), 3);
}

/// Rank-stabilized scaling on two projections only, as PEFT computes it.
#[test]
fn rslora_on_a_subset_of_projections_matches_peft() {
    let e = expected();
    let tb = batch(&e);
    let mut model = TransformerLm::from_pretrained(base_dir()).unwrap();
    model.load_lora(fixture_path("lora").join("peft_adapter_rslora")).unwrap();
    let want = LoraConfig::new(4).alpha(8.0).rslora(true).targets(&["v_proj", "q_proj"]);
    assert_eq!(model.lora_config(), Some(&want));
    assert_eq!(want.scale(), 4.0, "alpha / sqrt(rank)");
    assert_eq!(model.lora_parameters().unwrap().len(), 2 * 2 * 2);
    let worst = close(
        "rslora logits",
        &model.forward_batch(&tb).unwrap(),
        &input_logits(&e.get("logits_rslora").unwrap()),
    );
    eprintln!("rslora logits: worst {worst:.3} of the allowance");
}

#[test]
fn merge_predicts_the_same_and_save_load_is_bitwise() {
    let e = expected();
    let tb = batch(&e);
    let mut model = TransformerLm::from_pretrained(base_dir()).unwrap();
    model.load_lora(peft_dir()).unwrap();
    model.optimizer = Optimizer::adam(1e-2);
    model.train_step_batch(&tb).unwrap();
    let adapted = model.forward_batch(&tb).unwrap();

    // save -> load onto a freshly prepared base: bitwise the same logits.
    let dir = scratch("save");
    let file = dir.join("adapter.rbl");
    model.save_lora(&file).unwrap();
    let mut fresh = TransformerLm::from_pretrained(base_dir()).unwrap();
    fresh.add_lora(peft_config()).unwrap();
    fresh.load_lora(&file).unwrap();
    let reloaded = fresh.forward_batch(&tb).unwrap();
    assert_eq!(
        adapted.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        reloaded.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    // The PEFT layout round trips too.
    let peft = dir.join("peft");
    model.save_lora_peft(&peft).unwrap();
    let mut again = TransformerLm::from_pretrained(base_dir()).unwrap();
    again.load_lora(&peft).unwrap();
    assert_eq!(named_bits(&again.lora_parameters().unwrap()), named_bits(&model.lora_parameters().unwrap()));
    if let Ok(out) = std::env::var("RB_LORA_PEFT_OUT") {
        // For tests/fixtures/check_lora_peft.py: our adapter directory and our logits.
        let out = Path::new(&out);
        model.save_lora_peft(out).unwrap();
        let bytes: Vec<u8> = adapted.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(out.join("logits.f32"), bytes).unwrap();
    }

    // merge: the same predictions (1e-5 relative), an ordinary model that trains again.
    model.merge_lora().unwrap();
    assert!(model.lora_config().is_none());
    assert_eq!(model.trainable_parameters(), model.parameter_counts().total);
    let merged = model.forward_batch(&tb).unwrap();
    let scale = adapted.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = worst_abs_diff(&merged, &adapted);
    assert!(worst <= 1e-5 * scale, "merged logits differ by {worst} (scale {scale})");
    eprintln!("merge: worst logit difference {:.2e} of the largest", worst / scale);
    model.train_step_batch(&tb).unwrap();
    assert!(model.named_gradients().unwrap().iter().all(|(_, g)| !g.is_empty()));
    // A merged model saves as a plain checkpoint.
    model.save_bin(dir.join("merged.rbw"), rusting_brain::Precision::F32).unwrap();
    let mut back = TransformerLm::load_bin(dir.join("merged.rbw")).unwrap();
    assert!(back.lora_config().is_none());
    back.forward_batch(&tb).unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// The gradient of an adapter follows from the full model's: with `W' = W + s B A`,
/// `dL/dB = s dL/dW' A^T` and `dL/dA = s B^T dL/dW'`. Both sides are our own backward
/// passes (the full one checked against transformers elsewhere), on a mixture of experts
/// with a shared expert, where the experts' adapters run on windows of grouped rows.
#[test]
fn adapter_gradients_follow_from_the_merged_model_on_a_mixture_of_experts() {
    let build = || {
        TransformerLm::builder()
            .vocab_size(40)
            .d_model(24)
            .n_layers(2)
            .heads(4, 2, 6)
            .d_ff(40)
            .experts(4, 2)
            .moe_layers([1])
            .shared_expert(true)
            .expert_d_ff(20)
            .max_seq_len(16)
            .seed(3)
            .build()
            .unwrap()
    };
    let tb = TokenBatch::new(vec![vec![1, 5, 9, 3, 7, 2, 8, 11, 4], vec![6, 2, 30, 31, 12, 0, 1, 19, 25]])
        .unwrap();
    let mut adapted = build();
    adapted.add_lora(LoraConfig::new(3).alpha(6.0)).unwrap();
    // Non-zero B everywhere, as after some training.
    let mut rng = rusting_brain::core::Rng::new(11);
    let dir = scratch("moe");
    let file = dir.join("a.rbl");
    adapted.save_lora(&file).unwrap();
    {
        // Rewrite the file with random B (and A) through the public loader's format.
        let bytes = std::fs::read(&file).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        let owned: Vec<(String, Vec<usize>, Vec<u8>)> = st
            .tensors()
            .into_iter()
            .map(|(n, v)| {
                let len: usize = v.shape().iter().product();
                let vals: Vec<u8> = rng.normal_vec(len, 0.3).iter().flat_map(|x| x.to_le_bytes()).collect();
                (n, v.shape().to_vec(), vals)
            })
            .collect();
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = owned
            .iter()
            .map(|(n, s, b)| {
                (
                    n.clone(),
                    safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b).unwrap(),
                )
            })
            .collect();
        let data = safetensors::tensor::serialize(views, meta.metadata().clone()).unwrap();
        std::fs::write(&file, data).unwrap();
    }
    adapted.load_lora(&file).unwrap();
    let lora = adapted.lora_parameters().unwrap();
    let scale = 6.0 / 3.0;
    adapted.zero_grad().unwrap();
    let l1 = adapted.accumulate_step(&tb).unwrap();
    let lora_grads = adapted.lora_gradients().unwrap();

    // The same model merged, trained in full.
    let mut merged = build();
    merged.load_lora(&file).unwrap();
    merged.merge_lora().unwrap();
    merged.zero_grad().unwrap();
    let l2 = merged.accumulate_step(&tb).unwrap();
    assert!((l1.lm_loss - l2.lm_loss).abs() <= 1e-5 * l2.lm_loss, "{} vs {}", l1.lm_loss, l2.lm_loss);
    let full: std::collections::HashMap<String, Vec<f32>> =
        merged.named_gradients().unwrap().into_iter().collect();
    let shapes: std::collections::HashMap<String, usize> =
        merged.named_parameters().unwrap().into_iter().map(|(n, v)| (n, v.len())).collect();
    let mut checked = 0;
    for pair in lora.chunks(2).zip(lora_grads.chunks(2)) {
        let ([(na, a), (_, b)], [(_, ga), (_, gb)]) = (pair.0, pair.1) else { unreachable!() };
        let weight = na.strip_prefix("base_model.model.").unwrap().replace(".lora_A.weight", ".weight");
        let gw = &full[&weight];
        let r = 3;
        let (d_in, d_out) = (a.len() / r, b.len() / r);
        assert_eq!(shapes[&weight], d_in * d_out);
        // dB = s gW A^T (d_out, r); dA = s B^T gW (r, d_in), in f64.
        let mut want_b = vec![0f64; d_out * r];
        let mut want_a = vec![0f64; r * d_in];
        for o in 0..d_out {
            for j in 0..r {
                want_b[o * r + j] =
                    scale * (0..d_in).map(|k| gw[o * d_in + k] as f64 * a[j * d_in + k] as f64).sum::<f64>();
            }
        }
        for j in 0..r {
            for k in 0..d_in {
                want_a[j * d_in + k] =
                    scale * (0..d_out).map(|o| b[o * r + j] as f64 * gw[o * d_in + k] as f64).sum::<f64>();
            }
        }
        for (what, got, want) in [("A", ga, want_a), ("B", gb, want_b)] {
            let t = Tensor { shape: vec![want.len()], data: want };
            assert_close(&format!("{weight} d{what}"), got, &t, Tolerance::new(1e-4, 1e-4 * rms(&t)));
        }
        checked += 1;
    }
    // 2 x 4 attention, layer 0's dense FFN, layer 1's 4 experts and shared expert.
    assert_eq!(checked, 2 * 4 + 3 + 4 * 3 + 3);
    let _ = std::fs::remove_dir_all(dir);
}

/// Adapters train on an int8 base: the base is untouched (bitwise), the loss falls, and
/// the int8 base's adapter gradients are the f32 base's to int8 rounding.
#[test]
fn adapters_train_on_an_int8_base() {
    let e = expected();
    let tb = batch(&e);
    let mut f32_base = TransformerLm::from_pretrained(base_dir()).unwrap();
    let mut q8 = TransformerLm::from_pretrained(base_dir()).unwrap();
    q8.quantize().unwrap();
    for m in [&mut f32_base, &mut q8] {
        m.load_lora(peft_dir()).unwrap();
        m.zero_grad().unwrap();
        m.accumulate_step(&tb).unwrap();
    }
    // The int8 base rounds weights and (W8A8) each activation row to int8 in the forward
    // pass, while the backward pass runs through the dequantized weights; on this tiny
    // model (weights drawn at std 0.3) that moves the adapters' gradients as a whole by
    // the L2-relative amount below, measured at 0.079, against 1 for an unrelated
    // direction; with the int8 weights left out of the backward pass it is 1.0.
    let (mut diff, mut norm) = (0f64, 0f64);
    for ((_, g), (_, want)) in q8.lora_gradients().unwrap().iter().zip(f32_base.lora_gradients().unwrap()) {
        for (a, b) in g.iter().zip(&want) {
            diff += ((a - b) as f64).powi(2);
            norm += (*b as f64).powi(2);
        }
    }
    let rel = (diff / norm).sqrt();
    eprintln!("int8 base: adapter gradients L2-relative {rel:.3} from the f32 base's");
    assert!(rel < 0.15, "int8 base gradients {rel} (L2-relative) from the f32 base's");
    q8.optimizer = Optimizer::adam(1e-2);
    let first = q8.evaluate(&tb).unwrap().lm_loss;
    for _ in 0..10 {
        q8.train_step_batch(&tb).unwrap();
    }
    let last = q8.evaluate(&tb).unwrap().lm_loss;
    assert!(last < first - 0.1, "loss {first} -> {last}");
    assert!(q8.is_quantized());
    let err = q8.merge_lora().unwrap_err().to_string();
    assert!(err.contains("int8"), "{err}");
}

fn edit(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("adapter_config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, v.to_string()).unwrap();
}

fn copy_peft(tag: &str) -> PathBuf {
    let d = scratch(tag);
    for f in ["adapter_config.json", "adapter_model.safetensors"] {
        std::fs::copy(peft_dir().join(f), d.join(f)).unwrap();
    }
    d
}

#[test]
fn mismatched_or_broken_adapters_are_refused_and_change_nothing() {
    let e = expected();
    let tb = batch(&e);
    let mut model = TransformerLm::from_pretrained(base_dir()).unwrap();
    model.add_lora(peft_config()).unwrap();
    let before = model.forward_batch(&tb).unwrap();
    let refuse = |model: &mut TransformerLm, path: &Path, parts: &[&str]| {
        let err = model.load_lora(path).unwrap_err().to_string();
        for p in parts {
            assert!(err.contains(p), "`{err}` does not name {p}");
        }
    };
    // Settings that differ from the attached adapters.
    let d = copy_peft("rank");
    edit(&d, |v| v["r"] = 8.into());
    refuse(&mut model, &d, &["rank 8", "adapter_config.json"]);
    edit(&d, |v| {
        v["r"] = 4.into();
        v["lora_alpha"] = 16.into();
    });
    refuse(&mut model, &d, &["alpha 16"]);
    edit(&d, |v| {
        v["lora_alpha"] = 8.into();
        v["target_modules"] = serde_json::json!(["q_proj", "v_proj"]);
    });
    refuse(&mut model, &d, &["targets q_proj,v_proj"]);
    edit(&d, |v| {
        v["target_modules"] = serde_json::json!(["q_proj", "x_proj"]);
    });
    refuse(&mut model, &d, &["x_proj"]);
    // What this library does not compute.
    for (key, value) in [
        ("use_dora", serde_json::json!(true)),
        ("bias", serde_json::json!("all")),
        ("layers_to_transform", serde_json::json!([0])),
    ] {
        let d = copy_peft("unsupported");
        edit(&d, |v| v[key] = value.clone());
        refuse(&mut model, &d, &[key]);
    }
    // A tensor of the wrong shape, and a file cut short.
    let other = scratch("shape");
    let mut wider =
        TransformerLm::builder().shape(64, 32, 2, (4, 2, 8), 40, 16).tie_embeddings(false).build().unwrap();
    wider.add_lora(peft_config()).unwrap();
    wider.save_lora(other.join("a.rbl")).unwrap();
    refuse(
        &mut model,
        &other.join("a.rbl"),
        &["model.layers.0.mlp.gate_proj.lora_B.weight", "[40, 4]", "[48, 4]"],
    );
    let _ = wider;
    let bytes = std::fs::read(peft_dir().join("adapter_model.safetensors")).unwrap();
    let cut = copy_peft("cut");
    std::fs::write(cut.join("adapter_model.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    refuse(&mut model, &cut, &["adapter_model.safetensors"]);
    refuse(&mut model, &base_dir().join("model.safetensors"), &["not an adapter file"]);
    refuse(&mut model, Path::new("/no/such/adapter.rbl"), &["/no/such/adapter.rbl"]);
    // None of it changed the model.
    let after = model.forward_batch(&tb).unwrap();
    assert_eq!(before, after);
    // Host operations are refused on a device, never silently done there.
    let err = TransformerLm::from_pretrained(base_dir()).unwrap().merge_lora().unwrap_err().to_string();
    assert!(err.contains("no adapters"), "{err}");
    assert!(matches!(model.save_optimizer_state(other.join("o.opt")), Err(NetworkError::InvalidInput(_))));
}

/// On wgpu the adapters train with the model (f32) and run in int8 decoding, through the
/// same model code: against the CPU.
#[test]
fn adapters_train_and_decode_on_wgpu() {
    let e = expected();
    let tb = batch(&e);
    let (mut cpu, mut gpu) = (
        TransformerLm::from_pretrained(base_dir()).unwrap(),
        TransformerLm::from_pretrained(base_dir()).unwrap(),
    );
    for m in [&mut cpu, &mut gpu] {
        m.load_lora(peft_dir()).unwrap();
        m.optimizer = Optimizer::adam(1e-2);
    }
    if !to_wgpu(&mut gpu) {
        return;
    }
    let err = gpu.add_lora(peft_config()).unwrap_err().to_string();
    assert!(err.contains("to_cpu"), "{err}");
    train_both(&mut cpu, &mut gpu, &tb, 2);
    for ((n, g), (_, c)) in gpu.lora_parameters().unwrap().iter().zip(cpu.lora_parameters().unwrap()) {
        let t = Tensor { shape: vec![c.len()], data: c.iter().map(|&v| v as f64).collect() };
        assert_close(&format!("wgpu {n}"), g, &t, Tolerance::new(1e-4, 1e-5));
    }
    // Back on the host, saved, then an int8 base with the adapter decodes on wgpu.
    gpu.to_cpu().unwrap();
    let dir = scratch("wgpu");
    gpu.save_lora(dir.join("a.rbl")).unwrap();
    let (mut qc, mut qg) = (
        TransformerLm::from_pretrained(base_dir()).unwrap(),
        TransformerLm::from_pretrained(base_dir()).unwrap(),
    );
    for m in [&mut qc, &mut qg] {
        m.quantize().unwrap();
        m.load_lora(dir.join("a.rbl")).unwrap();
    }
    assert!(to_wgpu(&mut qg));
    let prompt = [3u32, 17, 9, 30];
    let mut s = rusting_brain::Sampler::greedy();
    let a = qc.generate(&prompt, 10, &mut s).unwrap();
    let b = qg.generate(&prompt, 10, &mut s).unwrap();
    assert_eq!(a, b, "int8 base + adapter: greedy decoding differs between the CPU and wgpu");
    let _ = std::fs::remove_dir_all(dir);
}

/// A mixture of experts with a shared expert, adapters on every projection (the experts'
/// run on windows of grouped rows, through `lora.wgsl` forward), trained on wgpu and on the
/// CPU from the same non-zero adapters.
#[test]
fn expert_adapters_train_on_wgpu_as_on_the_cpu() {
    let build = || {
        let mut m = TransformerLm::builder()
            .vocab_size(48)
            .d_model(32)
            .n_layers(2)
            .heads(4, 2, 8)
            .d_ff(48)
            .experts(4, 2)
            .moe_layers([0, 1])
            .shared_expert(true)
            .expert_d_ff(24)
            .max_seq_len(16)
            .seed(9)
            .build()
            .unwrap();
        m.add_lora(LoraConfig::new(4).alpha(8.0)).unwrap();
        m.optimizer = Optimizer::adam(1e-2);
        m
    };
    let (mut cpu, mut gpu, mut first) = (build(), build(), build());
    // One step on a third copy so every B is non-zero, then its adapters on both (both at
    // optimizer step 0).
    let tb =
        TokenBatch::new(vec![vec![1, 7, 3, 9, 20, 4, 11, 2, 30], vec![5, 5, 40, 2, 8, 13, 1, 0, 6]]).unwrap();
    first.train_step_batch(&tb).unwrap();
    let dir = scratch("moe-wgpu");
    first.save_lora(dir.join("a.rbl")).unwrap();
    gpu.load_lora(dir.join("a.rbl")).unwrap();
    cpu.load_lora(dir.join("a.rbl")).unwrap();
    if !to_wgpu(&mut gpu) {
        return;
    }
    let l0 = close_logits(&gpu.forward_batch(&tb).unwrap(), &cpu.forward_batch(&tb).unwrap());
    train_both(&mut cpu, &mut gpu, &tb, 2);
    let mut experts = 0;
    for ((n, g), (_, c)) in gpu.lora_parameters().unwrap().iter().zip(cpu.lora_parameters().unwrap()) {
        experts += usize::from(n.contains(".experts."));
        let t = Tensor { shape: vec![c.len()], data: c.iter().map(|&v| v as f64).collect() };
        // Adam at lr 1e-2 moves an element whose small gradient rounds differently (the
        // GPU sums an expert's few rows in another order) by up to lr x 5e-3: measured
        // 1.7e-5 on one of 96 elements of a weakly routed expert's B.
        assert_close(&format!("wgpu {n}"), g, &t, Tolerance::new(1e-4, 5e-5));
    }
    assert_eq!(experts, 2 * 4 * 3 * 2, "A and B of 3 projections of 4 experts in 2 layers");
    eprintln!("MoE adapters on wgpu: logits worst {l0:.2e} of the largest");
    let _ = std::fs::remove_dir_all(dir);
}

/// `steps` training steps on both copies, their losses within 1e-5 of each other.
fn train_both(cpu: &mut TransformerLm, gpu: &mut TransformerLm, tb: &TokenBatch, steps: usize) {
    for step in 0..steps {
        let (lc, lg) = (cpu.train_step_batch(tb).unwrap(), gpu.train_step_batch(tb).unwrap());
        assert!(
            (lc.lm_loss - lg.lm_loss).abs() <= 1e-5 * lc.lm_loss,
            "step {step}: {} vs {}",
            lg.lm_loss,
            lc.lm_loss
        );
    }
}

/// The worst difference of two logit sets relative to the largest, asserted under 1e-5.
fn close_logits(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = worst_abs_diff(got, want) / scale;
    assert!(worst <= 1e-5, "logits differ by {worst} of the largest");
    worst
}

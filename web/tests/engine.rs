//! The browser engine, run natively: a model loaded from `.rbw` bytes gives the native
//! crate's int8 ids on the wasm CPU path (the portable backend) and on the GPU path
//! (core's model over `WgpuBackend`, on lavapipe here; SwiftShader in the browser tests), for
//! greedy and seeded sampling, across conversation turns; bad files and ids are errors.
//!
//! The ids are compared exactly: the int8 products are bit-identical on every path, the
//! rest (norms, attention, SwiGLU) differs by summation order only, and the model is trained to be confident, so no draw sits on a near-tie.

use rusting_brain::core::Rng;
use rusting_brain::{Optimizer, Precision, Sampler, TokenBatch, TransformerLm};
use rusting_brain_shaders::block_on;
use rusting_brain_test_support::gpu_or_skip;
use rusting_brain_web::{DeviceChoice, Engine, GenerateOptions, WebError};

/// Sequences of `next = (5 * prev + 3) mod 64`.
fn rule_batch(rng: &mut Rng, rows: usize) -> TokenBatch {
    let seqs: Vec<Vec<u32>> = (0..rows)
        .map(|_| {
            let mut t = rng.below(64) as u32;
            (0..25)
                .map(|_| {
                    let c = t;
                    t = (5 * t + 3) % 64;
                    c
                })
                .collect()
        })
        .collect();
    TokenBatch::new(&seqs).unwrap()
}

fn trained(moe: bool) -> TransformerLm {
    let b = TransformerLm::builder()
        .shape(64, 64, 2, (4, 2, 16), 96, 96)
        .optimizer(Optimizer::adam(3e-3))
        .seed(5);
    let b = if moe { b.experts(4, 2).expert_d_ff(48) } else { b };
    let mut m = b.build().unwrap();
    let mut rng = Rng::new(6);
    for _ in 0..120 {
        m.train_step_batch(&rule_batch(&mut rng, 8)).unwrap();
    }
    m
}

fn file_bytes(m: &TransformerLm, precision: Precision, name: &str) -> Vec<u8> {
    let path = std::env::temp_dir().join(format!("rb_web_{}_{name}.rbw", std::process::id()));
    m.save_bin(&path, precision).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    bytes
}

fn generate(e: &mut Engine, prompt: &[u32], n: usize, sampler: &mut Sampler) -> Vec<u32> {
    block_on(e.generate(prompt, n, sampler, None, |_| true, || async {})).unwrap().ids
}

/// The engine on the GPU, or None (skip, with the reason) where there is no adapter and
/// CI did not ask for one.
fn on_gpu(bytes: &[u8]) -> Option<Engine> {
    let loaded = block_on(Engine::load(bytes, DeviceChoice::WebGpu));
    let e = gpu_or_skip("loading on the GPU failed", loaded, WebError::is_no_adapter)?;
    eprintln!("device: {}", e.reason());
    Some(e)
}

#[test]
fn cpu_path_gives_the_native_int8_ids_from_q8_and_f32_files() {
    for moe in [false, true] {
        let mut native = trained(moe);
        let f32_file = file_bytes(&native, Precision::F32, "f32");
        native.quantize().unwrap();
        let q8_file = file_bytes(&native, Precision::Q8, "q8");
        let prompt = [3u32, 18, 29];
        let want = native.generate(&prompt, 32, &mut Sampler::greedy()).unwrap();
        let right = want.windows(2).filter(|w| w[1] == (5 * w[0] + 3) % 64).count();
        assert!(right >= 25, "the trained model follows its rule ({right}/31): the ids are not ties");
        for (what, bytes) in [("Q8 file", &q8_file), ("F32 file, quantized on load", &f32_file)] {
            let mut e = block_on(Engine::load(bytes, DeviceChoice::Cpu)).unwrap();
            assert_eq!(e.device(), "cpu");
            assert_eq!(generate(&mut e, &prompt, 32, &mut Sampler::greedy()), want, "{what}, moe {moe}");
        }
        // A seeded sampled run draws the native ids too (same core sampler, same logits).
        let opts = GenerateOptions {
            temperature: 0.9,
            top_k: Some(20),
            top_p: Some(0.95),
            repetition_penalty: 1.1,
            ..Default::default()
        };
        let want = native.generate(&prompt, 32, &mut opts.sampler(42).unwrap()).unwrap();
        let mut e = block_on(Engine::load(&q8_file, DeviceChoice::Cpu)).unwrap();
        assert_eq!(generate(&mut e, &prompt, 32, &mut opts.sampler(42).unwrap()), want, "sampled, moe {moe}");
    }
}

/// A Q4 file: the CPU path decodes the native 4-bit model's ids (its products are core's
/// bits on both). The MoE model's experts stay int8 (`format_of`), the rest 4-bit.
#[test]
fn cpu_path_gives_the_native_four_bit_ids_from_a_q4_file() {
    for moe in [false, true] {
        let mut native = trained(moe);
        native.quantize_to(Precision::Q4).unwrap();
        let q4_file = file_bytes(&native, Precision::Q4, "q4");
        let prompt = [3u32, 18, 29];
        let want = native.generate(&prompt, 32, &mut Sampler::greedy()).unwrap();
        let mut e = block_on(Engine::load(&q4_file, DeviceChoice::Cpu)).unwrap();
        assert_eq!(generate(&mut e, &prompt, 32, &mut Sampler::greedy()), want, "Q4 file, moe {moe}");
    }
}

/// The WGSL path gives the native ids from an int8 and a 4-bit file: greedy, and a seeded
/// sampled run (the same core sampler on logits whose quantized products are core's bits).
#[test]
fn gpu_path_gives_the_native_int8_and_four_bit_ids() {
    for (moe, precision) in
        [(false, Precision::Q8), (true, Precision::Q8), (false, Precision::Q4), (true, Precision::Q4)]
    {
        let mut native = trained(moe);
        native.quantize_to(precision).unwrap();
        let bytes = file_bytes(&native, precision, "gpu");
        let Some(mut e) = on_gpu(&bytes) else { return };
        assert_eq!(e.device(), "webgpu");
        let prompt = [3u32, 18, 29];
        let want = native.generate(&prompt, 32, &mut Sampler::greedy()).unwrap();
        assert_eq!(
            generate(&mut e, &prompt, 32, &mut Sampler::greedy()),
            want,
            "greedy, moe {moe}, {precision:?}"
        );
        let s = || Sampler::temperature(0.8, Some(7)).top_k(16).repetition_penalty(1.2);
        let want = native.generate(&prompt, 32, &mut s()).unwrap();
        e.reset();
        assert_eq!(generate(&mut e, &prompt, 32, &mut s()), want, "sampled, moe {moe}, {precision:?}");
    }
}

/// "auto" takes WebGPU on a hardware adapter only: on a software one (lavapipe here, as
/// SwiftShader in a browser) it runs the CPU path and says why; "webgpu" takes it anyway.
#[test]
fn auto_leaves_a_software_adapter_for_the_cpu_path() {
    let mut native = trained(false);
    native.quantize().unwrap();
    let bytes = file_bytes(&native, Precision::Q8, "auto");
    let Some(webgpu) = on_gpu(&bytes) else { return };
    let auto = block_on(Engine::load(&bytes, DeviceChoice::Auto)).unwrap();
    let software =
        webgpu.reason().to_lowercase().contains("llvmpipe") || webgpu.reason().contains("SwiftShader");
    eprintln!("webgpu: {}; auto: {} ({})", webgpu.reason(), auto.device(), auto.reason());
    if software {
        assert_eq!(auto.device(), "cpu");
        assert!(auto.reason().contains("renders in software"), "{}", auto.reason());
    } else {
        assert_eq!(auto.device(), "webgpu", "{}", auto.reason());
    }
}

#[test]
fn turns_keep_the_conversation_like_the_native_decoder() {
    let mut native = trained(false);
    native.quantize().unwrap();
    let bytes = file_bytes(&native, Precision::Q8, "turns");
    let mut want = Vec::new();
    {
        let mut d = native.decoder();
        for turn in [&[3u32, 18][..], &[7], &[40, 9]] {
            d.feed(turn).unwrap();
            let mut ids = Vec::new();
            for _ in 0..10 {
                let id = d.next(&mut Sampler::greedy()).unwrap();
                ids.push(id);
            }
            want.push(ids);
        }
    }
    let mut engines = vec![block_on(Engine::load(&bytes, DeviceChoice::Cpu)).unwrap()];
    engines.extend(on_gpu(&bytes));
    for e in &mut engines {
        for (turn, want) in [&[3u32, 18][..], &[7], &[40, 9]].into_iter().zip(&want) {
            assert_eq!(&generate(e, turn, 10, &mut Sampler::greedy()), want, "{}", e.device());
        }
        assert_eq!(e.context().len(), 2 + 10 + 1 + 10 + 2 + 10);
    }
}

#[test]
fn stopping_early_and_the_end_id() {
    let mut native = trained(false);
    native.quantize().unwrap();
    let bytes = file_bytes(&native, Precision::Q8, "stop");
    let mut e = block_on(Engine::load(&bytes, DeviceChoice::Cpu)).unwrap();
    let all = generate(&mut e, &[3], 20, &mut Sampler::greedy());
    e.reset();
    let mut seen = 0;
    let g = block_on(e.generate(
        &[3],
        20,
        &mut Sampler::greedy(),
        None,
        |_| {
            seen += 1;
            seen < 5
        },
        || async {},
    ))
    .unwrap();
    assert_eq!((g.ids.as_slice(), g.finish), (&all[..5], "stopped"));
    e.reset();
    let g =
        block_on(e.generate(&[3], 20, &mut Sampler::greedy(), Some(all[7]), |_| true, || async {})).unwrap();
    let first = all.iter().position(|&id| id == all[7]).unwrap();
    assert_eq!((g.ids.as_slice(), g.finish), (&all[..first], "end"));
    // The cache fills: generation ends there, and the next turn asks for a reset.
    e.reset();
    let g = block_on(e.generate(&[3; 90], 20, &mut Sampler::greedy(), None, |_| true, || async {})).unwrap();
    assert_eq!((g.ids.len(), g.finish), (7, "max_seq_len"));
    let err = block_on(e.generate(&[3], 5, &mut Sampler::greedy(), None, |_| true, || async {}))
        .unwrap_err()
        .to_string();
    assert!(err.contains("max_seq_len") && err.contains("reset"), "{err}");
}

#[test]
fn bad_files_and_ids_are_errors() {
    let mut native = trained(false);
    native.quantize().unwrap();
    let bytes = file_bytes(&native, Precision::Q8, "bad");
    let load = |b: &[u8]| block_on(Engine::load(b, DeviceChoice::Cpu)).err().map(|e| e.to_string());
    for (what, b) in [
        ("empty", Vec::new()),
        ("truncated", bytes[..bytes.len() / 2].to_vec()),
        ("not safetensors", b"GIF89a not a model at all".to_vec()),
    ] {
        let e = load(&b).unwrap_or_else(|| panic!("{what} loaded"));
        assert!(e.starts_with("bad model file"), "{what}: {e}");
    }
    // A header claiming a length past the end of the file.
    let mut lying = bytes.clone();
    lying[..8].copy_from_slice(&(bytes.len() as u64 * 4).to_le_bytes());
    assert!(load(&lying).unwrap().starts_with("bad model file"));
    // A flipped byte in the metadata's config (still valid JSON, a shape that disagrees).
    let text = String::from_utf8_lossy(&bytes[..2000]).to_string();
    let at = text.find("\\\"d_model\\\":64").expect("config in the header");
    let mut wrong = bytes.clone();
    wrong[at + 12] = b'8'; // d_model 84: the tensors' shapes no longer fit
    let e = load(&wrong).unwrap();
    assert!(e.contains("shape") || e.contains("config"), "{e}");

    let mut e = block_on(Engine::load(&bytes, DeviceChoice::Cpu)).unwrap();
    let err = block_on(e.generate(&[3, 64], 4, &mut Sampler::greedy(), None, |_| true, || async {}))
        .unwrap_err()
        .to_string();
    assert!(err.contains("64") && err.contains("vocabulary"), "{err}");
    assert!(e.context().is_empty(), "a refused prompt changes nothing");
    assert!(block_on(e.generate(&[], 4, &mut Sampler::greedy(), None, |_| true, || async {})).is_err());
    assert!(block_on(e.draw(&mut Sampler::greedy())).is_err(), "nothing fed");
    let bad = Sampler::temperature(-1.0, Some(1));
    assert!(block_on(e.generate(&[3], 4, &mut bad.clone(), None, |_| true, || async {})).is_err());
    assert!(DeviceChoice::parse("tpu").is_err());
}

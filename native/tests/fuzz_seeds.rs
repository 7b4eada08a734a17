//! The fuzz targets' seed corpus (`fuzz/`): files saved by the library itself from the
//! fuzz model, and the test fixtures. With `RB_FUZZ_SEEDS=<folder>` the test writes them
//! there (`fuzz/run.sh` does, into `fuzz/corpus/<target>/`); without it, into a temporary
//! folder, and checks that every seed of our own loads through the loader its target
//! fuzzes, so the targets start from valid files.

use std::fs;
use std::path::{Path, PathBuf};

use rusting_brain::{Activation, Loss, Network, Precision, TokenFile};
use rusting_brain_test_support::fuzz::{join, split, tiny_lm, tiny_lora};
use rusting_brain_test_support::TempDir;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

fn read(path: impl AsRef<Path>) -> Vec<u8> {
    fs::read(path.as_ref()).unwrap_or_else(|e| panic!("{}: {e}", path.as_ref().display()))
}

fn npy_f32(rows: usize, cols: usize) -> Vec<u8> {
    let header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {cols}), }}");
    let mut h = header.into_bytes();
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(b' ');
    }
    h.push(b'\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(h.len() as u16).to_le_bytes());
    out.extend_from_slice(&h);
    for i in 0..rows * cols {
        out.extend_from_slice(&(i as f32 * 0.5).to_le_bytes());
    }
    out
}

fn idx(dims: &[u32]) -> Vec<u8> {
    let mut out = vec![0, 0, 8, dims.len() as u8];
    for d in dims {
        out.extend_from_slice(&d.to_be_bytes());
    }
    let n: u32 = dims.iter().product();
    out.extend((0..n).map(|i| (i % 10) as u8));
    out
}

/// Writes every target's seeds under `out/<target>/`.
fn write_seeds(out: &Path) -> rusting_brain::Result<()> {
    let scratch = TempDir::new("fuzz_seeds");
    let tmp = scratch.path();
    let seed = |target: &str, name: &str, bytes: &[u8]| {
        let dir = out.join(target);
        fs::create_dir_all(&dir).expect("creating the corpus folder");
        fs::write(dir.join(name), bytes).expect("writing a seed");
    };

    // .rbw in both precisions, and the optimizer state, from the fuzz model.
    let mut lm = tiny_lm();
    lm.train_step(&[vec![1, 2, 3, 4, 5], vec![6, 7, 8, 9, 10]])?;
    for (name, p) in [("f32.rbw", Precision::F32), ("q8.rbw", Precision::Q8)] {
        lm.save_bin(tmp.join(name), p)?;
        seed("rbw", name, &read(tmp.join(name)));
    }
    lm.save_optimizer_state(tmp.join("state.opt"))?;
    seed("opt", "state.opt", &read(tmp.join("state.opt")));

    // Adapters, .rbl and PEFT.
    lm.add_lora(tiny_lora())?;
    lm.train_step(&[vec![1, 2, 3, 4, 5]])?;
    lm.save_lora(tmp.join("a.rbl"))?;
    seed("rbl", "a.rbl", &read(tmp.join("a.rbl")));
    lm.save_lora_peft(tmp.join("peft"))?;
    seed(
        "peft",
        "tiny",
        &join(&read(tmp.join("peft/adapter_config.json")), &read(tmp.join("peft/adapter_model.safetensors"))),
    );

    // Hugging Face folders: the fuzz model saved, and fixtures of the other families (the
    // executions per second fall with the seed's size, so not all of them).
    let lm = tiny_lm();
    // GGUF: the block-type fixture and a tiny Llama with its tokenizer, as the `gguf`
    // package writes them.
    seed("gguf", "blocks", &read(fixtures().join("gguf_blocks.gguf")));
    seed("gguf", "tiny_llama", &read(fixtures().join("gguf_tiny_llama.gguf")));
    // And a mixture of experts as llama.cpp's converter and quantizer write it.
    seed("gguf", "qwen3_moe_q4_0", &read(fixtures().join("gguf_llama_cpp/qwen3_moe.q4_0.gguf")));
    // A SentencePiece vocabulary (scores, byte tokens) over Q8_0 weights.
    seed("gguf", "tiny_llama_spm", &read(fixtures().join("gguf_spm/tiny_llama_spm.gguf")));
    lm.save_pretrained(tmp.join("hf"))?;
    seed("hf", "tiny", &join(&read(tmp.join("hf/config.json")), &read(tmp.join("hf/model.safetensors"))));
    for dir in fs::read_dir(fixtures().join("hf")).expect("the hf fixtures").flatten() {
        let dir = dir.path();
        let (c, w) = (dir.join("config.json"), dir.join("model.safetensors"));
        let name = dir.file_name().expect("a name").to_string_lossy().into_owned();
        if c.exists() && w.exists() && ["qwen3_moe", "llama_bf16", "qwen2"].contains(&name.as_str()) {
            seed("hf", &name, &join(&read(c), &read(w)));
        }
    }

    // Chat templates and generation settings.
    for dir in fs::read_dir(fixtures().join("hf_chat")).expect("the chat fixtures").flatten() {
        let dir = dir.path();
        let t = dir.join("tokenizer_config.json");
        if t.exists() {
            let g = fs::read(dir.join("generation_config.json")).unwrap_or_default();
            let name = dir.file_name().expect("a name").to_string_lossy().into_owned();
            seed("tokenizer_config", &name, &join(&read(t), &g));
        }
    }

    // Dense networks as JSON.
    let net = Network::builder()
        .input_size(4)
        .dense(5, Activation::Relu)
        .dense(2, Activation::Identity)
        .loss(Loss::MeanSquaredError)
        .seed(1)
        .try_build()?;
    net.save_json(tmp.join("net.json"))?;
    seed("network_json", "net.json", &read(tmp.join("net.json")));

    // Tables, arrays, IDX, token files.
    seed("csv", "numbers.csv", b"a,b,y\n1,2,3\n4,5.5,6\n\n7,8,9\r\n");
    seed("csv", "labels.csv", b"x1,x2,label\n0.1,0.2,cat\n\"1.5\",2,\"d\"\"og\"\n");
    seed("npy", "xy", &join(&npy_f32(3, 2), &npy_f32(3, 1)));
    seed("idx", "mnist", &join(&idx(&[2, 3, 3]), &idx(&[2])));
    TokenFile::write(tmp.join("c.tok"), &(0..40).collect::<Vec<u32>>())?;
    seed("token_file", "c.tok", &read(tmp.join("c.tok")));

    // The server's request bodies (chat, text completions, pictures).
    seed(
        "openai_request",
        "chat.json",
        br#"{"model": "m", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 8, "temperature": 0.7, "top_p": 0.9, "seed": 3, "stop": ["\n", "END"], "stream": true, "stream_options": {"include_usage": true}}"#,
    );
    seed(
        "openai_request",
        "completion.json",
        br#"{"model": "m", "prompt": "Once", "max_completion_tokens": 4, "n": 1}"#,
    );
    seed(
        "openai_request",
        "image.json",
        br#"{"model": "sd", "prompt": "a lighthouse in fog", "size": "512x512", "n": 1, "response_format": "b64_json", "seed": 7}"#,
    );

    // ONNX: the committed exports and one of our own.
    for f in fs::read_dir(fixtures().join("onnx")).expect("the onnx fixtures").flatten() {
        let f = f.path();
        if f.extension().is_some_and(|e| e == "onnx") {
            let name = f.file_name().expect("a name").to_string_lossy().into_owned();
            seed("onnx", &name, &read(&f));
        }
    }
    net.save_onnx(tmp.join("net.onnx"))?;
    seed("onnx", "net.onnx", &read(tmp.join("net.onnx")));

    Ok(())
}

#[test]
fn the_fuzz_seeds_are_valid_files() {
    if let Ok(out) = std::env::var("RB_FUZZ_SEEDS") {
        write_seeds(Path::new(&out)).unwrap();
        eprintln!("seeds written under {out}");
        return;
    }
    let d = TempDir::new("fuzz_corpus");
    write_seeds(d.path()).unwrap();
    let only = |target: &str, name: &str| read(d.join(target).join(name));
    let file = |name: &str, bytes: &[u8]| {
        let p = d.join(name);
        fs::write(&p, bytes).unwrap();
        p
    };
    for name in ["f32.rbw", "q8.rbw"] {
        rusting_brain::TransformerLm::load_bin(file(name, &only("rbw", name))).unwrap();
    }
    tiny_lm().load_optimizer_state(file("s.opt", &only("opt", "state.opt"))).unwrap();
    tiny_lm().load_lora(file("a.rbl", &only("rbl", "a.rbl"))).unwrap();
    let peft = only("peft", "tiny");
    let (config, weights) = split(&peft);
    fs::create_dir_all(d.join("peft")).unwrap();
    fs::write(d.join("peft/adapter_config.json"), config).unwrap();
    fs::write(d.join("peft/adapter_model.safetensors"), weights).unwrap();
    tiny_lm().load_lora(d.join("peft")).unwrap();
    let hf = only("hf", "tiny");
    let (config, weights) = split(&hf);
    fs::create_dir_all(d.join("hf")).unwrap();
    fs::write(d.join("hf/config.json"), config).unwrap();
    fs::write(d.join("hf/model.safetensors"), weights).unwrap();
    rusting_brain::TransformerLm::from_pretrained(d.join("hf")).unwrap();
    Network::load_json(file("n.json", &only("network_json", "net.json"))).unwrap();
    rusting_brain::Dataset::from_csv(file("t.csv", &only("csv", "numbers.csv")), 1).unwrap();
    rusting_brain::Dataset::from_csv_labeled(file("l.csv", &only("csv", "labels.csv"))).unwrap();
    let xy = only("npy", "xy");
    let (x, y) = split(&xy);
    rusting_brain::Dataset::from_npy(file("x.npy", x), file("y.npy", y)).unwrap();
    let iy = only("idx", "mnist");
    let (i, l) = split(&iy);
    rusting_brain::Dataset::from_idx(file("i.idx", i), file("l.idx", l)).unwrap();
    TokenFile::open(file("c.tok", &only("token_file", "c.tok")), 0).unwrap();
}

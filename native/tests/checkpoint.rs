//! Transformer checkpoints: round trip, exact resume, and every kind of bad file.

use std::path::PathBuf;

use rusting_brain::core::Rng;
use rusting_brain::{Optimizer, Precision, TokenBatch, TransformerLm};

use rusting_brain_test_support::TempDir as Dir;

fn build(vocab: usize, seed: u64) -> TransformerLm {
    TransformerLm::builder()
        .shape(vocab, 32, 2, (4, 2, 8), 48, 16)
        .optimizer(Optimizer::adam(5e-3).betas(0.9, 0.95).weight_decay(0.1))
        .seed(seed)
        .build()
        .unwrap()
}

/// The batch of step `s`: a pure function of the step, as a resumed run needs.
fn batch(step: u64) -> TokenBatch {
    let mut rng = Rng::new(1000 + step);
    let seqs: Vec<Vec<u32>> = (0..2).map(|_| (0..13).map(|_| rng.below(40) as u32).collect()).collect();
    TokenBatch::new(&seqs).unwrap()
}

fn bits(m: &TransformerLm) -> Vec<(String, Vec<u32>)> {
    m.named_parameters()
        .unwrap()
        .into_iter()
        .map(|(n, v)| (n, v.iter().map(|x| x.to_bits()).collect()))
        .collect()
}

#[test]
fn resuming_from_a_checkpoint_is_bitwise_identical_to_not_stopping() {
    let d = Dir::new("ckpt_resume");
    let mut straight = build(40, 1);
    for s in 0..7 {
        straight.train_step_batch(&batch(s)).unwrap();
    }
    let mut first = build(40, 1);
    for s in 0..4 {
        first.train_step_batch(&batch(s)).unwrap();
    }
    first.save_bin(d.join("m.rbw"), Precision::F32).unwrap();
    first.save_optimizer_state(d.join("m.rbw.opt")).unwrap();
    drop(first);
    let mut resumed = TransformerLm::load_bin(d.join("m.rbw")).unwrap();
    resumed.load_optimizer_state(d.join("m.rbw.opt")).unwrap();
    assert_eq!(resumed.optimizer, Optimizer::adam(5e-3).betas(0.9, 0.95).weight_decay(0.1));
    assert_eq!(resumed.steps(), 4);
    for s in 4..7 {
        resumed.train_step_batch(&batch(s)).unwrap();
    }
    assert!(bits(&resumed) == bits(&straight), "4 + 3 resumed steps differ from 7 straight ones");
}

#[test]
fn weights_round_trip_and_the_file_is_plain_safetensors() {
    let d = Dir::new("ckpt_roundtrip");
    let mut m = build(40, 2);
    m.train_step_batch(&batch(0)).unwrap();
    m.save_bin(d.join("a.rbw"), Precision::F32).unwrap();
    let mut back = TransformerLm::load_bin(d.join("a.rbw")).unwrap();
    assert!(bits(&back) == bits(&m));
    assert_eq!(back.config(), m.config());
    let b = batch(1);
    assert_eq!(back.forward_batch(&b).unwrap(), m.forward_batch(&b).unwrap());
    // What Python's safetensors sees: F32 tensors under Hugging Face names, config in metadata.
    let bytes = std::fs::read(d.join("a.rbw")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor("model.layers.1.self_attn.k_proj.weight").unwrap();
    assert_eq!((t.dtype(), t.shape().to_vec()), (safetensors::Dtype::F32, vec![16, 32]));
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    assert!(meta.metadata().as_ref().unwrap()["config"].contains("\"kv_heads\":2"));
}

#[test]
fn bad_checkpoints_are_errors_and_leave_the_model_alone() {
    let d = Dir::new("ckpt_bad");
    let m = build(40, 3);
    m.save_bin(d.join("good.rbw"), Precision::F32).unwrap();
    m.save_optimizer_state(d.join("good.opt")).unwrap();
    let good = std::fs::read(d.join("good.rbw")).unwrap();
    let write = |name: &str, bytes: &[u8]| {
        std::fs::write(d.join(name), bytes).unwrap();
        d.join(name)
    };
    let err = |p: PathBuf| TransformerLm::load_bin(&p).err().expect("should fail").to_string();

    let e = err(write("truncated.rbw", &good[..good.len() - 100]));
    assert!(e.contains("truncated.rbw") && e.contains("not a valid safetensors"), "{e}");
    let e = err(write("magic.rbw", b"PK\x03\x04 definitely a zip file"));
    assert!(e.contains("magic.rbw"), "{e}");
    // A header that claims a huge length: rejected before anything is allocated from it.
    let mut lying = good.clone();
    lying[..8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    let e = err(write("lying.rbw", &lying));
    assert!(e.contains("not a valid safetensors"), "{e}");
    // A config whose shapes disagree with the tensors.
    let header_len = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&good[8..8 + header_len]).unwrap();
    let swapped = header.replace("\\\"d_ff\\\":48", "\\\"d_ff\\\":40");
    assert_ne!(swapped, header, "the test edits the config");
    let mut wrong = (swapped.len() as u64).to_le_bytes().to_vec();
    wrong.extend_from_slice(swapped.as_bytes());
    wrong.extend_from_slice(&good[8 + header_len..]);
    let e = err(write("shapes.rbw", &wrong));
    assert!(e.contains("mlp.gate_proj.weight") && e.contains("the config needs [40, 32]"), "{e}");
    // A missing tensor: the same file rebuilt without one.
    {
        let st = safetensors::SafeTensors::deserialize(&good).unwrap();
        let (_, meta) = safetensors::SafeTensors::read_metadata(&good).unwrap();
        let kept: Vec<(String, safetensors::tensor::TensorView)> =
            st.tensors().into_iter().filter(|(n, _)| n != "model.layers.0.mlp.up_proj.weight").collect();
        let bytes = safetensors::tensor::serialize(kept, meta.metadata().clone()).unwrap();
        let e = err(write("missing.rbw", &bytes));
        assert!(e.contains("model.layers.0.mlp.up_proj.weight") && e.contains("missing tensor"), "{e}");
    }
    // A file of another format altogether.
    let e = err(d.join("good.opt"));
    assert!(e.contains("format"), "{e}");
    let e = err(d.join("nothing.rbw"));
    assert!(e.contains("nothing.rbw"), "{e}");

    // Optimizer state of another model: refused, and nothing changes.
    let mut other = build(44, 4);
    let before = bits(&other);
    let e = other.load_optimizer_state(d.join("good.opt")).unwrap_err().to_string();
    assert!(e.contains("another configuration"), "{e}");
    assert_eq!(other.steps(), 0);
    assert!(bits(&other) == before);
    // A save over the old file that fails part way leaves the old file whole. The write
    // goes to `.good.rbw.tmp<pid>` first: a directory standing there makes it fail.
    let tmp = d.join(format!(".good.rbw.tmp{}", std::process::id()));
    std::fs::create_dir(&tmp).unwrap();
    let changed = build(40, 9);
    assert!(changed.save_bin(d.join("good.rbw"), Precision::F32).is_err());
    assert_eq!(std::fs::read(d.join("good.rbw")).unwrap(), good, "the old file changed");
    std::fs::remove_dir(&tmp).unwrap();
    // A save whose rename fails (the path is a directory) leaves no temporary behind.
    std::fs::create_dir(d.join("taken.rbw")).unwrap();
    std::fs::write(d.join("taken.rbw/keep"), b"x").unwrap();
    assert!(changed.save_bin(d.join("taken.rbw"), Precision::F32).is_err());
    assert_eq!(std::fs::read(d.join("taken.rbw/keep")).unwrap(), b"x");
    let stray: Vec<String> = std::fs::read_dir(d.join(""))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp"))
        .collect();
    assert!(stray.is_empty(), "temporaries left: {stray:?}");
    // And the same save to the free path succeeds, replacing the old file.
    changed.save_bin(d.join("good.rbw"), Precision::F32).unwrap();
    assert_ne!(std::fs::read(d.join("good.rbw")).unwrap(), good);
}

/// A Q8 file written before int8 blocks (checkpoint version 1, one scale per weight row,
/// committed with the program that wrote it: `fixtures/q8_v1/write_v1.rs`, run at commit
/// 77c30cf) loads and gives the very logits and greedy ids that build computed from it:
/// nothing a user saved is lost, and a per-row model keeps its int8 activations. Saved
/// again, it stays per-row (version 2 writes the scales it holds) and reads back the same.
#[test]
fn a_version_1_int8_file_loads_and_runs_as_it_was_written() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/q8_v1");
    let want: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("q8_v1.json")).unwrap()).unwrap();
    let list = |key: &str| -> Vec<u32> {
        want[key].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect()
    };
    let check = |m: &mut TransformerLm, what: &str| {
        assert!(m.is_quantized(), "{what}: loads as int8");
        let logits = m.forward_batch(&TokenBatch::new([list("ids")]).unwrap()).unwrap();
        let bits: Vec<u32> = logits.iter().map(|v| v.to_bits()).collect();
        assert_eq!(bits, list("logit_bits"), "{what}: the logits version 1 computed, bit for bit");
        let ids = m.generate(&list("prompt"), 12, &mut rusting_brain::Sampler::greedy()).unwrap();
        assert_eq!(ids, list("greedy"), "{what}: the greedy ids");
    };
    let mut m = TransformerLm::load_bin(dir.join("q8_v1.rbw")).unwrap();
    check(&mut m, "the version-1 file");
    let tmp = Dir::new("q8_v1_again");
    m.save_bin(tmp.path().join("again.rbw"), Precision::Q8).unwrap();
    check(&mut TransformerLm::load_bin(tmp.path().join("again.rbw")).unwrap(), "saved again");
}

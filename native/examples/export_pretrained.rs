//! Writes one Hugging Face directory per family this library saves, from models built and
//! trained here, with this library's logits beside each, so that a Python run can check
//! that transformers loads them and computes the same thing:
//!
//!     cargo run --release -p rusting_brain --example export_pretrained -- OUT
//!     python3 tests/fixtures/check_save_pretrained.py OUT
//!
//! Each model takes a few AdamW steps first, so biases, norms and routers are no longer at
//! their initial values (a bias of zero or a norm of one would hide a misplaced tensor).
//! OUT/NAME/ours.safetensors holds `ids` (I64, 2 x 9) and `logits` (F32, 2 x 9 x vocab):
//! the logits at every position, from `forward_batch` over the ids with one more token
//! after them.

use std::collections::HashMap;
use std::path::PathBuf;

use rusting_brain::{Optimizer, RopeScaling, TokenBatch, TransformerLm, TransformerLmBuilder};
use safetensors::tensor::{Dtype, TensorView};

type Error = Box<dyn std::error::Error + Send + Sync>;

const VOCAB: usize = 96;
const T: usize = 9;

fn base() -> TransformerLmBuilder {
    TransformerLm::builder()
        .vocab_size(VOCAB)
        .d_model(32)
        .n_layers(2)
        .heads(4, 2, 8)
        .d_ff(48)
        .max_seq_len(64)
        .optimizer(Optimizer::adam(1e-2))
        .seed(5)
}

fn families() -> Vec<(&'static str, TransformerLmBuilder, Option<usize>)> {
    vec![
        (
            "llama",
            base().tie_embeddings(false).rope_theta(500_000.0).rope_scaling(RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position: 16,
            }),
            // Shards of at most 20 KB: several files and the index.
            Some(20_000),
        ),
        ("qwen2", base().qkv_bias(true).rope_scaling(RopeScaling::Linear { factor: 2.0 }), None),
        ("qwen3", base().qk_norm(true).tie_embeddings(false), None),
        ("mixtral", base().tie_embeddings(false).experts(4, 2).expert_d_ff(24), None),
        ("qwen3_moe", base().qk_norm(true).experts(4, 2).expert_d_ff(24).renormalize_top_k(true), None),
    ]
}

fn main() -> Result<(), Error> {
    let out = std::env::args().nth(1).map(PathBuf::from).ok_or("usage: export_pretrained OUT")?;
    std::fs::create_dir_all(&out)?;
    for (name, builder, shard) in families() {
        let mut model = builder.build()?;
        // A few steps on a fixed pattern: every parameter moves off its initial value.
        let rows: Vec<Vec<u32>> =
            (0..4u32).map(|r| (0..17u32).map(|t| (r * 7 + t * 13) % VOCAB as u32).collect()).collect();
        let batch = TokenBatch::new(rows)?;
        for _ in 0..5 {
            model.zero_grad()?;
            model.accumulate_step(&batch)?;
            model.step(1.0)?;
        }
        let dir = out.join(name);
        match shard {
            Some(bytes) => model.save_pretrained_sharded(&dir, bytes)?,
            None => model.save_pretrained(&dir)?,
        }
        // Logits at every position of two rows: forward_batch drops the last token's, so
        // each row carries one more.
        let ids: Vec<Vec<u32>> = (0..2u32)
            .map(|r| (0..=T as u32).map(|t| (r * 31 + t * 5 + 3) % VOCAB as u32).collect())
            .collect();
        let logits = model.forward_batch(&TokenBatch::new(ids.clone())?)?;
        let id_bytes: Vec<u8> =
            ids.iter().flat_map(|r| r[..T].iter().flat_map(|&i| i64::from(i).to_le_bytes())).collect();
        let logit_bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
        let tensors = HashMap::from([
            ("ids".to_string(), TensorView::new(Dtype::I64, vec![2, T], &id_bytes)?),
            ("logits".to_string(), TensorView::new(Dtype::F32, vec![2, T, VOCAB], &logit_bytes)?),
        ]);
        safetensors::serialize_to_file(tensors, None, &dir.join("ours.safetensors"))?;
        let files: Vec<String> = std::fs::read_dir(&dir)?
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect();
        let mut files = files;
        files.sort();
        println!("{name}: {} ({})", dir.display(), files.join(", "));
    }
    Ok(())
}

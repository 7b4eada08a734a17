//! GGUF files, llama.cpp's model format, natively: the formats crate's reader over a
//! memory map of the file (every count, length and offset checked against the file's size
//! before anything is allocated, so a truncated or lying file is an error naming the file
//! and the key or tensor), tensors decoded one at a time with their pages handed back
//! after, as the Hugging Face loader reads safetensors; and the writer ([`write`]).

mod folder;
mod lm;
mod write;

use std::ops::Deref;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use rusting_brain_formats::FormatError;

use crate::{NetworkError, Result};
pub(crate) use lm::load;
#[cfg(test)]
use rusting_brain_formats::gguf::TensorInfo;
pub(crate) use rusting_brain_formats::gguf::{GgmlType, Meta};
pub(crate) use write::save;
pub use write::GgufType;

/// The tokenizer a GGUF file carries (`tokenizer.ggml.*`: byte-level BPE with the
/// pre-tokenizer the file names, or SentencePiece's BPE) as the text of a Hugging Face
/// `tokenizer.json`, which `tokenizers::Tokenizer::from_str` loads: this crate ships no
/// tokenizer of its own. A tokenizer this rebuild does not cover (WordPiece, Unigram, an
/// unknown pre-tokenizer) is an error naming the key.
pub fn tokenizer_json(path: impl AsRef<Path>) -> Result<String> {
    let file = Gguf::open(path.as_ref())?;
    file.tokenizer_json().map_err(|e| file.lift(e))
}

/// The precision that holds a GGUF file's matrices as they are stored, for
/// [`crate::TransformerLm::from_gguf_at`]: `Q4` when it has 4-bit blocks (Q4_0, Q4_1,
/// Q4_K: they are kept exactly, its wider blocks in int8), `Q8` when its matrices are
/// other blocks (Q8_0, Q5_x, Q6_K), `F32` when they are floats (F32, F16, BF16).
pub fn held_precision(path: impl AsRef<Path>) -> Result<crate::Precision> {
    use GgmlType::*;
    let file = Gguf::open(path.as_ref())?;
    let kinds: Vec<GgmlType> = file.tensors.iter().filter(|t| t.dims.len() >= 2).map(|t| t.kind).collect();
    Ok(if kinds.iter().any(|k| matches!(k, Q4_0 | Q4_1 | Q4K)) {
        crate::Precision::Q4
    } else if kinds.iter().any(|k| !matches!(k, F32 | F16 | BF16)) {
        crate::Precision::Q8
    } else {
        crate::Precision::F32
    })
}

/// A chat template's source, if the file has one, and the texts of its special tokens
/// (`bos_token`, `eos_token`, `unk_token`, `pad_token`).
pub(crate) type TemplateParts = (Option<String>, Vec<(&'static str, String)>);

/// The file's chat template and special tokens, what `ChatTemplate::from_gguf` reads.
pub(crate) fn chat_template(path: &Path) -> Result<TemplateParts> {
    let file = Gguf::open(path)?;
    Ok((file.chat_template().map_err(|e| file.lift(e))?, file.special_texts()))
}

/// The ids that end a reply (`tokenizer.ggml.eos_token_id`, and the end-of-turn and
/// end-of-message ids where the file names them), the start id and the padding id.
pub(crate) fn special_ids(path: &Path) -> Result<(Vec<u32>, Option<u32>, Option<u32>)> {
    let file = Gguf::open(path)?;
    file.special_ids().map_err(|e| file.lift(e))
}

/// An opened GGUF file: the formats crate's reader over a memory map, errors naming the file.
pub(crate) struct Gguf {
    pub(crate) path: PathBuf,
    file: rusting_brain_formats::gguf::Gguf<Mmap>,
}

impl Deref for Gguf {
    type Target = rusting_brain_formats::gguf::Gguf<Mmap>;
    fn deref(&self) -> &Self::Target {
        &self.file
    }
}

impl Gguf {
    /// Maps `path` and reads its header.
    pub(crate) fn open(path: &Path) -> Result<Gguf> {
        let file = std::fs::File::open(path).map_err(|e| NetworkError::io(path, e))?;
        // SAFETY: the map is read only; a file changed under it while it is read is the
        // same hazard the safetensors loader accepts (documented there).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| NetworkError::io(path, e))?;
        let file = rusting_brain_formats::gguf::Gguf::parse(map)
            .map_err(|e| NetworkError::parse(path, e.what, e.message))?;
        Ok(Gguf { path: path.to_path_buf(), file })
    }

    /// An error about `what` (a key or a tensor) of this file.
    pub(crate) fn err(&self, what: &str, message: impl Into<String>) -> NetworkError {
        NetworkError::parse(&self.path, what, message)
    }

    /// The formats crate's error with this file named.
    pub(crate) fn lift(&self, e: FormatError) -> NetworkError {
        NetworkError::parse(&self.path, e.what, e.message)
    }

    /// Hands `bytes` (a tensor's, read once) back: its pages leave this process's memory
    /// and stay in the page cache.
    pub(crate) fn release(&self, bytes: &[u8]) {
        crate::io::weights::release(self.file.bytes(), bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/gguf_blocks.gguf")
    }

    /// Every type decoded to the bits the `gguf` package's numpy decoders give
    /// (`tests/fixtures/gen_gguf_blocks.py`): the same multiplies and adds in the same
    /// order, so equality is exact.
    #[test]
    fn gguf_blocks_match_the_gguf_package() {
        let file = Gguf::open(&fixture()).unwrap();
        let mut seen = Vec::new();
        let decoded = |t: &&TensorInfo| !t.name.ends_with(".expected") && !t.name.starts_with("encode.");
        for t in file.tensors.iter().filter(decoded) {
            let want = file.read_f32(&format!("{}.expected", t.name)).unwrap();
            let got = file.read_f32(&t.name).unwrap();
            assert_eq!(t.shape(), [2, 512], "{}", t.name);
            assert_eq!(got.len(), want.len(), "{}", t.name);
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{} value {i}: {a} against the package's {b}",
                    t.kind.name()
                );
            }
            seen.push(t.kind);
        }
        use GgmlType::*;
        for kind in [F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4K, Q5K, Q6K] {
            assert!(seen.contains(&kind), "the fixture has no {}", kind.name());
        }
    }

    /// The 4-bit and int8 layouts taken straight from a file's blocks hold the values the
    /// `gguf` package decodes, bit for bit (Q4_0, Q4_1, Q4_K at 4 bits; Q8_0, Q4_0, Q5_0
    /// in int8; a zero's sign aside), and the types no layout of ours holds exactly, or a byte
    /// of -128, are refused; a Q4_0 block
    /// with a negative scale (which llama.cpp's rounding makes) flips its bytes' signs.
    #[test]
    fn blocks_taken_as_they_are_hold_the_decoded_values_exactly() {
        use rusting_brain_core::ops::{q4, q8};
        let file = Gguf::open(&fixture()).unwrap();
        let (mut to_q4, mut to_int8) = (Vec::new(), Vec::new());
        let decoded = |t: &&TensorInfo| !t.name.ends_with(".expected") && !t.name.starts_with("encode.");
        for t in file.tensors.iter().filter(decoded) {
            let want = file.read_f32(&format!("{}.expected", t.name)).unwrap();
            let bytes = file.raw(&t.name).unwrap();
            let (rows, cols) = (2, 512);
            let same = |got: Vec<f32>, r: usize, how: &str| {
                let want = &want[r * cols..(r + 1) * cols];
                // Bit for bit, but for the sign of a zero (Q4_0's `d (8 - 8)` is -0 under a
                // negative scale, `8 d - 8 d` +0: the same in every product).
                let bad = got
                    .iter()
                    .zip(want)
                    .position(|(a, b)| a.to_bits() != b.to_bits() && (*a != 0.0 || *b != 0.0));
                assert!(
                    bad.is_none(),
                    "{} {how} row {r} value {bad:?}: {:?} against {:?}",
                    t.kind.name(),
                    bad.map(|i| got[i]),
                    bad.map(|i| want[i])
                );
            };
            if let Some((p, s)) = t.kind.to_q4(bytes, rows, cols) {
                assert!(q4::is_q4(rows, cols, p.len(), s.len()));
                (0..rows).for_each(|r| same(q4::q4_dequantize_row(&p, &s, r, cols), r, "at 4 bits"));
                to_q4.push(t.kind);
            }
            if let Some((p, s)) = t.kind.to_int8(bytes, rows, cols) {
                assert_eq!(q8::q8_block("test", rows, cols, s.len()).unwrap(), 32);
                (0..rows).for_each(|r| same(q8::dequantize_row(&p, &s, r, cols), r, "in int8"));
                to_int8.push(t.kind);
            }
        }
        use GgmlType::*;
        to_q4.sort_by_key(|k| k.id());
        to_int8.sort_by_key(|k| k.id());
        assert_eq!(to_q4, [Q4_0, Q4_1, Q4K]);
        // The fixture's Q8_0 bytes are random and hold -128, which our symmetric int8 does
        // not take (that tensor is decoded and rounded); a block of -127..=127 is taken.
        assert_eq!(to_int8, [Q4_0, Q5_0]);
        let mut q8_block = half::f16::from_f32(0.375).to_le_bytes().to_vec();
        q8_block.extend((0..32).map(|i| (i * 8 - 127) as i8 as u8));
        let mut want = [0f32; 32];
        Q8_0.decode(&q8_block, &mut want);
        let (p, s) = Q8_0.to_int8(&q8_block, 1, 32).unwrap();
        assert_eq!(q8::dequantize_row(&p, &s, 0, 32), want);
        q8_block[5] = 0x80;
        assert!(Q8_0.to_int8(&q8_block, 1, 32).is_none());
        // A Q4_0 block with scale -0.5: bytes 0x08 (values 0 and 0 after the offset) and
        // 0xF1 (value 1 - 8 = -7 low, 15 - 8 = 7 high).
        let mut block = half::f16::from_f32(-0.5).to_le_bytes().to_vec();
        block.extend([0xF1u8].iter().chain(&[0x08u8; 15]));
        let mut want = [0f32; 32];
        Q4_0.decode(&block, &mut want);
        let (p, s) = Q4_0.to_int8(&block, 1, 32).unwrap();
        assert_eq!(s, [0.5]);
        let got = q8::dequantize_row(&p, &s, 0, 32);
        assert_eq!(got, want);
        assert_eq!((got[0], got[16]), (3.5, -3.5));
        let (p, s) = Q4_0.to_q4(&block, 1, 32).unwrap();
        let got = q4::q4_dequantize_row(&p, &s, 0, 32);
        assert_eq!(got, want);
        // Rows that are not whole blocks, or bytes that are not the rows', are not taken.
        assert!(Q4_0.to_q4(&block, 1, 16).is_none() && Q4_0.to_q4(&block[..17], 1, 32).is_none());
    }

    /// A GGUF 3 file: metadata `(key, type, value bytes)`, tensor infos `(name, dims,
    /// type, offset)` and the data after the header, aligned to 32.
    fn file(kv: &[(&str, u32, Vec<u8>)], tensors: &[(&str, &[u64], u32, u64)], data: &[u8]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend((tensors.len() as u64).to_le_bytes());
        b.extend((kv.len() as u64).to_le_bytes());
        let string = |b: &mut Vec<u8>, s: &str| {
            b.extend((s.len() as u64).to_le_bytes());
            b.extend(s.as_bytes());
        };
        for (k, t, v) in kv {
            string(&mut b, k);
            b.extend(t.to_le_bytes());
            b.extend(v);
        }
        for (name, dims, t, offset) in tensors {
            string(&mut b, name);
            b.extend((dims.len() as u32).to_le_bytes());
            for d in *dims {
                b.extend(d.to_le_bytes());
            }
            b.extend(t.to_le_bytes());
            b.extend(offset.to_le_bytes());
        }
        b.resize(b.len().div_ceil(32) * 32, 0);
        b.extend(data);
        b
    }

    /// A string value's bytes.
    fn text(s: &str) -> Vec<u8> {
        [&(s.len() as u64).to_le_bytes()[..], s.as_bytes()].concat()
    }

    /// A whole tiny Llama as a GGUF (one layer, d_model 4, one head of 4, d_ff 8, six
    /// tokens), F32, its metadata `kv` and its tensors `(name, dims)` with values.
    fn tiny_llama(kv: &[(&str, u32, Vec<u8>)], extra: &[(&str, &[u64])]) -> Vec<u8> {
        let mut names: Vec<(&str, Vec<u64>)> = vec![
            ("token_embd.weight", vec![4, 6]),
            ("output_norm.weight", vec![4]),
            ("blk.0.attn_norm.weight", vec![4]),
            ("blk.0.attn_q.weight", vec![4, 4]),
            ("blk.0.attn_k.weight", vec![4, 4]),
            ("blk.0.attn_v.weight", vec![4, 4]),
            ("blk.0.attn_output.weight", vec![4, 4]),
            ("blk.0.ffn_norm.weight", vec![4]),
            ("blk.0.ffn_gate.weight", vec![4, 8]),
            ("blk.0.ffn_up.weight", vec![4, 8]),
            ("blk.0.ffn_down.weight", vec![8, 4]),
        ];
        names.extend(extra.iter().map(|(n, d)| (*n, d.to_vec())));
        let (mut infos, mut data) = (Vec::new(), Vec::new());
        for (i, (name, dims)) in names.iter().enumerate() {
            let n: u64 = dims.iter().product();
            infos.push((*name, dims.as_slice(), 0u32, data.len() as u64));
            data.extend(
                (0..n).flat_map(|j| (0.1 * ((i as u64 * 7 + j * 3) % 11) as f32 - 0.4).to_le_bytes()),
            );
            data.resize(data.len().div_ceil(32) * 32, 0);
        }
        let mut meta = vec![
            ("general.architecture", 8u32, text("llama")),
            ("llama.embedding_length", 4, 4u32.to_le_bytes().to_vec()),
            ("llama.feed_forward_length", 4, 8u32.to_le_bytes().to_vec()),
            ("llama.block_count", 4, 1u32.to_le_bytes().to_vec()),
            ("llama.attention.head_count", 4, 1u32.to_le_bytes().to_vec()),
            ("llama.context_length", 4, 16u32.to_le_bytes().to_vec()),
            ("llama.attention.layer_norm_rms_epsilon", 6, 1e-5f32.to_le_bytes().to_vec()),
        ];
        for (k, t, v) in kv {
            match meta.iter_mut().find(|(key, _, _)| key == k) {
                Some(m) => *m = (k, *t, v.clone()),
                None => meta.push((k, *t, v.clone())),
            }
        }
        let infos: Vec<(&str, &[u64], u32, u64)> = infos;
        file(&meta, &infos, &data)
    }

    fn load_err(name: &str, bytes: &[u8]) -> String {
        let path = std::env::temp_dir().join(format!("rb_gguf_{}_{name}.gguf", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        let r = load(&path, crate::Precision::F32);
        let _ = std::fs::remove_file(&path);
        match r {
            Ok(_) => panic!("{name}: loaded"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_tiny_llama_loads_and_what_is_not_mapped_is_refused_by_key() {
        let path = std::env::temp_dir().join(format!("rb_gguf_{}_tiny.gguf", std::process::id()));
        std::fs::write(&path, tiny_llama(&[], &[])).unwrap();
        let (model, _) = load(&path, crate::Precision::Q8).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!((model.config.vocab_size, model.config.d_ff, model.config.n_layers), (6, 8, 1));
        assert!(model.config.tie_embeddings, "no output.weight: the head is the embedding");

        let e = load_err("arch", &tiny_llama(&[("general.architecture", 8, text("gpt2"))], &[]));
        assert!(e.contains("general.architecture: gpt2 is not an architecture this reader maps"), "{e}");
        let u32_le = |v: u32| v.to_le_bytes().to_vec();
        let e = load_err("experts", &tiny_llama(&[("llama.expert_count", 4, u32_le(8))], &[]));
        assert!(e.contains("blk.0.ffn_gate_exps.weight: missing"), "{e}");
        // Two experts stacked; a count of millions (the layout it would build) is refused.
        let stacked: &[(&str, &[u64])] = &[("blk.0.ffn_gate_exps.weight", &[4, 8, 2])];
        let e = load_err("millions", &tiny_llama(&[("llama.expert_count", 4, u32_le(1 << 24))], stacked));
        assert!(e.contains("llama.expert_count: 16777216, where blk.0.ffn_gate_exps.weight holds 2"), "{e}");
        let e = load_err("used", &tiny_llama(&[("llama.expert_count", 4, u32_le(2))], stacked));
        assert!(e.contains("llama.expert_used_count: missing, 0 or over the 2 experts"), "{e}");
        let sigmoid = [
            ("llama.expert_count", 4, u32_le(2)),
            ("llama.expert_used_count", 4, u32_le(2)),
            ("llama.expert_gating_func", 4, u32_le(2)),
        ];
        let e = load_err("sigmoid", &tiny_llama(&sigmoid, stacked));
        assert!(e.contains("llama.expert_gating_func: U32(2): only softmax routing"), "{e}");
        let e = load_err("qwen3moe", &tiny_llama(&[("general.architecture", 8, text("qwen3moe"))], &[]));
        assert!(e.contains("qwen3moe.expert_count: missing or 0"), "{e}");
        let count = 11_862_017u32.to_le_bytes().to_vec();
        let e = load_err("blocks", &tiny_llama(&[("llama.block_count", 4, count)], &[]));
        assert!(e.contains("llama.block_count: 11862017 blocks need at least"), "{e}");
        let e = load_err("heads", &tiny_llama(&[("llama.attention.head_count", 8, text("one"))], &[]));
        assert!(e.contains("llama.attention.head_count") && e.contains("not a whole number"), "{e}");
        let tokens =
            [&8u32.to_le_bytes()[..], &3u64.to_le_bytes(), &text("a"), &text("b"), &text("c")].concat();
        let e = load_err("vocab", &tiny_llama(&[("tokenizer.ggml.tokens", 9, tokens)], &[]));
        assert!(e.contains("tokenizer.ggml.tokens: 3 tokens, where the embedding has 6 rows"), "{e}");
        let e = load_err("yarn", &tiny_llama(&[("llama.rope.scaling.type", 8, text("yarn"))], &[]));
        assert!(e.contains("llama.rope.scaling.type"), "{e}");
        let e = load_err("freqs", &tiny_llama(&[], &[("rope_freqs.weight", &[2])]));
        assert!(e.contains("rope_freqs.weight: per-frequency RoPE factors"), "{e}");
        let e = load_err("extra", &tiny_llama(&[], &[("blk.0.attn_q.bias", &[4])]));
        assert!(e.contains("blk.0.attn_q.bias: this tensor is not part of the model"), "{e}");
    }

    /// A SentencePiece vocabulary whose scores are missing, short, not numbers or not
    /// finite is refused naming the key; a whole one rebuilds.
    #[test]
    fn a_sentencepiece_vocabulary_without_sound_scores_is_refused_by_key() {
        let array = |elem: u32, items: Vec<Vec<u8>>| -> Vec<u8> {
            let head = [&elem.to_le_bytes()[..], &(items.len() as u64).to_le_bytes()].concat();
            [head, items.concat()].concat()
        };
        let tokens = array(8, ["<unk>", "<s>", "</s>", "\u{2581}a", "\u{2581}", "a"].map(text).to_vec());
        let types = array(5, [2i32, 3, 3, 1, 1, 1].map(|t| t.to_le_bytes().to_vec()).to_vec());
        let scores = |v: &[f32]| array(6, v.iter().map(|x| x.to_le_bytes().to_vec()).collect());
        let tokenizer = |name: &str, scores: Option<Vec<u8>>| -> std::result::Result<String, String> {
            let mut kv = vec![
                ("tokenizer.ggml.model", 8u32, text("llama")),
                ("tokenizer.ggml.tokens", 9, tokens.clone()),
                ("tokenizer.ggml.token_type", 9, types.clone()),
            ];
            kv.extend(scores.map(|s| ("tokenizer.ggml.scores", 9, s)));
            let path = std::env::temp_dir().join(format!("rb_gguf_{}_spm_{name}.gguf", std::process::id()));
            std::fs::write(&path, tiny_llama(&kv, &[])).unwrap();
            let r = tokenizer_json(&path).map_err(|e| e.to_string());
            let _ = std::fs::remove_file(&path);
            r
        };
        let json = tokenizer("whole", Some(scores(&[0.0, 0.0, 0.0, -1.0, -2.0, -3.0]))).unwrap();
        let tok: tokenizers::Tokenizer = json.parse().unwrap();
        assert_eq!(tok.encode("a a", false).unwrap().get_ids(), [3, 3]);
        let e = tokenizer("missing", None).unwrap_err();
        assert!(e.contains("tokenizer.ggml.scores: missing"), "{e}");
        let e = tokenizer("short", Some(scores(&[0.0, 1.0]))).unwrap_err();
        assert!(e.contains("tokenizer.ggml.scores: 2 scores for 6 tokens"), "{e}");
        let e = tokenizer("nan", Some(scores(&[0.0, 0.0, 0.0, f32::NAN, -2.0, -3.0]))).unwrap_err();
        assert!(e.contains("tokenizer.ggml.scores: holds a value that is not a finite number"), "{e}");
        let e = tokenizer("text", Some(array(8, vec![text("x"); 6]))).unwrap_err();
        assert!(e.contains("tokenizer.ggml.scores: holds a value that is not a finite number"), "{e}");
    }

    fn open_bytes(name: &str, bytes: &[u8]) -> Result<Gguf> {
        let path = std::env::temp_dir().join(format!("rb_gguf_{}_{name}.gguf", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        let r = Gguf::open(&path);
        let _ = std::fs::remove_file(&path);
        r
    }

    fn err(name: &str, bytes: &[u8]) -> String {
        match open_bytes(name, bytes) {
            Ok(_) => panic!("{name}: opened"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn bad_files_are_errors_naming_the_key_or_tensor() {
        let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let arch = ("general.architecture", 8u32, [&4u64.to_le_bytes()[..], b"test"].concat());
        let good = file(std::slice::from_ref(&arch), &[("w", &[2, 2], 0, 0)], &f32s(&[1.0, 2.0, 3.0, 4.0]));
        let g = open_bytes("good", &good).unwrap();
        assert_eq!(g.get("general.architecture").and_then(Meta::as_str), Some("test"));
        assert_eq!(g.read_f32("w").unwrap(), [1.0, 2.0, 3.0, 4.0]);
        assert!(g.read_f32("v").unwrap_err().to_string().contains("no tensor"));

        // Every cut of the file short of its end is an error, never a panic.
        for cut in 0..good.len() {
            assert!(open_bytes("cut", &good[..cut]).is_err(), "a file cut at {cut} bytes opened");
        }
        assert!(err("magic", b"GGUX\x03\0\0\0").contains("not a GGUF file"));
        let mut v4 = good.clone();
        v4[4] = 4;
        assert!(err("version", &v4).contains("version 4"));
        // Counts that cannot fit in the file are refused before anything is allocated.
        let mut lying = good.clone();
        lying[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(err("tensor count", &lying).contains("tensor_count"));
        let array = [&4u32.to_le_bytes()[..], &u64::MAX.to_le_bytes()].concat();
        let e = err("array", &file(&[("tokens", 9, array)], &[], &[]));
        assert!(e.contains("tokens") && e.contains("do not fit"), "{e}");
        let e = err("value type", &file(&[("k", 13, vec![0; 8])], &[], &[]));
        assert!(e.contains("k: unknown value type 13"), "{e}");
        // Tensors: past the data, misaligned, an unknown type, rows not whole blocks.
        let e = err("past", &file(std::slice::from_ref(&arch), &[("w", &[2, 3], 0, 0)], &f32s(&[1.0; 4])));
        assert!(e.contains("w: its 24 bytes at offset 0 run past the end"), "{e}");
        let e = err("aligned", &file(&[], &[("w", &[1], 0, 4)], &f32s(&[1.0; 4])));
        assert!(e.contains("not a multiple of the alignment"), "{e}");
        let e = err("type", &file(&[], &[("w", &[256], 10, 0)], &[0; 84]));
        assert!(e.contains("w: ggml type 10 (Q2_K)"), "{e}");
        let e = err("blocks", &file(&[], &[("w", &[16, 2], 8, 0)], &[0; 68]));
        assert!(e.contains("do not hold whole Q8_0 blocks"), "{e}");
        let e = err("dims", &file(&[], &[("w", &[1, 1, 1, 1, 1], 0, 0)], &[0; 4]));
        assert!(e.contains("5 dimensions"), "{e}");
        let nan = open_bytes("nan", &file(&[], &[("w", &[2], 0, 0)], &f32s(&[1.0, f32::NAN]))).unwrap();
        assert!(nan.read_f32("w").unwrap_err().to_string().contains("NaN"));
    }
}

//! GGUF files, llama.cpp's model format: the reader (version 2 and 3: the metadata, the
//! alignment, the tensor infos) and the block formats of its tensors decoded to f32
//! ([`blocks`]). Every count, length and offset is checked against the file's size before
//! anything is allocated for it, so a truncated or lying file is an error naming the key or
//! tensor, never a huge allocation or a panic. Tensors are read through a memory map, one at
//! a time, as the Hugging Face loader reads safetensors.

pub(crate) mod blocks;
mod lm;
mod tokenizer;
mod write;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::{NetworkError, Result};
pub(crate) use blocks::GgmlType;
pub(crate) use lm::load;
pub(crate) use write::save;

/// The tokenizer a GGUF file carries (`tokenizer.ggml.*`: byte-level BPE with the
/// pre-tokenizer the file names) as the text of a Hugging Face `tokenizer.json`, which
/// `tokenizers::Tokenizer::from_str` loads: this crate ships no tokenizer of its own. A
/// tokenizer this rebuild does not cover (SentencePiece, an unknown pre-tokenizer) is an
/// error naming the key.
pub fn tokenizer_json(path: impl AsRef<Path>) -> Result<String> {
    tokenizer::tokenizer_json(&Gguf::open(path.as_ref())?)
}

/// A chat template's source, if the file has one, and the texts of its special tokens
/// (`bos_token`, `eos_token`, `unk_token`, `pad_token`).
pub(crate) type TemplateParts = (Option<String>, Vec<(&'static str, String)>);

/// The file's chat template and special tokens, what `ChatTemplate::from_gguf` reads.
pub(crate) fn chat_template(path: &Path) -> Result<TemplateParts> {
    let file = Gguf::open(path)?;
    let specials = [
        ("bos_token", "tokenizer.ggml.bos_token_id"),
        ("eos_token", "tokenizer.ggml.eos_token_id"),
        ("unk_token", "tokenizer.ggml.unknown_token_id"),
        ("pad_token", "tokenizer.ggml.padding_token_id"),
    ];
    let specials =
        specials.iter().filter_map(|(n, k)| Some((*n, tokenizer::special_text(&file, k)?))).collect();
    Ok((tokenizer::chat_template(&file)?, specials))
}

/// The ids that end a reply (`tokenizer.ggml.eos_token_id`, and the end-of-turn and
/// end-of-message ids where the file names them), the start id and the padding id.
pub(crate) fn special_ids(path: &Path) -> Result<(Vec<u32>, Option<u32>, Option<u32>)> {
    let file = Gguf::open(path)?;
    let id = |key: &str| -> Result<Option<u32>> {
        match file.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| file.err(key, format!("{v:?} is not a token id"))),
        }
    };
    let mut eos = Vec::new();
    for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        if let Some(i) = id(key)?.filter(|i| !eos.contains(i)) {
            eos.push(i);
        }
    }
    Ok((eos, id("tokenizer.ggml.bos_token_id")?, id("tokenizer.ggml.padding_token_id")?))
}

/// The bytes every GGUF file starts with.
const MAGIC: &[u8; 4] = b"GGUF";
/// The alignment of the tensor data when `general.alignment` does not say.
const DEFAULT_ALIGNMENT: u64 = 32;
/// The most dimensions a ggml tensor has.
const MAX_DIMS: u32 = 4;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Meta {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Meta>),
}

impl Meta {
    /// The value as a non-negative whole number, whatever its integer type.
    pub(crate) fn as_u64(&self) -> Option<u64> {
        match *self {
            Meta::U8(v) => Some(v as u64),
            Meta::U16(v) => Some(v as u64),
            Meta::U32(v) => Some(v as u64),
            Meta::U64(v) => Some(v),
            Meta::I8(v) => u64::try_from(v).ok(),
            Meta::I16(v) => u64::try_from(v).ok(),
            Meta::I32(v) => u64::try_from(v).ok(),
            Meta::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
    /// The value as a float, from a float or an integer type.
    pub(crate) fn as_f64(&self) -> Option<f64> {
        match *self {
            Meta::F32(v) => Some(v as f64),
            Meta::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }
    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Meta::Str(s) => Some(s),
            _ => None,
        }
    }
    pub(crate) fn as_array(&self) -> Option<&[Meta]> {
        match self {
            Meta::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// Where a tensor's data lies and how it is stored.
#[derive(Debug, Clone)]
pub(crate) struct TensorInfo {
    pub(crate) name: String,
    /// ggml's order: the fastest-varying dimension first (a `(rows, cols)` matrix is
    /// `[cols, rows]`).
    pub(crate) dims: Vec<usize>,
    pub(crate) kind: GgmlType,
    /// From the start of the data section.
    offset: usize,
    /// Values and bytes, checked against the file when it was opened.
    pub(crate) values: usize,
    bytes: usize,
}

impl TensorInfo {
    /// The shape as Hugging Face and numpy write it: the slowest dimension first.
    pub(crate) fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().copied().collect()
    }
}

/// An opened GGUF file: its metadata and tensor infos read and checked, the tensors read
/// on demand.
pub(crate) struct Gguf {
    pub(crate) path: PathBuf,
    map: Mmap,
    meta: Vec<(String, Meta)>,
    index: HashMap<String, usize>,
    pub(crate) tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    data: usize,
}

/// A cursor over the header, every read checked against what is left.
struct Cursor<'a> {
    path: &'a Path,
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn err(&self, what: &str, message: impl Into<String>) -> NetworkError {
        NetworkError::parse(self.path, what, message)
    }
    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.left() {
            return Err(self.err(
                what,
                format!(
                    "needs {n} bytes at offset {}, but the file ends {} bytes later",
                    self.at,
                    self.left()
                ),
            ));
        }
        let s = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }
    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        Ok(self.take(N, what)?.try_into().expect("took N bytes"))
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    /// A count of things at least `min_bytes` each, which must fit in what is left.
    fn count(&mut self, what: &str, min_bytes: usize) -> Result<usize> {
        let n = self.u64(what)?;
        let fits = usize::try_from(n).ok().filter(|&n| n.saturating_mul(min_bytes.max(1)) <= self.left());
        fits.ok_or_else(|| {
            self.err(
                what,
                format!(
                    "{n} entries of at least {min_bytes} bytes do not fit in the {} bytes left",
                    self.left()
                ),
            )
        })
    }
    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.count(what, 1)?;
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| self.err(what, "a string that is not UTF-8"))
    }
    /// A value of type `t` (GGUF's `gguf_type` numbering).
    fn value(&mut self, t: u32, what: &str, depth: usize) -> Result<Meta> {
        Ok(match t {
            0 => Meta::U8(self.array::<1>(what)?[0]),
            1 => Meta::I8(self.array::<1>(what)?[0] as i8),
            2 => Meta::U16(u16::from_le_bytes(self.array(what)?)),
            3 => Meta::I16(i16::from_le_bytes(self.array(what)?)),
            4 => Meta::U32(self.u32(what)?),
            5 => Meta::I32(i32::from_le_bytes(self.array(what)?)),
            6 => Meta::F32(f32::from_le_bytes(self.array(what)?)),
            7 => match self.array::<1>(what)?[0] {
                0 => Meta::Bool(false),
                1 => Meta::Bool(true),
                b => return Err(self.err(what, format!("a bool of value {b}"))),
            },
            8 => Meta::Str(self.string(what)?),
            9 => {
                if depth > 0 {
                    return Err(self.err(what, "an array of arrays (llama.cpp writes none)"));
                }
                let inner = self.u32(what)?;
                let size = match inner {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    _ => return Err(self.err(what, format!("an array of unknown value type {inner}"))),
                };
                let n = self.count(what, size)?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(inner, what, depth + 1)?);
                }
                Meta::Array(items)
            }
            10 => Meta::U64(self.u64(what)?),
            11 => Meta::I64(i64::from_le_bytes(self.array(what)?)),
            12 => Meta::F64(f64::from_le_bytes(self.array(what)?)),
            _ => return Err(self.err(what, format!("unknown value type {t}"))),
        })
    }
}

impl Gguf {
    /// Opens `path` and reads its header: the magic, the version (2 or 3), the metadata and
    /// the tensor infos, each tensor's type, size and offset checked against the file.
    pub(crate) fn open(path: &Path) -> Result<Gguf> {
        let file = std::fs::File::open(path).map_err(|e| NetworkError::io(path, e))?;
        // SAFETY: the map is read only; a file changed under it while it is read is the
        // same hazard the safetensors loader accepts (documented there).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| NetworkError::io(path, e))?;
        let mut c = Cursor { path, bytes: &map, at: 0 };
        if c.take(4, "magic").ok() != Some(MAGIC.as_slice()) {
            return Err(c.err("magic", "not a GGUF file (it does not start with \"GGUF\")"));
        }
        let version = c.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(c.err("version", format!("version {version}; this reader reads GGUF 2 and 3")));
        }
        // A tensor info is at least a name length, a dimension count, a type and an offset.
        let n_tensors = c.count("tensor_count", 8 + 4 + 4 + 8)?;
        let n_meta = c.count("metadata_kv_count", 8 + 4)?;
        let mut meta = Vec::with_capacity(n_meta);
        let mut index = HashMap::new();
        for i in 0..n_meta {
            let key = c.string(&format!("metadata key {i}"))?;
            let t = c.u32(&key)?;
            let value = c.value(t, &key, 0)?;
            if index.insert(key.clone(), meta.len()).is_some() {
                return Err(c.err(&key, "this key is written twice"));
            }
            meta.push((key, value));
        }
        let alignment = match meta.iter().find(|(k, _)| k == "general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some((k, v)) => v
                .as_u64()
                .filter(|a| a.is_power_of_two())
                .ok_or_else(|| c.err(k, format!("{v:?} is not a power of two")))?,
        };
        let mut tensors = Vec::with_capacity(n_tensors);
        let mut tensor_index = HashMap::new();
        for i in 0..n_tensors {
            let name = c.string(&format!("tensor info {i}"))?;
            let n_dims = c.u32(&name)?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(c.err(&name, format!("{n_dims} dimensions (ggml tensors have 1 to {MAX_DIMS})")));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                let d = c.u64(&name)?;
                dims.push(usize::try_from(d).map_err(|_| c.err(&name, format!("a dimension of {d}")))?);
            }
            let kind = GgmlType::from_id(c.u32(&name)?).map_err(|m| c.err(&name, m))?;
            let offset = c.u64(&name)?;
            let values = dims
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .ok_or_else(|| c.err(&name, format!("dimensions {dims:?} overflow")))?;
            let bytes = kind.bytes_of(dims[0], values).map_err(|m| c.err(&name, m))?;
            let offset = usize::try_from(offset)
                .ok()
                .filter(|o| (*o as u64).is_multiple_of(alignment))
                .ok_or_else(|| {
                    c.err(&name, format!("offset {offset} is not a multiple of the alignment {alignment}"))
                })?;
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(c.err(&name, "two tensors have this name"));
            }
            tensors.push(TensorInfo { name, dims, kind, offset, values, bytes });
        }
        let data = (c.at as u64).div_ceil(alignment) * alignment;
        let data =
            usize::try_from(data).map_err(|_| c.err("tensor data", "starts past the address space"))?;
        let room = map.len().saturating_sub(data);
        for t in &tensors {
            if t.offset.checked_add(t.bytes).is_none_or(|end| end > room) {
                return Err(NetworkError::parse(
                    path,
                    &t.name,
                    format!(
                        "its {} bytes at offset {} run past the end of the data ({room} bytes)",
                        t.bytes, t.offset
                    ),
                ));
            }
        }
        Ok(Gguf { path: path.to_path_buf(), map, meta, index, tensors, tensor_index, data })
    }

    /// The metadata value of `key`.
    pub(crate) fn get(&self, key: &str) -> Option<&Meta> {
        self.index.get(key).map(|&i| &self.meta[i].1)
    }

    /// An error about `what` (a key or a tensor) of this file.
    pub(crate) fn err(&self, what: &str, message: impl Into<String>) -> NetworkError {
        NetworkError::parse(&self.path, what, message)
    }

    /// The tensor info of `name`.
    pub(crate) fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The stored bytes of the tensor `name`, as the file holds them.
    pub(crate) fn raw(&self, name: &str) -> Option<&[u8]> {
        let t = self.tensor(name)?;
        Some(&self.map[self.data + t.offset..self.data + t.offset + t.bytes])
    }

    /// The tensor `name` decoded to f32 in ggml's order (row-major over [`TensorInfo::shape`]);
    /// a NaN or infinity in it is an error. Its pages of the file are handed back after
    /// (they stay in the page cache): a tensor is read once.
    pub(crate) fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        self.read_f32_part(name, 0, 1)
    }

    /// Slab `part` of `parts` equal slabs along the tensor's slowest dimension, decoded to
    /// f32: one expert's matrix of a stacked `[experts, rows, cols]` tensor. Rows hold
    /// whole blocks (checked when the file was opened), so a slab is whole rows of bytes.
    pub(crate) fn read_f32_part(&self, name: &str, part: usize, parts: usize) -> Result<Vec<f32>> {
        let t = self.tensor(name).ok_or_else(|| self.err(name, "no tensor of this name"))?;
        let slowest = t.dims.last().copied().unwrap_or(1);
        if parts == 0 || part >= parts || !slowest.is_multiple_of(parts) {
            return Err(self.err(name, format!("its {slowest} outer rows do not split into {parts} parts")));
        }
        let all = self.raw(name).expect("the tensor is there");
        let (values, size) = (t.values / parts, t.bytes / parts);
        let bytes = &all[part * size..(part + 1) * size];
        let mut out = vec![0f32; values];
        t.kind.decode(bytes, &mut out);
        // Each tensor is read once: its pages leave this process's memory.
        crate::io::weights::release(&self.map, bytes);
        if out.iter().any(|v| !v.is_finite()) {
            return Err(self.err(name, "holds NaN or infinite values"));
        }
        Ok(out)
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

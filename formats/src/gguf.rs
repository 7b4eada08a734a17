//! GGUF, llama.cpp's model format: the reader (version 2 and 3: the metadata, the
//! alignment, the tensor infos), the block formats of its tensors ([`blocks`]), the
//! metadata as the Hugging Face files a folder of the model would have ([`model`],
//! [`tokenizer`]). Every count, length and offset is checked against the file's size
//! before anything is allocated for it, so a truncated or lying file is an error naming the
//! key or tensor, never a huge allocation or a panic.

pub mod blocks;
pub mod model;
pub mod tokenizer;

use std::collections::HashMap;

use crate::{FormatError, Result};
pub use blocks::GgmlType;

/// Whether `bytes` start as a GGUF file does.
pub fn is_gguf(bytes: &[u8]) -> bool {
    bytes.starts_with(MAGIC)
}

/// The bytes every GGUF file starts with.
const MAGIC: &[u8; 4] = b"GGUF";
/// The alignment of the tensor data when `general.alignment` does not say.
const DEFAULT_ALIGNMENT: u64 = 32;
/// The most dimensions a ggml tensor has.
const MAX_DIMS: u32 = 4;

/// A metadata value, one variant per GGUF value type (`gguf_type`), named as it is.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum Meta {
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
    pub fn as_u64(&self) -> Option<u64> {
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
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Meta::F32(v) => Some(v as f64),
            Meta::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }
    /// The value as a boolean, if it is one.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Meta::Bool(b) => Some(b),
            _ => None,
        }
    }
    /// The value as a string, if it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Meta::Str(s) => Some(s),
            _ => None,
        }
    }
    /// The value as an array, if it is one.
    pub fn as_array(&self) -> Option<&[Meta]> {
        match self {
            Meta::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// Where a tensor's data lies and how it is stored.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    /// llama.cpp's name of it (`blk.0.attn_q.weight`).
    pub name: String,
    /// ggml's order: the fastest-varying dimension first (a `(rows, cols)` matrix is
    /// `[cols, rows]`).
    pub dims: Vec<usize>,
    /// How its values are stored.
    pub kind: GgmlType,
    /// From the start of the data section.
    pub offset: usize,
    /// Values, checked against the file when it was parsed.
    pub values: usize,
    /// Bytes stored, checked against the file when it was parsed.
    pub bytes: usize,
}

impl TensorInfo {
    /// The shape as Hugging Face and numpy write it: the slowest dimension first.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().copied().collect()
    }
}

/// A GGUF file's bytes with its metadata and tensor infos read and checked; the tensors
/// are decoded on demand. `D` is whatever holds the bytes: a memory map natively, a
/// `Vec<u8>` in the browser.
pub struct Gguf<D> {
    bytes: D,
    meta: Vec<(String, Meta)>,
    index: HashMap<String, usize>,
    /// The tensor infos in the file's order.
    pub tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    data: usize,
}

/// A cursor over the header, every read checked against what is left.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn err(&self, what: &str, message: impl Into<String>) -> FormatError {
        FormatError::new(what, message)
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

impl<D: AsRef<[u8]>> Gguf<D> {
    /// Reads the header of the file in `bytes`: the magic, the version (2 or 3), the
    /// metadata and the tensor infos, each tensor's type, size and offset checked against
    /// the file.
    pub fn parse(bytes: D) -> Result<Gguf<D>> {
        let all = bytes.as_ref();
        let mut c = Cursor { bytes: all, at: 0 };
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
            let size = kind.bytes_of(dims[0], values).map_err(|m| c.err(&name, m))?;
            let offset = usize::try_from(offset)
                .ok()
                .filter(|o| (*o as u64).is_multiple_of(alignment))
                .ok_or_else(|| {
                    c.err(&name, format!("offset {offset} is not a multiple of the alignment {alignment}"))
                })?;
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(c.err(&name, "two tensors have this name"));
            }
            tensors.push(TensorInfo { name, dims, kind, offset, values, bytes: size });
        }
        let data = (c.at as u64).div_ceil(alignment) * alignment;
        let data =
            usize::try_from(data).map_err(|_| c.err("tensor data", "starts past the address space"))?;
        let room = all.len().saturating_sub(data);
        for t in &tensors {
            if t.offset.checked_add(t.bytes).is_none_or(|end| end > room) {
                return Err(FormatError::new(
                    &t.name,
                    format!(
                        "its {} bytes at offset {} run past the end of the data ({room} bytes)",
                        t.bytes, t.offset
                    ),
                ));
            }
        }
        Ok(Gguf { bytes, meta, index, tensors, tensor_index, data })
    }

    /// What holds the file's bytes.
    pub fn bytes(&self) -> &D {
        &self.bytes
    }

    /// The metadata value of `key`.
    pub fn get(&self, key: &str) -> Option<&Meta> {
        self.index.get(key).map(|&i| &self.meta[i].1)
    }

    /// Every metadata key and value, in the file's order.
    pub fn meta(&self) -> &[(String, Meta)] {
        &self.meta
    }

    /// The tensor info of `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The stored bytes of the tensor `name`, as the file holds them.
    pub fn raw(&self, name: &str) -> Option<&[u8]> {
        let t = self.tensor(name)?;
        Some(&self.bytes.as_ref()[self.data + t.offset..self.data + t.offset + t.bytes])
    }

    /// The stored bytes of slab `part` of `parts` equal slabs along the tensor's slowest
    /// dimension: one expert's matrix of a stacked `[experts, rows, cols]` tensor. Rows
    /// hold whole blocks (checked when the file was parsed), so a slab is whole rows.
    pub fn part_bytes(&self, name: &str, part: usize, parts: usize) -> Result<&[u8]> {
        let t = self.tensor(name).ok_or_else(|| FormatError::new(name, "no tensor of this name"))?;
        let slowest = t.dims.last().copied().unwrap_or(1);
        if parts == 0 || part >= parts || !slowest.is_multiple_of(parts) {
            return Err(FormatError::new(
                name,
                format!("its {slowest} outer rows do not split into {parts} parts"),
            ));
        }
        let all = self.raw(name).ok_or_else(|| FormatError::new(name, "no tensor of this name"))?;
        let size = t.bytes / parts;
        Ok(&all[part * size..(part + 1) * size])
    }

    /// The tensor `name` decoded to f32 in ggml's order (row-major over
    /// [`TensorInfo::shape`]); a NaN or infinity in it is an error.
    pub fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        self.read_f32_part(name, 0, 1)
    }

    /// Slab `part` of `parts` (see [`Gguf::part_bytes`]) decoded to f32.
    pub fn read_f32_part(&self, name: &str, part: usize, parts: usize) -> Result<Vec<f32>> {
        let bytes = self.part_bytes(name, part, parts)?;
        let t = self.tensor(name).ok_or_else(|| FormatError::new(name, "no tensor of this name"))?;
        let mut out = vec![0f32; t.values / parts];
        t.kind.decode(bytes, &mut out);
        if out.iter().any(|v| !v.is_finite()) {
            return Err(FormatError::new(name, "holds NaN or infinite values"));
        }
        Ok(out)
    }

    /// The file's tokenizer (`tokenizer.ggml.*`: byte-level BPE with the pre-tokenizer the
    /// file names) as the text of a Hugging Face `tokenizer.json`, which
    /// `tokenizers::Tokenizer::from_str` loads. A tokenizer this rebuild does not cover
    /// (SentencePiece, an unknown pre-tokenizer) is an error naming the key.
    pub fn tokenizer_json(&self) -> Result<String> {
        tokenizer::tokenizer_json(self)
    }

    /// The file's chat template (`tokenizer.chat_template`), if it has one.
    pub fn chat_template(&self) -> Result<Option<String>> {
        match self.get("tokenizer.chat_template") {
            None => Ok(None),
            Some(Meta::Str(s)) => Ok(Some(s.clone())),
            Some(_) => Err(FormatError::new("tokenizer.chat_template", "is not a string")),
        }
    }

    /// The texts of the special tokens a chat template may name (`bos_token`,
    /// `eos_token`, `unk_token`, `pad_token`), where the file has them.
    pub fn special_texts(&self) -> Vec<(&'static str, String)> {
        let specials = [
            ("bos_token", "tokenizer.ggml.bos_token_id"),
            ("eos_token", "tokenizer.ggml.eos_token_id"),
            ("unk_token", "tokenizer.ggml.unknown_token_id"),
            ("pad_token", "tokenizer.ggml.padding_token_id"),
        ];
        specials.iter().filter_map(|(n, k)| Some((*n, self.token_text(k)?))).collect()
    }

    /// The text of the token whose id `key` holds (`tokenizer.ggml.eos_token_id`...).
    fn token_text(&self, key: &str) -> Option<String> {
        let id = usize::try_from(self.get(key)?.as_u64()?).ok()?;
        self.get("tokenizer.ggml.tokens")?.as_array()?.get(id)?.as_str().map(str::to_string)
    }

    /// The ids that end a reply (`tokenizer.ggml.eos_token_id`, and the end-of-turn and
    /// end-of-message ids where the file names them), the start id and the padding id.
    pub fn special_ids(&self) -> Result<(Vec<u32>, Option<u32>, Option<u32>)> {
        let id = |key: &str| -> Result<Option<u32>> {
            match self.get(key) {
                None => Ok(None),
                Some(v) => v
                    .as_u64()
                    .and_then(|x| u32::try_from(x).ok())
                    .map(Some)
                    .ok_or_else(|| FormatError::new(key, format!("{v:?} is not a token id"))),
            }
        };
        let mut eos = Vec::new();
        for key in
            ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"]
        {
            if let Some(i) = id(key)?.filter(|i| !eos.contains(i)) {
                eos.push(i);
            }
        }
        Ok((eos, id("tokenizer.ggml.bos_token_id")?, id("tokenizer.ggml.padding_token_id")?))
    }
}

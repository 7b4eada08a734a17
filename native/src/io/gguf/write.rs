//! A model out as a GGUF file llama.cpp reads: llama.cpp's names, its metadata keys, the
//! query and key rows interleaved as its converter interleaves them for Llama-family
//! models, and the tokenizer and chat template the model came with. F32, or every matrix
//! whose rows hold whole blocks in Q8_0, Q4_0 or Q4_K (Q5_0 for rows that are not whole
//! super-blocks), rounded as llama.cpp's `quantize_row_*_ref` round (f16 scales by round to
//! nearest even, the same float order): the bytes `llama-quantize` writes from the same
//! f32 values. Norms (and rows that are not whole blocks) stay F32; in 4-bit files the
//! embedding and the head are Q8_0, as llama.cpp's 4-bit files of these models keep them.

use std::io::Write;
use std::path::Path;

use half::f16;
use rusting_brain_core::models::transformer::{TransformerConfig, TransformerModel};
use rusting_brain_core::RopeScaling;

use super::{GgmlType, Gguf, Meta};
use crate::backend::cpu::CpuBackend;
use crate::io::hf::{Family, Origin};
use crate::{NetworkError, Precision, Result};
use rusting_brain_formats::gguf::model::{gguf_place, rotary_heads, rotary_rows};

const ALIGNMENT: usize = 32;

/// The tokenizer metadata to write (`tokenizer.*` keys), from the GGUF file or the folder
/// the model came from.
fn tokenizer_keys(origin: Option<&Origin>) -> Result<Vec<(String, Meta)>> {
    let source = origin.map(|o| o.source());
    let Some(source) = source else {
        return Err(NetworkError::InvalidInput(
            "save_gguf: the model came from no file with a tokenizer (from_gguf or from_pretrained); llama.cpp needs one in the file".into(),
        ));
    };
    if source.is_file() {
        let file = Gguf::open(source)?;
        let keys: Vec<(String, Meta)> =
            file.meta().iter().filter(|(k, _)| k.starts_with("tokenizer.")).cloned().collect();
        if keys.is_empty() {
            return Err(
                file.err("tokenizer.ggml.model", "missing: the file the model came from has no tokenizer")
            );
        }
        return Ok(keys);
    }
    super::folder::from_folder(source)
}

/// llama.cpp's architecture name for a model of `family`.
fn arch_of(family: Family) -> Result<&'static str> {
    match family {
        Family::Llama | Family::Mistral => Ok("llama"),
        Family::Qwen2 => Ok("qwen2"),
        Family::Qwen3 => Ok("qwen3"),
        Family::Mixtral => Ok("llama"),
        Family::Qwen3Moe => Ok("qwen3moe"),
        other => Err(NetworkError::InvalidInput(format!(
            "save_gguf: {other:?} has no GGUF architecture that computes it (a shared expert)"
        ))),
    }
}

/// The metadata llama.cpp reads for `arch`.
fn model_keys(c: &TransformerConfig, arch: &str, file_type: u32) -> Result<Vec<(String, Meta)>> {
    let k = |s: &str| format!("{arch}.{s}");
    let u = |v: usize| Meta::U32(v as u32);
    let mut m = vec![
        ("general.architecture".to_string(), Meta::Str(arch.into())),
        ("general.file_type".to_string(), Meta::U32(file_type)),
        ("general.quantization_version".to_string(), Meta::U32(2)),
        (k("context_length"), u(c.max_seq_len)),
        (k("embedding_length"), u(c.d_model)),
        (k("block_count"), u(c.n_layers)),
        (k("feed_forward_length"), u(c.d_ff)),
        (k("attention.head_count"), u(c.q_heads)),
        (k("attention.head_count_kv"), u(c.kv_heads)),
        (k("attention.key_length"), u(c.head_dim)),
        (k("attention.value_length"), u(c.head_dim)),
        (k("attention.layer_norm_rms_epsilon"), Meta::F32(c.norm_eps)),
        (k("rope.freq_base"), Meta::F32(c.rope_theta)),
        (k("rope.dimension_count"), u(c.head_dim)),
        (k("vocab_size"), u(c.vocab_size)),
    ];
    if let Some(moe) = &c.moe {
        // llama.cpp routes every block of these architectures, softmax then the top k
        // renormalized: a model that routes otherwise would compute something else there.
        if moe.layers.len() != c.n_layers || !moe.renormalize || moe.shared_expert {
            return Err(NetworkError::InvalidInput(
                "save_gguf: llama.cpp's mixtures of experts route every block and renormalize the top-k weights, with no shared expert; this model does not".into(),
            ));
        }
        if arch == "llama" && moe.expert_d_ff != c.d_ff {
            return Err(NetworkError::InvalidInput(format!(
                "save_gguf: Mixtral's experts are as wide as its feed-forward length ({}), not {}",
                c.d_ff, moe.expert_d_ff
            )));
        }
        m.push((k("expert_count"), u(moe.n_experts)));
        m.push((k("expert_used_count"), u(moe.top_k)));
        if arch != "llama" {
            m.push((k("expert_feed_forward_length"), u(moe.expert_d_ff)));
        }
    }
    match c.rope_scaling {
        RopeScaling::None => {}
        RopeScaling::Linear { factor } => {
            m.push((k("rope.scaling.type"), Meta::Str("linear".into())));
            m.push((k("rope.scaling.factor"), Meta::F32(factor)));
        }
        other => {
            return Err(NetworkError::InvalidInput(format!(
                "save_gguf: RoPE scaling {other:?} is not written as GGUF yet (llama.cpp keeps Llama 3's as a rope_freqs tensor)"
            )))
        }
    }
    Ok(m)
}

/// The tensor types [`crate::TransformerLm::save_gguf_as`] writes a model's matrices in.
/// Norms and biases are F32 in every file, and so is a matrix whose rows are not whole
/// blocks of 32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgufType {
    /// F32 throughout (`save_gguf(path, Precision::F32)`).
    F32,
    /// Q8_0 (`Precision::Q8`).
    Q8_0,
    /// Q4_0, the embedding and the output head Q8_0 (`Precision::Q4`).
    Q4_0,
    /// Q4_K where a row holds whole 256-value super-blocks and Q5_0 where it does not
    /// (llama.cpp's own fallback for such rows), the embedding and the output head Q8_0:
    /// llama.cpp's `Q4_K_S` without its per-tensor choices, rounded as `llama-quantize`
    /// rounds (the same bytes). Better than Q4_0 at about the same size where rows are
    /// whole super-blocks (widths 256, 512, ..., 4096).
    Q4K,
}

impl GgufType {
    /// The type of `precision`'s file.
    pub fn of(precision: Precision) -> GgufType {
        match precision {
            Precision::F32 => GgufType::F32,
            Precision::Q8 => GgufType::Q8_0,
            Precision::Q4 => GgufType::Q4_0,
        }
    }
    /// llama.cpp's `general.file_type` for the file.
    fn file_type(self) -> u32 {
        match self {
            GgufType::F32 => 0,
            GgufType::Q8_0 => 7,
            GgufType::Q4_0 => 2,
            GgufType::Q4K => 14,
        }
    }
}

/// How each tensor is stored: norms and biases F32; matrices at the file's type where
/// their rows hold whole blocks.
fn kind_of(name: &str, shape: &[usize], file: GgufType) -> GgmlType {
    let row = if shape.len() >= 2 { shape[shape.len() - 1] } else { 0 };
    let whole = row > 0 && row.is_multiple_of(32);
    let edge = name == "model.embed_tokens.weight" || name == "lm_head.weight";
    match file {
        _ if !whole => GgmlType::F32,
        GgufType::F32 => GgmlType::F32,
        GgufType::Q8_0 => GgmlType::Q8_0,
        GgufType::Q4_0 | GgufType::Q4K if edge => GgmlType::Q8_0,
        GgufType::Q4_0 => GgmlType::Q4_0,
        GgufType::Q4K if row.is_multiple_of(256) => GgmlType::Q4K,
        GgufType::Q4K => GgmlType::Q5_0,
    }
}

/// `w` (rows of whole 32-blocks) as `kind`'s bytes.
fn encode(kind: GgmlType, w: &[f32]) -> Vec<u8> {
    match kind {
        GgmlType::F32 => w.iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlType::Q8_0 => w.chunks_exact(32).flat_map(q8_0_block).collect(),
        GgmlType::Q4_0 => w.chunks_exact(32).flat_map(q4_0_block).collect(),
        GgmlType::Q5_0 => w.chunks_exact(32).flat_map(q5_0_block).collect(),
        GgmlType::Q4K => w.chunks_exact(256).flat_map(q4_k_block).collect(),
        _ => unreachable!("the writer picks F32, Q8_0, Q4_0, Q5_0 or Q4_K"),
    }
}

/// The value of largest magnitude with its sign (the first of equal magnitudes), which
/// llama.cpp's symmetric 4- and 5-bit blocks scale from.
fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// llama.cpp's `nearest_int`: to nearest, ties to even (its `+ 1.5 * 2^23` trick).
fn nearest_int(v: f32) -> i32 {
    v.round_ties_even() as i32
}

/// llama.cpp's `quantize_row_q5_0_ref` on one block: `d = max / -16` for the value of
/// largest magnitude, each value `min(31, trunc(x / d + 16.5))`, its fifth bit in `qh`.
fn q5_0_block(x: &[f32]) -> Vec<u8> {
    let d = signed_absmax(x) / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let q = |v: f32| ((v * id + 16.5) as i8).min(31) as u8;
    let (mut qh, mut qs) = (0u32, [0u8; 16]);
    for j in 0..16 {
        let (a, b) = (q(x[j]), q(x[16 + j]));
        qs[j] = (a & 15) | ((b & 15) << 4);
        qh |= (((a & 16) >> 4) as u32) << j;
        qh |= (((b & 16) >> 4) as u32) << (j + 16);
    }
    let mut out = f16::from_f32(d).to_le_bytes().to_vec();
    out.extend(qh.to_le_bytes());
    out.extend(qs);
    out
}

/// llama.cpp's `make_qkx2_quants(32, 15, x, weights, L, &min, Laux, -1, 0.1, 20, false)`:
/// a sub-block's scale, its offset (the minimum, negated) and levels, by weighted least
/// squares over twenty-one trial scales, each step's minimum the best one so far. Every
/// float operation in llama.cpp's order.
fn make_qkx2_quants(x: &[f32], weights: &[f32], levels: &mut [u8]) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        min = if x[i] < min { x[i] } else { min };
        max = if x[i] > max { x[i] } else { max };
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        levels[..n].fill(0);
        return (0.0, -min);
    }
    let nmax = 15.0f32;
    let mut iscale = nmax / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        levels[i] = nearest_int(iscale * (x[i] - min)).clamp(0, 15) as u8;
        let diff = scale * levels[i] as f32 + min - x[i];
        best_error += weights[i] * (diff * diff);
    }
    let mut aux = [0u8; 32];
    for step in 0..=20 {
        iscale = (-1.0 + 0.1 * step as f32 + nmax) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, 15);
            aux[i] = l as u8;
            let (w, l) = (weights[i], l as f32);
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut error = 0f32;
            for i in 0..n {
                let diff = this_scale * aux[i] as f32 + this_min - x[i];
                error += weights[i] * (diff * diff);
            }
            if error < best_error {
                levels[..n].copy_from_slice(&aux[..n]);
                best_error = error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// llama.cpp's `quantize_row_q4_K_ref` on one super-block of 256: each sub-block of 32's
/// scale and offset by [`make_qkx2_quants`] (importance `sqrt(mean x^2) + |x|`), coded in
/// 6 bits against the super-block's largest (f16 `d` and `dmin`), then every value again
/// against the coded ones.
fn q4_k_block(x: &[f32]) -> Vec<u8> {
    let mut levels = [0u8; 256];
    let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..8 {
        let sub = &x[32 * j..32 * j + 32];
        let sum_x2 = sub.iter().fold(0f32, |a, v| a + v * v);
        let av_x = (sum_x2 / 32.0).sqrt();
        let weights: Vec<f32> = sub.iter().map(|v| av_x + v.abs()).collect();
        (scales[j], mins[j]) = make_qkx2_quants(sub, &weights, &mut levels[32 * j..32 * j + 32]);
        max_scale = if scales[j] > max_scale { scales[j] } else { max_scale };
        max_min = if mins[j] > max_min { mins[j] } else { max_min };
    }
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; 12];
    for j in 0..8 {
        let ls = nearest_int(inv_scale * scales[j]).min(63) as u8;
        let lm = nearest_int(inv_min * mins[j]).min(63) as u8;
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 15) | ((lm & 15) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let (d, dmin) = (f16::from_f32(max_scale / 63.0), f16::from_f32(max_min / 63.0));
    for j in 0..8 {
        let (sc, m) = if j < 4 {
            (packed[j] & 63, packed[j + 4] & 63)
        } else {
            (
                (packed[j + 4] & 15) | ((packed[j - 4] >> 6) << 4),
                (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4),
            )
        };
        let dl = d.to_f32() * sc as f32;
        if dl == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * m as f32;
        for i in 0..32 {
            levels[32 * j + i] = nearest_int((x[32 * j + i] + dm) / dl).clamp(0, 15) as u8;
        }
    }
    let mut out = d.to_le_bytes().to_vec();
    out.extend(dmin.to_le_bytes());
    out.extend(packed);
    for group in levels.chunks_exact(64) {
        out.extend((0..32).map(|l| group[l] | (group[l + 32] << 4)));
    }
    out
}

/// llama.cpp's `quantize_row_q8_0_ref` on one block: `d = absmax / 127`, each value
/// `round(x / d)` half away from zero.
fn q8_0_block(x: &[f32]) -> Vec<u8> {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut b = f16::from_f32(d).to_le_bytes().to_vec();
    b.extend(x.iter().map(|&v| (v * id).round() as i8 as u8));
    b
}

/// llama.cpp's `quantize_row_q4_0_ref` on one block: `d = max / -8` for the value of
/// largest magnitude, each value `min(15, trunc(x / d + 8.5))`.
fn q4_0_block(x: &[f32]) -> Vec<u8> {
    let d = signed_absmax(x) / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let q = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
    let mut b = f16::from_f32(d).to_le_bytes().to_vec();
    b.extend((0..16).map(|j| q(x[j]) | (q(x[16 + j]) << 4)));
    b
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend(s.as_bytes());
}

/// A value's type id and bytes.
fn put_value(b: &mut Vec<u8>, v: &Meta, with_type: bool) {
    let (t, bytes): (u32, Vec<u8>) = match v {
        Meta::U8(x) => (0, vec![*x]),
        Meta::I8(x) => (1, vec![*x as u8]),
        Meta::U16(x) => (2, x.to_le_bytes().to_vec()),
        Meta::I16(x) => (3, x.to_le_bytes().to_vec()),
        Meta::U32(x) => (4, x.to_le_bytes().to_vec()),
        Meta::I32(x) => (5, x.to_le_bytes().to_vec()),
        Meta::F32(x) => (6, x.to_le_bytes().to_vec()),
        Meta::Bool(x) => (7, vec![*x as u8]),
        Meta::Str(s) => {
            let mut s_bytes = Vec::new();
            put_str(&mut s_bytes, s);
            (8, s_bytes)
        }
        Meta::Array(items) => {
            let mut a = Vec::new();
            // An empty array is written as strings (llama.cpp's writer does the same).
            let inner = items.first().map_or(8, meta_type);
            a.extend(inner.to_le_bytes());
            a.extend((items.len() as u64).to_le_bytes());
            for item in items {
                put_value(&mut a, item, false);
            }
            (9, a)
        }
        Meta::U64(x) => (10, x.to_le_bytes().to_vec()),
        Meta::I64(x) => (11, x.to_le_bytes().to_vec()),
        Meta::F64(x) => (12, x.to_le_bytes().to_vec()),
    };
    if with_type {
        b.extend(t.to_le_bytes());
    }
    b.extend(bytes);
}

fn meta_type(v: &Meta) -> u32 {
    let mut b = Vec::new();
    put_value(&mut b, v, true);
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// Writes `model` (f32) to `path` as a GGUF file of type `file`, through a temporary file.
pub(crate) fn save(
    model: &TransformerModel<CpuBackend>, origin: Option<&Origin>, path: &Path, file: GgufType,
) -> Result<()> {
    if model.quantized.is_some() {
        return Err(NetworkError::InvalidInput(
            "save_gguf: the model is quantized and its f32 weights are gone (rounding again would round twice); load it at f32 and save at Q8 or Q4".into(),
        ));
    }
    let c = &model.config;
    let family = match origin {
        Some(o) => o.family(),
        None => match (c.qkv_bias, c.qk_norm, &c.moe) {
            (false, false, None) => Family::Llama,
            (true, false, None) => Family::Qwen2,
            (false, true, None) => Family::Qwen3,
            (false, false, Some(_)) => Family::Mixtral,
            (false, true, Some(_)) => Family::Qwen3Moe,
            _ => {
                return Err(NetworkError::InvalidInput(
                    "save_gguf: no GGUF architecture computes this model".into(),
                ))
            }
        },
    };
    let arch = arch_of(family)?;
    let mut meta = model_keys(c, arch, file.file_type())?;
    meta.extend(tokenizer_keys(origin)?);

    // The tensors in llama.cpp's order and names, with their stored types and sizes: each
    // of ours, or a block's experts stacked into one `[experts, rows, cols]` tensor.
    let named = model.params.as_ref().into_named();
    let layout = c.layout();
    let shapes: Vec<Vec<usize>> =
        layout.as_ref().into_named().into_iter().map(|(_, t)| t.shape.clone()).collect();
    struct Out {
        name: String,
        shape: Vec<usize>,
        kind: GgmlType,
        offset: usize,
        /// Our tensors stored in it, by expert.
        members: Vec<(usize, usize)>,
    }
    let mut infos: Vec<Out> = Vec::new();
    let mut stacked = std::collections::HashMap::new();
    for (i, ((name, _), shape)) in named.iter().zip(&shapes).enumerate() {
        let (g, expert) = gguf_place(name);
        let kind = kind_of(name, shape, file);
        match expert {
            Some(j) if stacked.contains_key(&g) => {
                let out: &mut Out = &mut infos[stacked[&g]];
                out.shape[0] += 1;
                out.members.push((j, i));
            }
            Some(j) => {
                stacked.insert(g.clone(), infos.len());
                let shape = std::iter::once(1).chain(shape.iter().copied()).collect();
                infos.push(Out { name: g, shape, kind, offset: 0, members: vec![(j, i)] });
            }
            None => infos.push(Out { name: g, shape: shape.clone(), kind, offset: 0, members: vec![(0, i)] }),
        }
    }
    let mut offset = 0usize;
    for out in &mut infos {
        out.members.sort_unstable();
        if out.members.iter().enumerate().any(|(e, m)| m.0 != e) {
            return Err(NetworkError::InvalidInput(format!(
                "save_gguf: {}: its experts are not numbered 0..n",
                out.name
            )));
        }
        let values: usize = out.shape.iter().product();
        let bytes =
            out.kind.bytes_of(*out.shape.last().unwrap_or(&1), values).map_err(NetworkError::InvalidInput)?;
        out.offset = offset;
        offset = (offset + bytes).div_ceil(ALIGNMENT) * ALIGNMENT;
    }

    let mut head = b"GGUF".to_vec();
    head.extend(3u32.to_le_bytes());
    head.extend((infos.len() as u64).to_le_bytes());
    head.extend((meta.len() as u64).to_le_bytes());
    for (k, v) in &meta {
        put_str(&mut head, k);
        put_value(&mut head, v, true);
    }
    for out in &infos {
        put_str(&mut head, &out.name);
        head.extend((out.shape.len() as u32).to_le_bytes());
        for d in out.shape.iter().rev() {
            head.extend((*d as u64).to_le_bytes());
        }
        head.extend(out.kind.id().to_le_bytes());
        head.extend((out.offset as u64).to_le_bytes());
    }
    head.resize(head.len().div_ceil(ALIGNMENT) * ALIGNMENT, 0);

    let permuted = arch == "llama";
    let (dir, tmp) = crate::io::files::temporary_for(path)?;
    let written = (|| -> std::io::Result<()> {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        f.write_all(&head)?;
        let mut at = 0usize;
        for out in &infos {
            f.write_all(&vec![0u8; out.offset - at])?;
            at = out.offset;
            for &(_, i) in &out.members {
                let (name, buf) = &named[i];
                let cols = *shapes[i].last().unwrap_or(&1);
                let w: &[f32] = buf;
                // Only the interleaved projections are copied; every other tensor is encoded in place.
                let w = match rotary_heads(name, c.q_heads, c.kv_heads).filter(|_| permuted) {
                    Some(heads) => std::borrow::Cow::Owned(rotary_rows(w, heads, cols, true)),
                    None => std::borrow::Cow::Borrowed(w),
                };
                let bytes = encode(out.kind, &w);
                f.write_all(&bytes)?;
                at += bytes.len();
            }
        }
        f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(NetworkError::io(path, e));
    }
    if let Ok(d) = std::fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Q8_0 and Q4_0 blocks as `gguf.quants.quantize` (ggml's reference rounding) makes
    /// them from the same f32 rows (`tests/fixtures/gen_gguf_blocks.py`): a block of exact
    /// ties for each, a block of zeros, random rows.
    #[test]
    fn q8_0_and_q4_0_blocks_are_ggml_s_bytes() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/gguf_blocks.gguf");
        let file = Gguf::open(&path).unwrap();
        let x = file.read_f32("encode.input").unwrap();
        for (kind, name) in [(GgmlType::Q8_0, "encode.q8_0"), (GgmlType::Q4_0, "encode.q4_0")] {
            let want = file.raw(name).unwrap();
            let got = encode(kind, &x);
            assert_eq!(got.len(), want.len(), "{name}");
            let (_, block) = kind.block();
            for (b, (g, w)) in got.chunks(block).zip(want.chunks(block)).enumerate() {
                assert_eq!(g, w, "{name} block {b}");
            }
        }
    }

    /// Q4_K and Q5_0 blocks as ggml itself makes them (`ggml_quantize_chunk`, what
    /// `llama-quantize` runs; `tests/fixtures/gen_gguf_encode_ggml.py`): random rows at
    /// three scales, an outlier, blocks of zeros, a repeated value, one-signed sub-blocks,
    /// half-steps.
    #[test]
    fn q4_k_and_q5_0_blocks_are_ggml_s_bytes() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/gguf_encode_ggml.gguf");
        let file = Gguf::open(&path).unwrap();
        let x = file.read_f32("encode.input").unwrap();
        for (kind, name) in [(GgmlType::Q4K, "encode.q4_k"), (GgmlType::Q5_0, "encode.q5_0")] {
            let want = file.raw(name).unwrap();
            let got = encode(kind, &x);
            assert_eq!(got.len(), want.len(), "{name}");
            let (_, block) = kind.block();
            let differ: Vec<usize> = got
                .chunks(block)
                .zip(want.chunks(block))
                .enumerate()
                .filter(|(_, (g, w))| g != w)
                .map(|(b, _)| b)
                .collect();
            assert!(differ.is_empty(), "{name}: blocks {differ:?} of {} differ", got.len() / block);
        }
    }

    #[test]
    fn permute_is_the_reader_s_inverse() {
        let w: Vec<f32> = (0..2 * 8 * 3).map(|v| v as f32).collect();
        let p = rotary_rows(&w, 2, 3, true);
        assert_ne!(p, w);
        assert_eq!(rotary_rows(&p, 2, 3, false), w);
    }
}

//! ggml's tensor types decoded to f32, as ggml's `dequantize_row_*` and the `gguf`
//! package's numpy twins decode them: each block's f16 scales widened, then one f32
//! multiply (and an add or a subtract of the block's offset) a value, in that order, so
//! the values are the same bits as numpy's (`tests/fixtures/gen_gguf_blocks.py` writes the
//! fixture `gguf_blocks_match_the_gguf_package` compares against).

use half::{bf16, f16};

/// The tensor types this reader decodes (ggml's numbering), with their block shapes; the
/// variants are ggml's names of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
}

/// Values a K-quant super-block holds.
const QK_K: usize = 256;

impl GgmlType {
    /// The type of ggml id `id`, or a message naming the id.
    pub fn from_id(id: u32) -> Result<GgmlType, String> {
        use GgmlType::*;
        Ok(match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            12 => Q4K,
            13 => Q5K,
            14 => Q6K,
            30 => BF16,
            _ => {
                return Err(format!(
                    "ggml type {id} ({}) is not one this reader decodes (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)",
                    ggml_name(id)
                ))
            }
        })
    }

    /// ggml's id of the type.
    pub fn id(self) -> u32 {
        use GgmlType::*;
        match self {
            F32 => 0,
            F16 => 1,
            Q4_0 => 2,
            Q4_1 => 3,
            Q5_0 => 6,
            Q5_1 => 7,
            Q8_0 => 8,
            Q4K => 12,
            Q5K => 13,
            Q6K => 14,
            BF16 => 30,
        }
    }

    /// The name llama.cpp gives the type.
    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            BF16 => "BF16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q4K => "Q4_K",
            Q5K => "Q5_K",
            Q6K => "Q6_K",
        }
    }

    /// (values, bytes) of one block.
    pub fn block(self) -> (usize, usize) {
        use GgmlType::*;
        match self {
            F32 => (1, 4),
            F16 | BF16 => (1, 2),
            Q4_0 => (32, 18),
            Q4_1 => (32, 20),
            Q5_0 => (32, 22),
            Q5_1 => (32, 24),
            Q8_0 => (32, 34),
            Q4K => (QK_K, 144),
            Q5K => (QK_K, 176),
            Q6K => (QK_K, 210),
        }
    }

    /// The bytes of a tensor of `values` values whose rows are `row` long: rows must hold
    /// whole blocks.
    pub fn bytes_of(self, row: usize, values: usize) -> Result<usize, String> {
        let (n, b) = self.block();
        if !row.is_multiple_of(n) {
            return Err(format!("rows of {row} values do not hold whole {} blocks of {n}", self.name()));
        }
        (values / n).checked_mul(b).ok_or_else(|| format!("{values} values of {} overflow", self.name()))
    }

    /// Decodes `bytes` (whole blocks) into `out` (their values).
    pub fn decode(self, bytes: &[u8], out: &mut [f32]) {
        use GgmlType::*;
        let (n, b) = self.block();
        debug_assert_eq!(bytes.len() / b * n, out.len());
        let blocks = bytes.chunks_exact(b).zip(out.chunks_exact_mut(n));
        match self {
            F32 => blocks.for_each(|(x, y)| y[0] = f32::from_le_bytes([x[0], x[1], x[2], x[3]])),
            F16 => blocks.for_each(|(x, y)| y[0] = half(x, 0)),
            BF16 => blocks.for_each(|(x, y)| y[0] = bf16::from_le_bytes([x[0], x[1]]).to_f32()),
            Q4_0 => blocks.for_each(|(x, y)| q4_0(x, y)),
            Q4_1 => blocks.for_each(|(x, y)| q4_1(x, y)),
            Q5_0 => blocks.for_each(|(x, y)| q5(x, y, false)),
            Q5_1 => blocks.for_each(|(x, y)| q5(x, y, true)),
            Q8_0 => blocks.for_each(|(x, y)| q8_0(x, y)),
            Q4K => blocks.for_each(|(x, y)| q4_k(x, y)),
            Q5K => blocks.for_each(|(x, y)| q5_k(x, y)),
            Q6K => blocks.for_each(|(x, y)| q6_k(x, y)),
        }
    }
}

/// ggml's name of type `id`, for errors about the types this reader does not decode.
fn ggml_name(id: u32) -> &'static str {
    match id {
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        15 => "Q8_K",
        16..=23 => "an IQ type",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => "unknown",
    }
}

/// The f16 at byte `at` of `x`, widened.
fn half(x: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([x[at], x[at + 1]]).to_f32()
}

/// 32 values: an f16 scale, then 16 bytes, value `j` in byte `j`'s low nibble and value
/// `16 + j` in its high one, `d (q - 8)`.
fn q4_0(x: &[u8], y: &mut [f32]) {
    let d = half(x, 0);
    for (j, &q) in x[2..18].iter().enumerate() {
        y[j] = d * ((q & 15) as i32 - 8) as f32;
        y[j + 16] = d * ((q >> 4) as i32 - 8) as f32;
    }
}

/// Q4_0's packing with a scale and an offset: `d q + m`.
fn q4_1(x: &[u8], y: &mut [f32]) {
    let (d, m) = (half(x, 0), half(x, 2));
    for (j, &q) in x[4..20].iter().enumerate() {
        y[j] = d * (q & 15) as f32 + m;
        y[j + 16] = d * (q >> 4) as f32 + m;
    }
}

/// Q5_0 (`d (q - 16)`) and Q5_1 (`d q + m`): Q4's nibbles with a fifth bit each from a
/// little-endian u32 (bit `j` for value `j`).
fn q5(x: &[u8], y: &mut [f32], offset: bool) {
    let d = half(x, 0);
    let (m, at) = if offset { (half(x, 2), 4) } else { (0.0, 2) };
    let qh = u32::from_le_bytes([x[at], x[at + 1], x[at + 2], x[at + 3]]);
    for (j, &q) in x[at + 4..at + 20].iter().enumerate() {
        let lo = (q & 15) as u32 | ((qh >> j) & 1) << 4;
        let hi = (q >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4;
        if offset {
            y[j] = d * lo as f32 + m;
            y[j + 16] = d * hi as f32 + m;
        } else {
            y[j] = d * (lo as i32 - 16) as f32;
            y[j + 16] = d * (hi as i32 - 16) as f32;
        }
    }
}

/// 32 values: an f16 scale and 32 signed bytes, `q d`.
fn q8_0(x: &[u8], y: &mut [f32]) {
    let d = half(x, 0);
    for (y, &q) in y.iter_mut().zip(&x[2..34]) {
        *y = (q as i8) as f32 * d;
    }
}

/// The 6-bit scale and minimum of sub-block `j` (of 8) from a K-quant's 12 packed bytes.
fn scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

/// 256 values: f16 `d` and `dmin`, 12 bytes of 6-bit sub-block scales and minima, then
/// 128 bytes; sub-block `2i` is the low nibbles of bytes `32i..32i + 32`, `2i + 1` their
/// high nibbles; `(d sc) q - (dmin m)`.
fn q4_k(x: &[u8], y: &mut [f32]) {
    let (d, dmin) = (half(x, 0), half(x, 2));
    let (scales, qs) = (&x[4..16], &x[16..144]);
    for (s, y) in y.chunks_exact_mut(32).enumerate() {
        let (sc, m) = scale_min(s, scales);
        let (dl, ml) = (d * sc as f32, dmin * m as f32);
        let bytes = &qs[32 * (s / 2)..32 * (s / 2) + 32];
        let shift = 4 * (s % 2);
        for (y, &q) in y.iter_mut().zip(bytes) {
            *y = dl * ((q >> shift) & 15) as f32 - ml;
        }
    }
}

/// Q4_K with a fifth bit a value: 32 bytes after the scales, bit `s` of byte `l` for
/// value `l` of sub-block `s`.
fn q5_k(x: &[u8], y: &mut [f32]) {
    let (d, dmin) = (half(x, 0), half(x, 2));
    let (scales, qh, qs) = (&x[4..16], &x[16..48], &x[48..176]);
    for (s, y) in y.chunks_exact_mut(32).enumerate() {
        let (sc, m) = scale_min(s, scales);
        let (dl, ml) = (d * sc as f32, dmin * m as f32);
        let bytes = &qs[32 * (s / 2)..32 * (s / 2) + 32];
        let shift = 4 * (s % 2);
        for ((y, &q), &h) in y.iter_mut().zip(bytes).zip(qh) {
            let v = ((q >> shift) & 15) | ((h >> s) & 1) << 4;
            *y = dl * v as f32 - ml;
        }
    }
}

/// 256 values: 128 bytes of low nibbles, 64 of high bit pairs, 16 signed 8-bit scales (one
/// a 16 values), an f16 `d`; `(d sc) (q - 32)`.
fn q6_k(x: &[u8], y: &mut [f32]) {
    let (ql, qh, sc) = (&x[..128], &x[128..192], &x[192..208]);
    let d = half(x, 208);
    for half_block in 0..2 {
        let (ql, qh) = (&ql[64 * half_block..], &qh[32 * half_block..]);
        let y = &mut y[128 * half_block..];
        let sc = &sc[8 * half_block..];
        for l in 0..32 {
            let q = [
                (ql[l] & 15) | (qh[l] & 3) << 4,
                (ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4,
                (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4,
                (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4,
            ];
            for (k, &q) in q.iter().enumerate() {
                let scale = d * (sc[l / 16 + 2 * k] as i8) as f32;
                y[l + 32 * k] = scale * (q as i32 - 32) as f32;
            }
        }
    }
}

/// Our quantized layouts (core's `ops::q8` blocked int8 and `ops::q4`) straight from a
/// file's blocks, where a layout holds the block's values exactly: no decode to f32 and no
/// second rounding, so a 4-bit file loads at 4 bits as it was written (rounding its decoded
/// values again took 9-17 s on SmolLM2-135M and added the second rounding's error) and an
/// 8-bit one as the int8 it already is.
impl GgmlType {
    /// Whether `bytes` are `rows` whole rows of `cols` values in this type.
    fn whole_rows(self, bytes: &[u8], rows: usize, cols: usize) -> bool {
        let (n, b) = self.block();
        cols > 0 && cols.is_multiple_of(n) && rows.checked_mul(cols / n * b) == Some(bytes.len())
    }

    /// `rows` rows of `cols` values stored as this type (`bytes`, whole rows) in our 4-bit
    /// layout, each value what [`GgmlType::decode`] gives bit for bit: Q4_0's `d (q - 8)`
    /// as `d q - 8 d`, Q4_1's `d q + m` as `d q - (-m)`, Q4_K's `(d sc) q - (dmin m)` with
    /// `d sc` and `dmin m` as the block's scale and offset (a 6-bit code times an f16 is
    /// exact in an f32, and so is an f16 times a 4-bit value). The row scales are only
    /// what a file of ours would code the blocks against; these blocks are not such codes
    /// (the checkpoint writer sees that and keeps them as they are). `None` for the other
    /// types, or where a scale is not finite (the f32 decode then names the tensor).
    pub fn to_q4(self, bytes: &[u8], rows: usize, cols: usize) -> Option<(Vec<f32>, Vec<f32>)> {
        use rusting_brain_core::ops::q4::{q4_packed_cols, q4_row_scales, Q4_BLOCK};
        let (n, b) = self.block();
        if !matches!(self, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q4K)
            || !self.whole_rows(bytes, rows, cols)
        {
            return None;
        }
        let (pc, rs, nb) = (q4_packed_cols(cols), q4_row_scales(cols), cols / Q4_BLOCK);
        let mut packed = vec![0f32; rows * pc];
        let mut scales = vec![0f32; rows * rs];
        let mut row_bytes = vec![0u8; 4 * pc];
        for (r, stored) in bytes.chunks_exact(cols / n * b).enumerate() {
            row_bytes.fill(0);
            let sc = &mut scales[r * rs..(r + 1) * rs];
            // Value c of the row goes to byte c / 64 * 32 + c % 32, low nibble for the
            // first 32 of each 64 (core's `q4_at`).
            let put = |row_bytes: &mut [u8], c: usize, q: u8| {
                let byte = c / 64 * 32 + c % 32;
                row_bytes[byte] |= if c % 64 < 32 { q } else { q << 4 };
            };
            for (i, x) in stored.chunks_exact(b).enumerate() {
                match self {
                    GgmlType::Q4_0 | GgmlType::Q4_1 => {
                        let d = half(x, 0);
                        let m = if self == GgmlType::Q4_1 { 0.0 - half(x, 2) } else { 8.0 * d };
                        let at = if self == GgmlType::Q4_1 { 4 } else { 2 };
                        (sc[2 + 2 * i], sc[3 + 2 * i]) = (d, m);
                        for (j, &q) in x[at..at + 16].iter().enumerate() {
                            put(&mut row_bytes, 32 * i + j, q & 15);
                            put(&mut row_bytes, 32 * i + j + 16, q >> 4);
                        }
                    }
                    _ => {
                        let (d, dmin) = (half(x, 0), half(x, 2));
                        for s in 0..8 {
                            let (code, min) = scale_min(s, &x[4..16]);
                            let blk = 8 * i + s;
                            (sc[2 + 2 * blk], sc[3 + 2 * blk]) = (d * code as f32, dmin * min as f32);
                        }
                        // Q4_K's bytes are already ours: 32 a 64 values, low nibbles first.
                        row_bytes[128 * i..128 * i + 128].copy_from_slice(&x[16..144]);
                    }
                }
            }
            let blocks = &sc[2..2 + 2 * nb];
            if blocks.iter().any(|v| !v.is_finite()) {
                return None;
            }
            let max = |o: usize| blocks.iter().skip(o).step_by(2).fold(0f32, |a, v| a.max(v.abs()));
            (sc[0], sc[1]) = (max(0) / 63.0, max(1) / 63.0);
            for (slot, four) in packed[r * pc..(r + 1) * pc].iter_mut().zip(row_bytes.chunks_exact(4)) {
                *slot = f32::from_ne_bytes([four[0], four[1], four[2], four[3]]);
            }
        }
        Some((packed, scales))
    }

    /// `rows` rows of `cols` values stored as this type in our blocked int8 layout (one
    /// scale a block of 32, the values packed four to an f32 slot), exactly: Q8_0's `q d`,
    /// Q4_0's `(q - 8) d` and Q5_0's `(q - 16) d` are each a signed byte times the block's
    /// f16 scale (a negative scale, which Q4_0's rounding makes, flips the bytes' signs;
    /// products keep their bits under a sign change). `None` for the other types, a scale
    /// that is not finite, or a byte of -128 (outside the symmetric range of our int8).
    pub fn to_int8(self, bytes: &[u8], rows: usize, cols: usize) -> Option<(Vec<f32>, Vec<f32>)> {
        use rusting_brain_core::ops::q8::{blocks_of, packed_cols, Q8_BLOCK};
        let (n, b) = self.block();
        if !matches!(self, GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0)
            || !self.whole_rows(bytes, rows, cols)
        {
            return None;
        }
        let (pc, nb) = (packed_cols(cols), blocks_of(cols, Q8_BLOCK));
        let mut packed = vec![0f32; rows * pc];
        let mut scales = vec![0f32; rows * nb];
        let mut values = vec![0i8; 4 * pc];
        let mut block = [0f32; 32];
        for (r, stored) in bytes.chunks_exact(cols / n * b).enumerate() {
            for (i, x) in stored.chunks_exact(b).enumerate() {
                let d = half(x, 0);
                if !d.is_finite() {
                    return None;
                }
                // The block's signed bytes: decode with a unit scale.
                let mut unit = x.to_vec();
                unit[..2].copy_from_slice(&f16::ONE.to_le_bytes());
                self.decode(&unit, &mut block);
                for (v, &q) in values[32 * i..32 * i + 32].iter_mut().zip(&block) {
                    let q = if d < 0.0 { -q } else { q };
                    // -128 (or 128 flipped) is outside the symmetric range our kernels
                    // take; such a block goes through the f32 decode and a rounding.
                    if !(-127.0..=127.0).contains(&q) {
                        return None;
                    }
                    *v = q as i8;
                }
                scales[r * nb + i] = d.abs();
            }
            for (slot, four) in packed[r * pc..(r + 1) * pc].iter_mut().zip(values.chunks_exact(4)) {
                *slot = f32::from_ne_bytes([four[0] as u8, four[1] as u8, four[2] as u8, four[3] as u8]);
            }
        }
        Some((packed, scales))
    }
}

//! NumPy `.npy` files (format versions 1-3): little-endian float32/64, int32/64 and uint8,
//! C order, 1-D (one column) or 2-D. The header's shape is checked against the bytes that
//! are actually there before anything is allocated from it.

use std::path::Path;

use crate::{NetworkError, Result};

/// A 2-D array: `rows` x `cols` values, row-major.
pub struct Array {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

pub fn read(path: &Path) -> Result<Array> {
    let bytes = crate::io::files::read(path)?;
    let err = |location: &str, message: String| NetworkError::parse(path, location, message);
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(err("header", "not a .npy file (missing the \\x93NUMPY magic)".into()));
    }
    let major = bytes[6];
    let (header_len, start): (usize, usize) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => {
            (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12)
        }
        _ => return Err(err("header", format!("unsupported .npy format version {major}"))),
    };
    let end = start.checked_add(header_len).filter(|&e| e <= bytes.len()).ok_or_else(|| {
        err("header", format!("the header claims {header_len} bytes but the file has {}", bytes.len()))
    })?;
    let header = std::str::from_utf8(&bytes[start..end])
        .map_err(|_| err("header", "the header is not text".into()))?;
    let descr = dict_value(header, "descr").ok_or_else(|| err("header", "no 'descr' entry".into()))?;
    let fortran = dict_value(header, "fortran_order")
        .ok_or_else(|| err("header", "no 'fortran_order' entry".into()))?;
    let shape = dict_value(header, "shape").ok_or_else(|| err("header", "no 'shape' entry".into()))?;
    if fortran.trim() != "False" {
        return Err(err(
            "header",
            "the array is in Fortran (column-major) order; save it with numpy.ascontiguousarray(x) first"
                .into(),
        ));
    }
    let descr = descr.trim().trim_matches(|c| c == '\'' || c == '"');
    let (size, kind): (usize, fn(&[u8]) -> f32) = match descr {
        "<f4" => (4, |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        "<f8" => (8, |b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32),
        "<i4" => (4, |b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32),
        "<i8" => (8, |b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32),
        "|u1" | "<u1" => (1, |b| b[0] as f32),
        other => {
            return Err(err(
                "header",
                format!("dtype '{other}' is not supported (use float32, float64, int32, int64 or uint8, little-endian)"),
            ))
        }
    };
    let dims: Vec<usize> = shape
        .trim()
        .trim_start_matches('(')
        .trim_end_matches(')')
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| err("header", format!("shape entry '{s}' is not a size"))))
        .collect::<Result<_>>()?;
    let (rows, cols) = match dims[..] {
        [n] => (n, 1),
        [n, m] => (n, m),
        _ => return Err(err("header", format!("shape {dims:?} is not 1-D or 2-D"))),
    };
    let data = &bytes[end..];
    let expected = rows.checked_mul(cols).and_then(|n| n.checked_mul(size));
    if expected != Some(data.len()) {
        return Err(err(
            "data",
            format!(
                "the header's shape ({rows}, {cols}) of {descr} needs {} bytes but the file holds {}",
                expected.map_or("more than usize::MAX".to_string(), |e| e.to_string()),
                data.len()
            ),
        ));
    }
    Ok(Array { rows, cols, data: data.chunks_exact(size).map(kind).collect() })
}

/// The text of `'key': value` in the header dict, up to the next top-level comma.
fn dict_value<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let pos = header.find(&format!("'{key}'")).or_else(|| header.find(&format!("\"{key}\"")))?;
    let rest = &header[pos + key.len() + 2..];
    let rest = rest.trim_start().strip_prefix(':')?;
    let mut depth = 0;
    for (i, c) in rest.char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            ',' | '}' if depth == 0 => return Some(&rest[..i]),
            _ => {}
        }
    }
    Some(rest)
}

//! IDX files (MNIST and relatives): big-endian header `0 0 type ndim`, `ndim` u32 sizes,
//! then the data. Only unsigned bytes (type 0x08), which is what every such set ships.

use std::path::Path;

use crate::{NetworkError, Result};

/// The sizes and the raw bytes of one IDX file with `want_dims` dimensions.
pub fn read(path: &Path, want_dims: usize) -> Result<(Vec<usize>, Vec<u8>)> {
    let bytes = crate::io::files::read(path)?;
    let err = |message: String| NetworkError::parse(path, "header", message);
    if bytes.len() < 4 || bytes[0] != 0 || bytes[1] != 0 {
        return Err(err("wrong magic number: not an IDX file (gunzip the .gz archives first)".into()));
    }
    if bytes[2] != 0x08 {
        return Err(err(format!(
            "element type 0x{:02x} is not supported (only unsigned bytes, 0x08)",
            bytes[2]
        )));
    }
    let ndim = bytes[3] as usize;
    if ndim != want_dims {
        return Err(err(format!("{ndim} dimensions, expected {want_dims}")));
    }
    let header = 4 + 4 * ndim;
    if bytes.len() < header {
        return Err(err("the file ends inside the header".into()));
    }
    let dims: Vec<usize> = (0..ndim)
        .map(|i| u32::from_be_bytes(bytes[4 + 4 * i..8 + 4 * i].try_into().expect("4 bytes")) as usize)
        .collect();
    let held = bytes.len() - header;
    match dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d)) {
        Some(need) if need == held => {}
        Some(need) => {
            return Err(NetworkError::parse(
                path,
                "data",
                format!("the header's sizes {dims:?} need {need} bytes of data but the file holds {held}"),
            ))
        }
        None => {
            return Err(NetworkError::parse(
                path,
                "header",
                format!(
                "the header's sizes {dims:?} overflow: no file holds that many bytes (this one holds {held})"
            ),
            ))
        }
    }
    Ok((dims, bytes[header..].to_vec()))
}

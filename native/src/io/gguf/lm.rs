//! A language model from a GGUF file: the formats crate reads llama.cpp's metadata as the
//! `config.json` the Hugging Face loader reads (so one parser checks both) and finds each
//! of the model's tensors under llama.cpp's name; here each is taken as its blocks are
//! where our quantized layout holds them exactly, else decoded and rounded to the
//! precision asked for in parallel slabs, and its pages handed back.

use std::path::Path;

use rayon::prelude::*;
use rusting_brain_core::models::transformer::{QuantFormat, TransformerModel};
use rusting_brain_formats::gguf::model;

use super::Gguf;
use crate::backend::cpu::CpuBackend;
use crate::io::hf::{self, Origin};
use crate::{Precision, Result};

/// The model in the GGUF file `path`, in f32 or with its matrices rounded to `precision`
/// one at a time as they are decoded; and where it came from.
pub(crate) fn load(path: &Path, precision: Precision) -> Result<(TransformerModel<CpuBackend>, Origin)> {
    let file = Gguf::open(path)?;
    let (family, config, json) = model::describe(&*file).map_err(|e| file.lift(e))?;
    let read = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
        let w = model::read_tensor(&*file, &config, name, shape).map_err(|e| file.lift(e))?;
        if let Ok(bytes) = model::stored_bytes(&*file, &config, name) {
            file.release(bytes);
        }
        Ok(w)
    };
    let read_quant = |name: &str, shape: &[usize], format: QuantFormat| -> Result<(Vec<f32>, Vec<f32>)> {
        // The file's blocks as they are where our layout holds them exactly (a 4-bit file
        // at Q4, an 8-bit one at Q8), else decoded and rounded.
        let format =
            match model::read_quant(&*file, &config, name, shape, format).map_err(|e| file.lift(e))? {
                model::QuantRead::Exact(packed, scales) => {
                    if let Ok(bytes) = model::stored_bytes(&*file, &config, name) {
                        file.release(bytes);
                    }
                    return Ok((packed, scales));
                }
                model::QuantRead::Round(format) => format,
            };
        let w = read(name, shape)?;
        let cols: usize = shape[1..].iter().product();
        // Rows round on their own: slabs of about 64K values in parallel, joined in order
        // (the 4-bit search is the slow part of a load).
        let slab = ((1 << 16) / cols.max(1)).max(1);
        let parts: Vec<Result<(Vec<f32>, Vec<f32>)>> = w
            .par_chunks(slab * cols)
            .map(|rows| {
                let n = rows.len() / cols;
                Ok(match format {
                    QuantFormat::Q8 => crate::backend::cpu::q8::quantize_blocks(rows, n, cols)?,
                    QuantFormat::Q8Rows => crate::backend::cpu::q8::quantize_rows(rows, n, cols)?,
                    QuantFormat::Q4 => rusting_brain_core::ops::q4::quantize_q4(rows, n, cols)?,
                })
            })
            .collect();
        crate::io::weights::join_parts(parts)
    };
    let model = hf::build_model(config.clone(), precision, read, read_quant)?;
    Ok((model, Origin::new(family, json, path.to_path_buf())))
}

//! Weights in `safetensors` directories, as `transformers` and `diffusers` save them: one
//! file, or shards named by an index file; every file memory-mapped and its header checked
//! before anything is read; tensors converted from F32, BF16 or F16 to f32 (or rounded
//! straight to int8) as they are reached, the pages of a tensor already read handed back.
//! A missing tensor, a shape the configuration does not give, an unreadable dtype or a
//! non-finite value is an error naming the file and the tensor.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use rusting_brain_core::ops::q8::QuantFormat;
use rusting_brain_core::CoreError;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde_json::Value;

use crate::{NetworkError, Result};

/// The safetensors files of a directory, mapped, and which file holds which tensor.
pub(crate) struct Files {
    pub(crate) paths: Vec<PathBuf>,
    maps: Vec<memmap2::Mmap>,
    /// Tensor name -> index into `paths` (from the index file, or every tensor of the one file).
    index: Option<HashMap<String, usize>>,
}

/// A plain file name inside the directory: an index entry may not climb out of it.
fn shard_path(dir: &Path, index_path: &Path, key: &str, file: &str) -> Result<PathBuf> {
    let p = Path::new(file);
    let plain =
        p.components().count() == 1 && matches!(p.components().next(), Some(std::path::Component::Normal(_)));
    if !plain {
        return Err(NetworkError::parse(
            index_path,
            format!("weight_map.{key}"),
            format!("{file:?} is not a file in this directory; shards must sit beside the index"),
        ));
    }
    Ok(dir.join(p))
}

fn map_file(path: &Path) -> Result<memmap2::Mmap> {
    let f = File::open(path).map_err(|e| NetworkError::io(path, e))?;
    // SAFETY: the map is read only, and only while the load runs; a file changed by another
    // process during that time gives wrong values but the safetensors checks still hold the
    // offsets inside the map. This is how candle and transformers' Rust readers map weights.
    unsafe { memmap2::Mmap::map(&f) }.map_err(|e| NetworkError::io(path, e))
}

/// Reads the files start to end on a thread of its own while the tensors are converted:
/// tensors are taken in the model's order, not the files', and a cold load would otherwise
/// fault its pages in one readahead window at a time. What it reads lands in the page
/// cache (not in this process's memory); errors are left to the real reads to report.
/// Dropped (the load done or refused), it stops after the piece it is reading.
pub(crate) struct Prefetch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Prefetch {
    pub(crate) fn start(paths: &[PathBuf]) -> Prefetch {
        use std::sync::atomic::Ordering;
        let paths = paths.to_vec();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            use std::io::Read;
            let mut buf = vec![0u8; 8 << 20];
            for p in paths {
                let Ok(mut f) = File::open(&p) else { continue };
                while !flag.load(Ordering::Relaxed) && matches!(f.read(&mut buf), Ok(n) if n > 0) {}
            }
        });
        Prefetch { stop, thread: Some(thread) }
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Files {
    /// [`Files::open`], or else the only `*.safetensors` file in `dir` whatever its name:
    /// a single-file checkpoint (`flux1-dev.safetensors`) placed beside its `config.json`.
    pub(crate) fn open_or_single(dir: &Path, stems: &[&str]) -> Result<Files> {
        let named = stems.iter().any(|stem| {
            dir.join(format!("{stem}.safetensors.index.json")).is_file()
                || dir.join(format!("{stem}.safetensors")).is_file()
        });
        if named {
            return Files::open(dir, stems);
        }
        let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| NetworkError::InvalidInput(format!("{}: {e}", dir.display())))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        found.sort();
        match found.as_slice() {
            [one] => {
                let maps = vec![map_file(one)?];
                Ok(Files { paths: vec![one.clone()], maps, index: None })
            }
            [] => Files::open(dir, stems),
            many => Err(NetworkError::InvalidInput(format!(
                "{}: {} .safetensors files ({}) and no {}.safetensors.index.json to say which is which",
                dir.display(),
                many.len(),
                many.iter()
                    .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                    .collect::<Vec<_>>()
                    .join(", "),
                stems.first().copied().unwrap_or("model")
            ))),
        }
    }

    /// The weights of `dir`: `<stem>.safetensors.index.json` with its shards, or the one
    /// `<stem>.safetensors`, for the first stem of `stems` the directory has
    /// (`transformers` writes `model`, `diffusers` `diffusion_pytorch_model`).
    pub(crate) fn open(dir: &Path, stems: &[&str]) -> Result<Files> {
        let found = stems.iter().find_map(|stem| {
            let index = dir.join(format!("{stem}.safetensors.index.json"));
            let single = dir.join(format!("{stem}.safetensors"));
            (index.is_file() || single.is_file()).then_some((index, single))
        });
        let Some((index_path, single)) = found else {
            let names: Vec<String> =
                stems.iter().map(|s| format!("no {s}.safetensors or {s}.safetensors.index.json")).collect();
            return Err(NetworkError::InvalidInput(format!("{}: {}", dir.display(), names.join(", "))));
        };
        if index_path.is_file() {
            let text = crate::io::files::read(&index_path)?;
            let v: Value = serde_json::from_slice(&text)
                .map_err(|e| NetworkError::parse(&index_path, "json", e.to_string()))?;
            let map = v
                .get("weight_map")
                .and_then(Value::as_object)
                .ok_or_else(|| NetworkError::parse(&index_path, "weight_map", "missing or not an object"))?;
            let mut paths: Vec<PathBuf> = Vec::new();
            let mut index = HashMap::new();
            for (key, file) in map {
                let file = file.as_str().ok_or_else(|| {
                    NetworkError::parse(&index_path, format!("weight_map.{key}"), "not a file name")
                })?;
                let p = shard_path(dir, &index_path, key, file)?;
                let i = match paths.iter().position(|q| *q == p) {
                    Some(i) => i,
                    None => {
                        if !p.is_file() {
                            return Err(NetworkError::parse(
                                &index_path,
                                format!("weight_map.{key}"),
                                format!("shard {file} is missing from {}", dir.display()),
                            ));
                        }
                        paths.push(p);
                        paths.len() - 1
                    }
                };
                index.insert(key.clone(), i);
            }
            if paths.is_empty() {
                return Err(NetworkError::parse(&index_path, "weight_map", "empty: it names no tensor"));
            }
            let maps = paths.iter().map(|p| map_file(p)).collect::<Result<_>>()?;
            Ok(Files { paths, maps, index: Some(index) })
        } else {
            let maps = vec![map_file(&single)?];
            Ok(Files { paths: vec![single], maps, index: None })
        }
    }
}

/// The checked headers of every file, with lookups that name the file on failure.
pub(crate) struct Tensors<'a> {
    files: &'a Files,
    parsed: Vec<SafeTensors<'a>>,
}

impl<'a> Tensors<'a> {
    pub(crate) fn new(files: &'a Files) -> Result<Tensors<'a>> {
        let parsed = files
            .maps
            .iter()
            .zip(&files.paths)
            .map(|(m, p)| {
                // The crate checks the header, and that every tensor's offsets lie inside
                // the file and cover it exactly, before anything is read.
                SafeTensors::deserialize(m).map_err(|e| {
                    NetworkError::parse(p, "header", format!("not a valid safetensors file: {e}"))
                })
            })
            .collect::<Result<_>>()?;
        Ok(Tensors { files, parsed })
    }

    /// Which file is to hold `name`.
    fn file_of(&self, name: &str) -> Option<usize> {
        match &self.files.index {
            Some(ix) => ix.get(name).copied(),
            None => Some(0),
        }
    }

    /// The stored tensor `name`, checked against `shape`, and the file it is in.
    fn view(&self, name: &str, shape: &[usize]) -> Result<(usize, TensorView<'a>)> {
        let Some(i) = self.file_of(name) else {
            let dir = self.files.paths[0].parent().unwrap_or(Path::new("."));
            return Err(NetworkError::parse(
                dir.join("model.safetensors.index.json"),
                format!("weight_map.{name}"),
                "missing: the configuration needs this tensor",
            ));
        };
        let path = &self.files.paths[i];
        let view = self.parsed[i]
            .tensor(name)
            .map_err(|_| NetworkError::parse(path, name, "missing tensor: the configuration needs it"))?;
        if view.shape() != shape {
            return Err(NetworkError::parse(
                path,
                name,
                format!("shape {:?}, config.json gives {:?}", view.shape(), shape),
            ));
        }
        match view.dtype() {
            Dtype::F32 | Dtype::BF16 | Dtype::F16 => Ok((i, view)),
            other => Err(NetworkError::parse(
                path,
                name,
                format!("dtype {other:?}; this build reads F32, BF16 and F16"),
            )),
        }
    }

    /// The tensor `name` (of `shape`) as f32, converted from F32, BF16 or F16.
    pub(crate) fn read(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        self.read_rows(name, shape, 0..shape.first().copied().unwrap_or(1))
    }

    /// Rows `rows` of the tensor `name` (stored as `shape`; a row is everything after the
    /// first axis), as f32: one part of a fused tensor, as BFL checkpoints store q, k and v.
    pub(crate) fn read_rows(&self, name: &str, shape: &[usize], rows: Range<usize>) -> Result<Vec<f32>> {
        let (i, view) = self.view(name, shape)?;
        let (total, cols) = rows_cols(shape);
        check_rows(&self.files.paths[i], name, &rows, total)?;
        let mut data = vec![0f32; rows.len() * cols];
        let per = 1 << 14;
        let from = rows.start * cols;
        data.par_chunks_mut(per).enumerate().for_each(|(c, out)| {
            widen(&view, from + c * per, out);
        });
        if data.par_iter().any(|v| !v.is_finite()) {
            return Err(NetworkError::parse(&self.files.paths[i], name, "holds NaN or infinite values"));
        }
        if rows.end == total {
            self.release(i, &view);
        }
        Ok(data)
    }

    /// The matrix `name` rounded to `format`: int8 in blocks (core's `q8::quantize_blocks`,
    /// through its CPU twin) or 4 bits (core's `q4::quantize_q4`), converted and rounded in
    /// slabs of rows in parallel, so the whole f32 matrix never exists.
    pub(crate) fn read_quant(
        &self, name: &str, shape: &[usize], format: QuantFormat,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        self.read_quant_rows(name, shape, 0..shape.first().copied().unwrap_or(1), format)
    }

    /// [`Tensors::read_quant`] of rows `rows` only (see [`Tensors::read_rows`]): both
    /// formats round each row on its own, so row ranges read apart and joined are the
    /// whole matrix's rounding.
    pub(crate) fn read_quant_rows(
        &self, name: &str, shape: &[usize], rows: Range<usize>, format: QuantFormat,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let (i, view) = self.view(name, shape)?;
        let (total, cols) = rows_cols(shape);
        check_rows(&self.files.paths[i], name, &rows, total)?;
        // About 64K values a slab: enough work per task, little memory in flight.
        let slab = ((1 << 16) / cols.max(1)).max(1);
        let first = rows.start;
        let parts: Vec<Result<(Vec<f32>, Vec<f32>)>> = (0..rows.len().div_ceil(slab))
            .into_par_iter()
            .map(|s| {
                let (r0, r1) = (first + s * slab, (first + (s + 1) * slab).min(rows.end));
                let mut w = vec![0f32; (r1 - r0) * cols];
                widen(&view, r0 * cols, &mut w);
                // The rounding refuses a non-finite value itself; said here by file and
                // tensor rather than scanned for twice.
                let rounded = match format {
                    QuantFormat::Q8 => crate::backend::cpu::q8::quantize_blocks(&w, r1 - r0, cols),
                    QuantFormat::Q8Rows => crate::backend::cpu::q8::quantize_rows(&w, r1 - r0, cols),
                    QuantFormat::Q4 => rusting_brain_core::ops::q4::quantize_q4(&w, r1 - r0, cols),
                };
                rounded.map_err(|e| match e {
                    CoreError::NonFinite { .. } => {
                        NetworkError::parse(&self.files.paths[i], name, "holds NaN or infinite values")
                    }
                    e => e.into(),
                })
            })
            .collect();
        let joined = join_parts(parts)?;
        if rows.end == total {
            self.release(i, &view);
        }
        Ok(joined)
    }

    /// Hands the pages under a tensor that has been read back to the kernel (see
    /// [`release`]).
    fn release(&self, i: usize, view: &TensorView<'_>) {
        release(&self.files.maps[i], view.data());
    }

    /// Every tensor name in the files.
    pub(crate) fn names(&self) -> impl Iterator<Item = (usize, String)> + '_ {
        self.parsed
            .iter()
            .enumerate()
            .flat_map(|(i, s)| s.names().into_iter().map(move |n| (i, n.to_string())))
    }
}

/// `(rows, values a row)` of a stored shape: the first axis against the rest (a vector is
/// rows of one value).
fn rows_cols(shape: &[usize]) -> (usize, usize) {
    match shape {
        [] => (1, 1),
        [r, rest @ ..] => (*r, rest.iter().product()),
    }
}

fn check_rows(path: &Path, name: &str, rows: &Range<usize>, total: usize) -> Result<()> {
    if rows.start > rows.end || rows.end > total {
        return Err(NetworkError::parse(
            path,
            name,
            format!("rows {}..{} asked of a tensor of {total}", rows.start, rows.end),
        ));
    }
    Ok(())
}

/// Values `from..from + out.len()` of a stored tensor (F32, BF16 or F16, checked by
/// `Tensors::view`) as f32; bf16 and f16 widen exactly.
pub(crate) fn widen(view: &TensorView<'_>, from: usize, out: &mut [f32]) {
    let b = view.data();
    match view.dtype() {
        Dtype::F32 => {
            for (x, c) in out.iter_mut().zip(b[4 * from..].chunks_exact(4)) {
                *x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        Dtype::BF16 => {
            for (x, c) in out.iter_mut().zip(b[2 * from..].chunks_exact(2)) {
                *x = half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        _ => {
            for (x, c) in out.iter_mut().zip(b[2 * from..].chunks_exact(2)) {
                *x = half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
    }
}

/// Hands the pages under `data` (a tensor inside `map` that has been read) back to the
/// kernel: they stay in the page cache, but stop counting in this process's memory, so a
/// load's peak is the model plus one tensor, not the model plus the files.
pub(crate) fn release(map: &memmap2::Mmap, data: &[u8]) {
    #[cfg(unix)]
    {
        let start = data.as_ptr() as usize - map.as_ptr() as usize;
        // Inward to 64 KiB, a multiple of every page size in use, so no page of a
        // neighbouring tensor is handed back.
        let page = 1 << 16;
        let (from, to) = (start.div_ceil(page) * page, (start + data.len()) / page * page);
        if to > from {
            // SAFETY: the map is read only and nothing reads this range again (each
            // tensor is read once); were it read, the kernel would fault the pages back
            // in from the file. The advice is a hint: a failure changes nothing.
            let _ =
                unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, from, to - from) };
        }
    }
    #[cfg(not(unix))]
    let _ = (map, data);
}

/// Slabs of a matrix's rows rounded apart (packed values and scales each), joined in
/// order; the first slab's error, if any.
pub(crate) fn join_parts(parts: Vec<Result<(Vec<f32>, Vec<f32>)>>) -> Result<(Vec<f32>, Vec<f32>)> {
    let total: usize = parts.iter().flatten().map(|(p, _)| p.len()).sum();
    let (mut packed, mut scales) = (Vec::with_capacity(total), Vec::new());
    for part in parts {
        let (p, sc) = part?;
        packed.extend_from_slice(&p);
        scales.extend_from_slice(&sc);
    }
    Ok((packed, scales))
}

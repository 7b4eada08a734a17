//! The parity harness: load tensors from a safetensors fixture and compare results against
//! them with a relative + absolute tolerance, reporting the worst element readably.
//!
//! Fixtures are written by the Python scripts beside them in `tests/fixtures/` (run by hand,
//! outputs committed); this crate only reads them, so CI needs no Python.

use std::fmt;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};

#[derive(Debug, thiserror::Error)]
pub enum ParityError {
    #[error("cannot read fixture {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("fixture {path} is not a valid safetensors file: {message}")]
    Format { path: PathBuf, message: String },
    #[error("fixture {path} has no tensor named `{name}`")]
    Missing { path: PathBuf, name: String },
    #[error("tensor `{name}` in {path} is {actual:?}, expected one of {expected}")]
    Dtype { path: PathBuf, name: String, actual: Dtype, expected: &'static str },
}

/// A safetensors fixture held in memory.
pub struct Fixture {
    path: PathBuf,
    bytes: Vec<u8>,
}

/// A tensor read out of a fixture, converted to f64 (exact for every dtype used here).
#[derive(Debug, Clone)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

impl Tensor {
    pub fn to_f32(&self) -> Vec<f32> {
        self.data.iter().map(|&v| v as f32).collect()
    }
}

/// `tests/fixtures/<name>` in this repository.
pub fn fixture_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name)
}

impl Fixture {
    pub fn open(path: impl AsRef<Path>) -> Result<Fixture, ParityError> {
        let path = path.as_ref().to_path_buf();
        let bytes = std::fs::read(&path).map_err(|source| ParityError::Io { path: path.clone(), source })?;
        SafeTensors::deserialize(&bytes)
            .map_err(|e| ParityError::Format { path: path.clone(), message: e.to_string() })?;
        Ok(Fixture { path, bytes })
    }

    /// Opens `tests/fixtures/<name>`.
    pub fn named(name: &str) -> Result<Fixture, ParityError> {
        Fixture::open(fixture_path(name))
    }

    fn tensors(&self) -> SafeTensors<'_> {
        // Validated in `open`, and the bytes never change afterwards.
        SafeTensors::deserialize(&self.bytes).expect("validated when the fixture was opened")
    }

    /// The metadata string `key` (generator script, package versions).
    pub fn metadata(&self, key: &str) -> Option<String> {
        let (_, meta) = SafeTensors::read_metadata(&self.bytes).ok()?;
        meta.metadata().as_ref()?.get(key).cloned()
    }

    /// Tensor `name` converted to the reference math's scalar type; panics (a test helper)
    /// when the fixture lacks it.
    pub fn real<T: rusting_brain_core::Real>(&self, name: &str) -> Vec<T> {
        let t = self.get(name).unwrap_or_else(|e| panic!("{e}"));
        t.data.iter().map(|&v| T::from_f64(v)).collect()
    }

    /// Any float or integer tensor, as f64.
    pub fn get(&self, name: &str) -> Result<Tensor, ParityError> {
        let st = self.tensors();
        let view = st
            .tensor(name)
            .map_err(|_| ParityError::Missing { path: self.path.clone(), name: name.to_string() })?;
        let raw = view.data();
        let data: Vec<f64> = match view.dtype() {
            Dtype::F32 => {
                raw.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect()
            }
            Dtype::F64 => raw.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect(),
            Dtype::I64 => {
                raw.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64).collect()
            }
            Dtype::I32 => {
                raw.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f64).collect()
            }
            other => {
                return Err(ParityError::Dtype {
                    path: self.path.clone(),
                    name: name.to_string(),
                    actual: other,
                    expected: "F32, F64, I32, I64",
                })
            }
        };
        Ok(Tensor { shape: view.shape().to_vec(), data })
    }
}

/// `|actual - expected| <= atol + rtol * |expected|`, element by element (numpy's allclose).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    pub rtol: f64,
    pub atol: f64,
}

impl Tolerance {
    pub const fn new(rtol: f64, atol: f64) -> Self {
        Tolerance { rtol, atol }
    }
}

/// The outcome of one comparison: the worst element and how far over (or under) it is.
#[derive(Debug, Clone)]
pub struct Report {
    pub name: String,
    pub shape: Vec<usize>,
    pub len: usize,
    pub tolerance: Tolerance,
    pub failing: usize,
    pub non_finite: usize,
    /// Index of the element with the largest `|a - e| / (atol + rtol |e|)`.
    pub worst_index: usize,
    pub worst_actual: f64,
    pub worst_expected: f64,
    pub worst_ratio: f64,
    pub max_abs_error: f64,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.failing == 0 && self.non_finite == 0
    }
}

fn unravel(mut index: usize, shape: &[usize]) -> Vec<usize> {
    let mut out = vec![0; shape.len()];
    for (o, &d) in out.iter_mut().zip(shape).rev() {
        if d > 0 {
            *o = index % d;
            index /= d;
        }
    }
    out
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} of {} elements outside rtol {:e} + atol {:e}{}; worst at {:?} (flat {}): got {:e}, expected {:e} \
             ({:.3}x the allowance); max abs error {:e}",
            self.name,
            self.failing,
            self.len,
            self.tolerance.rtol,
            self.tolerance.atol,
            if self.non_finite > 0 { format!(", {} not finite", self.non_finite) } else { String::new() },
            unravel(self.worst_index, &self.shape),
            self.worst_index,
            self.worst_actual,
            self.worst_expected,
            self.worst_ratio,
            self.max_abs_error
        )
    }
}

/// Compares element by element. A length mismatch, or a NaN/Inf in `actual` where
/// `expected` is finite, always fails.
pub fn compare<A: Copy + Into<f64>>(name: &str, actual: &[A], expected: &Tensor, tol: Tolerance) -> Report {
    let mut report = Report {
        name: name.to_string(),
        shape: expected.shape.clone(),
        len: expected.data.len(),
        tolerance: tol,
        failing: 0,
        non_finite: 0,
        worst_index: 0,
        worst_actual: f64::NAN,
        worst_expected: f64::NAN,
        worst_ratio: 0.0,
        max_abs_error: 0.0,
    };
    if actual.len() != expected.data.len() {
        report.failing = actual.len().max(expected.data.len());
        report.name = format!("{name} (length {} vs expected {})", actual.len(), expected.data.len());
        return report;
    }
    for (i, (&a, &e)) in actual.iter().zip(&expected.data).enumerate() {
        let a: f64 = a.into();
        let err = (a - e).abs();
        let ratio = if a.is_finite() || !e.is_finite() {
            err / (tol.atol + tol.rtol * e.abs())
        } else {
            f64::INFINITY
        };
        if !a.is_finite() && e.is_finite() {
            report.non_finite += 1;
        }
        if (ratio.is_nan() || ratio > 1.0) && a != e {
            report.failing += 1;
        }
        if err.is_finite() {
            report.max_abs_error = report.max_abs_error.max(err);
        }
        if ratio > report.worst_ratio || (ratio.is_nan() && !report.worst_ratio.is_nan()) {
            report.worst_ratio = ratio;
            report.worst_index = i;
            report.worst_actual = a;
            report.worst_expected = e;
        }
    }
    report
}

/// [`compare`], panicking with the report when it fails (for tests).
#[track_caller]
pub fn assert_close<A: Copy + Into<f64>>(
    name: &str, actual: &[A], expected: &Tensor, tol: Tolerance,
) -> Report {
    let report = compare(name, actual, expected, tol);
    assert!(report.passed(), "{report}");
    report
}

/// The root mean square of a tensor's values.
pub fn rms(t: &Tensor) -> f64 {
    (t.data.iter().map(|v| v * v).sum::<f64>() / t.data.len().max(1) as f64).sqrt()
}

/// [`assert_close`] at `rtol` with an absolute floor of `rtol * rms(expected)`: f32 error
/// follows the size of the terms a value sums, not its own, so an element near zero among
/// values of size one carries the same absolute error as its neighbours. Prints the worst
/// element's share of its bound.
pub fn assert_close_rms(name: &str, actual: &[f32], expected: &Tensor, rtol: f64) -> Report {
    let r = assert_close(name, actual, expected, Tolerance::new(rtol, rtol * rms(expected)));
    println!("{name:<28} max abs error {:.2e}, worst {:.3} of allowance", r.max_abs_error, r.worst_ratio);
    r
}

/// A picture of ours (values in [-1, 1]) against diffusers' `output_type="pt"` one (in
/// [0, 1], `(1, channels, height, width)`), 1e-3 absolute: both sides run in float32, so
/// they differ by rounding carried through a few denoising steps and the decoder. Prints
/// the worst difference.
pub fn assert_same_picture(what: &str, got: &rusting_brain::vae::Image, want: &Tensor) -> f64 {
    assert_picture_within(what, got, want, 1e-3)
}

/// [`assert_same_picture`] with a bound of `atol` per pixel value (in [0, 1]), for pictures
/// that differ by design (an int8 model against the f32 reference).
pub fn assert_picture_within(what: &str, got: &rusting_brain::vae::Image, want: &Tensor, atol: f64) -> f64 {
    assert_eq!([1, got.channels, got.height, got.width], want.shape[..], "{what}: shape");
    let ours: Vec<f32> = got.data.iter().map(|v| (v / 2.0 + 0.5).clamp(0.0, 1.0)).collect();
    let r = assert_close(what, &ours, want, Tolerance::new(0.0, atol));
    println!("{what:<28} max abs error {:.2e}", r.max_abs_error);
    r.max_abs_error
}

/// `||actual - expected|| / ||expected||`: the error of a whole tensor, for int8 results
/// whose rounding noise is judged on average. NaN anywhere gives NaN, which fails any
/// `<` bound; a length mismatch panics.
pub fn relative_l2(actual: &[f32], expected: &Tensor) -> f64 {
    assert_eq!(actual.len(), expected.data.len(), "relative_l2: lengths");
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (&a, &e) in actual.iter().zip(&expected.data) {
        diff += (a as f64 - e).powi(2);
        norm += e * e;
    }
    (diff / norm).sqrt()
}

/// Moves `model` to wgpu (lavapipe where no GPU is); false, with the reason printed, when
/// there is no adapter and RB_REQUIRE_GPU is not 1 (CI sets it, so a missing adapter fails
/// there).
pub fn to_wgpu(model: &mut rusting_brain::TransformerLm) -> bool {
    rusting_brain_test_support::gpu_or_skip("to_gpu", model.to_gpu_with(&software()), no_adapter).is_some()
}

/// [`to_wgpu`] for a dense network.
pub fn network_to_wgpu(net: &mut rusting_brain::Network) -> bool {
    rusting_brain_test_support::gpu_or_skip("to_gpu", net.to_gpu_with(&software()), no_adapter).is_some()
}

/// The software adapter (lavapipe in CI).
pub fn software() -> rusting_brain::GpuOptions {
    rusting_brain::GpuOptions { software: true, ..Default::default() }
}

/// Whether `e` says there is no GPU adapter here (what [`to_wgpu`] and the GPU tests skip on).
pub fn no_adapter(e: &rusting_brain::NetworkError) -> bool {
    matches!(e, rusting_brain::NetworkError::Gpu(m) if m.starts_with("no GPU adapter"))
}

pub use rusting_brain_test_support::worst_abs_diff;

/// Named tensors' bits (`named_parameters`, `lora_parameters`), for bitwise comparisons.
pub fn named_bits(tensors: &[(String, Vec<f32>)]) -> Vec<(String, Vec<u32>)> {
    tensors.iter().map(|(n, v)| (n.clone(), v.iter().map(|x| x.to_bits()).collect())).collect()
}

/// A JSON array of numbers from a fixture file, as f64; panics, naming nothing more, on
/// anything else (a fixture that is not what its script wrote).
pub fn json_floats(v: &serde_json::Value) -> Vec<f64> {
    v.as_array().expect("a JSON array").iter().map(|x| x.as_f64().expect("a JSON number")).collect()
}

/// Rewrites `dir/config.json` through `f`: the loaders' refusal tests break one field at a
/// time.
pub fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
}

//! `rusting_brain_kernels`: the CUDA C kernels of rusting_brain and their compiler.
//!
//! Each kernel file is a `.cu` in `cu/`, named after the op it implements (`rmsnorm.cu`
//! beside `rusting_brain_core::ops::rmsnorm`), embedded with `include_str!` so the crate
//! publishes on its own, and compiled by NVRTC at first use for the device's own
//! architecture, with the PTX cached on disk under a key of source hash, architecture and
//! NVRTC version. The CUDA libraries are loaded at run time through cudarc: nothing here
//! needs a CUDA toolkit to build, and [`probe`] turns a missing library into an error
//! (cudarc itself panics on one).
//!
//! Every kernel has its reference twin in `rusting_brain_core::ops`; CI compiles every
//! file with NVRTC (from the `nvidia-cuda-nvrtc-cu12` wheel) even without a GPU. Launching
//! them, and comparing them with the twins on a device, is the CUDA backend's part.
//!
//! The kernel files, and NVRTC where it is installed:
//!
//! ```
//! use rusting_brain_kernels::{nvrtc_version, SOURCES};
//!
//! assert!(SOURCES.iter().any(|s| s.name == "flash_attention"));
//! match nvrtc_version() {
//!     Ok((major, minor)) => println!("NVRTC {major}.{minor}"),
//!     // Without the library: an error naming it and how to install it, not a panic.
//!     Err(e) => println!("{e}"),
//! }
//! ```

#![warn(missing_docs)]
#![deny(unsafe_code)]

use std::path::{Path, PathBuf};

/// One `.cu` file: its name (the op) and its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source {
    /// The file's stem, which names the op.
    pub name: &'static str,
    /// The CUDA C++ source.
    pub code: &'static str,
}

/// What every kernel file shares (`RB_EXPORT`, the reductions), pasted in for
/// `#include "common.cuh"` (the sources are strings, not files NVRTC could find).
const COMMON: &str = include_str!("../cu/common.cuh");

/// A kernel file of `cu/` by its op name.
macro_rules! source {
    ($name:literal) => {
        Source { name: $name, code: include_str!(concat!("../cu/", $name, ".cu")) }
    };
}

/// Every kernel file.
pub const SOURCES: &[Source] = &[
    source!("rmsnorm"),
    source!("swiglu"),
    source!("rope"),
    source!("cross_entropy"),
    source!("optim"),
    source!("l2norm"),
    source!("embedding"),
    source!("attention"),
    source!("flash_attention"),
    source!("elementwise"),
    source!("softmax"),
    source!("moe"),
    source!("q8"),
];

/// What can go wrong before a kernel runs; every message says what to change.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// A CUDA library cannot be loaded.
    #[error("the CUDA library `{lib}` is not installed or not on the loader path (tried {tried}); install the NVIDIA driver (libcuda) and NVRTC (the CUDA toolkit, or the nvidia-cuda-nvrtc-cu12 wheel on LD_LIBRARY_PATH; docs/INSTALL_CUDA.md), or use another backend")]
    LibraryMissing {
        /// The library ("cuda", "nvrtc", "cublasLt").
        lib: &'static str,
        /// The file names looked for.
        tried: String,
    },
    /// A kernel file did not compile.
    #[error("NVRTC could not compile kernel file `{kernel}` for {arch}: {message}\n{log}")]
    Compile {
        /// The kernel file.
        kernel: String,
        /// The architecture compiled for.
        arch: String,
        /// NVRTC's error.
        message: String,
        /// NVRTC's compile log.
        log: String,
    },
    /// An architecture name NVRTC does not take.
    #[error("`{0}` is not a GPU architecture NVRTC takes (expected like compute_80 or sm_90)")]
    BadArch(String),
    /// The compiled-kernel cache could not be read or written.
    #[error("kernel cache {path}: {source}")]
    Cache {
        /// The cache file or folder.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
}

/// The CUDA libraries the backend loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Library {
    /// The driver API (`libcuda`).
    Driver,
    /// The runtime compiler.
    Nvrtc,
    /// cuBLASLt, for the GEMMs.
    CublasLt,
}

impl Library {
    fn name(self) -> &'static str {
        match self {
            Library::Driver => "cuda",
            Library::Nvrtc => "nvrtc",
            Library::CublasLt => "cublasLt",
        }
    }
}

/// Whether `lib` can be loaded, by the same names cudarc will try. Call it before the
/// first cudarc call into that library: cudarc panics where this returns an error.
pub fn probe(lib: Library) -> Result<(), KernelError> {
    let candidates = cudarc::get_lib_name_candidates(lib.name());
    for name in &candidates {
        // SAFETY: loading a shared library runs its initializers; these are NVIDIA's
        // CUDA libraries, loaded by the names cudarc itself loads them by.
        #[allow(unsafe_code)]
        if unsafe { libloading::Library::new(name) }.is_ok() {
            return Ok(());
        }
    }
    Err(KernelError::LibraryMissing { lib: lib.name(), tried: candidates.join(", ") })
}

/// NVRTC's version, as (major, minor).
pub fn nvrtc_version() -> Result<(i32, i32), KernelError> {
    probe(Library::Nvrtc)?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-pointers to live locals; the library was found by `probe`.
    #[allow(unsafe_code)]
    let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if status != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(KernelError::LibraryMissing {
            lib: "nvrtc",
            tried: format!("nvrtcVersion returned {status:?}"),
        });
    }
    Ok((major, minor))
}

/// `compute_XY` for an `sm_XY`, `compute_XY` or `XY` spelling.
pub fn virtual_arch(arch: &str) -> Result<String, KernelError> {
    let digits = arch.strip_prefix("sm_").or_else(|| arch.strip_prefix("compute_")).unwrap_or(arch);
    if digits.len() >= 2 && digits.chars().all(|c| c.is_ascii_digit() || c == 'a') {
        Ok(format!("compute_{digits}"))
    } else {
        Err(KernelError::BadArch(arch.to_string()))
    }
}

/// FNV-1a over the bytes: a cache key that is the same in every process and build.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100000001b3))
}

/// The text NVRTC compiles for `source`: the shared header pasted in.
pub fn expanded(source: &Source) -> String {
    source.code.replace("#include \"common.cuh\"", COMMON)
}

/// Compiles kernel files to PTX for one architecture, keeping the results on disk.
#[derive(Debug, Clone)]
pub struct Compiler {
    arch: String,
    cache: Option<PathBuf>,
}

impl Compiler {
    /// For `arch` (`sm_90`, `compute_80`, ...), caching in `cache` when given.
    pub fn new(arch: &str, cache: Option<PathBuf>) -> Result<Compiler, KernelError> {
        Ok(Compiler { arch: virtual_arch(arch)?, cache })
    }

    /// Where PTX is cached by default: `$RB_KERNEL_CACHE`, else `$XDG_CACHE_HOME` or
    /// `~/.cache`, under `rusting_brain/kernels`.
    pub fn default_cache() -> Option<PathBuf> {
        if let Some(p) = std::env::var_os("RB_KERNEL_CACHE") {
            return Some(PathBuf::from(p));
        }
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))?;
        Some(base.join("rusting_brain").join("kernels"))
    }

    /// The architecture the kernels are compiled for (`sm_90`...).
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// The cache file for `source` (its name holds everything the PTX depends on).
    fn cache_path(&self, source: &Source, nvrtc: (i32, i32)) -> Option<PathBuf> {
        let text = expanded(source);
        self.cache.as_ref().map(|dir| {
            dir.join(format!(
                "{}-{}-nvrtc{}.{}-{:016x}.ptx",
                source.name,
                self.arch,
                nvrtc.0,
                nvrtc.1,
                fnv1a(text.as_bytes())
            ))
        })
    }

    /// The PTX of `source`: from the cache when it holds this exact source, architecture
    /// and NVRTC version, else compiled now (and cached, written atomically).
    pub fn ptx(&self, source: &Source) -> Result<String, KernelError> {
        let version = nvrtc_version()?;
        let path = self.cache_path(source, version);
        if let Some(p) = &path {
            if let Ok(ptx) = std::fs::read_to_string(p) {
                if ptx.contains(".entry") {
                    return Ok(ptx);
                }
            }
        }
        let ptx = self.compile(source)?;
        if let Some(p) = &path {
            let err = |e| KernelError::Cache { path: p.clone(), source: e };
            if let Some(dir) = p.parent() {
                std::fs::create_dir_all(dir).map_err(err)?;
            }
            let tmp = p.with_extension(format!("tmp{}", std::process::id()));
            std::fs::write(&tmp, &ptx).map_err(err)?;
            std::fs::rename(&tmp, p).map_err(err)?;
        }
        Ok(ptx)
    }

    /// Compiles `source` with NVRTC, no cache.
    pub fn compile(&self, source: &Source) -> Result<String, KernelError> {
        probe(Library::Nvrtc)?;
        let opts = cudarc::nvrtc::CompileOptions {
            options: vec![
                format!("--gpu-architecture={}", self.arch),
                "--std=c++17".into(),
                "-default-device".into(),
            ],
            name: Some(format!("{}.cu", source.name)),
            ..Default::default()
        };
        let fail = |message: String, log: String| KernelError::Compile {
            kernel: source.name.to_string(),
            arch: self.arch.clone(),
            message,
            log,
        };
        match cudarc::nvrtc::compile_ptx_with_opts(expanded(source), opts) {
            Ok(ptx) => Ok(ptx.to_src()),
            Err(cudarc::nvrtc::CompileError::CompileError { nvrtc, log, .. }) => {
                Err(fail(format!("{nvrtc:?}"), log.to_string_lossy().into_owned()))
            }
            Err(e) => Err(fail(format!("{e:?}"), String::new())),
        }
    }
}

//! The CUDA backend (feature `cuda`): every primitive of `rusting_brain_core::Backend` on one
//! NVIDIA GPU, through cudarc with the driver, NVRTC and cuBLASLt loaded at run time.
//!
//! - GEMMs go to cuBLASLt ([`gemm`]): FP32 operands with FP32 compute (TF32 off unless
//!   [`CudaBackend::set_tf32`] turns it on), or BF16 operands with FP32 accumulation and an
//!   FP32 result when the model asks for [`OperandPrecision::Bf16`] (mixed precision).
//! - Everything else is a kernel of `rusting_brain_kernels` (the `.cu` files of `kernels/`),
//!   compiled by NVRTC for this device's architecture at first use and cached on disk.
//! - Attention: the BF16 tensor-core flash kernels (head size 64 or 128) under mixed
//!   precision, the FP32 kernels otherwise.
//!
//! Fail-closed: a missing library, a failed compile, launch, allocation or cuBLAS call is a
//! `CoreError::Device`, never a quiet fallback to the CPU. Every allocation is counted
//! against the budget given to [`CudaBackend::new`] and refused, before it is made, when it
//! would pass it.
//!
//! Reductions (sums of squares, losses) are summed per block in a fixed grid and the
//! partial sums added on the host in f64, in block order: the same bits on every run.

mod activation;
mod gemm;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use rusting_brain_core::backend::*;
use rusting_brain_core::error::{check_len, check_range};
use rusting_brain_core::ops;
use rusting_brain_core::{Activation, CoreError, Loss, Result};
use rusting_brain_kernels::{probe, Compiler, Library, SOURCES};

use gemm::{alignment, GemmKey, Lt};

/// Blocks of the fixed-size reduction grids: enough to fill a large GPU, few enough that
/// the host adds the partial sums in microseconds.
const REDUCE_BLOCKS: usize = 1024;
const THREADS: u32 = 256;

fn dev_err(message: impl Into<String>) -> CoreError {
    CoreError::Device { backend: "cuda", message: message.into() }
}

pub(crate) fn drv(what: &str) -> impl Fn(cudarc::driver::DriverError) -> CoreError + '_ {
    move |e| dev_err(format!("{what}: {e:?}"))
}

/// Bytes the backend may hold on the device, and bytes held now.
#[derive(Debug)]
struct Budget {
    limit: usize,
    used: AtomicUsize,
}

impl Budget {
    fn take(&self, bytes: usize, what: &str) -> Result<()> {
        let used = self.used.fetch_add(bytes, Ordering::SeqCst);
        if used + bytes > self.limit {
            self.used.fetch_sub(bytes, Ordering::SeqCst);
            return Err(dev_err(format!(
                "{what}: {:.1} MiB more would pass the budget of {:.1} MiB ({:.1} MiB in use); give to_cuda a larger budget or use a smaller batch",
                bytes as f64 / MIB,
                self.limit as f64 / MIB,
                used as f64 / MIB
            )));
        }
        Ok(())
    }
    fn give(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::SeqCst);
    }
}

const MIB: f64 = 1024.0 * 1024.0;

/// A device buffer of f32, counted against its backend's budget until dropped.
pub struct CudaBuffer {
    data: CudaSlice<f32>,
    len: usize,
    budget: Arc<Budget>,
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        self.budget.give(self.len.max(1) * 4);
    }
}

impl std::fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBuffer({} f32)", self.len)
    }
}

/// Scratch memory reused across calls (BF16 operand copies, partial sums, routing
/// tables); grown when a call needs more, counted against the budget.
struct Scratch<T: DeviceRepr> {
    buf: Option<CudaSlice<T>>,
}

struct Device {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    name: String,
    arch: (i32, i32),
    funcs: HashMap<&'static str, CudaFunction>,
    lt: Mutex<Lt>,
    budget: Arc<Budget>,
    bf16_a: Mutex<Scratch<u16>>,
    bf16_b: Mutex<Scratch<u16>>,
    partials: Mutex<Scratch<f32>>,
    /// RMSNorm's per-row weight gradients, and column sums' per-chunk partial sums.
    rows_dw: Mutex<Scratch<f32>>,
    col_partials: Mutex<Scratch<f32>>,
    tf32: AtomicBool,
    flash: AtomicBool,
}

/// The CUDA backend. Cheap to clone (the device is shared); buffers are [`CudaBuffer`].
#[derive(Clone)]
pub struct CudaBackend {
    dev: Arc<Device>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBackend({})", self.dev.name)
    }
}

/// Whether a CUDA driver and at least one device are here; the reason when not. Nothing
/// is initialized beyond the driver.
pub fn cuda_available() -> std::result::Result<usize, String> {
    probe(Library::Driver).map_err(|e| e.to_string())?;
    let n = CudaContext::device_count().map_err(|e| format!("cuDeviceGetCount: {e:?}"))?;
    if n < 1 {
        return Err("the CUDA driver sees no device".into());
    }
    Ok(n as usize)
}

/// Every family's kernels (each family file names its own), loaded when the backend starts.
const KERNELS: &[(&str, &[&str])] = &[
    rmsnorm::KERNELS,
    swiglu::KERNELS,
    rope::KERNELS,
    cross_entropy::KERNELS,
    optim::KERNELS,
    l2norm::KERNELS,
    embedding::KERNELS,
    attention::KERNELS,
    attention::FLASH_KERNELS,
    elementwise::KERNELS,
    softmax::KERNELS,
    moe::KERNELS,
    q8::KERNELS,
];

/// One launch: `launch!(self, "kernel", cfg; arg, arg, ...)` with every argument a reference
/// (`&mut` for outputs). The builder chain is one expression so temporaries such as
/// `&(n as i64)` live until the launch.
macro_rules! launch {
    ($s:expr, $name:literal, $cfg:expr; $($arg:expr),+ $(,)?) => {{
        let f = $s.func($name)?;
        // SAFETY: the arguments match the kernel's C signature in kernels/cu (checked by the
        // on-device tests), and every buffer holds the elements its shape arguments imply
        // (checked by the caller before the launch).
        let r = unsafe { $s.dev.stream.launch_builder(f)$(.arg($arg))+.launch($cfg) };
        r.map(|_| ()).map_err(|e| dev_err(format!("launching {}: {e:?}", $name)))
    }};
}

// Op families, each beside its kernel file in kernels/cu and its twin in core's ops;
// declared after `launch!` so they can use it.
mod attention;
mod cross_entropy;
mod dense;
mod elementwise;
mod embedding;
mod l2norm;
mod loss;
mod matmul;
mod memory;
mod moe;
mod optim;
mod q8;
mod rmsnorm;
mod rope;
mod softmax;
mod swiglu;

pub(crate) fn grid(n: usize) -> LaunchConfig {
    // Grid-stride kernels: a bounded grid covers any n.
    let blocks = n.div_ceil(THREADS as usize).clamp(1, 65_535) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
}

fn rows_grid(rows: usize, threads: u32) -> Result<LaunchConfig> {
    if rows > i32::MAX as usize {
        return Err(dev_err(format!("{rows} rows is more than one launch takes")));
    }
    Ok(LaunchConfig { grid_dim: (rows.max(1) as u32, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 })
}

fn i32_of(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| dev_err(format!("{what} = {v} does not fit the kernels' 32-bit indices")))
}

impl CudaBackend {
    /// Device `ordinal`, with at most `budget_mib` MiB of device memory for buffers,
    /// scratch and the cuBLASLt workspace. Compiles (or reads from the cache) every kernel
    /// for the device's architecture. Needs compute capability 8.0 or later (the BF16
    /// tensor-core kernels).
    pub fn new(ordinal: usize, budget_mib: usize) -> Result<CudaBackend> {
        probe(Library::Driver).map_err(|e| dev_err(e.to_string()))?;
        probe(Library::Nvrtc).map_err(|e| dev_err(e.to_string()))?;
        probe(Library::CublasLt).map_err(|e| dev_err(e.to_string()))?;
        let count = CudaContext::device_count().map_err(drv("cuDeviceGetCount"))?;
        if ordinal >= count.max(0) as usize {
            return Err(dev_err(format!("there is no CUDA device {ordinal}: the driver sees {count}")));
        }
        let ctx = CudaContext::new(ordinal).map_err(drv("creating the context"))?;
        // One stream, buffers owned by the backend: the per-use event tracking cudarc does
        // for multi-stream safety is pure overhead here.
        // SAFETY: every buffer of this context is used on `stream` only.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        let name = ctx.name().map_err(drv("device name"))?;
        let arch = ctx.compute_capability().map_err(drv("compute capability"))?;
        if arch.0 < 8 {
            return Err(dev_err(format!(
                "{name} has compute capability {}.{}; the CUDA backend needs 8.0 or later (Ampere: BF16 tensor cores)",
                arch.0, arch.1
            )));
        }
        let budget =
            Arc::new(Budget { limit: budget_mib.saturating_mul(1024 * 1024), used: AtomicUsize::new(0) });
        let compiler = Compiler::new(&format!("sm_{}{}", arch.0, arch.1), Compiler::default_cache())
            .map_err(|e| dev_err(e.to_string()))?;
        let mut funcs = HashMap::new();
        for (file, names) in KERNELS {
            let src = SOURCES
                .iter()
                .find(|s| s.name == *file)
                .ok_or_else(|| dev_err(format!("kernel file {file}.cu is not in the build")))?;
            let ptx = compiler.ptx(src).map_err(|e| dev_err(e.to_string()))?;
            let module = ctx.load_module(Ptx::from_src(ptx)).map_err(drv(&format!(
                "loading {file}.cu (a driver older than the NVRTC that compiled it?)"
            )))?;
            for n in *names {
                let f = module.load_function(n).map_err(drv(&format!("kernel {n} of {file}.cu")))?;
                funcs.insert(*n, f);
            }
        }
        // cuBLASLt's workspace: 32 MiB on Hopper, 4 MiB before (NVIDIA's guidance).
        let ws_bytes = if arch.0 >= 9 { 32 << 20 } else { 4 << 20 };
        budget.take(ws_bytes, "the cuBLASLt workspace")?;
        let workspace =
            stream.alloc_zeros::<u8>(ws_bytes).map_err(drv("allocating the cuBLASLt workspace"))?;
        let lt = Lt::new(workspace).map_err(dev_err)?;
        Ok(CudaBackend {
            dev: Arc::new(Device {
                ctx,
                stream,
                name,
                arch,
                funcs,
                lt: Mutex::new(lt),
                budget,
                bf16_a: Mutex::new(Scratch { buf: None }),
                bf16_b: Mutex::new(Scratch { buf: None }),
                partials: Mutex::new(Scratch { buf: None }),
                rows_dw: Mutex::new(Scratch { buf: None }),
                col_partials: Mutex::new(Scratch { buf: None }),
                tf32: AtomicBool::new(false),
                flash: AtomicBool::new(false),
            }),
        })
    }

    /// The device's name, as the driver gives it.
    pub fn device_name(&self) -> &str {
        &self.dev.name
    }
    /// Compute capability (major, minor).
    pub fn compute_capability(&self) -> (i32, i32) {
        self.dev.arch
    }
    /// (bytes in use by this backend, budget in bytes).
    pub fn memory(&self) -> (usize, usize) {
        (self.dev.budget.used.load(Ordering::SeqCst), self.dev.budget.limit)
    }
    /// Whether the budget has room for `bytes` more; the error names the numbers.
    pub fn check_room(&self, bytes: usize, what: &str) -> Result<()> {
        self.dev.budget.take(bytes, what)?;
        self.dev.budget.give(bytes);
        Ok(())
    }
    /// FP32 GEMMs on TF32 tensor cores (10-bit mantissa products). Off by default, so FP32
    /// means FP32; BF16 GEMMs are unaffected.
    pub fn set_tf32(&self, on: bool) {
        self.dev.tf32.store(on, Ordering::SeqCst);
    }
    /// Whether FP32 GEMMs run on TF32 tensor cores.
    pub fn tf32(&self) -> bool {
        self.dev.tf32.load(Ordering::SeqCst)
    }
    /// Attention on BF16 tensor cores (the flash kernels) where the head size is 64 or 128;
    /// set with the model's mixed precision.
    pub fn set_bf16_attention(&self, on: bool) {
        self.dev.flash.store(on, Ordering::SeqCst);
    }
    /// Whether attention runs on the BF16 flash kernels where it can.
    pub fn bf16_attention(&self) -> bool {
        self.dev.flash.load(Ordering::SeqCst)
    }
    /// Waits for every queued kernel; surfaces an asynchronous fault of any of them.
    pub fn synchronize(&self) -> Result<()> {
        self.dev.stream.synchronize().map_err(drv("synchronize (a kernel failed)"))
    }

    fn func(&self, name: &str) -> Result<&CudaFunction> {
        self.dev.funcs.get(name).ok_or_else(|| dev_err(format!("kernel {name} was not loaded")))
    }

    fn alloc(&self, len: usize) -> Result<CudaBuffer> {
        // Zero-length buffers (an int8 model's missing gradients) hold one element: the
        // driver has no empty allocation.
        let bytes = len.max(1).checked_mul(4).ok_or_else(|| dev_err("buffer size overflows"))?;
        self.dev.budget.take(bytes, &format!("a buffer of {len} f32"))?;
        match self.dev.stream.alloc_zeros::<f32>(len.max(1)) {
            Ok(data) => Ok(CudaBuffer { data, len, budget: self.dev.budget.clone() }),
            Err(e) => {
                self.dev.budget.give(bytes);
                Err(dev_err(format!("allocating {bytes} bytes: {e:?}")))
            }
        }
    }

    /// A scratch buffer of at least `len` elements, grown (and counted) as needed.
    fn scratch<'a, T: DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self, slot: &'a mut Scratch<T>, len: usize, what: &str,
    ) -> Result<&'a mut CudaSlice<T>> {
        let have = slot.buf.as_ref().map_or(0, |b| b.len());
        if have < len {
            let size = std::mem::size_of::<T>();
            if let Some(old) = slot.buf.take() {
                drop(old);
                self.dev.budget.give(have * size);
            }
            // Grow by half again to spare reallocations, or exactly to `len` when only
            // that fits the budget.
            let mut grow = len.max(have * 3 / 2);
            if self.dev.budget.take(grow * size, what).is_err() {
                grow = len;
                self.dev.budget.take(grow * size, what)?;
            }
            match self.dev.stream.alloc_zeros::<T>(grow) {
                Ok(b) => slot.buf = Some(b),
                Err(e) => {
                    self.dev.budget.give(grow * size);
                    return Err(dev_err(format!("allocating {what}: {e:?}")));
                }
            }
        }
        slot.buf.as_mut().ok_or_else(|| dev_err("scratch vanished"))
    }

    fn upload_u32(&self, data: &[u32]) -> Result<CudaSlice<u32>> {
        self.dev.budget.take(data.len().max(1) * 4, "index table")?;
        let r = if data.is_empty() {
            self.dev.stream.alloc_zeros::<u32>(1)
        } else {
            self.dev.stream.clone_htod(data)
        };
        // Index tables are short-lived (one call): released right away in the count, and
        // freed when the slice drops at the end of the call.
        self.dev.budget.give(data.len().max(1) * 4);
        r.map_err(drv("uploading an index table"))
    }

    fn upload_any<T: DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self, data: &[T],
    ) -> Result<CudaSlice<T>> {
        // Short-lived like the index tables: checked against the budget, freed at the end
        // of the call.
        let bytes = std::mem::size_of_val(data).max(1);
        self.dev.budget.take(bytes, "a per-call table")?;
        self.dev.budget.give(bytes);
        if data.is_empty() {
            return self.dev.stream.alloc_zeros::<T>(1).map_err(drv("upload"));
        }
        self.dev.stream.clone_htod(data).map_err(drv("upload"))
    }

    /// The first `slots` partial sums of a reduction, added on the host in f64 in slot
    /// order (so the total does not depend on scheduling).
    fn reduce_host(&self, partials: &CudaSlice<f32>, slots: usize) -> Result<f64> {
        let host =
            self.dev.stream.clone_dtoh(&partials.slice(0..slots)).map_err(drv("reading partial sums"))?;
        Ok(host.iter().map(|&v| v as f64).sum())
    }

    fn reduce_cfg(n: usize) -> LaunchConfig {
        let blocks = n.div_ceil(THREADS as usize).clamp(1, REDUCE_BLOCKS) as u32;
        LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
    }
}

// Families this backend runs through their default methods (on the host, or through
// the backend's other primitives).
impl LoraOps for CudaBackend {}
impl ConvOps for CudaBackend {}
impl NormOps for CudaBackend {}
impl UnaryOps for CudaBackend {}
impl SdpaOps for CudaBackend {}
impl SpatialOps for CudaBackend {}
impl ModulationOps for CudaBackend {}

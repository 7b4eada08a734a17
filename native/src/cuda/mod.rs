//! The CUDA backend (feature `cuda`): every primitive of `rusting_brain_core::Backend` on one
//! NVIDIA GPU, through cudarc with the driver, NVRTC and cuBLASLt loaded at run time.
//!
//! - GEMMs go to cuBLASLt ([`gemm`]): FP32 operands with FP32 compute (TF32 off unless
//!   [`CudaBackend::set_tf32`] turns it on), or BF16 operands with FP32 accumulation and an
//!   FP32 result when the model asks for [`Precision::Bf16`] (mixed precision).
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

mod gemm;
mod lm;

pub(crate) use lm::device_copy;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use rusting_brain_core::backend::*;
use rusting_brain_core::error::{check_len, check_range, check_rows};
use rusting_brain_core::ops::{cross_entropy, elementwise, embedding, moe, optim, q8, rmsnorm, swiglu};
use rusting_brain_core::{Activation, CoreError, Loss, Result};
use rusting_brain_kernels::{probe, Compiler, Library, SOURCES};

use gemm::{alignment, GemmKey, Lt};

/// Blocks of the fixed-size reduction grids: enough to fill a large GPU, few enough that
/// the host adds the partial sums in microseconds.
const REDUCE_BLOCKS: usize = 1024;
const THREADS: u32 = 256;

fn dev_err(message: impl Into<String>) -> CoreError {
    CoreError::Device {
        backend: "cuda",
        message: message.into(),
    }
}

fn drv(what: &str) -> impl Fn(cudarc::driver::DriverError) -> CoreError + '_ {
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

/// The shape argument of the attention kernels (`struct Shape` in attention.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct AttnShape {
    batch: i32,
    q_len: i32,
    kv_len: i32,
    kv_capacity: i32,
    q_heads: i32,
    kv_heads: i32,
    head_dim: i32,
}
// SAFETY: plain-old-data of i32 fields, laid out as the C struct the kernels take.
unsafe impl DeviceRepr for AttnShape {}

/// `struct Shape` of flash_attention.cu (the head size is in the kernel's name).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct FlashShape {
    batch: i32,
    q_len: i32,
    kv_len: i32,
    kv_capacity: i32,
    q_heads: i32,
    kv_heads: i32,
}
// SAFETY: as for AttnShape.
unsafe impl DeviceRepr for FlashShape {}

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

/// Kernel names each `.cu` file must provide, checked when the backend starts so a
/// missing one is an error then, not at the first training step.
const KERNELS: &[(&str, &[&str])] = &[
    (
        "rmsnorm",
        &[
            "rmsnorm_forward",
            "rmsnorm_backward",
            "column_sum",
            "column_sum_chunks",
        ],
    ),
    ("swiglu", &["swiglu_forward", "swiglu_backward"]),
    ("rope", &["rope"]),
    ("cross_entropy", &["cross_entropy"]),
    ("adamw", &["adamw"]),
    ("l2norm", &["sum_squares"]),
    ("embedding", &["embedding_forward", "embedding_backward_grouped"]),
    (
        "attention",
        &[
            "attention_forward",
            "attention_backward_dq",
            "attention_backward_dkv",
        ],
    ),
    (
        "flash_attention",
        &[
            "flash_forward_64",
            "flash_backward_kv_64",
            "flash_backward_q_64",
            "flash_forward_128",
            "flash_backward_kv_128",
            "flash_backward_q_128",
            "flash_delta",
        ],
    ),
    (
        "elementwise",
        &[
            "fill",
            "axpy",
            "scale",
            "add_bias",
            "partial_sums",
            "activation_forward",
            "activation_backward",
            "loss_terms",
            "loss_backward",
            "sgd",
            "to_bf16",
        ],
    ),
    ("softmax", &["softmax_forward", "softmax_backward"]),
    ("moe", &["moe_combine", "moe_combine_backward"]),
    ("q8", &["q8_quantize_rows", "q8_matmul", "q8_embedding"]),
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

fn grid(n: usize) -> LaunchConfig {
    // Grid-stride kernels: a bounded grid covers any n.
    let blocks = n.div_ceil(THREADS as usize).clamp(1, 65_535) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn rows_grid(rows: usize, threads: u32) -> Result<LaunchConfig> {
    if rows > i32::MAX as usize {
        return Err(dev_err(format!("{rows} rows is more than one launch takes")));
    }
    Ok(LaunchConfig {
        grid_dim: (rows.max(1) as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    })
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
            return Err(dev_err(format!(
                "there is no CUDA device {ordinal}: the driver sees {count}"
            )));
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
        let budget = Arc::new(Budget {
            limit: budget_mib.saturating_mul(1024 * 1024),
            used: AtomicUsize::new(0),
        });
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
                let f = module
                    .load_function(n)
                    .map_err(drv(&format!("kernel {n} of {file}.cu")))?;
                funcs.insert(*n, f);
            }
        }
        // cuBLASLt's workspace: 32 MiB on Hopper, 4 MiB before (NVIDIA's guidance).
        let ws_bytes = if arch.0 >= 9 { 32 << 20 } else { 4 << 20 };
        budget.take(ws_bytes, "the cuBLASLt workspace")?;
        let workspace = stream
            .alloc_zeros::<u8>(ws_bytes)
            .map_err(drv("allocating the cuBLASLt workspace"))?;
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
    pub fn tf32(&self) -> bool {
        self.dev.tf32.load(Ordering::SeqCst)
    }
    /// Attention on BF16 tensor cores (the flash kernels) where the head size is 64 or 128;
    /// set with the model's mixed precision.
    pub fn set_bf16_attention(&self, on: bool) {
        self.dev.flash.store(on, Ordering::SeqCst);
    }
    pub fn bf16_attention(&self) -> bool {
        self.dev.flash.load(Ordering::SeqCst)
    }
    /// Waits for every queued kernel; surfaces an asynchronous fault of any of them.
    pub fn synchronize(&self) -> Result<()> {
        self.dev
            .stream
            .synchronize()
            .map_err(drv("synchronize (a kernel failed)"))
    }

    fn func(&self, name: &str) -> Result<&CudaFunction> {
        self.dev
            .funcs
            .get(name)
            .ok_or_else(|| dev_err(format!("kernel {name} was not loaded")))
    }

    fn alloc(&self, len: usize) -> Result<CudaBuffer> {
        // Zero-length buffers (an int8 model's missing gradients) hold one element: the
        // driver has no empty allocation.
        let bytes = len
            .max(1)
            .checked_mul(4)
            .ok_or_else(|| dev_err("buffer size overflows"))?;
        self.dev.budget.take(bytes, &format!("a buffer of {len} f32"))?;
        match self.dev.stream.alloc_zeros::<f32>(len.max(1)) {
            Ok(data) => Ok(CudaBuffer {
                data,
                len,
                budget: self.dev.budget.clone(),
            }),
            Err(e) => {
                self.dev.budget.give(bytes);
                Err(dev_err(format!("allocating {bytes} bytes: {e:?}")))
            }
        }
    }

    /// A scratch buffer of at least `len` elements, grown (and counted) as needed.
    fn scratch<'a, T: DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self,
        slot: &'a mut Scratch<T>,
        len: usize,
        what: &str,
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
        &self,
        data: &[T],
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
        let host = self
            .dev
            .stream
            .clone_dtoh(&partials.slice(0..slots))
            .map_err(drv("reading partial sums"))?;
        Ok(host.iter().map(|&v| v as f64).sum())
    }

    fn reduce_cfg(n: usize) -> LaunchConfig {
        let blocks = n.div_ceil(THREADS as usize).clamp(1, REDUCE_BLOCKS) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Rounds `len` f32 of `src` from `offset` to bf16 into `dst`.
    fn to_bf16(&self, dst: &mut CudaSlice<u16>, src: &CudaBuffer, offset: usize, len: usize) -> Result<()> {
        let view = src.data.slice(offset..offset + len);
        launch!(self, "to_bf16", grid(len); dst, &view, &(len as i64))
    }

    fn gemm(&self, c: &mut CudaBuffer, a: &CudaBuffer, b: &CudaBuffer, spec: &MatmulSpec) -> Result<()> {
        let (la, lb, lc) = spec.check("matmul", a.len, b.len, c.len)?;
        let (wa, wb, wc) = spec.window.map_or((0, 0, 0), |w| (w.a, w.b, w.c));
        let (m, n, k, batch) = (spec.m, spec.n, spec.k, spec.batch);
        if m == 0 || n == 0 || batch == 0 {
            return Ok(());
        }
        if k == 0 {
            // C = beta C: no product to run.
            let mut view = c.data.slice_mut(wc..wc + lc * batch);
            let total = lc * batch;
            return if spec.beta == 0.0 {
                launch!(self, "fill", grid(total); &mut view, &0.0f32, &(total as i64))
            } else {
                launch!(self, "scale", grid(total); &mut view, &spec.beta, &(total as i64))
            };
        }
        let bf16 = spec.precision == Precision::Bf16;
        // cuBLASLt runs in whatever context is current on this thread; cudarc's own calls
        // bind it, raw ones do not.
        self.dev
            .ctx
            .bind_to_thread()
            .map_err(drv("binding the CUDA context"))?;
        let stream = &self.dev.stream;
        let (c_ptr, _gc) = c.data.device_ptr_mut(stream);
        let c_ptr = c_ptr + (wc * 4) as u64;
        let mut a_guard = self
            .dev
            .bf16_a
            .lock()
            .map_err(|_| dev_err("scratch lock poisoned"))?;
        let mut b_guard = self
            .dev
            .bf16_b
            .lock()
            .map_err(|_| dev_err("scratch lock poisoned"))?;
        let (a_ptr, b_ptr) = if bf16 {
            let sa = self.scratch(&mut a_guard, la * batch, "BF16 operand scratch")?;
            self.to_bf16(sa, a, wa, la * batch)?;
            let pa = sa.device_ptr(stream).0;
            let sb = self.scratch(&mut b_guard, lb * batch, "BF16 operand scratch")?;
            self.to_bf16(sb, b, wb, lb * batch)?;
            (pa, sb.device_ptr(stream).0)
        } else {
            let (pa, _) = a.data.device_ptr(stream);
            let (pb, _) = b.data.device_ptr(stream);
            (pa + (wa * 4) as u64, pb + (wb * 4) as u64)
        };
        let key = GemmKey {
            m,
            n,
            k,
            trans_a: spec.trans_a,
            trans_b: spec.trans_b,
            batch,
            bf16,
            tf32: self.tf32(),
            align: [alignment(a_ptr), alignment(b_ptr), alignment(c_ptr)],
        };
        let mut lt = self
            .dev
            .lt
            .lock()
            .map_err(|_| dev_err("cuBLASLt lock poisoned"))?;
        let ws = lt.workspace.device_ptr(stream).0;
        // SAFETY: the pointers address the operands `spec.check` validated (offset by the
        // window), in bf16 scratch of la*batch / lb*batch elements when bf16; all on this
        // backend's device and stream.
        unsafe {
            lt.run(
                key,
                a_ptr,
                b_ptr,
                c_ptr,
                spec.alpha,
                spec.beta,
                ws,
                stream.cu_stream(),
            )
        }
        .map_err(dev_err)
    }

    /// `acc[c] += sum over rows of m[r][c]` for an (rows, cols) matrix, in two fixed stages
    /// (chunks of rows, then the chunks in order): deterministic, and parallel over rows.
    fn column_sum(
        &self,
        acc: &mut CudaSlice<f32>,
        m: &CudaSlice<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let col_blocks = cols.div_ceil(THREADS as usize);
        if col_blocks > 65_535 {
            return Err(dev_err(format!(
                "{cols} columns is more than the column-sum kernels take"
            )));
        }
        let chunk_rows = rows.div_ceil(65_535).max(256);
        let chunks = rows.div_ceil(chunk_rows);
        let mut guard = self
            .dev
            .col_partials
            .lock()
            .map_err(|_| dev_err("scratch lock poisoned"))?;
        let partial = self.scratch(&mut guard, chunks * cols, "column-sum scratch")?;
        let (r, c, cr, ch) = (
            i32_of("rows", rows)?,
            i32_of("cols", cols)?,
            i32_of("rows", chunk_rows)?,
            i32_of("rows", chunks)?,
        );
        let cfg = LaunchConfig {
            grid_dim: (col_blocks as u32, chunks as u32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(self, "column_sum_chunks", cfg; &mut *partial, m, &r, &c, &cr)?;
        let cfg = LaunchConfig {
            grid_dim: (col_blocks as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(self, "column_sum", cfg; acc, &*partial, &ch, &c)
    }

    fn sum_squares_into(&self, partials: &mut CudaSlice<f32>, slot: usize, x: &CudaBuffer) -> Result<()> {
        let mut view = partials.slice_mut(slot * REDUCE_BLOCKS..(slot + 1) * REDUCE_BLOCKS);
        launch!(self, "sum_squares", Self::reduce_cfg(x.len); &mut view, &x.data, &(x.len as i64))
    }

    fn attention_shape(spec: &AttentionSpec) -> Result<AttnShape> {
        Ok(AttnShape {
            batch: i32_of("batch", spec.batch)?,
            q_len: i32_of("q_len", spec.q_len)?,
            kv_len: i32_of("kv_len", spec.kv_len)?,
            kv_capacity: i32_of("kv_capacity", spec.kv_capacity)?,
            q_heads: i32_of("q_heads", spec.q_heads)?,
            kv_heads: i32_of("kv_heads", spec.kv_heads)?,
            head_dim: i32_of("head_dim", spec.head_dim)?,
        })
    }

    fn flash_shape(s: &AttnShape) -> FlashShape {
        FlashShape {
            batch: s.batch,
            q_len: s.q_len,
            kv_len: s.kv_len,
            kv_capacity: s.kv_capacity,
            q_heads: s.q_heads,
            kv_heads: s.kv_heads,
        }
    }

    /// Whether this call takes the tensor-core kernels.
    fn use_flash(&self, spec: &AttentionSpec) -> bool {
        self.bf16_attention() && (spec.head_dim == 64 || spec.head_dim == 128)
    }

    fn warps_cfg(rows: usize) -> Result<LaunchConfig> {
        // 8 warps a block, one warp a row.
        let blocks = rows.div_ceil(8);
        if blocks > i32::MAX as usize {
            return Err(dev_err("too many rows for one launch"));
        }
        Ok(LaunchConfig {
            grid_dim: (blocks.max(1) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        })
    }

    fn flash_cfg(blocks: usize, s: &FlashShape, heads: i32) -> Result<LaunchConfig> {
        if blocks > i32::MAX as usize || s.batch > 65_535 || heads > 65_535 {
            return Err(dev_err("attention grid too large for one launch"));
        }
        Ok(LaunchConfig {
            grid_dim: (blocks.max(1) as u32, heads as u32, s.batch as u32),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        })
    }
}

fn act_code(act: Activation) -> (i32, f32) {
    match act {
        Activation::Identity => (0, 0.0),
        Activation::Relu => (1, 0.0),
        Activation::LeakyRelu(a) => (2, a),
        Activation::Sigmoid => (3, 0.0),
        Activation::Tanh => (4, 0.0),
        // Row-wise: handled by the softmax kernels.
        Activation::Softmax => (5, 0.0),
    }
}

/// `loss_backward`'s code for the fused softmax/sigmoid + cross-entropy gradient,
/// `(pred - target) / divisor`.
const FUSED_OUTPUT: i32 = 3;

fn loss_code(loss: Loss) -> i32 {
    match loss {
        Loss::MeanSquaredError => 0,
        Loss::BinaryCrossEntropy => 1,
        Loss::CategoricalCrossEntropy => 2,
    }
}

impl Backend for CudaBackend {
    type Buffer = CudaBuffer;

    fn name(&self) -> &'static str {
        "cuda"
    }
    fn synchronize(&self) -> Result<()> {
        CudaBackend::synchronize(self)
    }
    fn zeros(&self, len: usize) -> Result<CudaBuffer> {
        self.alloc(len)
    }
    fn upload(&self, data: &[f32]) -> Result<CudaBuffer> {
        let mut b = self.alloc(data.len())?;
        if !data.is_empty() {
            self.dev
                .stream
                .memcpy_htod(data, &mut b.data)
                .map_err(drv("copying to the device"))?;
        }
        Ok(b)
    }
    fn download(&self, buf: &CudaBuffer) -> Result<Vec<f32>> {
        if buf.len == 0 {
            return Ok(Vec::new());
        }
        self.dev
            .stream
            .clone_dtoh(&buf.data.slice(0..buf.len))
            .map_err(drv("copying from the device (or an earlier kernel failed)"))
    }
    fn write(&self, dst: &mut CudaBuffer, data: &[f32]) -> Result<()> {
        check_len("write", "data", data.len(), dst.len)?;
        if data.is_empty() {
            return Ok(());
        }
        self.dev
            .stream
            .memcpy_htod(data, &mut dst.data)
            .map_err(drv("copying to the device"))
    }
    fn len(&self, buf: &CudaBuffer) -> usize {
        buf.len
    }
    fn fill(&self, buf: &mut CudaBuffer, value: f32) -> Result<()> {
        let n = buf.len;
        if n == 0 {
            return Ok(());
        }
        launch!(self, "fill", grid(n); &mut buf.data, &value, &(n as i64))
    }
    fn copy(&self, dst: &mut CudaBuffer, src: &CudaBuffer) -> Result<()> {
        check_len("copy", "src", src.len, dst.len)?;
        self.copy_range(dst, 0, src, 0, src.len)
    }
    fn copy_range(
        &self,
        dst: &mut CudaBuffer,
        dst_offset: usize,
        src: &CudaBuffer,
        src_offset: usize,
        len: usize,
    ) -> Result<()> {
        check_range("copy_range", "dst", dst.len, dst_offset, len)?;
        check_range("copy_range", "src", src.len, src_offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let from = src.data.slice(src_offset..src_offset + len);
        let mut to = dst.data.slice_mut(dst_offset..dst_offset + len);
        self.dev
            .stream
            .memcpy_dtod(&from, &mut to)
            .map_err(drv("device copy"))
    }
    fn axpy(&self, y: &mut CudaBuffer, alpha: f32, x: &CudaBuffer) -> Result<()> {
        check_len("axpy", "x", x.len, y.len)?;
        let n = y.len;
        if n == 0 {
            return Ok(());
        }
        launch!(self, "axpy", grid(n); &mut y.data, &alpha, &x.data, &(n as i64))
    }
    fn scale(&self, x: &mut CudaBuffer, alpha: f32) -> Result<()> {
        let n = x.len;
        if n == 0 {
            return Ok(());
        }
        launch!(self, "scale", grid(n); &mut x.data, &alpha, &(n as i64))
    }
    fn sum_of_squares(&self, x: &CudaBuffer) -> Result<f64> {
        self.sum_of_squares_many(&[x])
    }
    fn sum_of_squares_many(&self, xs: &[&CudaBuffer]) -> Result<f64> {
        // One partials slot range per tensor, one download for all: the global norm costs
        // one host round trip, not one per parameter.
        let mut guard = self
            .dev
            .partials
            .lock()
            .map_err(|_| dev_err("scratch lock poisoned"))?;
        let slots = xs.len().max(1) * REDUCE_BLOCKS;
        let partials = self.scratch(&mut guard, slots, "reduction scratch")?;
        let mut zero = partials.slice_mut(0..slots);
        self.dev
            .stream
            .memset_zeros(&mut zero)
            .map_err(drv("clearing partial sums"))?;
        for (i, x) in xs.iter().enumerate() {
            if x.len > 0 {
                self.sum_squares_into(partials, i, x)?;
            }
        }
        self.reduce_host(partials, slots)
    }
    fn matmul(&self, c: &mut CudaBuffer, a: &CudaBuffer, b: &CudaBuffer, spec: &MatmulSpec) -> Result<()> {
        self.gemm(c, a, b, spec)
    }
    fn add_bias(&self, out: &mut CudaBuffer, bias: &CudaBuffer, rows: usize, cols: usize) -> Result<()> {
        elementwise::check_bias("add_bias", ["out", "bias"], out.len, bias.len, rows, cols)?;
        let n = rows * cols;
        if n == 0 {
            return Ok(());
        }
        launch!(self, "add_bias", grid(n); &mut out.data, &bias.data, &(n as i64), &i32_of("cols", cols)?)
    }
    fn bias_backward(
        &self,
        dbias: &mut CudaBuffer,
        dout: &CudaBuffer,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        elementwise::check_bias(
            "bias_backward",
            ["dout", "dbias"],
            dout.len,
            dbias.len,
            rows,
            cols,
        )?;
        if cols == 0 {
            return Ok(());
        }
        self.column_sum(&mut dbias.data, &dout.data, rows, cols)
    }
    fn activation_forward(
        &self,
        act: Activation,
        out: &mut CudaBuffer,
        inp: &CudaBuffer,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        let n = check_rows(
            "activation_forward",
            rows,
            cols,
            &[("inp", inp.len), ("out", out.len)],
        )?;
        if n == 0 {
            return Ok(());
        }
        if act == Activation::Softmax {
            return self.softmax_forward(out, inp, rows, cols);
        }
        let (code, alpha) = act_code(act);
        launch!(self, "activation_forward", grid(n); &mut out.data, &inp.data, &(n as i64), &code, &alpha)
    }
    fn activation_backward(
        &self,
        act: Activation,
        dinp: &mut CudaBuffer,
        dout: &CudaBuffer,
        inp: &CudaBuffer,
        out: &CudaBuffer,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        const OP: &str = "activation_backward";
        let n = check_rows(OP, rows, cols, &[("inp", inp.len), ("out", out.len)])?;
        check_len(OP, "dinp", dinp.len, n)?;
        check_len(OP, "dout", dout.len, n)?;
        if n == 0 {
            return Ok(());
        }
        if act == Activation::Softmax {
            return self.softmax_backward(dinp, dout, out, rows, cols);
        }
        let (code, alpha) = act_code(act);
        launch!(self, "activation_backward", grid(n);
            &mut dinp.data, &dout.data, &inp.data, &out.data, &(n as i64), &code, &alpha)
    }
    fn loss_forward(
        &self,
        loss: Loss,
        pred: &CudaBuffer,
        target: &CudaBuffer,
        rows: usize,
        cols: usize,
    ) -> Result<f64> {
        const OP: &str = "loss_forward";
        let n = check_rows(OP, rows, cols, &[("pred", pred.len), ("target", target.len)])?;
        if rows == 0 || n == 0 {
            return Ok(0.0);
        }
        let mut terms = self.alloc(n)?;
        launch!(self, "loss_terms", grid(n);
            &mut terms.data, &pred.data, &target.data, &(n as i64), &loss_code(loss))?;
        let mut guard = self
            .dev
            .partials
            .lock()
            .map_err(|_| dev_err("scratch lock poisoned"))?;
        let partials = self.scratch(&mut guard, REDUCE_BLOCKS, "reduction scratch")?;
        let cfg = Self::reduce_cfg(n);
        let blocks = cfg.grid_dim.0 as usize;
        launch!(self, "partial_sums", cfg; &mut *partials, &terms.data, &(n as i64))?;
        let value = self.reduce_host(partials, blocks)? / loss.divisor(rows, cols) as f64;
        if !value.is_finite() {
            return Err(CoreError::NonFinite { op: OP, value });
        }
        Ok(value)
    }
    fn loss_backward(
        &self,
        loss: Loss,
        dpred: &mut CudaBuffer,
        pred: &CudaBuffer,
        target: &CudaBuffer,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        let code = loss_code(loss);
        self.loss_gradient(
            "loss_backward",
            "dpred",
            code,
            loss,
            dpred,
            pred,
            target,
            rows,
            cols,
        )
    }
    fn fused_output_backward(
        &self,
        loss: Loss,
        dlogits: &mut CudaBuffer,
        pred: &CudaBuffer,
        target: &CudaBuffer,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        self.loss_gradient(
            "fused_output_backward",
            "dlogits",
            FUSED_OUTPUT,
            loss,
            dlogits,
            pred,
            target,
            rows,
            cols,
        )
    }
    fn rmsnorm_forward(
        &self,
        out: &mut CudaBuffer,
        rstd: &mut CudaBuffer,
        inp: &CudaBuffer,
        weight: &CudaBuffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        rmsnorm::check_rmsnorm_forward(out.len, rstd.len, inp.len, weight.len, rows, dim)?;
        if rows == 0 {
            return Ok(());
        }
        let (r, d) = (i32_of("rows", rows)?, i32_of("dim", dim)?);
        launch!(self, "rmsnorm_forward", rows_grid(rows, 256)?;
            &mut out.data, &mut rstd.data, &inp.data, &weight.data, &r, &d, &eps)
    }
    fn rmsnorm_backward(
        &self,
        dinp: &mut CudaBuffer,
        dweight: &mut CudaBuffer,
        dout: &CudaBuffer,
        inp: &CudaBuffer,
        weight: &CudaBuffer,
        rstd: &CudaBuffer,
        rows: usize,
        dim: usize,
    ) -> Result<()> {
        rmsnorm::check_rmsnorm_backward(
            dinp.len,
            dweight.len,
            dout.len,
            inp.len,
            weight.len,
            rstd.len,
            rows,
            dim,
        )?;
        if rows == 0 {
            return Ok(());
        }
        let (r, d) = (i32_of("rows", rows)?, i32_of("dim", dim)?);
        // Per-row weight gradients (scratch kept between calls), then a column sum in row
        // order: no atomics.
        let mut guard = self
            .dev
            .rows_dw
            .lock()
            .map_err(|_| dev_err("scratch lock poisoned"))?;
        let rows_dw = self.scratch(&mut guard, rows * dim, "RMSNorm weight-gradient scratch")?;
        launch!(self, "rmsnorm_backward", rows_grid(rows, 256)?;
            &mut dinp.data, &mut *rows_dw, &dout.data, &inp.data, &weight.data, &rstd.data, &r, &d)?;
        self.column_sum(&mut dweight.data, rows_dw, rows, dim)
    }
    fn rope_forward(&self, x: &mut CudaBuffer, spec: &RopeSpec) -> Result<()> {
        self.rope(x, spec, 1.0, "rope_forward")
    }
    fn rope_backward(&self, dx: &mut CudaBuffer, spec: &RopeSpec) -> Result<()> {
        self.rope(dx, spec, -1.0, "rope_backward")
    }
    fn softmax_forward(
        &self,
        out: &mut CudaBuffer,
        inp: &CudaBuffer,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        check_rows(
            "softmax_forward",
            rows,
            cols,
            &[("inp", inp.len), ("out", out.len)],
        )?;
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let (r, c) = (i32_of("rows", rows)?, i32_of("cols", cols)?);
        launch!(self, "softmax_forward", rows_grid(rows, 256)?; &mut out.data, &inp.data, &r, &c)
    }
    fn softmax_backward(
        &self,
        dinp: &mut CudaBuffer,
        dout: &CudaBuffer,
        out: &CudaBuffer,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        check_rows(
            "softmax_backward",
            rows,
            cols,
            &[("dinp", dinp.len), ("dout", dout.len), ("out", out.len)],
        )?;
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let (r, c) = (i32_of("rows", rows)?, i32_of("cols", cols)?);
        launch!(self, "softmax_backward", rows_grid(rows, 256)?; &mut dinp.data, &dout.data, &out.data, &r, &c)
    }
    fn swiglu_forward(&self, out: &mut CudaBuffer, gate: &CudaBuffer, up: &CudaBuffer) -> Result<()> {
        swiglu::check_swiglu_forward(out.len, gate.len, up.len)?;
        let n = out.len;
        if n == 0 {
            return Ok(());
        }
        launch!(self, "swiglu_forward", grid(n); &mut out.data, &gate.data, &up.data, &(n as i64))
    }
    fn swiglu_backward(
        &self,
        dgate: &mut CudaBuffer,
        dup: &mut CudaBuffer,
        dout: &CudaBuffer,
        gate: &CudaBuffer,
        up: &CudaBuffer,
    ) -> Result<()> {
        swiglu::check_swiglu_backward(dgate.len, dup.len, dout.len, gate.len, up.len)?;
        let n = dout.len;
        if n == 0 {
            return Ok(());
        }
        launch!(self, "swiglu_backward", grid(n);
            &mut dgate.data, &mut dup.data, &dout.data, &gate.data, &up.data, &(n as i64))
    }
    fn attention_forward(
        &self,
        out: &mut CudaBuffer,
        lse: &mut CudaBuffer,
        q: &CudaBuffer,
        k: &CudaBuffer,
        v: &CudaBuffer,
        spec: &AttentionSpec,
    ) -> Result<()> {
        spec.check_forward(out.len, lse.len, q.len, k.len, v.len)?;
        if spec.batch == 0 || spec.q_len == 0 || spec.q_heads == 0 {
            return Ok(());
        }
        let s = Self::attention_shape(spec)?;
        if self.use_flash(spec) {
            let fs = Self::flash_shape(&s);
            let cfg = Self::flash_cfg(spec.q_len.div_ceil(64), &fs, s.q_heads)?;
            return if spec.head_dim == 64 {
                launch!(self, "flash_forward_64", cfg; &mut out.data, &mut lse.data, &q.data, &k.data, &v.data, &fs)
            } else {
                launch!(self, "flash_forward_128", cfg; &mut out.data, &mut lse.data, &q.data, &k.data, &v.data, &fs)
            };
        }
        self.check_f32_head(spec)?;
        let rows = spec.batch * spec.q_len * spec.q_heads;
        launch!(self, "attention_forward", Self::warps_cfg(rows)?;
            &mut out.data, &mut lse.data, &q.data, &k.data, &v.data, &s)
    }
    fn attention_backward(
        &self,
        dq: &mut CudaBuffer,
        dk: &mut CudaBuffer,
        dv: &mut CudaBuffer,
        dout: &CudaBuffer,
        q: &CudaBuffer,
        k: &CudaBuffer,
        v: &CudaBuffer,
        out: &CudaBuffer,
        lse: &CudaBuffer,
        spec: &AttentionSpec,
    ) -> Result<()> {
        spec.check_backward([
            dq.len, dk.len, dv.len, dout.len, q.len, k.len, v.len, out.len, lse.len,
        ])?;
        if spec.batch == 0 || spec.q_heads == 0 {
            // No query sees a key: their gradients are zero, as the reference writes them.
            self.fill(dk, 0.0)?;
            return self.fill(dv, 0.0);
        }
        let s = Self::attention_shape(spec)?;
        if self.use_flash(spec) {
            let rows = spec.batch * spec.q_len * spec.q_heads;
            let mut delta = self.alloc(rows)?;
            let d = s.head_dim;
            launch!(self, "flash_delta", Self::warps_cfg(rows)?;
                &mut delta.data, &dout.data, &out.data, &(rows as i64), &d)?;
            let fs = Self::flash_shape(&s);
            let kv_cfg = Self::flash_cfg(spec.kv_capacity.div_ceil(64), &fs, s.kv_heads)?;
            let q_cfg = Self::flash_cfg(spec.q_len.div_ceil(64), &fs, s.q_heads)?;
            if spec.head_dim == 64 {
                launch!(self, "flash_backward_kv_64", kv_cfg;
                    &mut dk.data, &mut dv.data, &dout.data, &q.data, &k.data, &v.data, &lse.data, &delta.data, &fs)?;
                return launch!(self, "flash_backward_q_64", q_cfg;
                    &mut dq.data, &dout.data, &q.data, &k.data, &v.data, &lse.data, &delta.data, &fs);
            }
            launch!(self, "flash_backward_kv_128", kv_cfg;
                &mut dk.data, &mut dv.data, &dout.data, &q.data, &k.data, &v.data, &lse.data, &delta.data, &fs)?;
            return launch!(self, "flash_backward_q_128", q_cfg;
                &mut dq.data, &dout.data, &q.data, &k.data, &v.data, &lse.data, &delta.data, &fs);
        }
        self.check_f32_head(spec)?;
        let q_rows = spec.batch * spec.q_len * spec.q_heads;
        launch!(self, "attention_backward_dq", Self::warps_cfg(q_rows)?;
            &mut dq.data, &dout.data, &q.data, &k.data, &v.data, &out.data, &lse.data, &s)?;
        let kv_rows = spec.batch * spec.kv_capacity * spec.kv_heads;
        launch!(self, "attention_backward_dkv", Self::warps_cfg(kv_rows)?;
            &mut dk.data, &mut dv.data, &dout.data, &q.data, &k.data, &v.data, &out.data, &lse.data, &s)
    }
    fn embedding_forward(
        &self,
        out: &mut CudaBuffer,
        table: &CudaBuffer,
        ids: &[u32],
        vocab: usize,
        dim: usize,
    ) -> Result<()> {
        embedding::check_embedding(
            "embedding_forward",
            ["table", "out"],
            table.len,
            out.len,
            ids,
            vocab,
            dim,
        )?;
        if ids.is_empty() || dim == 0 {
            return Ok(());
        }
        let idg = self.upload_u32(ids)?;
        let (r, d) = (i32_of("rows", ids.len())?, i32_of("dim", dim)?);
        launch!(self, "embedding_forward", grid(ids.len() * dim); &mut out.data, &table.data, &idg, &r, &d)
    }
    fn embedding_backward(
        &self,
        dtable: &mut CudaBuffer,
        dout: &CudaBuffer,
        ids: &[u32],
        vocab: usize,
        dim: usize,
    ) -> Result<()> {
        embedding::check_embedding(
            "embedding_backward",
            ["dtable", "dout"],
            dtable.len,
            dout.len,
            ids,
            vocab,
            dim,
        )?;
        if ids.is_empty() || dim == 0 {
            return Ok(());
        }
        // Rows grouped by id on the host (a stable sort keeps each id's rows in order), so
        // the kernel is parallel over (id, column) and still adds in a fixed order.
        let mut order: Vec<u32> = (0..ids.len() as u32).collect();
        order.sort_by_key(|&r| ids[r as usize]);
        let (mut uniq, mut offsets) = (Vec::new(), Vec::new());
        for (p, &r) in order.iter().enumerate() {
            let id = ids[r as usize];
            if uniq.last() != Some(&id) {
                uniq.push(id);
                offsets.push(p as u32);
            }
        }
        offsets.push(order.len() as u32);
        let (ug, og, pg) = (
            self.upload_u32(&uniq)?,
            self.upload_u32(&offsets)?,
            self.upload_u32(&order)?,
        );
        let (nu, d) = (i32_of("ids", uniq.len())?, i32_of("dim", dim)?);
        launch!(self, "embedding_backward_grouped", grid(uniq.len() * dim);
            &mut dtable.data, &dout.data, &ug, &og, &pg, &nu, &d)
    }
    fn cross_entropy(
        &self,
        logits: &mut CudaBuffer,
        targets: &[u32],
        mask: Option<&[bool]>,
        rows: usize,
        vocab: usize,
        grad_scale: Option<f32>,
    ) -> Result<CrossEntropySum> {
        cross_entropy::check_cross_entropy(logits.len, targets, mask, rows, vocab)?;
        let counted = mask.map_or(rows, |m| m.iter().filter(|&&b| b).count());
        let mut losses = self.alloc(rows)?;
        if rows > 0 {
            let tg = self.upload_u32(targets)?;
            let flags: Vec<u8> = match mask {
                Some(m) => m.iter().map(|&b| b as u8).collect(),
                None => vec![1; rows],
            };
            let mg = self.upload_any(&flags)?;
            let (r, v) = (i32_of("rows", rows)?, i32_of("vocab", vocab)?);
            let write = grad_scale.is_some() as i32;
            let gs = grad_scale.unwrap_or(0.0);
            launch!(self, "cross_entropy", rows_grid(rows, 256)?;
                &mut logits.data, &mut losses.data, &tg, &mg, &r, &v, &write, &gs)?;
        }
        // The per-row losses, added on the host in f64 in row order.
        let host = self.download(&losses)?;
        let loss_sum: f64 = host.iter().map(|&l| l as f64).sum();
        let sum = CrossEntropySum {
            loss_sum,
            count: counted,
        };
        if !loss_sum.is_finite() {
            return Err(CoreError::NonFinite {
                op: "cross_entropy",
                value: loss_sum,
            });
        }
        Ok(sum)
    }
    fn moe_combine(
        &self,
        out: &mut CudaBuffer,
        y: &CudaBuffer,
        row_of_slot: &[u32],
        weight: &[f32],
        top_k: usize,
        dim: usize,
    ) -> Result<()> {
        let n = moe::check_combine("moe_combine", out.len, y.len, row_of_slot, weight, top_k, dim)?;
        if n == 0 {
            return Ok(());
        }
        let rows = self.upload_u32(row_of_slot)?;
        let w = self.upload_any(weight)?;
        let (nn, kk, d) = (i32_of("n", n)?, i32_of("top_k", top_k)?, i32_of("dim", dim)?);
        launch!(self, "moe_combine", grid(n * dim); &mut out.data, &y.data, &rows, &w, &nn, &kk, &d)
    }
    fn moe_combine_backward(
        &self,
        dy: &mut CudaBuffer,
        dout: &CudaBuffer,
        y: &CudaBuffer,
        row_of_slot: &[u32],
        weight: &[f32],
        top_k: usize,
        dim: usize,
    ) -> Result<Vec<f32>> {
        const OP: &str = "moe_combine_backward";
        let n = moe::check_combine(OP, dout.len, y.len, row_of_slot, weight, top_k, dim)?;
        check_len(OP, "dy", dy.len, y.len)?;
        let slots = n * top_k;
        if slots == 0 {
            return Ok(Vec::new());
        }
        let rows = self.upload_u32(row_of_slot)?;
        let w = self.upload_any(weight)?;
        let mut dweight = self.alloc(slots)?;
        let (s, kk, d) = (
            i32_of("slots", slots)?,
            i32_of("top_k", top_k)?,
            i32_of("dim", dim)?,
        );
        launch!(self, "moe_combine_backward", rows_grid(slots, 128)?;
            &mut dy.data, &mut dweight.data, &dout.data, &y.data, &rows, &w, &s, &kk, &d)?;
        self.download(&dweight)
    }
    fn q8_matmul(
        &self,
        out: &mut CudaBuffer,
        x: &CudaBuffer,
        packed: &CudaBuffer,
        scales: &CudaBuffer,
        spec: &MatmulSpec,
    ) -> Result<()> {
        const OP: &str = "q8_matmul";
        let (m, n, k) = (spec.m, spec.n, spec.k);
        // The same contract as the host backends: check it on lengths, then on the window.
        q8::check_q8(OP, packed.len, scales.len, n, k)?;
        let (wx, wo) = match spec.window {
            None => {
                q8::check_q8_matmul(out.len, x.len, packed.len, scales.len, m, n, k)?;
                (0, 0)
            }
            Some(w) => {
                let (lx, lo) = (m * k, m * n);
                check_range(OP, "x", x.len, w.a, lx)?;
                check_range(OP, "out", out.len, w.c, lo)?;
                (w.a, w.c)
            }
        };
        if !spec.trans_b
            || spec.trans_a
            || spec.alpha != 1.0
            || spec.batch != 1
            || spec.window.is_some_and(|w| w.b != 0)
        {
            return Err(CoreError::InvalidArgument {
                op: OP,
                message: format!("the int8 product is out = x W^T + beta * out (trans_b, alpha 1, one problem, unwindowed weight); got {spec:?}"),
            });
        }
        if m == 0 || n == 0 {
            return Ok(());
        }
        let words = q8::packed_cols(k);
        let xq_bytes = m * words * 4;
        self.check_room(xq_bytes, "int8 activation scratch")?;
        let mut xq = self
            .dev
            .stream
            .alloc_zeros::<i8>(xq_bytes.max(1))
            .map_err(drv("allocating int8 activation scratch"))?;
        let mut xs = self.alloc(m)?;
        let xv = x.data.slice(wx..wx + m * k);
        let (mi, ki, kp) = (i32_of("m", m)?, i32_of("k", k)?, i32_of("k", words * 4)?);
        launch!(self, "q8_quantize_rows", rows_grid(m, 256)?; &mut xq, &mut xs.data, &xv, &mi, &ki, &kp)?;
        let mut ov = out.data.slice_mut(wo..wo + m * n);
        let (ni, wi) = (i32_of("n", n)?, i32_of("k", words)?);
        launch!(self, "q8_matmul", Self::warps_cfg(m * n)?;
            &mut ov, &xq, &xs.data, &packed.data, &scales.data, &mi, &ni, &wi, &spec.beta)
    }
    fn q8_embedding(
        &self,
        out: &mut CudaBuffer,
        packed: &CudaBuffer,
        scales: &CudaBuffer,
        ids: &[u32],
        vocab: usize,
        dim: usize,
    ) -> Result<()> {
        const OP: &str = "q8_embedding";
        q8::check_q8(OP, packed.len, scales.len, vocab, dim)?;
        check_len(OP, "out", out.len, ids.len() * dim)?;
        embedding::check_ids(OP, ids, vocab)?;
        if ids.is_empty() {
            return Ok(());
        }
        let idg = self.upload_u32(ids)?;
        let (r, d, w) = (
            i32_of("rows", ids.len())?,
            i32_of("dim", dim)?,
            i32_of("dim", q8::packed_cols(dim))?,
        );
        launch!(self, "q8_embedding", grid(ids.len() * dim); &mut out.data, &packed.data, &scales.data, &idg, &r, &d, &w)
    }
    fn adam_update(
        &self,
        param: &mut CudaBuffer,
        grad: &CudaBuffer,
        m: &mut CudaBuffer,
        v: &mut CudaBuffer,
        hp: &AdamParams,
        step: u64,
    ) -> Result<()> {
        optim::check_adam(param.len, grad.len, m.len, v.len, hp, step)?;
        let n = param.len;
        if n == 0 {
            return Ok(());
        }
        let c = optim::AdamConstants::<f32>::new(hp, step);
        launch!(self, "adamw", grid(n);
            &mut param.data, &grad.data, &mut m.data, &mut v.data, &(n as i64),
            &hp.lr, &hp.beta1, &hp.beta2, &c.one_minus_beta1, &c.one_minus_beta2, &hp.eps,
            &hp.weight_decay, &(hp.decoupled as i32), &hp.grad_scale, &0u64, &c.step_size, &c.bias_correction2_sqrt)
    }
    fn sgd_update(
        &self,
        param: &mut CudaBuffer,
        grad: &CudaBuffer,
        velocity: Option<&mut CudaBuffer>,
        hp: &SgdParams,
    ) -> Result<()> {
        optim::check_sgd(param.len, grad.len, velocity.as_ref().map(|v| v.len), hp)?;
        let n = param.len;
        if n == 0 {
            return Ok(());
        }
        let nesterov = hp.nesterov as i32;
        match velocity {
            Some(vel) => launch!(self, "sgd", grid(n);
                &mut param.data, &grad.data, &mut vel.data, &(n as i64), &hp.lr, &hp.momentum,
                &hp.weight_decay, &hp.grad_scale, &nesterov),
            None => launch!(self, "sgd", grid(n);
                &mut param.data, &grad.data, &0u64, &(n as i64), &hp.lr, &hp.momentum,
                &hp.weight_decay, &hp.grad_scale, &nesterov),
        }
    }
}

impl CudaBackend {
    fn rope(&self, x: &mut CudaBuffer, spec: &RopeSpec, sign: f32, op: &'static str) -> Result<()> {
        spec.check(op, x.len)?;
        if x.len == 0 {
            return Ok(());
        }
        let dims = [
            i32_of("batch", spec.batch)?,
            i32_of("seq", spec.seq)?,
            i32_of("heads", spec.heads)?,
            i32_of("head_dim", spec.head_dim)?,
            i32_of("pos_offset", spec.pos_offset)?,
        ];
        launch!(self, "rope", grid(x.len / 2);
            &mut x.data, &dims[0], &dims[1], &dims[2], &dims[3], &dims[4], &spec.theta, &sign)
    }

    /// The gradient of a loss with respect to `pred` (or, fused, to the logits): kernel
    /// `loss_backward` with `code`, scaled by 1 / the loss's divisor.
    #[allow(clippy::too_many_arguments)]
    fn loss_gradient(
        &self,
        op: &'static str,
        grad_name: &'static str,
        code: i32,
        loss: Loss,
        grad: &mut CudaBuffer,
        pred: &CudaBuffer,
        target: &CudaBuffer,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        let n = check_rows(op, rows, cols, &[("pred", pred.len), ("target", target.len)])?;
        check_len(op, grad_name, grad.len, n)?;
        if rows == 0 || n == 0 {
            return Ok(());
        }
        let inv = 1.0f32 / loss.divisor(rows, cols) as f32;
        launch!(self, "loss_backward", grid(n);
            &mut grad.data, &pred.data, &target.data, &(n as i64), &code, &inv)
    }

    fn check_f32_head(&self, spec: &AttentionSpec) -> Result<()> {
        // attention.cu holds at most 8 features a lane (32 lanes).
        if spec.head_dim > 256 {
            return Err(CoreError::InvalidDimension {
                op: "attention (cuda)",
                message: format!(
                    "head_dim {} is over 256, the most the CUDA attention kernels take",
                    spec.head_dim
                ),
            });
        }
        Ok(())
    }
}

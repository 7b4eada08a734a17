//! The device, its buffers and the compiled kernels: everything created once.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use wgpu::util::DeviceExt;

use crate::ShaderError;

/// Which adapter to ask for.
#[derive(Debug, Clone, Default)]
pub struct GpuOptions {
    /// Ask for the fallback (software) adapter, e.g. lavapipe: what CI tests on.
    pub software: bool,
    /// Prefer the discrete GPU over an integrated one.
    pub high_performance: bool,
    /// Ask for at most this many bytes per storage binding (default: all the adapter
    /// offers). Smaller values act like a smaller adapter: tests use it to exercise
    /// splitting, and a page can use it to stay within what every browser grants.
    pub max_binding: Option<u64>,
    /// Never use subgroup operations, even where the adapter has them (the reductions
    /// then go through workgroup memory, as in a browser): tests cover both paths with it.
    pub no_subgroups: bool,
}

/// A buffer on the device: `len` 4-byte words (f32 values, or int8 packed four to a u32).
/// Inside the crate it may also be a view of words `at .. at + len` of a larger buffer (a
/// row slab of an int8 weight over one binding).
#[derive(Debug, Clone)]
pub struct GpuBuffer {
    pub(crate) buf: wgpu::Buffer,
    pub(crate) at: usize,
    pub(crate) len: usize,
    /// Bound as words `at .. at + len` only; otherwise the whole buffer is bound.
    pub(crate) slab: bool,
}

impl GpuBuffer {
    /// Words (4 bytes each) in the buffer.
    pub fn len(&self) -> usize {
        self.len
    }
    /// No words.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first `len` words of this buffer (a pooled buffer handed out for a shorter
    /// request): the kernels index only those, and the whole buffer is bound.
    pub(crate) fn prefix(&self, len: usize) -> GpuBuffer {
        debug_assert!(len <= self.len && !self.slab);
        GpuBuffer { len, ..self.clone() }
    }

    /// Words `at .. at + len` of this buffer, bound on their own: a row slab of a weight
    /// over one binding. The caller keeps `at` on the adapter's offset alignment (see
    /// [`Gpu::slab_rows`]).
    pub(crate) fn slab(&self, at: usize, len: usize) -> GpuBuffer {
        debug_assert!(at + len <= self.len && len > 0);
        GpuBuffer { buf: self.buf.clone(), at: self.at + at, len, slab: true }
    }

    /// The bytes a binding of this buffer covers.
    pub(crate) fn bound_bytes(&self) -> u64 {
        if self.slab {
            self.len as u64 * 4
        } else {
            self.buf.size()
        }
    }

    /// What a bind group cache tells bindings apart by.
    pub(crate) fn key(&self) -> crate::ops::BindingKey {
        (self.buf.clone(), self.at, if self.slab { self.len } else { 0 })
    }

    pub(crate) fn binding(&self) -> wgpu::BindingResource<'_> {
        if !self.slab {
            self.buf.as_entire_binding()
        } else {
            wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &self.buf,
                offset: self.at as u64 * 4,
                size: wgpu::BufferSize::new(self.len as u64 * 4),
            })
        }
    }
}

/// One adapter's device and queue, with every kernel compiled up front (pipeline creation
/// is slow on WebGPU; doing it once at start keeps it out of the decode loop).
pub struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    pub(crate) limits: wgpu::Limits,
    /// Every kernel's, by name; none for the subgroup kernels where subgroups are not used.
    pub(crate) pipelines: HashMap<&'static str, wgpu::ComputePipeline>,
    /// Whether the subgroup variants are in use.
    pub(crate) subgroups: bool,
    /// Errors the device reported outside any scope (validation, out of memory, lost).
    errors: Arc<Mutex<Vec<String>>>,
    /// One-word buffers bound where a kernel's layout has a slot an op does not use.
    pub(crate) spare: [GpuBuffer; 2],
    /// The read-back buffer, kept between reads (a decode step reads 4 bytes each token).
    staging: Mutex<Option<wgpu::Buffer>>,
    pub(crate) counters: Counters,
}

/// What the device has been asked for since it opened: the numbers a test reads to show
/// that a steady-state step creates nothing and submits once.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub buffers: AtomicU64,
    pub bind_groups: AtomicU64,
    pub submits: AtomicU64,
    pub dispatches: AtomicU64,
}

/// A snapshot of [`Gpu::counters`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GpuCounters {
    /// Buffers created (storage, uniform, staging and read-back).
    pub buffers: u64,
    /// Bind groups created.
    pub bind_groups: u64,
    /// Command buffers submitted (including read-backs).
    pub submits: u64,
    /// Kernels dispatched.
    pub dispatches: u64,
}

impl std::ops::Sub for GpuCounters {
    type Output = GpuCounters;
    fn sub(self, o: GpuCounters) -> GpuCounters {
        GpuCounters {
            buffers: self.buffers - o.buffers,
            bind_groups: self.bind_groups - o.bind_groups,
            submits: self.submits - o.submits,
            dispatches: self.dispatches - o.dispatches,
        }
    }
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").field("adapter", &self.info.name).finish()
    }
}

impl Gpu {
    /// Opens an adapter and compiles every kernel. Asks for the adapter's own storage
    /// binding and buffer sizes (the defaults are WebGPU's 128/256 MiB minimums).
    pub async fn new(options: &GpuOptions) -> Result<Gpu, ShaderError> {
        #[cfg(target_arch = "wasm32")]
        browser_webgpu()?;
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: if options.high_performance {
                    wgpu::PowerPreference::HighPerformance
                } else {
                    wgpu::PowerPreference::default()
                },
                force_fallback_adapter: options.software,
                compatible_surface: None,
                apply_limit_buckets: false,
            })
            .await
            .map_err(|e| {
                let hint = if cfg!(target_arch = "wasm32") {
                    "the browser offers no WebGPU adapter; use the CPU path"
                } else {
                    "install a Vulkan driver (e.g. Debian's mesa-vulkan-drivers for the software one) or use the CPU backend"
                };
                ShaderError::NoAdapter(format!("{e} ({hint})"))
            })?;
        let info = adapter.get_info();
        let offered = adapter.limits();
        let requested = wgpu::Limits {
            max_storage_buffer_binding_size: offered.max_storage_buffer_binding_size,
            max_buffer_size: offered.max_buffer_size,
            ..wgpu::Limits::default()
        };
        // The cap is ours to enforce (splitting, TooLarge): a device is never asked for
        // less than WebGPU's defaults.
        let mut limits = requested.clone();
        if let Some(cap) = options.max_binding {
            limits.max_storage_buffer_binding_size = cap.min(limits.max_storage_buffer_binding_size);
        }
        // Subgroups where the adapter has them (natively; wgpu's browser backend does not
        // offer them yet), unless the caller asked for the portable path.
        let subgroups = !options.no_subgroups && adapter.features().contains(wgpu::Features::SUBGROUP);
        let features = if subgroups { wgpu::Features::SUBGROUP } else { wgpu::Features::empty() };
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("rusting_brain"),
                required_features: features,
                required_limits: requested,
                ..Default::default()
            })
            .await
            .map_err(|e| ShaderError::Device(format!("{} ({:?}): {e}", info.name, info.backend)))?;
        let errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            sink.lock().unwrap_or_else(|p| p.into_inner()).push(describe(&e));
        }));
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let pipelines = crate::ops::kernels()
            .filter(|k| subgroups || !k.needs_subgroups)
            .map(|k| {
                let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some(k.name),
                    source: wgpu::ShaderSource::Wgsl(k.source().into()),
                });
                let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(k.name),
                    layout: None,
                    module: &module,
                    entry_point: Some("main"),
                    compilation_options: Default::default(),
                    cache: None,
                });
                (k.name, pipeline)
            })
            .collect();
        if let Some(e) = scope.pop().await {
            return Err(ShaderError::Validation(describe(&e)));
        }
        let spare = |label| GpuBuffer {
            buf: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: 4,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            }),
            at: 0,
            len: 1,
            slab: false,
        };
        Ok(Gpu {
            counters: Counters::default(),
            staging: Mutex::new(None),
            spare: [spare("spare 0"), spare("spare 1")],
            device,
            queue,
            info,
            limits,
            pipelines,
            subgroups,
            errors,
        })
    }

    /// [`Gpu::new`], waiting for the adapter on this thread (native only).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new_blocking(options: &GpuOptions) -> Result<Gpu, ShaderError> {
        block_on(Gpu::new(options))
    }

    /// Objects created, submissions and dispatches since the device opened.
    pub fn counters(&self) -> GpuCounters {
        let c = &self.counters;
        GpuCounters {
            buffers: c.buffers.load(Ordering::Relaxed),
            bind_groups: c.bind_groups.load(Ordering::Relaxed),
            submits: c.submits.load(Ordering::Relaxed),
            dispatches: c.dispatches.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn count_dispatch(&self) {
        self.counters.dispatches.fetch_add(1, Ordering::Relaxed);
    }

    /// Submits one encoder's commands and reports any error the device raised.
    pub(crate) fn submit(&self, encoder: wgpu::CommandEncoder) -> Result<(), ShaderError> {
        self.queue.submit([encoder.finish()]);
        self.counters.submits.fetch_add(1, Ordering::Relaxed);
        self.check_errors()
    }

    /// Overwrites a uniform buffer's parameters (queued: lands before the next submission).
    pub(crate) fn write_params(&self, uniform: &wgpu::Buffer, words: &[u32]) {
        self.queue.write_buffer(uniform, 0, &words_to_bytes(words.iter().copied()));
    }

    /// The adapter: name, backend, device type.
    pub fn adapter_info(&self) -> &wgpu::AdapterInfo {
        &self.info
    }

    /// Whether the adapter renders in software on the CPU: lavapipe, WARP, a browser's
    /// fallback adapter (wgpu reports those as `DeviceType::Cpu`), or SwiftShader by name
    /// (which a browser may not mark). A page's "auto" leaves such an adapter for its own
    /// CPU path, which runs the same model many times faster.
    pub fn is_software(&self) -> bool {
        self.info.device_type == wgpu::DeviceType::Cpu
            || self.info.name.to_lowercase().contains("swiftshader")
    }

    /// Whether reductions use the adapter's subgroup operations.
    pub fn uses_subgroups(&self) -> bool {
        self.subgroups
    }

    /// The largest buffer one binding may cover, in bytes.
    pub fn max_binding(&self) -> u64 {
        self.limits.max_storage_buffer_binding_size
    }

    /// Rows per binding of a weight of `rows` rows of `row_words` words that is over one
    /// binding: a multiple of the rows that keep each slab's first word (and its scales')
    /// on the adapter's offset alignment; `None` when not even that many fit.
    pub(crate) fn slab_rows(&self, row_words: usize) -> Option<usize> {
        // A slab starting at row r0 binds from word r0 * row_words of the weight and word
        // r0 of its scales: both on the alignment when r0 is a multiple of it.
        let step = self.slab_align();
        let fit = (self.max_binding() as usize / 4) / row_words.max(1);
        let rows = fit / step * step;
        (rows > 0).then_some(rows)
    }

    /// The storage-binding offset alignment, in words.
    pub(crate) fn slab_align(&self) -> usize {
        (self.limits.min_storage_buffer_offset_alignment as usize / 4).max(1)
    }

    /// The largest buffer the device makes, in bytes.
    pub fn max_buffer(&self) -> u64 {
        self.limits.max_buffer_size
    }

    fn check_size(&self, what: &str, words: usize) -> Result<u64, ShaderError> {
        let bytes = (words as u64).saturating_mul(4);
        // A buffer may be larger than one binding (an int8 weight, bound in row slabs);
        // a kernel handed one whole says so (see `Batch::dispatch`).
        let limit = self.limits.max_buffer_size;
        if bytes > limit {
            return Err(ShaderError::TooLarge { what: what.to_string(), bytes, limit });
        }
        Ok(bytes.max(4))
    }

    fn create(&self, what: &str, words: usize, contents: Option<&[u8]>) -> Result<GpuBuffer, ShaderError> {
        let size = self.check_size(what, words)?;
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        self.counters.buffers.fetch_add(1, Ordering::Relaxed);
        let buf = match contents {
            Some(bytes) if !bytes.is_empty() => {
                self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some(what),
                    contents: bytes,
                    usage,
                })
            }
            _ => self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(what),
                size,
                usage,
                mapped_at_creation: false,
            }),
        };
        Ok(GpuBuffer { buf, at: 0, len: words, slab: false })
    }

    /// A zeroed buffer of `words` 4-byte words.
    pub fn zeros(&self, what: &str, words: usize) -> Result<GpuBuffer, ShaderError> {
        self.create(what, words, None)
    }

    /// Copies f32 values (or int8 packed in f32 slots, as the CPU stores them) to the device.
    pub fn upload(&self, what: &str, data: &[f32]) -> Result<GpuBuffer, ShaderError> {
        self.create(what, data.len(), Some(&words_to_bytes(data.iter().map(|v| v.to_bits()))))
    }

    /// Copies u32 values (token ids) to the device.
    pub fn upload_u32(&self, what: &str, data: &[u32]) -> Result<GpuBuffer, ShaderError> {
        self.create(what, data.len(), Some(&words_to_bytes(data.iter().copied())))
    }

    /// Overwrites `buf` from word `offset` on with `data` (queued before the next submit).
    pub fn write(&self, buf: &GpuBuffer, offset: usize, data: &[f32]) -> Result<(), ShaderError> {
        self.write_words(buf, offset, data.iter().map(|v| v.to_bits()), data.len())
    }

    /// As [`Gpu::write`], u32 words.
    pub fn write_u32(&self, buf: &GpuBuffer, offset: usize, data: &[u32]) -> Result<(), ShaderError> {
        self.write_words(buf, offset, data.iter().copied(), data.len())
    }

    fn write_words(
        &self, buf: &GpuBuffer, offset: usize, words: impl Iterator<Item = u32>, n: usize,
    ) -> Result<(), ShaderError> {
        if offset.checked_add(n).is_none_or(|end| end > buf.len) {
            return Err(ShaderError::Invalid(format!(
                "writing {n} words at {offset} into a buffer of {}",
                buf.len
            )));
        }
        if n > 0 {
            self.queue.write_buffer(&buf.buf, (buf.at + offset) as u64 * 4, &words_to_bytes(words));
        }
        Ok(())
    }

    /// Reads a buffer back as f32 without blocking the thread (on wasm the browser
    /// resolves the map; natively the device is polled until it completes).
    pub async fn read(&self, buf: &GpuBuffer) -> Result<Vec<f32>, ShaderError> {
        Ok(self.read_words(buf, 0, buf.len).await?.into_iter().map(f32::from_bits).collect())
    }

    /// Reads `n` u32 words from word `offset` on.
    pub async fn read_u32(&self, buf: &GpuBuffer, offset: usize, n: usize) -> Result<Vec<u32>, ShaderError> {
        self.read_words(buf, offset, n).await
    }

    async fn read_words(&self, buf: &GpuBuffer, offset: usize, n: usize) -> Result<Vec<u32>, ShaderError> {
        self.read_words_after(None, buf, offset, n).await
    }

    /// Reads `n` u32 words from word `offset` on, the copy recorded after the work in
    /// `encoder` and submitted with it: work and read in one submission.
    pub(crate) async fn read_words_after(
        &self, encoder: Option<wgpu::CommandEncoder>, buf: &GpuBuffer, offset: usize, n: usize,
    ) -> Result<Vec<u32>, ShaderError> {
        if offset.checked_add(n).is_none_or(|end| end > buf.len) {
            return Err(ShaderError::Invalid(format!(
                "reading {n} words at {offset} from a buffer of {}",
                buf.len
            )));
        }
        if n == 0 {
            if let Some(e) = encoder {
                self.submit(e)?;
            }
            return Ok(Vec::new());
        }
        let bytes = n as u64 * 4;
        // Taken out while mapped, so a concurrent read makes its own.
        let kept = self.staging.lock().unwrap_or_else(|p| p.into_inner()).take();
        let staging = match kept {
            Some(b) if b.size() >= bytes => b,
            _ => {
                self.counters.buffers.fetch_add(1, Ordering::Relaxed);
                self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("readback"),
                    size: bytes.max(256),
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                })
            }
        };
        let mut encoder = encoder.unwrap_or_else(|| self.device.create_command_encoder(&Default::default()));
        encoder.copy_buffer_to_buffer(&buf.buf, (buf.at + offset) as u64 * 4, &staging, 0, bytes);
        let (tx, rx) = oneshot();
        encoder.map_buffer_on_submit(&staging, wgpu::MapMode::Read, ..bytes, move |r| tx.send(r));
        self.queue.submit([encoder.finish()]);
        self.counters.submits.fetch_add(1, Ordering::Relaxed);
        #[cfg(not(target_arch = "wasm32"))]
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| ShaderError::Readback(e.to_string()))?;
        rx.await
            .ok_or_else(|| ShaderError::Readback("the map callback was dropped".into()))?
            .map_err(|e| ShaderError::Readback(e.to_string()))?;
        let words = {
            let view = staging.get_mapped_range(..bytes).map_err(|e| ShaderError::Readback(e.to_string()))?;
            view.chunks_exact(4).map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]])).collect()
        };
        staging.unmap();
        *self.staging.lock().unwrap_or_else(|p| p.into_inner()) = Some(staging);
        self.check_errors()?;
        Ok(words)
    }

    /// [`Gpu::read`] on this thread (native only).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_blocking(&self, buf: &GpuBuffer) -> Result<Vec<f32>, ShaderError> {
        block_on(self.read(buf))
    }

    /// [`Gpu::read_u32`] of the whole buffer on this thread (native only).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_u32_blocking(&self, buf: &GpuBuffer) -> Result<Vec<u32>, ShaderError> {
        block_on(self.read_words(buf, 0, buf.len))
    }

    /// The device's copy bandwidth in GB/s (bytes read per second): `repeats` copies of a
    /// `bytes` buffer in one submission, timed to completion, after one untimed warm-up.
    /// Native only (it waits on the device).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn copy_bandwidth(&self, bytes: usize, repeats: usize) -> Result<f64, ShaderError> {
        let words = bytes / 4;
        let (src, dst) = (self.zeros("copy src", words)?, self.zeros("copy dst", words)?);
        let run = |n: usize| -> Result<f64, ShaderError> {
            let t = std::time::Instant::now();
            let mut encoder = self.device.create_command_encoder(&Default::default());
            for _ in 0..n {
                encoder.copy_buffer_to_buffer(&src.buf, 0, &dst.buf, 0, words as u64 * 4);
            }
            self.queue.submit([encoder.finish()]);
            self.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| ShaderError::Readback(e.to_string()))?;
            Ok(t.elapsed().as_secs_f64())
        };
        run(1)?;
        let secs = run(repeats.max(1))?;
        self.check_errors()?;
        Ok((words * 4 * repeats.max(1)) as f64 / secs / 1e9)
    }

    /// Errors the device reported since the last check (validation, lost device).
    pub fn check_errors(&self) -> Result<(), ShaderError> {
        let mut errors = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        if errors.is_empty() {
            return Ok(());
        }
        let all = errors.join("; ");
        errors.clear();
        Err(ShaderError::Validation(all))
    }

    /// A uniform buffer of parameters (each kernel's `Params` struct, 16-byte padded).
    pub(crate) fn params(&self, words: &[u32]) -> wgpu::Buffer {
        let mut padded = words.to_vec();
        padded.resize(words.len().div_ceil(4).max(1) * 4, 0);
        self.counters.buffers.fetch_add(1, Ordering::Relaxed);
        self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("params"),
            contents: &words_to_bytes(padded.into_iter()),
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        })
    }
}

/// A wgpu error on one line (its Display spreads the causes over several).
fn describe(e: &wgpu::Error) -> String {
    e.to_string().split_whitespace().collect::<Vec<_>>().join(" ")
}

fn words_to_bytes(words: impl Iterator<Item = u32>) -> Vec<u8> {
    words.flat_map(u32::to_ne_bytes).collect()
}

/// A one-value channel whose receiving end is a future: the map callback sends, `read`
/// awaits (the browser wakes it; natively `poll` has run the callback already).
struct Slot<T> {
    value: Option<T>,
    waker: Option<Waker>,
    closed: bool,
}

struct Sender<T>(Arc<Mutex<Slot<T>>>);
struct Receiver<T>(Arc<Mutex<Slot<T>>>);

fn oneshot<T>() -> (Sender<T>, Receiver<T>) {
    let slot = Arc::new(Mutex::new(Slot { value: None, waker: None, closed: false }));
    (Sender(slot.clone()), Receiver(slot))
}

impl<T> Sender<T> {
    fn send(self, value: T) {
        let mut s = self.0.lock().unwrap_or_else(|p| p.into_inner());
        s.value = Some(value);
        if let Some(w) = s.waker.take() {
            w.wake();
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut s = self.0.lock().unwrap_or_else(|p| p.into_inner());
        s.closed = true;
        if let Some(w) = s.waker.take() {
            w.wake();
        }
    }
}

impl<T> Future for Receiver<T> {
    type Output = Option<T>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut s = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = s.value.take() {
            return Poll::Ready(Some(v));
        }
        if s.closed {
            return Poll::Ready(None);
        }
        s.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// Whether this JS environment offers WebGPU: a page or a dedicated worker (where wgpu can
/// reach `navigator.gpu`; elsewhere, as under Node, it would panic) whose navigator has it.
#[cfg(target_arch = "wasm32")]
fn browser_webgpu() -> Result<(), ShaderError> {
    use js_sys::Reflect;
    let global = js_sys::global();
    let get = |obj: &js_sys::wasm_bindgen::JsValue, key: &str| {
        Reflect::get(obj, &key.into()).ok().filter(|v| !v.is_undefined() && !v.is_null())
    };
    if get(&global, "window").is_none() && get(&global, "WorkerGlobalScope").is_none() {
        return Err(ShaderError::NoAdapter(
            "WebGPU runs in a page or a dedicated worker, and this JS environment is neither (Node has no WebGPU)".into(),
        ));
    }
    if get(&global, "navigator").and_then(|n| get(&n, "gpu")).is_none() {
        return Err(ShaderError::NoAdapter(
            "this browser has no WebGPU (navigator.gpu is undefined; Chromium on Linux needs --enable-unsafe-webgpu)".into(),
        ));
    }
    Ok(())
}

/// Runs a future to completion on this thread, parking between polls (native only; the
/// browser must never block).
#[cfg(not(target_arch = "wasm32"))]
pub fn block_on<F: Future>(future: F) -> F::Output {
    use std::task::Wake;
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let Poll::Ready(v) = future.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

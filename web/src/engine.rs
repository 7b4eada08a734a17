//! The language model behind the bindings, in plain Rust so native tests run it: core's
//! int8 `TransformerModel` on WebGPU (`WgpuBackend`) or on the portable backend (the CPU
//! fallback: core's math in f32 with SIMD128 kernels), its KV cache, the ids of the conversation so far, and the draw. Every read from the GPU is awaited, never blocked on, so the same code runs in a
//! page, in a worker and natively (where the tests await it with `block_on`).

use std::future::Future;

use rusting_brain_core::checkpoint::read_model;
use rusting_brain_core::models::transformer::{
    Conversation, Finish, KvCache, Reply, TransformerConfig, TransformerModel, Turn,
};
use rusting_brain_core::Sampler;
use rusting_brain_portable::PortableBackend;
use rusting_brain_shaders::{DeviceSampler, Gpu, GpuOptions, ShaderError, WgpuBackend};

use crate::WebError;

/// Which device a model should run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceChoice {
    /// WebGPU where the browser has a hardware adapter, else the CPU (the reason is kept).
    Auto,
    /// WebGPU or an error.
    WebGpu,
    /// The wasm CPU path, without touching the GPU.
    Cpu,
}

impl DeviceChoice {
    /// "auto", "webgpu" (or "gpu") or "cpu"; anything else is an error naming the choices.
    pub fn parse(s: &str) -> Result<DeviceChoice, WebError> {
        match s {
            "auto" => Ok(DeviceChoice::Auto),
            "webgpu" | "gpu" => Ok(DeviceChoice::WebGpu),
            "cpu" => Ok(DeviceChoice::Cpu),
            other => Err(WebError::Invalid(format!(
                "options.device is \"{other}\"; expected \"auto\", \"webgpu\" or \"cpu\""
            ))),
        }
    }
}

/// Where a trained model computes in the page: the wasm CPU path or WebGPU (the trainers
/// of `lm.rs` and `network.rs` hold one).
pub(crate) enum OnDevice<C, G> {
    Cpu(C),
    Gpu(G),
}

impl<C, G> OnDevice<C, G> {
    /// "webgpu" or "cpu".
    pub(crate) fn name(&self) -> &'static str {
        match self {
            OnDevice::Cpu(_) => "cpu",
            OnDevice::Gpu(_) => "webgpu",
        }
    }
}

enum Device {
    Cpu { model: Box<TransformerModel<PortableBackend>>, cache: KvCache<PortableBackend> },
    Gpu { model: Box<TransformerModel<WgpuBackend>>, cache: KvCache<WgpuBackend>, draw: Box<DeviceSampler> },
}

/// A loaded model and the state of one conversation.
pub struct Engine {
    device: Device,
    config: TransformerConfig,
    /// Why the device in use was chosen ("WebGPU adapter ...", "no WebGPU: ...").
    reason: String,
    /// The ids fed or drawn since the last reset, checked against the model's limits
    /// (core's bookkeeping, the same as native decoding's).
    conversation: Conversation,
    /// Logits of the last position waiting for the next draw.
    pending: Option<Pending>,
}

/// Where the logits of the last fed position are.
enum Pending {
    /// On the CPU path: here.
    Host(Vec<f32>),
    /// On the GPU, where the draw reads them.
    Device,
}

/// Bytes the CPU path will hold for a model with this file size and configuration: the
/// weights (int8 ones stay one byte each, packed; F32 ones four, until quantized, then
/// one), the KV cache and a forward pass's scratch. Checked up front so a model too large
/// for the wasm heap is an error, not a trap.
fn cpu_bytes(file_len: usize, c: &TransformerConfig) -> usize {
    let cache = 2 * c.n_layers * c.max_seq_len * c.kv_dim() * 4;
    let scratch = 4 * c.max_seq_len * (c.q_heads * c.max_seq_len + 8 * c.d_model.max(c.d_ff));
    file_len.saturating_mul(2).saturating_add(cache).saturating_add(scratch)
}

impl Engine {
    /// Loads `.rbw` bytes (Q8 or Q4, or F32 which is quantized to int8 here) onto the
    /// chosen device.
    pub async fn load(bytes: &[u8], choice: DeviceChoice) -> Result<Engine, WebError> {
        let model = read_model(bytes, PortableBackend)?;
        Engine::from_model(model, bytes.len(), choice).await
    }

    /// Puts `model` (read from a file of `file_len` bytes) on the chosen device, quantized
    /// to int8 if it is not already.
    pub async fn from_model(
        mut model: TransformerModel<PortableBackend>, file_len: usize, choice: DeviceChoice,
    ) -> Result<Engine, WebError> {
        let config = model.config.clone();
        // The whole CPU footprint is reserved once before anything large is built, so an
        // allocation the heap cannot make is reported (wasm32's heap stops at 4 GiB).
        let need = cpu_bytes(file_len, &config);
        let mut probe: Vec<u8> = Vec::new();
        probe.try_reserve_exact(need).map_err(|_| {
            WebError::OutOfMemory(format!(
                "the model needs about {} MiB of memory on this device",
                need >> 20
            ))
        })?;
        drop(probe);
        model.quantize()?;
        let gpu = match usable_gpu(choice).await? {
            Err(reason) => Err(reason),
            Ok(gpu) => match on_webgpu(&model, gpu) {
                Ok(on) => Ok(on),
                Err(e) if choice == DeviceChoice::Auto => Err(format!("no usable WebGPU: {e}")),
                Err(e) => return Err(e.into()),
            },
        };
        let (device, reason) = match gpu {
            Ok((gpu_model, cache, draw)) => {
                // Browsers may withhold the adapter's name (fingerprinting).
                let info = gpu_model.backend.gpu().adapter_info();
                let name = format!("{} ({:?})", info.name, info.backend);
                let reason = if name.trim_start().starts_with('(') {
                    format!("WebGPU adapter {name}, unnamed by the browser")
                } else {
                    format!("WebGPU adapter {name}")
                };
                (Device::Gpu { model: Box::new(gpu_model), cache, draw: Box::new(draw) }, reason)
            }
            Err(reason) => {
                let cache = model.new_kv_caches()?;
                (Device::Cpu { model: Box::new(model), cache }, reason)
            }
        };
        Ok(Engine { device, conversation: Conversation::new(&config), config, reason, pending: None })
    }

    /// "webgpu" or "cpu".
    pub fn device(&self) -> &'static str {
        match self.device {
            Device::Cpu { .. } => "cpu",
            Device::Gpu { .. } => "webgpu",
        }
    }

    /// Why the device in use was chosen ("WebGPU adapter ...", "no usable WebGPU: ...").
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// The loaded model's architecture.
    pub fn config(&self) -> &TransformerConfig {
        &self.config
    }

    /// Ids in the conversation so far.
    pub fn context(&self) -> &[u32] {
        self.conversation.context()
    }

    /// Room left in the KV cache.
    pub fn room(&self) -> usize {
        self.conversation.room()
    }

    /// Forgets the conversation (the cache's memory stays allocated).
    pub fn reset(&mut self) {
        match &mut self.device {
            Device::Cpu { cache, .. } => cache.clear(),
            Device::Gpu { cache, .. } => cache.clear(),
        }
        self.conversation.clear();
        self.pending = None;
    }

    /// Runs `ids` after the conversation so far. Checked whole first (ids inside the
    /// vocabulary, room in the cache), so a refused call changes nothing.
    pub fn feed(&mut self, ids: &[u32]) -> Result<(), WebError> {
        self.conversation.check_feed(ids)?;
        match &mut self.device {
            Device::Cpu { model, cache } => {
                self.pending = Some(Pending::Host(model.forward_cached(ids, cache)?));
            }
            Device::Gpu { model, cache, .. } => {
                model.forward_cached_on_device(ids, cache)?;
                self.pending = Some(Pending::Device);
            }
        }
        self.conversation.fed(ids);
        Ok(())
    }

    /// Draws the next id from the last position's logits (as `Sampler::sample` would on
    /// them, on either device) without feeding it.
    pub async fn draw(&mut self, sampler: &mut Sampler) -> Result<u32, WebError> {
        let id = match (self.pending.take(), &mut self.device) {
            (Some(Pending::Host(logits)), _) => sampler.sample(&logits, self.conversation.context())?,
            (Some(Pending::Device), Device::Gpu { model, draw, .. }) => {
                let logits = model.cached_logits().ok_or_else(no_logits)?;
                draw.draw(&model.backend, logits, sampler, self.conversation.context()).await?
            }
            _ => return Err(no_logits()),
        };
        Ok(id)
    }

    /// Feeds `prompt` after the conversation so far, then draws up to `max_new` ids,
    /// handing each to `on_token` (false stops) and feeding it back, so the conversation
    /// continues from it. `end`: an id that ends the reply (not handed on). `pause` runs
    /// between tokens: the bindings let the event loop turn there.
    pub async fn generate<F, P, Fut>(
        &mut self, prompt: &[u32], max_new: usize, sampler: &mut Sampler, end: Option<u32>, mut on_token: F,
        pause: P,
    ) -> Result<Generated, WebError>
    where
        F: FnMut(u32) -> bool,
        P: Fn() -> Fut,
        Fut: Future<Output = ()>,
    {
        sampler.validate()?;
        self.feed(prompt)?;
        let mut reply = Reply::new(max_new, end);
        let finish = loop {
            if let Some(f) = reply.before_draw() {
                break f;
            }
            let id = self.draw(sampler).await?;
            match reply.drawn(&mut self.conversation, id, &mut on_token) {
                Turn::Done(f) => break f,
                // Fed even when stopping, so the conversation continues from it.
                Turn::Feed { stop } => {
                    self.feed(&[id])?;
                    if stop {
                        break Finish::Stopped;
                    }
                }
            }
            pause().await;
        };
        Ok(Generated { ids: reply.into_ids(), finish: finish.as_str() })
    }

    /// Frees the model's memory (GPU buffers included) now; the engine answers every
    /// later call with an error (the bindings check [`crate::Model`]'s state first).
    pub fn dispose(self) {
        drop(self);
    }
}

/// The backend over `gpu`. `WgpuBackend` holds its device in an `Arc` because native
/// programs share it across threads; in a page the WebGPU handles are JS objects (neither
/// `Send` nor `Sync` on wasm32) and stay on the worker's one thread, so the `Arc` is only
/// ever cloned there.
#[allow(clippy::arc_with_non_send_sync)]
fn backend_on(gpu: Gpu) -> WgpuBackend {
    WgpuBackend::new(std::sync::Arc::new(gpu))
}

/// The int8 model on the WebGPU adapter `gpu`: core's model over `WgpuBackend`, its KV
/// cache and the draw's buffers.
fn on_webgpu(
    model: &TransformerModel<PortableBackend>, gpu: Gpu,
) -> Result<(TransformerModel<WgpuBackend>, KvCache<WgpuBackend>, DeviceSampler), ShaderError> {
    let backend = backend_on(gpu);
    let on = model.copy_to(backend.clone())?;
    let cache = on.new_kv_caches()?;
    let draw = DeviceSampler::new(&backend, model.config.vocab_size)?;
    Ok((on, cache, draw))
}

/// A WebGPU backend and the adapter's description for `choice`, or (`Ok(Err(reason))`) why
/// the CPU path runs instead ([`usable_gpu`]; "webgpu" with no adapter is an error). What
/// the trainers choose their device by.
pub(crate) async fn webgpu_for(
    choice: DeviceChoice,
) -> Result<Result<(WgpuBackend, String), String>, WebError> {
    Ok(usable_gpu(choice).await?.map(|gpu| {
        let info = gpu.adapter_info();
        let reason = format!("WebGPU adapter {} ({:?})", info.name, info.backend);
        (backend_on(gpu), reason)
    }))
}

/// The adapter for `choice`, or (`Ok(Err(reason))`) why the CPU path runs instead. "auto"
/// takes the CPU path where there is no adapter and where the adapter renders in software
/// (SwiftShader, a browser's fallback adapter): the page's CPU path runs the same model
/// 30-40 times faster than SwiftShader. "webgpu" takes whatever adapter there is.
async fn usable_gpu(choice: DeviceChoice) -> Result<Result<Gpu, String>, WebError> {
    if choice == DeviceChoice::Cpu {
        return Ok(Err("the CPU was asked for".into()));
    }
    match Gpu::new(&GpuOptions::default()).await {
        Ok(gpu) if choice == DeviceChoice::Auto && gpu.is_software() => {
            // Browsers may withhold the adapter's description (fingerprinting).
            let name = gpu.adapter_info().name.trim().to_string();
            let which = if name.is_empty() { "a fallback adapter".to_string() } else { name };
            Ok(Err(format!(
                "the WebGPU adapter ({which}) renders in software, slower than the CPU path; device \"webgpu\" uses it anyway"
            )))
        }
        Ok(gpu) => Ok(Ok(gpu)),
        Err(e) if choice == DeviceChoice::Auto => Ok(Err(format!("no usable WebGPU: {e}"))),
        Err(e) => Err(e.into()),
    }
}

/// What `generate` produced and why it ended ("length", "end", "stopped", "max_seq_len").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generated {
    pub ids: Vec<u32>,
    pub finish: &'static str,
}

fn no_logits() -> WebError {
    WebError::Invalid("no logits to draw from: feed a prompt first".into())
}

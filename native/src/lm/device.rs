//! A `TransformerLm` that trains on a device backend (CUDA or wgpu): core's model on that
//! backend, and the host copy that keeps the configuration and is what `save_bin` writes
//! once `sync_from_device` has brought the weights back. Both devices run the one model
//! definition in core; what differs per device is only how it opens and what it is called.

use rusting_brain_core::backend::OperandPrecision;
use rusting_brain_core::models::transformer::{LossSum, Params, TokenBatch, TransformerModel};
use rusting_brain_core::{Backend, CoreError, Optimizer};

use crate::backend::cpu::CpuBackend;
use crate::{NetworkError, Result};

/// What a device backend adds to `Backend` for a model that lives on it.
pub(crate) trait DeviceBackend: Backend + Clone + 'static {
    /// For messages: "CUDA", "wgpu".
    const KIND: &'static str;
    /// The adapter or card, for [`crate::TransformerLm::device`].
    fn device_name(&self) -> String;
    /// The model's GEMM precision changed (CUDA switches its attention kernels with it).
    fn precision_changed(&self, _: OperandPrecision) {}
}

pub(crate) struct DeviceLm<B: DeviceBackend> {
    pub host: TransformerModel<CpuBackend>,
    pub device: TransformerModel<B>,
    /// Whether the host copy holds what the device holds (false after a device step).
    pub synced: bool,
}

/// An int8 model cannot train, so it does not move to a training device.
#[cfg(feature = "cuda-backend")]
pub(crate) fn check_trainable(host: &TransformerModel<CpuBackend>, kind: &str) -> Result<()> {
    if host.quantized.is_some() && host.lora.is_none() {
        return Err(NetworkError::InvalidInput(format!(
            "moving to {kind} for training: this model is int8 (quantize or a Q8 checkpoint); the f32 weights training needs are gone. Load the f32 checkpoint instead"
        )));
    }
    Ok(())
}

fn download_tree<B: Backend>(b: &B, to: &mut Params<CpuBackend>, from: &Params<B>) -> Result<()> {
    for (h, d) in to.as_mut().into_leaves().into_iter().zip(from.as_ref().into_leaves()) {
        let values = b.download(d)?;
        if values.len() != h.len() {
            return Err(NetworkError::InvalidInput(format!(
                "the device copy has a tensor of {} values where the host has {}",
                values.len(),
                h.len()
            )));
        }
        h.copy_from_slice(&values);
    }
    Ok(())
}

impl<B: DeviceBackend> DeviceLm<B> {
    /// The device copy of `host` (weights, f32 or int8; gradients, optimizer moments,
    /// step, precision) on `backend`; `host` is not touched.
    pub fn copy_of(host: &TransformerModel<CpuBackend>, backend: B) -> Result<TransformerModel<B>> {
        let device = host.copy_to(backend.clone())?;
        backend.precision_changed(host.precision);
        backend.synchronize()?;
        Ok(device)
    }

    /// Brings weights, gradients, moments and the step count back to the host copy.
    pub fn sync(&mut self) -> Result<()> {
        let b = self.device.backend.clone();
        download_tree(&b, &mut self.host.params, &self.device.params)?;
        download_tree(&b, &mut self.host.grads, &self.device.grads)?;
        download_tree(&b, &mut self.host.m, &self.device.m)?;
        download_tree(&b, &mut self.host.v, &self.device.v)?;
        if let (Some(h), Some(d)) = (self.host.lora.as_mut(), self.device.lora.as_ref()) {
            for (to, from) in
                [(&mut h.weights, &d.weights), (&mut h.grads, &d.grads), (&mut h.m, &d.m), (&mut h.v, &d.v)]
            {
                for (t, f) in rusting_brain_core::models::transformer::adapter_buffers_mut(to)
                    .into_iter()
                    .zip(rusting_brain_core::models::transformer::adapter_buffers(from))
                {
                    let values = b.download(f)?;
                    if values.len() != t.len() {
                        return Err(NetworkError::InvalidInput(
                            "the device's adapters are shaped differently from the host's".into(),
                        ));
                    }
                    t.copy_from_slice(&values);
                }
            }
        }
        self.host.step = self.device.step;
        self.host.precision = self.device.precision;
        self.synced = true;
        Ok(())
    }
}

/// The training surface of a model on any device, so `TransformerLm` dispatches once.
pub(crate) trait OnDevice {
    fn host(&self) -> &TransformerModel<CpuBackend>;
    fn host_mut(&mut self) -> &mut TransformerModel<CpuBackend>;
    fn synced(&self) -> bool;
    fn sync(&mut self) -> Result<()>;
    /// The error for reading the host copy while the device is ahead of it.
    fn stale(&self, what: &str) -> NetworkError;
    fn kind(&self) -> &'static str;
    fn device_name(&self) -> String;
    fn steps(&self) -> u64;
    fn expert_usage(&self) -> Vec<Vec<f64>>;
    fn set_precision(&mut self, p: OperandPrecision);
    fn zero_grad(&mut self) -> Result<(), CoreError>;
    fn accumulate(&mut self, tb: &TokenBatch) -> Result<LossSum, CoreError>;
    fn step(&mut self, opt: &Optimizer, scale: f32) -> Result<(), CoreError>;
    fn grad_norm(&self, scale: f32) -> Result<f64, CoreError>;
    fn evaluate(&mut self, tb: &TokenBatch) -> Result<LossSum, CoreError>;
    fn forward_logits(&mut self, tb: &TokenBatch) -> Result<Vec<f32>, CoreError>;
    fn set_parameter(&mut self, name: &str, values: &[f32]) -> Result<(), CoreError>;
    fn named_parameters(&self) -> Result<Vec<(String, Vec<f32>)>, CoreError>;
    fn named_gradients(&self) -> Result<Vec<(String, Vec<f32>)>, CoreError>;
    fn named_adapters(&self, grads: bool) -> Result<Vec<(String, Vec<f32>)>, CoreError>;
}

impl<B: DeviceBackend> OnDevice for DeviceLm<B> {
    fn host(&self) -> &TransformerModel<CpuBackend> {
        &self.host
    }
    fn host_mut(&mut self) -> &mut TransformerModel<CpuBackend> {
        &mut self.host
    }
    fn synced(&self) -> bool {
        self.synced
    }
    fn sync(&mut self) -> Result<()> {
        DeviceLm::sync(self)
    }
    fn stale(&self, what: &str) -> NetworkError {
        NetworkError::InvalidInput(format!(
            "{what}: the weights on the {} device have changed since the last sync_from_device(); call sync_from_device() (or to_cpu()) first",
            B::KIND
        ))
    }
    fn kind(&self) -> &'static str {
        B::KIND
    }
    fn device_name(&self) -> String {
        self.device.backend.device_name()
    }
    fn steps(&self) -> u64 {
        self.device.step
    }
    fn expert_usage(&self) -> Vec<Vec<f64>> {
        self.device.expert_usage().to_vec()
    }
    fn set_precision(&mut self, p: OperandPrecision) {
        self.device.precision = p;
        self.host.precision = p;
        self.device.backend.precision_changed(p);
    }
    fn zero_grad(&mut self) -> Result<(), CoreError> {
        self.synced = false;
        self.device.zero_grad()
    }
    fn accumulate(&mut self, tb: &TokenBatch) -> Result<LossSum, CoreError> {
        self.synced = false;
        self.device.accumulate(tb)
    }
    fn step(&mut self, opt: &Optimizer, scale: f32) -> Result<(), CoreError> {
        self.synced = false;
        self.device.step(opt, scale)
    }
    fn grad_norm(&self, scale: f32) -> Result<f64, CoreError> {
        self.device.grad_norm(scale)
    }
    fn evaluate(&mut self, tb: &TokenBatch) -> Result<LossSum, CoreError> {
        self.device.evaluate(tb)
    }
    fn forward_logits(&mut self, tb: &TokenBatch) -> Result<Vec<f32>, CoreError> {
        self.device.forward_logits(tb)
    }
    fn set_parameter(&mut self, name: &str, values: &[f32]) -> Result<(), CoreError> {
        // Both copies, device first: a rejected value changes neither.
        self.device.set_parameter(name, values)?;
        self.host.set_parameter(name, values)
    }
    fn named_parameters(&self) -> Result<Vec<(String, Vec<f32>)>, CoreError> {
        self.device.named_parameters()
    }
    fn named_gradients(&self) -> Result<Vec<(String, Vec<f32>)>, CoreError> {
        self.device.named_gradients()
    }
    fn named_adapters(&self, grads: bool) -> Result<Vec<(String, Vec<f32>)>, CoreError> {
        self.device.named_adapters(grads)
    }
}

#[cfg(feature = "gpu")]
impl DeviceBackend for rusting_brain_shaders::WgpuBackend {
    const KIND: &'static str = "wgpu";
    fn device_name(&self) -> String {
        let i = self.gpu().adapter_info();
        format!("{} ({:?})", i.name, i.backend)
    }
}

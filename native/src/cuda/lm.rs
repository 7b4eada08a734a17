//! A `TransformerLm` on a CUDA device: the device model that trains, and the host copy that
//! keeps the configuration and is what `save_bin` writes once `sync_from_device` has
//! brought the weights back.

use rusting_brain_core::backend::Precision;
use rusting_brain_core::models::transformer::{Params, TransformerModel};
use rusting_brain_core::Backend;

use super::CudaBackend;
use crate::cpu::CpuBackend;
use crate::{NetworkError, Result};

pub(crate) struct CudaLm {
    pub host: TransformerModel<CpuBackend>,
    pub device: TransformerModel<CudaBackend>,
    /// Whether the host copy holds what the device holds (false after a device step).
    pub synced: bool,
}

/// Copies every buffer of `from` into the same-shaped `to`.
fn upload_tree(b: &CudaBackend, to: &mut Params<CudaBackend>, from: &Params<CpuBackend>) -> Result<()> {
    for (d, h) in to
        .as_mut()
        .into_leaves()
        .into_iter()
        .zip(from.as_ref().into_leaves())
    {
        b.write(d, h)?;
    }
    Ok(())
}

fn download_tree(b: &CudaBackend, to: &mut Params<CpuBackend>, from: &Params<CudaBackend>) -> Result<()> {
    for (h, d) in to
        .as_mut()
        .into_leaves()
        .into_iter()
        .zip(from.as_ref().into_leaves())
    {
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

impl CudaLm {
    /// Builds the device copy of `host` (weights, gradients, Adam moments, step, precision)
    /// on device `ordinal`. The four weight-sized trees are counted against `budget_mib`
    /// before the first of them is allocated; `host` is not touched.
    pub fn device_copy(
        host: &TransformerModel<CpuBackend>,
        ordinal: usize,
        budget_mib: usize,
    ) -> Result<TransformerModel<CudaBackend>> {
        if host.quantized.is_some() {
            return Err(NetworkError::InvalidInput(
                "to_cuda: this model is int8 (quantize or a Q8 checkpoint); the f32 weights training needs are gone. Load the f32 checkpoint instead".into(),
            ));
        }
        let cuda = CudaBackend::new(ordinal, budget_mib)?;
        let floats = host.config.parameter_count();
        cuda.check_room(
            floats.saturating_mul(16),
            &format!(
                "the model's weights, gradients and two Adam moments ({floats} parameters, 16 bytes each)"
            ),
        )?;
        let b = &cuda;
        let params = host.params.as_ref().try_map(|_, h| b.upload(h))?;
        let mut device = TransformerModel::from_params(cuda.clone(), host.config.clone(), params)?;
        upload_tree(&cuda, &mut device.grads, &host.grads)?;
        upload_tree(&cuda, &mut device.m, &host.m)?;
        upload_tree(&cuda, &mut device.v, &host.v)?;
        device.step = host.step;
        device.precision = host.precision;
        cuda.set_bf16_attention(host.precision == Precision::Bf16);
        cuda.synchronize()?;
        Ok(device)
    }

    /// Brings weights, gradients, moments and the step count back to the host copy.
    pub fn sync(&mut self) -> Result<()> {
        let b = self.device.backend.clone();
        download_tree(&b, &mut self.host.params, &self.device.params)?;
        download_tree(&b, &mut self.host.grads, &self.device.grads)?;
        download_tree(&b, &mut self.host.m, &self.device.m)?;
        download_tree(&b, &mut self.host.v, &self.device.v)?;
        self.host.step = self.device.step;
        self.host.precision = self.device.precision;
        self.synced = true;
        Ok(())
    }

    pub fn set_precision(&mut self, p: Precision) {
        self.device.precision = p;
        self.host.precision = p;
        self.device.backend.set_bf16_attention(p == Precision::Bf16);
    }

    /// The error for reading the host copy while the device is ahead of it.
    pub fn stale(what: &str) -> NetworkError {
        NetworkError::InvalidInput(format!(
            "{what}: the weights on the CUDA device have changed since the last sync_from_device(); call sync_from_device() (or to_cpu()) first"
        ))
    }
}

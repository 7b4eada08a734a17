//! A `TransformerLm` on a CUDA device: what the CUDA backend adds to the shared device
//! model (`crate::lm::device::DeviceLm`): the memory budget checked before the copy, and the
//! attention kernels following the GEMM precision.

use rusting_brain_core::backend::OperandPrecision;
use rusting_brain_core::models::transformer::TransformerModel;

use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::CudaBackend;
use crate::lm::device::{check_trainable, DeviceBackend, DeviceLm};
use crate::Result;

impl DeviceBackend for CudaBackend {
    const KIND: &'static str = "CUDA";
    fn device_name(&self) -> String {
        format!("{} (CUDA)", CudaBackend::device_name(self))
    }
    fn precision_changed(&self, p: OperandPrecision) {
        self.set_bf16_attention(p == OperandPrecision::Bf16);
    }
}

/// The device copy of `host` on device `ordinal`. The four weight-sized trees are counted
/// against `budget_mib` before the first of them is allocated; `host` is not touched.
pub(crate) fn device_copy(
    host: &TransformerModel<CpuBackend>, ordinal: usize, budget_mib: usize,
) -> Result<TransformerModel<CudaBackend>> {
    // Refused before the device opens, so nothing is held.
    check_trainable(host, CudaBackend::KIND)?;
    let cuda = CudaBackend::new(ordinal, budget_mib)?;
    let floats = host.config.parameter_count();
    match &host.lora {
        // Frozen under adapters: the weights once (int8 ones a quarter), the adapters four
        // times (weights, gradients, two moments).
        Some(st) => {
            let base: usize = host.params.as_ref().into_leaves().iter().map(|p| p.len() * 4).sum::<usize>()
                + host.quantized.as_ref().map_or(0, |q| {
                    q.as_ref().into_leaves().into_iter().flatten().map(|(p, s)| (p.len() + s.len()) * 4).sum()
                });
            let adapters = st.parameter_count(&host.backend);
            cuda.check_room(
                base.saturating_add(adapters.saturating_mul(16)),
                &format!("the frozen weights ({base} bytes) and the adapters with their gradients and two Adam moments ({adapters} values, 16 bytes each)"),
            )?;
        }
        None => cuda.check_room(
            floats.saturating_mul(16),
            &format!(
                "the model's weights, gradients and two Adam moments ({floats} parameters, 16 bytes each)"
            ),
        )?,
    }
    DeviceLm::copy_of(host, cuda)
}

//! The lora family on this backend.

use crate::PortableBackend;
use alloc::vec::Vec;
use rusting_brain_core::backend::LoraOps;
use rusting_brain_core::backend::LoraSpec;
use rusting_brain_core::ops::lora;
use rusting_brain_core::Result;

impl LoraOps for PortableBackend {
    fn lora_forward(
        &self, y: &mut Vec<f32>, t: &mut Vec<f32>, x: &Vec<f32>, a: &Vec<f32>, b: &Vec<f32>, s: &LoraSpec,
    ) -> Result<()> {
        s.check("lora_forward", x.len(), y.len(), t.len(), a.len(), b.len())?;
        lora::lora_down(t, x, a, s)?;
        lora::lora_up(y, t, b, s)
    }
    fn lora_backward(
        &self, dx: Option<&mut Vec<f32>>, da: &mut Vec<f32>, db: &mut Vec<f32>, dt: &mut Vec<f32>,
        dy: &Vec<f32>, x: &Vec<f32>, t: &Vec<f32>, a: &Vec<f32>, b: &Vec<f32>, s: &LoraSpec,
    ) -> Result<()> {
        lora::lora_backward(s.dx_or_sink(dx, &mut Vec::new()), da, db, dt, dy, x, t, a, b, s)
    }
}

//! Element-wise activations of the image and text-encoder models, forward only (their
//! scope is inference): GELU exact and tanh-approximated, CLIP's quick GELU, SiLU.

use crate::backend::Memory;
use crate::error::check_len;
use crate::ops::swiglu::sigmoid;
use crate::reference::ReferenceBackend;
use crate::{Real, Result};

/// An elementwise activation of the image models.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unary {
    /// `x * Phi(x) = x / 2 * (1 + erf(x / sqrt 2))`: PyTorch's `gelu`, Hugging Face's "gelu".
    Gelu,
    /// `x / 2 * (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`: `gelu(approximate="tanh")`,
    /// "gelu_new" / "gelu_pytorch_tanh" (T5's gated-gelu, the DiTs' feed-forward).
    GeluTanh,
    /// `x * sigmoid(1.702 x)`: OpenAI CLIP's "quick_gelu".
    QuickGelu,
    /// `x * sigmoid(x)`: the VAEs' and UNets' nonlinearity, the DiTs' modulation input.
    Silu,
}

impl Unary {
    /// The activation a Hugging Face config's `hidden_act` / `act_fn` names.
    pub fn from_hf(name: &str) -> Option<Unary> {
        Some(match name {
            "gelu" => Unary::Gelu,
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" | "gelu-approximate" => Unary::GeluTanh,
            "quick_gelu" => Unary::QuickGelu,
            "silu" | "swish" => Unary::Silu,
            _ => return None,
        })
    }

    /// One value.
    pub fn apply<T: Real>(self, x: T) -> T {
        let half = T::from_f64(0.5);
        match self {
            Unary::Gelu => half * x * (T::ONE + (x * T::from_f64(core::f64::consts::FRAC_1_SQRT_2)).erf()),
            Unary::GeluTanh => {
                // x / 2 (1 + tanh u) written as x sigmoid(2u): the same function, without
                // 1 + tanh u cancelling to 0 in the negative tail (where f32 tanh is -1).
                let c = T::from_f64(0.797_884_560_802_865_4); // sqrt(2 / pi)
                let u = c * (x + T::from_f64(0.044715) * x * x * x);
                x * sigmoid(u + u)
            }
            Unary::QuickGelu => x * sigmoid(T::from_f64(1.702) * x),
            Unary::Silu => x * sigmoid(x),
        }
    }
}

/// `out = f(inp)`, any length (the two equal).
pub fn unary<T: Real>(op: Unary, out: &mut [T], inp: &[T]) -> Result<()> {
    check_len("unary", "out", out.len(), inp.len())?;
    for (o, &x) in out.iter_mut().zip(inp) {
        *o = op.apply(x);
    }
    Ok(())
}

/// `out = f(gate) * up` (all one length): the gated feed-forward of T5 v1.1 (GELU-tanh,
/// "gated-gelu") and of the GEGLU blocks.
pub fn gated<T: Real>(op: Unary, out: &mut [T], gate: &[T], up: &[T]) -> Result<()> {
    check_len("gated", "gate", gate.len(), out.len())?;
    check_len("gated", "up", up.len(), out.len())?;
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = op.apply(g) * u;
    }
    Ok(())
}

/// Element-wise activations of the image models and text encoders: see [`crate::ops::unary`].
pub trait UnaryOps: Memory {
    /// See [`crate::ops::unary::unary`].
    fn unary(&self, op: Unary, out: &mut Self::Buffer, inp: &Self::Buffer) -> Result<()> {
        let mut o = alloc::vec![0.0; self.len(out)];
        crate::ops::unary::unary(op, &mut o, &self.download(inp)?)?;
        self.write(out, &o)
    }
    /// See [`crate::ops::unary::gated`]: `out = f(gate) * up`.
    fn gated(&self, op: Unary, out: &mut Self::Buffer, gate: &Self::Buffer, up: &Self::Buffer) -> Result<()> {
        let mut o = alloc::vec![0.0; self.len(out)];
        crate::ops::unary::gated(op, &mut o, &self.download(gate)?, &self.download(up)?)?;
        self.write(out, &o)
    }
}

impl UnaryOps for ReferenceBackend {}

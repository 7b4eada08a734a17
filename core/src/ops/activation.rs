//! The activations of a dense network, forward and backward, row-wise over (rows, cols).

use crate::backend::Memory;
use crate::error::check_rows;
use crate::ops::softmax::{softmax_backward, softmax_row};
use crate::ops::swiglu::sigmoid;
use crate::reference::in_f64;
use crate::reference::wide;
use crate::reference::ReferenceBackend;
use crate::{Real, Result};
use alloc::vec::Vec;

/// What follows a dense layer's affine map.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Activation {
    /// f(x) = x (also called linear).
    #[default]
    Identity,
    /// f(x) = max(x, 0).
    Relu,
    /// f(x) = x for x > 0, `alpha * x` otherwise.
    LeakyRelu(f32),
    /// f(x) = 1 / (1 + e^-x).
    Sigmoid,
    /// f(x) = tanh(x).
    Tanh,
    /// Row-wise softmax over the layer's units.
    Softmax,
}

impl Activation {
    /// The code and slope the GPU kernels (WGSL and CUDA) switch on: identity 0, ReLU 1,
    /// leaky ReLU 2 (with its slope), sigmoid 3, tanh 4, softmax 5 (row-wise: the softmax
    /// kernels).
    pub fn kernel_code(self) -> (u32, f32) {
        match self {
            Activation::Identity => (0, 0.0),
            Activation::Relu => (1, 0.0),
            Activation::LeakyRelu(a) => (2, a),
            Activation::Sigmoid => (3, 0.0),
            Activation::Tanh => (4, 0.0),
            Activation::Softmax => (5, 0.0),
        }
    }

    /// The leaky ReLU slope PyTorch uses by default.
    pub const LEAKY_RELU_DEFAULT: f32 = 0.01;

    /// Every activation, the leaky ReLU with slope `leaky_slope`: what a sweep over the
    /// activations (a test, an architecture search) walks.
    pub fn every(leaky_slope: f32) -> [Activation; 6] {
        use Activation::*;
        [Identity, Relu, LeakyRelu(leaky_slope), Sigmoid, Tanh, Softmax]
    }
}

/// The forward's shape check, which every backend calls: `inp` and `out` hold
/// `rows x cols` (`cols` at least 1). Returns `rows * cols`.
pub fn check_activation_forward(out: usize, inp: usize, rows: usize, cols: usize) -> Result<usize> {
    check_rows("activation_forward", rows, cols, &[("inp", inp), ("out", out)])
}

/// The backward's shape check, which every backend calls: `inp`, `out`, `dinp` and `dout`
/// each hold `rows x cols`. Returns `rows * cols`.
pub fn check_activation_backward(
    dinp: usize, dout: usize, inp: usize, out: usize, rows: usize, cols: usize,
) -> Result<usize> {
    check_rows(
        "activation_backward",
        rows,
        cols,
        &[("inp", inp), ("out", out), ("dinp", dinp), ("dout", dout)],
    )
}

/// out = f(inp), inp and out: (rows, cols).
pub fn activation_forward<T: Real>(
    act: Activation, out: &mut [T], inp: &[T], rows: usize, cols: usize,
) -> Result<()> {
    check_activation_forward(out.len(), inp.len(), rows, cols)?;
    match act {
        Activation::Identity => out.copy_from_slice(inp),
        Activation::Relu => {
            for (o, &x) in out.iter_mut().zip(inp) {
                *o = if x > T::ZERO { x } else { T::ZERO };
            }
        }
        Activation::LeakyRelu(alpha) => {
            let a = T::from_f32(alpha);
            for (o, &x) in out.iter_mut().zip(inp) {
                *o = if x > T::ZERO { x } else { a * x };
            }
        }
        Activation::Sigmoid => {
            for (o, &x) in out.iter_mut().zip(inp) {
                *o = sigmoid(x);
            }
        }
        Activation::Tanh => {
            for (o, &x) in out.iter_mut().zip(inp) {
                *o = x.tanh();
            }
        }
        Activation::Softmax => {
            for r in 0..rows {
                softmax_row(&mut out[r * cols..(r + 1) * cols], &inp[r * cols..(r + 1) * cols]);
            }
        }
    }
    Ok(())
}

/// dinp = f'(inp) * dout (overwritten). `inp` is the pre-activation, `out` the forward result;
/// each activation reads whichever makes its derivative cheapest. ReLU's derivative at 0 is 0.
pub fn activation_backward<T: Real>(
    act: Activation, dinp: &mut [T], dout: &[T], inp: &[T], out: &[T], rows: usize, cols: usize,
) -> Result<()> {
    let n = check_activation_backward(dinp.len(), dout.len(), inp.len(), out.len(), rows, cols)?;
    match act {
        Activation::Identity => dinp.copy_from_slice(dout),
        Activation::Relu => {
            for i in 0..n {
                dinp[i] = if inp[i] > T::ZERO { dout[i] } else { T::ZERO };
            }
        }
        Activation::LeakyRelu(alpha) => {
            let a = T::from_f32(alpha);
            for i in 0..n {
                dinp[i] = if inp[i] > T::ZERO { dout[i] } else { a * dout[i] };
            }
        }
        Activation::Sigmoid => {
            for i in 0..n {
                dinp[i] = dout[i] * out[i] * (T::ONE - out[i]);
            }
        }
        Activation::Tanh => {
            for i in 0..n {
                dinp[i] = dout[i] * (T::ONE - out[i] * out[i]);
            }
        }
        Activation::Softmax => softmax_backward(dinp, dout, out, rows, cols)?,
    }
    Ok(())
}

/// The dense networks' activations, forward and backward: see [`crate::ops::activation`].
pub trait ActivationOps: Memory {
    /// `out = act(inp)` elementwise (softmax over each row).
    fn activation_forward(
        &self, act: Activation, out: &mut Self::Buffer, inp: &Self::Buffer, rows: usize, cols: usize,
    ) -> Result<()>;
    /// `dinp` from `dout` through `act`, given its input and output (overwrites `dinp`).
    #[allow(clippy::too_many_arguments)]
    fn activation_backward(
        &self, act: Activation, dinp: &mut Self::Buffer, dout: &Self::Buffer, inp: &Self::Buffer,
        out: &Self::Buffer, rows: usize, cols: usize,
    ) -> Result<()>;
}

impl ActivationOps for ReferenceBackend {
    fn activation_forward(
        &self, act: Activation, out: &mut Vec<f32>, inp: &Vec<f32>, rows: usize, cols: usize,
    ) -> Result<()> {
        in_f64([out], |[o]| activation_forward(act, o, &wide(inp), rows, cols))
    }
    fn activation_backward(
        &self, act: Activation, dinp: &mut Vec<f32>, dout: &Vec<f32>, inp: &Vec<f32>, out: &Vec<f32>,
        rows: usize, cols: usize,
    ) -> Result<()> {
        in_f64([dinp], |[d]| activation_backward(act, d, &wide(dout), &wide(inp), &wide(out), rows, cols))
    }
}

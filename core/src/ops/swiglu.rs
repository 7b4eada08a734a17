//! SiLU and the SwiGLU gate of a Llama feed-forward: `out = silu(gate) * up`.

use crate::error::check_len;
use crate::{Real, Result};

pub fn sigmoid<T: Real>(x: T) -> T {
    // Both branches avoid exp of a large positive number, so neither overflows.
    if x >= T::ZERO {
        T::ONE / (T::ONE + (-x).exp())
    } else {
        let e = x.exp();
        e / (T::ONE + e)
    }
}

pub fn silu<T: Real>(x: T) -> T {
    x * sigmoid(x)
}

/// d silu / dx = s(x) * (1 + x * (1 - s(x))).
pub fn silu_grad<T: Real>(x: T) -> T {
    let s = sigmoid(x);
    s * (T::ONE + x * (T::ONE - s))
}

/// out = silu(inp), element-wise.
pub fn silu_forward<T: Real>(out: &mut [T], inp: &[T]) -> Result<()> {
    check_len("silu_forward", "out", out.len(), inp.len())?;
    for (o, &x) in out.iter_mut().zip(inp) {
        *o = silu(x);
    }
    Ok(())
}

/// dinp = dout * silu'(inp) (overwritten).
pub fn silu_backward<T: Real>(dinp: &mut [T], dout: &[T], inp: &[T]) -> Result<()> {
    check_len("silu_backward", "dinp", dinp.len(), inp.len())?;
    check_len("silu_backward", "dout", dout.len(), inp.len())?;
    for i in 0..inp.len() {
        dinp[i] = dout[i] * silu_grad(inp[i]);
    }
    Ok(())
}

/// out = silu(gate) * up, element-wise; all the same length.
pub fn swiglu_forward<T: Real>(out: &mut [T], gate: &[T], up: &[T]) -> Result<()> {
    const OP: &str = "swiglu_forward";
    check_len(OP, "up", up.len(), gate.len())?;
    check_len(OP, "out", out.len(), gate.len())?;
    for i in 0..gate.len() {
        out[i] = silu(gate[i]) * up[i];
    }
    Ok(())
}

/// dgate = dout * up * silu'(gate), dup = dout * silu(gate) (both overwritten).
pub fn swiglu_backward<T: Real>(
    dgate: &mut [T],
    dup: &mut [T],
    dout: &[T],
    gate: &[T],
    up: &[T],
) -> Result<()> {
    const OP: &str = "swiglu_backward";
    let n = gate.len();
    check_len(OP, "up", up.len(), n)?;
    check_len(OP, "dout", dout.len(), n)?;
    check_len(OP, "dgate", dgate.len(), n)?;
    check_len(OP, "dup", dup.len(), n)?;
    for i in 0..n {
        dgate[i] = dout[i] * up[i] * silu_grad(gate[i]);
        dup[i] = dout[i] * silu(gate[i]);
    }
    Ok(())
}

//! RoPE with each position's cos and sin kept across calls. A decode step rotates one
//! position per call, and forming its angles (a `powf` per frequency, then a sin and a cos)
//! was a twentieth of the browser's decode. Twin of `rusting_brain_core::ops::rope`: the
//! same f32 angles and libm calls, so the same bits.

use alloc::vec::Vec;
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, Ordering};

use rusting_brain_core::ops::rope::{RopeScaling, RopeSpec};
use rusting_brain_core::{Real, Result};

/// Positions past this are formed per call instead of kept (a row is head_dim floats).
const MAX_KEPT_POSITIONS: usize = 1 << 14;

/// One table: per position, cos[half] then sin[half].
struct Table {
    head_dim: usize,
    theta: u32,
    scaling: RopeScaling,
    rows: Vec<f32>,
}

/// The table of the last (head_dim, theta, scaling) rotated, behind a flag taken without
/// waiting: on wasm32 there is one thread and it is always free; a native caller that
/// finds it taken forms its rows itself.
struct Kept {
    taken: AtomicBool,
    table: UnsafeCell<Option<Table>>,
}

// SAFETY: `table` is only touched by the holder of `taken` (acquired with compare_exchange,
// released with a Release store).
unsafe impl Sync for Kept {}

static KEPT: Kept = Kept { taken: AtomicBool::new(false), table: UnsafeCell::new(None) };

/// Appends the rows of positions `from..to` to `rows`, as core's `rotate` forms them.
fn push_rows(rows: &mut Vec<f32>, d: usize, theta: f32, scaling: RopeScaling, from: usize, to: usize) {
    let half = d / 2;
    let freqs: Vec<f32> = (0..half).map(|i| scaling.inv_freq(i, d, theta)).collect();
    for pos in from..to {
        let pos = pos as f32;
        rows.extend(freqs.iter().map(|&f| Real::cos(pos * f)));
        rows.extend(freqs.iter().map(|&f| Real::sin(pos * f)));
    }
}

/// Rotates `x` by the rows `table` holds for positions `pos_offset..pos_offset + seq`
/// (`table` starting at position `first`).
fn rotate_with(x: &mut [f32], spec: &RopeSpec, sign: f32, table: &[f32], first: usize) {
    let (d, half) = (spec.head_dim, spec.head_dim / 2);
    for (r, row) in x.chunks_exact_mut(spec.heads * d).enumerate() {
        let t = spec.pos_offset + r % spec.seq - first;
        let (cos, sin) = table[t * d..(t + 1) * d].split_at(half);
        for head in row.chunks_exact_mut(d) {
            let (x1, x2) = head.split_at_mut(half);
            for (((a, b), &c), &s) in x1.iter_mut().zip(x2).zip(cos).zip(sin) {
                // sign is +-1, so sin * sign is exact, as in core.
                let s = s * sign;
                let (va, vb) = (*a, *b);
                *a = va * c - vb * s;
                *b = vb * c + va * s;
            }
        }
    }
}

fn rotate(x: &mut [f32], spec: &RopeSpec, sign: f32) {
    let (d, end) = (spec.head_dim, spec.pos_offset + spec.seq);
    let free = end <= MAX_KEPT_POSITIONS
        && KEPT.taken.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok();
    if !free {
        let mut rows = Vec::new();
        push_rows(&mut rows, d, spec.theta, spec.scaling, spec.pos_offset, end);
        rotate_with(x, spec, sign, &rows, spec.pos_offset);
        return;
    }
    // SAFETY: this thread holds `taken` until the store below.
    let kept = unsafe { &mut *KEPT.table.get() };
    let table = match kept {
        Some(t) if t.head_dim == d && t.theta == spec.theta.to_bits() && t.scaling == spec.scaling => t,
        _ => kept.insert(Table {
            head_dim: d,
            theta: spec.theta.to_bits(),
            scaling: spec.scaling,
            rows: Vec::new(),
        }),
    };
    let have = table.rows.len() / d;
    if have < end {
        // At least double, so a decode loop forms rows O(log n) times.
        let want = end.max(2 * have).min(MAX_KEPT_POSITIONS);
        push_rows(&mut table.rows, d, spec.theta, spec.scaling, have, want);
    }
    rotate_with(x, spec, sign, &table.rows, 0);
    KEPT.taken.store(false, Ordering::Release);
}

/// Twin of `ops::rope::rope_forward`.
pub(crate) fn rope_forward(x: &mut [f32], spec: &RopeSpec) -> Result<()> {
    spec.check("rope_forward", x.len())?;
    rotate(x, spec, 1.0);
    Ok(())
}

/// Twin of `ops::rope::rope_backward`.
pub(crate) fn rope_backward(dx: &mut [f32], spec: &RopeSpec) -> Result<()> {
    spec.check("rope_backward", dx.len())?;
    rotate(dx, spec, -1.0);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusting_brain_core::ops::rope as core_rope;
    use rusting_brain_core::Rng;

    fn spec(
        batch: usize, seq: usize, head_dim: usize, pos_offset: usize, theta: f32, scaling: RopeScaling,
    ) -> RopeSpec {
        RopeSpec { batch, seq, heads: 3, head_dim, pos_offset, theta, scaling }
    }

    /// The same bits as core's f32 rotation, call after call as a decode makes them (the
    /// table growing), with a second model's spec in between (the table replaced), at
    /// positions past what is kept, with the flag held elsewhere, and backward.
    #[test]
    fn kept_rows_rotate_as_core_does_bit_for_bit() {
        let mut rng = Rng::new(11);
        let linear = RopeScaling::Linear { factor: 4.0 };
        let mut calls = Vec::new();
        for pos in 0..70 {
            calls.push(spec(1, 1, 32, pos, 10_000.0, RopeScaling::None));
            if pos % 9 == 0 {
                calls.push(spec(2, 5, 10, pos, 500_000.0, linear));
            }
        }
        calls.push(spec(1, 3, 32, MAX_KEPT_POSITIONS - 1, 10_000.0, RopeScaling::None));
        calls.push(spec(2, 4, 32, 0, 10_000.0, RopeScaling::None));
        for (i, s) in calls.iter().enumerate() {
            let x = rng.normal_vec(s.batch * s.seq * s.heads * s.head_dim, 1.0);
            for backward in [false, true] {
                let (mut got, mut want) = (x.clone(), x.clone());
                if backward {
                    rope_backward(&mut got, s).unwrap();
                    core_rope::rope_backward(&mut want, s).unwrap();
                } else {
                    rope_forward(&mut got, s).unwrap();
                    core_rope::rope_forward(&mut want, s).unwrap();
                }
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "call {i} {s:?}, backward {backward}");
            }
        }
        // Taken elsewhere: the rows are formed for the call, with the same result.
        let s = spec(1, 2, 32, 5, 10_000.0, RopeScaling::None);
        let x = rng.normal_vec(2 * 3 * 32, 1.0);
        let (mut got, mut want) = (x.clone(), x);
        while KEPT.taken.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {}
        rope_forward(&mut got, &s).unwrap();
        KEPT.taken.store(false, Ordering::Release);
        core_rope::rope_forward(&mut want, &s).unwrap();
        assert_eq!(got, want);
    }

    /// A bad spec is refused before anything is rotated.
    #[test]
    fn a_bad_spec_is_refused() {
        let mut x = alloc::vec![1.0f32; 12];
        assert!(rope_forward(&mut x, &spec(1, 1, 3, 0, 10_000.0, RopeScaling::None)).is_err());
        assert!(rope_forward(&mut x, &spec(1, 2, 4, 0, 10_000.0, RopeScaling::None)).is_err());
        assert_eq!(x, alloc::vec![1.0f32; 12]);
    }
}

//! RoPE on the CPU: cos/sin come from a table kept per (head_dim, theta, scaling) across calls
//! (angles in f32 exactly as the reference forms them, so results agree to the bit), then
//! rows rotate in parallel. Twin of `rusting_brain_core::ops::rope`.

use std::sync::{Arc, Mutex};

use rayon::prelude::*;
use rusting_brain_core::ops::rope::{RopeScaling, RopeSpec};
use rusting_brain_core::{Real, Result};

use super::rows_per_task;
use crate::backend::cpu::CpuBackend;
use rusting_brain_core::backend::RopeOps;

/// Positions past this are computed per call instead of kept (a table row is head_dim floats).
const MAX_CACHED_POSITIONS: usize = 1 << 16;

/// One table: per position, cos[half] then sin[half].
struct Table {
    head_dim: usize,
    theta: u32,
    scaling: RopeScaling,
    rows: Arc<Vec<f32>>,
}

/// Decoding rotates one position per call, and building its row took 2 * half libm calls
/// (a sixth of a decode step's RoPE time was trig); the table grows, never changes.
static TABLES: Mutex<Vec<Table>> = Mutex::new(Vec::new());

fn build_rows(d: usize, theta: f32, scaling: RopeScaling, from: usize, to: usize) -> Vec<f32> {
    let half = d / 2;
    let freqs: Vec<f32> = (0..half).map(|i| scaling.inv_freq(i, d, theta)).collect();
    let mut rows = vec![0.0f32; (to - from) * d];
    rows.par_chunks_mut(d).enumerate().for_each(|(t, row)| {
        let pos = (from + t) as f32;
        for i in 0..half {
            let angle = pos * freqs[i];
            row[i] = Real::cos(angle);
            row[half + i] = Real::sin(angle);
        }
    });
    rows
}

/// The rows of positions `0..end`, or `None` when `end` is past what is kept.
fn cached_rows(d: usize, theta: f32, scaling: RopeScaling, end: usize) -> Option<Arc<Vec<f32>>> {
    if end > MAX_CACHED_POSITIONS {
        return None;
    }
    // A poisoned lock only means another thread panicked mid-update; the tables are
    // replaced whole, so what is there is still consistent.
    let mut tables = TABLES.lock().unwrap_or_else(|e| e.into_inner());
    let at = match tables
        .iter()
        .position(|t| t.head_dim == d && t.theta == theta.to_bits() && t.scaling == scaling)
    {
        Some(i) => i,
        None => {
            tables.push(Table { head_dim: d, theta: theta.to_bits(), scaling, rows: Arc::new(Vec::new()) });
            tables.len() - 1
        }
    };
    let table = &mut tables[at];
    let have = table.rows.len() / d;
    if have < end {
        // Grow to at least double, so a decode loop rebuilds the table O(log n) times.
        let want = end.max(2 * have).min(MAX_CACHED_POSITIONS);
        let mut rows = Vec::with_capacity(want * d);
        rows.extend_from_slice(&table.rows);
        rows.extend(build_rows(d, theta, scaling, have, want));
        table.rows = Arc::new(rows);
    }
    Some(table.rows.clone())
}

fn rotate(x: &mut [f32], spec: &RopeSpec, sign: f32) {
    let (rows, first) = table(spec);
    rotate_with(x, spec, &rows[first * spec.head_dim..], sign);
}

/// The cos/sin rows of `spec`'s positions: the kept table and the row of position
/// `pos_offset` in it, or rows made for this call alone (then from row 0).
pub(crate) fn table(spec: &RopeSpec) -> (Arc<Vec<f32>>, usize) {
    let (d, end) = (spec.head_dim, spec.pos_offset + spec.seq);
    match cached_rows(d, spec.theta, spec.scaling, end) {
        Some(rows) => (rows, spec.pos_offset),
        None => (Arc::new(build_rows(d, spec.theta, spec.scaling, spec.pos_offset, end)), 0),
    }
}

/// Rotates `x` (`spec`'s layout) by `sign` times the angles in `rows`, the cos/sin rows
/// of its positions from the first.
pub(crate) fn rotate_with(x: &mut [f32], spec: &RopeSpec, rows: &[f32], sign: f32) {
    let (d, half, heads, seq) = (spec.head_dim, spec.head_dim / 2, spec.heads, spec.seq);
    let table = &rows[..seq * d];
    let row_len = heads * d;
    let per_task = rows_per_task(row_len);
    let block = |chunk: usize, block: &mut [f32]| {
        let first = chunk * per_task;
        for (r, row) in block.chunks_exact_mut(row_len).enumerate() {
            let t = (first + r) % seq;
            let (cos, sin) = table[t * d..(t + 1) * d].split_at(half);
            for head in row.chunks_exact_mut(d) {
                let (x1, x2) = head.split_at_mut(half);
                for (((a, b), &c), &s) in x1.iter_mut().zip(x2.iter_mut()).zip(cos).zip(sin) {
                    let (x, y) = (*a, *b);
                    // sign is +-1, so sin * sign is exact, as in the reference.
                    let s = s * sign;
                    *a = x * c - y * s;
                    *b = y * c + x * s;
                }
            }
        }
    };
    // A decode step's rotation (one position) is one task: run it here, not through
    // rayon's splitting machinery, which cost more than the rotation.
    if x.len() <= row_len * per_task {
        block(0, x);
    } else {
        x.par_chunks_mut(row_len * per_task).enumerate().for_each(|(chunk, b)| block(chunk, b));
    }
}

pub fn rope_forward(x: &mut [f32], spec: &RopeSpec) -> Result<()> {
    spec.check("rope_forward", x.len())?;
    rotate(x, spec, 1.0);
    Ok(())
}

pub fn rope_backward(dx: &mut [f32], spec: &RopeSpec) -> Result<()> {
    spec.check("rope_backward", dx.len())?;
    rotate(dx, spec, -1.0);
    Ok(())
}

impl RopeOps for CpuBackend {
    fn rope_forward(&self, x: &mut Vec<f32>, spec: &RopeSpec) -> Result<()> {
        rope_forward(x, spec)
    }
    fn rope_backward(&self, dx: &mut Vec<f32>, spec: &RopeSpec) -> Result<()> {
        rope_backward(dx, spec)
    }
}

//! RoPE on the CPU: the cos/sin table is built once per call (angles in f32 exactly as the
//! reference forms them, so results agree to the bit), then rows rotate in parallel.
//! Twin of `rusting_brain_core::ops::rope`.

use rayon::prelude::*;
use rusting_brain_core::ops::rope::{inv_freq, RopeSpec};
use rusting_brain_core::{Real, Result};

use super::rows_per_task;

fn rotate(x: &mut [f32], spec: &RopeSpec, sign: f32) {
    let (d, half, heads, seq) = (spec.head_dim, spec.head_dim / 2, spec.heads, spec.seq);
    let freqs: Vec<f32> = (0..half).map(|i| inv_freq(i, d, spec.theta)).collect();
    let mut table = vec![0.0f32; seq * d]; // per position: cos[half], sin[half]
    table.par_chunks_mut(d).enumerate().for_each(|(t, row)| {
        let pos = (spec.pos_offset + t) as f32;
        for i in 0..half {
            let angle = pos * freqs[i];
            row[i] = Real::cos(angle);
            row[half + i] = Real::sin(angle) * sign;
        }
    });
    let row_len = heads * d;
    x.par_chunks_mut(row_len * rows_per_task(row_len))
        .enumerate()
        .for_each(|(chunk, block)| {
            let first = chunk * rows_per_task(row_len);
            for (r, row) in block.chunks_exact_mut(row_len).enumerate() {
                let t = (first + r) % seq;
                let (cos, sin) = table[t * d..(t + 1) * d].split_at(half);
                for head in row.chunks_exact_mut(d) {
                    let (x1, x2) = head.split_at_mut(half);
                    for i in 0..half {
                        let (a, b) = (x1[i], x2[i]);
                        x1[i] = a * cos[i] - b * sin[i];
                        x2[i] = b * cos[i] + a * sin[i];
                    }
                }
            }
        });
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

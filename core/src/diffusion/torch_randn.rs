//! PyTorch's CPU `torch.randn` for a seed, reproduced: the same Mersenne Twister
//! (`torch.Generator().manual_seed(seed)`), the same uniforms and the same Box-Muller
//! layout, so a seed gives the noise (and so the image) diffusers gives for it.
//!
//! For 16 values or more (every latent), PyTorch draws all the uniforms first (24-bit,
//! `(r & 0xFFFFFF) / 2^24`), then turns each block of 16 into normals: value `j` and
//! `j + 8` of a block are `r cos(theta)` and `r sin(theta)` with `r = sqrt(-2 ln(1 - u_j))`
//! and `theta = 2 pi u_{j+8}`; when the count is not a multiple of 16 the last 16 values
//! are drawn again from fresh uniforms and transformed the same way. Below 16 values it
//! draws one normal at a time in f64 (53-bit uniforms from two draws, `r = sqrt(-2
//! ln(1 - u2))`, `theta = 2 pi u1`, the sine kept for the next value).
//!
//! PyTorch computes the block transform with vectorized log/sin/cos (SLEEF, within one
//! ulp); libm's may differ in the last bit, so values agree to a few f32 ulps, not bitwise.

use alloc::vec;
use alloc::vec::Vec;

/// The 32-bit Mersenne Twister (MT19937), seeded as PyTorch seeds it (the seed's low 32
/// bits through the standard initialization).
#[derive(Debug, Clone)]
pub struct Mt19937 {
    state: [u32; 624],
    index: usize,
}

impl Mt19937 {
    /// PyTorch's CPU generator state for `seed`.
    pub fn new(seed: u64) -> Self {
        let mut state = [0u32; 624];
        state[0] = seed as u32;
        for j in 1..624 {
            let prev = state[j - 1];
            state[j] = 1_812_433_253u32.wrapping_mul(prev ^ (prev >> 30)).wrapping_add(j as u32);
        }
        Mt19937 { state, index: 624 }
    }

    fn twist(&mut self) {
        for i in 0..624 {
            let y = (self.state[i] & 0x8000_0000) | (self.state[(i + 1) % 624] & 0x7fff_ffff);
            let mut next = self.state[(i + 397) % 624] ^ (y >> 1);
            if y & 1 != 0 {
                next ^= 0x9908_b0df;
            }
            self.state[i] = next;
        }
        self.index = 0;
    }

    /// The next 32 random bits.
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= 624 {
            self.twist();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// Two draws, the first the high half (PyTorch's `random64`).
    pub fn next_u64(&mut self) -> u64 {
        let hi = self.next_u32() as u64;
        let lo = self.next_u32() as u64;
        (hi << 32) | lo
    }

    /// A float uniform in [0, 1) from 24 bits of one draw.
    fn uniform_f32(&mut self) -> f32 {
        (self.next_u32() & 0x00ff_ffff) as f32 * (1.0 / 16_777_216.0)
    }

    /// A double uniform in [0, 1) from 53 bits of two draws.
    fn uniform_f64(&mut self) -> f64 {
        (self.next_u64() & ((1u64 << 53) - 1)) as f64 * (1.0 / 9_007_199_254_740_992.0)
    }
}

/// Box-Muller over one block of 16 uniforms, in place.
fn normal_fill_16(d: &mut [f32]) {
    for j in 0..8 {
        let u1 = 1.0 - d[j];
        let u2 = d[j + 8];
        let radius = libm::sqrtf(-2.0 * libm::logf(u1));
        let theta = 2.0 * core::f32::consts::PI * u2;
        d[j] = radius * libm::cosf(theta);
        d[j + 8] = radius * libm::sinf(theta);
    }
}

/// `torch.randn(n, generator=torch.Generator().manual_seed(seed))` on the CPU, as f32.
pub fn torch_randn(seed: u64, n: usize) -> Vec<f32> {
    TorchGenerator::new(seed).randn(n)
}

/// A CPU `torch.Generator` seeded with `manual_seed`: successive [`TorchGenerator::randn`]
/// calls give what successive `torch.randn(.., generator=g)` calls give (a pipeline that
/// samples the autoencoder's latent and then the noise draws twice from one generator).
#[derive(Debug, Clone)]
pub struct TorchGenerator {
    mt: Mt19937,
    /// The second value of the last f64 Box-Muller pair, which PyTorch keeps on the
    /// generator for the next scalar draw.
    cached: Option<f64>,
}

impl TorchGenerator {
    /// A generator in the state `torch.Generator().manual_seed(seed)` leaves.
    pub fn new(seed: u64) -> Self {
        TorchGenerator { mt: Mt19937::new(seed), cached: None }
    }

    /// `n` standard normal values, as `torch.randn(n)` draws them: from 16 values on, f32
    /// uniforms through Box-Muller in blocks of 16 (a ragged end recomputes the last 16 from
    /// fresh uniforms); below 16, one f64 pair at a time.
    pub fn randn(&mut self, n: usize) -> Vec<f32> {
        let g = &mut self.mt;
        if n >= 16 {
            let mut d: Vec<f32> = (0..n).map(|_| g.uniform_f32()).collect();
            for block in d.chunks_exact_mut(16) {
                normal_fill_16(block);
            }
            if !n.is_multiple_of(16) {
                let tail = &mut d[n - 16..];
                for v in tail.iter_mut() {
                    *v = g.uniform_f32();
                }
                normal_fill_16(tail);
            }
            return d;
        }
        let mut out = vec![0f32; n];
        for v in out.iter_mut() {
            let x = match self.cached.take() {
                Some(x) => x,
                None => {
                    let u1 = g.uniform_f64();
                    let u2 = g.uniform_f64();
                    let r = libm::sqrt(-2.0 * libm::log1p(-u2));
                    let theta = 2.0 * core::f64::consts::PI * u1;
                    self.cached = Some(r * libm::sin(theta));
                    r * libm::cos(theta)
                }
            };
            *v = x as f32;
        }
        out
    }
}

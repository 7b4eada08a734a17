//! AMX tiles (x86-64, where `simd::has_amx_int8` / `simd::has_amx_bf16` found them granted):
//! the blocks the int8 GEMM and mixed-precision attention run on. A tile is 16 rows of
//! 64 bytes; `tdpbusd` (u8 x i8 into i32) and `tdpbf16ps` (bf16 pairs into f32) multiply a
//! 16 x 16-word A tile by a 16-step x 16-column B tile of words (four bytes or two bf16 a
//! word, along the sum) into 16 x 16 sums: 1,024 int8 or 512 bf16 multiply-adds an
//! instruction, where AVX-512 VNNI does 64 and `vdpbf16ps` 32.
//!
//! A block here is 32 rows by 16 or 32 columns: tiles 4 and 5 hold A's two groups of 16
//! rows, tiles 6 and 7 B's one or two column tiles, tiles 0 to 3 the sums, kept over all of
//! the block's steps and then stored once. A is packed in groups of 16 rows step by step
//! ([`scatter_row`]: a step's 16 rows of 16 words, 1 KiB in order, so a tile load reads
//! memory in order; A's rows loaded at their own stride left the loads waiting on memory);
//! B is read where its packer put it, rows `b_stride` bytes apart, steps `b_step` bytes
//! apart, the second column tile 64 bytes after the first. Sums past the caller's rows or
//! columns are computed from whatever the buffers hold there and never stored; along the
//! sum, the padding of A and B is zero (bf16: zeros on both sides, as a NaN times zero
//! would reach every sum of its row).
//!
//! The tiles are state of the thread: [`Tiles`] configures them for a task and releases
//! them after it, so a thread switched out has no tile data to save.
//!
//! Reference twins: core's `q8_matmul` (the int8 sums are the same integers as VNNI's) and
//! `sdpa` in mixed precision (`tdpbf16ps` adds exact products of the same bf16 operands in
//! f32; only the order of the f32 additions differs from `vdpbf16ps`).

// Off x86-64 only `aligned` is used (the buffers' helper); the tiles are x86-64's.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

#[cfg(target_arch = "x86_64")]
use std::arch::asm;

/// Rows of a block: two tiles of 16.
pub const ROWS: usize = 32;
/// Words of a row a step takes: a tile row is 64 bytes.
pub const STEP_WORDS: usize = 16;
/// Rows of a group of A, packed step by step.
pub const GROUP: usize = 16;

/// The thread's tile configuration while it lives: eight tiles of 16 rows of 64 bytes;
/// `tilerelease` when dropped.
#[cfg(target_arch = "x86_64")]
pub struct Tiles(());

#[cfg(target_arch = "x86_64")]
impl Tiles {
    /// # Safety
    /// `simd::has_amx_int8()` or `simd::has_amx_bf16()` is true (the tile data granted).
    pub unsafe fn configure() -> Tiles {
        // Palette 1; bytes 16.. the tiles' row widths (u16), bytes 48.. their rows.
        let mut cfg = [0u8; 64];
        cfg[0] = 1;
        for t in 0..8 {
            cfg[16 + 2 * t] = 64;
            cfg[48 + t] = 16;
        }
        // SAFETY: AMX-TILE is there and granted (the caller's contract); the configuration
        // is a valid palette-1 one.
        unsafe { asm!("ldtilecfg [{}]", in(reg) cfg.as_ptr(), options(nostack, readonly)) };
        Tiles(())
    }
}

#[cfg(target_arch = "x86_64")]
impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: tiles were configured (only `configure` makes a `Tiles`).
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// `len` words of `v` that start on a 64-byte line (`v` grown by up to 15 words to hold
/// them): a tile row read from a misaligned buffer spans two cache lines, and tile loads
/// from glibc's 16-byte-aligned blocks ran at about half speed.
pub fn aligned(v: &mut Vec<u32>, len: usize) -> &mut [u32] {
    if v.len() < len + 15 {
        v.resize(len + 15, 0);
    }
    let skip = (v.as_ptr() as usize).wrapping_neg() % 64 / 4;
    &mut v[skip..skip + len]
}

/// A block's sums, on a 64-byte line (see [`aligned`]).
#[repr(C, align(64))]
pub struct Sums(pub [u32; ROWS * 32]);

/// Row `r` (< GROUP) of a group of A: `words` (a multiple of STEP_WORDS long) stored step
/// by step, word `p` at `group[(p / 16 * GROUP + r) * 16 + p % 16]`.
#[inline]
pub fn scatter_row(group: &mut [u32], r: usize, words: &[u32]) {
    debug_assert!(words.len().is_multiple_of(STEP_WORDS) && r < GROUP);
    for (step, chunk) in words.chunks_exact(STEP_WORDS).enumerate() {
        group[(step * GROUP + r) * STEP_WORDS..][..STEP_WORDS].copy_from_slice(chunk);
    }
}

/// Where a block's B comes from: the first column tile's first row, the bytes between its
/// rows, and the bytes between steps (16 rows on).
#[derive(Clone, Copy)]
pub struct BTiles {
    pub at: *const u32,
    pub stride: usize,
    pub step: usize,
}

/// Which instruction a block runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `tdpbusd`: A unsigned bytes, B signed, i32 sums.
    U8I8,
    /// `tdpbf16ps`: bf16 pairs, f32 sums.
    Bf16,
}

/// Where a block's sums go: 32 rows of 16 or 32 values (i32 or f32 bits) from `at`, rows
/// `stride` bytes apart: a [`Sums`] (`Out::sums`), or the caller's output itself.
#[derive(Clone, Copy)]
pub struct Out {
    pub at: *mut u32,
    pub stride: usize,
}

impl Out {
    /// The block's own buffer, 128 bytes a row.
    pub fn sums(sums: &mut Sums) -> Out {
        Out { at: sums.0.as_mut_ptr(), stride: 32 * 4 }
    }
}

/// One block: `out` (32 rows of 16 or 32 sums) = A (two groups of 16 rows from `a`, each
/// `steps` steps of 1 KiB) times B's `cols_tiles` (1 or 2) column tiles over `steps`
/// steps.
///
/// # Safety
/// The calling thread's tiles are configured ([`Tiles`]) and the CPU has the instruction
/// `kind` needs (AMX-INT8 or AMX-BF16); `a` holds 2 * steps KiB from its start (two groups
/// of `steps` steps); B's tiles are readable as `b` describes for `steps` steps;
/// `out` is writable for 32 rows of 16 * cols_tiles values; `steps >= 1`.
#[cfg(target_arch = "x86_64")]
pub unsafe fn block(out: Out, a: &[u32], b: BTiles, steps: usize, cols_tiles: usize, kind: Kind) {
    debug_assert!(steps >= 1 && a.len() >= 2 * steps * GROUP * STEP_WORDS && (1..=2).contains(&cols_tiles));
    let a0 = a.as_ptr();
    // SAFETY: the second group starts steps KiB after the first, inside `a`.
    let a1 = unsafe { a0.add(steps * GROUP * STEP_WORDS) };
    let c0 = out.at;
    // SAFETY: row 16 of the 32 the contract names.
    let c1 = unsafe { c0.cast::<u8>().add(16 * out.stride).cast::<u32>() };
    // A step: tiles 4 and 5 take the step's KiB of each group of A (rows 64 bytes apart),
    // tiles 6 and 7 B's column tiles; `tdp.. dst, A, B`. The sums are stored `out.stride`
    // bytes a row.
    macro_rules! run {
        ($op:literal, two) => {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                "2:",
                "tileloadd tmm4, [{a0} + {sa}*1]",
                "tileloadd tmm5, [{a1} + {sa}*1]",
                "tileloadd tmm6, [{b} + {sb}*1]",
                "tileloadd tmm7, [{b} + {sb}*1 + 64]",
                concat!($op, " tmm0, tmm4, tmm6"),
                concat!($op, " tmm1, tmm4, tmm7"),
                concat!($op, " tmm2, tmm5, tmm6"),
                concat!($op, " tmm3, tmm5, tmm7"),
                "add {a0}, 1024",
                "add {a1}, 1024",
                "add {b}, {bstep}",
                "dec {steps}",
                "jnz 2b",
                "tilestored [{c0} + {sc}*1], tmm0",
                "tilestored [{c0} + {sc}*1 + 64], tmm1",
                "tilestored [{c1} + {sc}*1], tmm2",
                "tilestored [{c1} + {sc}*1 + 64], tmm3",
                a0 = inout(reg) a0 => _,
                a1 = inout(reg) a1 => _,
                b = inout(reg) b.at => _,
                steps = inout(reg) steps => _,
                sa = in(reg) 64usize,
                sb = in(reg) b.stride,
                bstep = in(reg) b.step,
                c0 = in(reg) c0,
                c1 = in(reg) c1,
                sc = in(reg) out.stride,
                options(nostack),
            )
        };
        ($op:literal, one) => {
            asm!(
                "tilezero tmm0",
                "tilezero tmm2",
                "2:",
                "tileloadd tmm4, [{a0} + {sa}*1]",
                "tileloadd tmm5, [{a1} + {sa}*1]",
                "tileloadd tmm6, [{b} + {sb}*1]",
                concat!($op, " tmm0, tmm4, tmm6"),
                concat!($op, " tmm2, tmm5, tmm6"),
                "add {a0}, 1024",
                "add {a1}, 1024",
                "add {b}, {bstep}",
                "dec {steps}",
                "jnz 2b",
                "tilestored [{c0} + {sc}*1], tmm0",
                "tilestored [{c1} + {sc}*1], tmm2",
                a0 = inout(reg) a0 => _,
                a1 = inout(reg) a1 => _,
                b = inout(reg) b.at => _,
                steps = inout(reg) steps => _,
                sa = in(reg) 64usize,
                sb = in(reg) b.stride,
                bstep = in(reg) b.step,
                c0 = in(reg) c0,
                c1 = in(reg) c1,
                sc = in(reg) out.stride,
                options(nostack),
            )
        };
    }
    // SAFETY: `steps` steps of both groups of A and of B are read, and the sums stored,
    // inside what the contract names.
    unsafe {
        match (kind, cols_tiles) {
            (Kind::U8I8, 2) => run!("tdpbusd", two),
            (Kind::U8I8, _) => run!("tdpbusd", one),
            (Kind::Bf16, 2) => run!("tdpbf16ps", two),
            (Kind::Bf16, _) => run!("tdpbf16ps", one),
        }
    }
}

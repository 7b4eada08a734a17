//! The inner loops of the CPU backend, compiled three times (AVX-512, AVX2+FMA, baseline)
//! and picked at run time, so one binary runs fast on any x86-64 and on aarch64 without
//! `-C target-cpu=native`.
//!
//! Each kernel is one `#[inline(always)]` body written with independent accumulator lanes
//! (so LLVM can vectorize a reduction without reassociating it), instantiated inside
//! `#[target_feature]` wrappers. Each has a plain twin in `rusting_brain_core::ops` and
//! the backend tests compare them.

use std::sync::OnceLock;

use rusting_brain_core::ops::optim::AdamConstants;
use rusting_brain_core::ops::unary::Unary;

/// The instruction set the kernels run with, detected once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512F (with VNNI and BF16 where present).
    Avx512,
    /// AVX2 with FMA.
    Avx2Fma,
    /// SSE2 on x86-64, NEON (which always has FMA) on aarch64.
    Baseline,
}

impl Isa {
    /// The name printed in benchmark tables and logs.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512f",
            Isa::Avx2Fma => "avx2+fma",
            Isa::Baseline if cfg!(target_arch = "aarch64") => "neon",
            Isa::Baseline => "baseline",
        }
    }
}

/// The instruction set the kernels run with: the best this CPU has, or a lower one asked
/// for with `RB_CPU_ISA` (`avx512`, `avx2`, `baseline`), so tests and benchmarks can run
/// every path on one machine. A path the CPU lacks is never taken: the request is lowered
/// to what the CPU has. The f32 GEMMs are the `gemm` crate's, which picks its own kernels
/// at run time and has no such switch.
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let detected = detected_isa();
        match requested_isa() {
            Some(want) if rank(want) < rank(detected) => want,
            _ => detected,
        }
    })
}

fn rank(isa: Isa) -> u8 {
    match isa {
        Isa::Baseline => 0,
        Isa::Avx2Fma => 1,
        Isa::Avx512 => 2,
    }
}

/// `RB_CPU_ISA`, when set to a path name; anything else is reported once and ignored.
fn requested_isa() -> Option<Isa> {
    let value = std::env::var("RB_CPU_ISA").ok()?;
    match value.trim().to_ascii_lowercase().as_str() {
        "avx512" | "avx512f" => Some(Isa::Avx512),
        "avx2" | "avx2+fma" => Some(Isa::Avx2Fma),
        "baseline" | "portable" | "neon" => Some(Isa::Baseline),
        "" | "native" | "auto" => None,
        other => {
            eprintln!(
                "rusting_brain: RB_CPU_ISA={other:?} is not one of avx512, avx2, baseline, native; using the CPU's best"
            );
            None
        }
    }
}

fn detected_isa() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
        {
            return Isa::Avx512;
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            return Isa::Avx2Fma;
        }
    }
    Isa::Baseline
}

/// `a * b + c`, fused where the instruction set has FMA (never a slow libm call).
#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

const LANES: usize = 16;

const BASE_FMA: bool = cfg!(target_arch = "aarch64");

/// Defines `pub fn $name(args) -> ret` that dispatches to `$body::<FMA>` compiled for the
/// detected instruction set. The `unsafe` calls are sound because each wrapper is only
/// called after `isa()` detected its features on this CPU.
macro_rules! dispatch {
    ($(#[$doc:meta])* $name:ident => $body:ident ( $($arg:ident : $ty:ty),* ) $(-> $ret:ty)?) => {
        $(#[$doc])*
        #[inline]
        pub fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2,fma")]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? { $body::<true>($($arg),*) }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? { $body::<true>($($arg),*) }
                match isa() {
                    // SAFETY: isa() returned this variant only after run-time detection
                    // found these features on the running CPU.
                    Isa::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: as above.
                    Isa::Avx2Fma => return unsafe { avx2($($arg),*) },
                    Isa::Baseline => {}
                }
            }
            $body::<BASE_FMA>($($arg),*)
        }
    };
}

// The kernels by kind, each file a family of loops; `dispatch!` above compiles them per ISA.
mod exp;
mod float;
mod int4;
mod int8;
mod int8_blocks;
mod rows;
#[cfg(test)]
mod tests;

pub use exp::*;
pub use float::*;
pub use int4::*;
pub use int8::*;
pub use int8_blocks::*;
pub use rows::*;

/// Elements per step of the reductions: four vectors of 16, so four independent FMA
/// chains hide the FMA latency (one chain would run at a quarter of the machine's rate).
const STEP: usize = 4 * LANES;

/// Fixed-size views, so the inner loops have no bounds checks and vectorize fully.
#[inline(always)]
fn block(x: &[f32]) -> &[f32; STEP] {
    x.try_into().expect("chunks_exact yields STEP elements")
}

#[inline(always)]
fn lanes(x: &[f32]) -> &[f32; LANES] {
    x.try_into().expect("chunks_exact yields LANES elements")
}

#[inline(always)]
fn block_mut(x: &mut [f32]) -> &mut [f32; STEP] {
    x.try_into().expect("chunks_exact yields STEP elements")
}

#[inline(always)]
fn fold(acc: &[f32; STEP]) -> f32 {
    let mut v = [0.0f32; LANES];
    for l in 0..LANES {
        v[l] = (acc[l] + acc[LANES + l]) + (acc[2 * LANES + l] + acc[3 * LANES + l]);
    }
    hsum(&v)
}

/// Whether `dot_i8` runs on VNNI here: the CPU has it, the AVX-512 path is in use, and
/// `RB_CPU_VNNI=0` did not turn it off.
pub fn has_vnni() -> bool {
    static VNNI: OnceLock<bool> = OnceLock::new();
    *VNNI.get_or_init(|| {
        let off = std::env::var("RB_CPU_VNNI").is_ok_and(|v| v.trim() == "0");
        #[cfg(target_arch = "x86_64")]
        {
            !off && isa() == Isa::Avx512
                && std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vnni")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = off;
            false
        }
    })
}

/// Whether the int8 GEMM (`int8_gemm`) runs on AMX tiles here: VNNI is in use (the GEMM
/// packs and finishes with AVX-512), the CPU lists AMX-TILE and AMX-INT8, the OS has the
/// tile state in XCR0, Linux granted this process the tile data (`arch_prctl`
/// `ARCH_REQ_XCOMP_PERM`: without it the first tile instruction is a SIGILL, which a
/// listed flag does not rule out), and `RB_CPU_AMX=0` did not turn it off. Tiles give the
/// same i32 sums as VNNI, so turning them off changes speed, never a result.
pub fn has_amx_int8() -> bool {
    has_vnni() && amx_granted().0
}

/// Whether mixed-precision attention runs on AMX-BF16 tiles here: AVX-512 is the path in
/// use, the CPU lists AMX-TILE and AMX-BF16, and the tile data is granted (as
/// [`has_amx_int8`]); `RB_CPU_AMX=0` turns it off.
pub fn has_amx_bf16() -> bool {
    isa() == Isa::Avx512 && amx_granted().1
}

/// AMX-INT8 and AMX-BF16, each where the CPU lists it with AMX-TILE and the tile data is
/// granted, checked once: CPUID, XCR0 and Linux's grant, in that order.
fn amx_granted() -> (bool, bool) {
    static AMX: OnceLock<(bool, bool)> = OnceLock::new();
    *AMX.get_or_init(|| {
        let off = std::env::var("RB_CPU_AMX").is_ok_and(|v| v.trim() == "0");
        if off {
            return (false, false);
        }
        amx_probe()
    })
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn amx_probe() -> (bool, bool) {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    let (leaf1, leaf7) = (__cpuid(1), __cpuid_count(7, 0));
    let amx_bf16 = leaf7.edx >> 22 & 1 == 1;
    let amx_tile = leaf7.edx >> 24 & 1 == 1;
    let amx_int8 = leaf7.edx >> 25 & 1 == 1;
    let osxsave = leaf1.ecx >> 27 & 1 == 1;
    if !(amx_tile && osxsave && (amx_int8 || amx_bf16)) {
        return (false, false);
    }
    /// XCR0 (XGETBV is there: CPUID said OSXSAVE).
    #[target_feature(enable = "xsave")]
    unsafe fn xcr0() -> u64 {
        std::arch::x86_64::_xgetbv(0)
    }
    // Bits 17 and 18: XTILECFG and XTILEDATA, the OS saves and restores the tiles.
    // SAFETY: OSXSAVE was checked above.
    if unsafe { xcr0() } & (3 << 17) != 3 << 17 {
        return (false, false);
    }
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: arch_prctl with these arguments only asks for a permission; the syscall
    // clobbers rcx and r11 and nothing else.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") SYS_ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    if ret != 0 {
        return (false, false);
    }
    (amx_int8, amx_bf16)
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn amx_probe() -> (bool, bool) {
    (false, false)
}

#[inline(always)]
fn hsum(acc: &[f32; LANES]) -> f32 {
    // Pairwise halving (8, 4, 2, 1 lanes apart), so the result does not depend on which
    // lane held what; written with fixed-size arrays so it compiles to a few shuffles and
    // adds (the attention scores at decode time take one per key).
    let h8: [f32; 8] = std::array::from_fn(|i| acc[i] + acc[i + 8]);
    let h4: [f32; 4] = std::array::from_fn(|i| h8[i] + h8[i + 4]);
    let h2 = [h4[0] + h4[2], h4[1] + h4[3]];
    h2[0] + h2[1]
}

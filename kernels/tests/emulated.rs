//! CUDA kernels run on the CPU: `emulate/*.cpp` compile kernel files from `cu/` with a C++
//! compiler against `emulate/cuda_shim.h` (one thread per CUDA thread, warp barriers for
//! shuffles, `__dp4a`, and mma.m16n8k16 computed from the 32 lanes' fragments as the PTX
//! ISA lays them out) and compare them with the formulas of core's ops in double:
//! - `flash_check.cpp`: the BF16 tensor-core flash attention, forward and backward, on
//!   awkward shapes (tiling, causal masking, GQA, decoding rows, fragment bookkeeping);
//! - `attention_check.cpp`: the FP32 attention kernels, head sizes that are not multiples
//!   of 32 included;
//! - `kernels_check.cpp`: the element-wise, softmax, column-sum, grouped embedding
//!   gradient, MoE combine and int8 kernels (the int8 product to the bit).
//!
//! This checks indexing and arithmetic without a GPU; the on-device tests check the same
//! kernels on hardware. Needs a C++20 compiler (`$CXX`, else `c++`); without one the tests
//! say so and skip, unless `RB_REQUIRE_CXX=1` (CI).

use std::path::Path;
use std::process::Command;

fn emulate(program: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join(program);
    let build = Command::new(&cxx)
        .args(["-std=c++20", "-O2", "-pthread", "-DRB_HOST_EMULATION", "-I"])
        .arg(dir.join("cu"))
        .arg(dir.join(format!("emulate/{program}.cpp")))
        .arg("-o")
        .arg(&exe)
        .output();
    let build = match build {
        Ok(b) => b,
        Err(e) if std::env::var("RB_REQUIRE_CXX").as_deref() != Ok("1") => {
            eprintln!("SKIPPED, no C++ compiler `{cxx}` here: {e}");
            return;
        }
        Err(e) => panic!("RB_REQUIRE_CXX=1 but `{cxx}` does not run: {e}"),
    };
    assert!(
        build.status.success(),
        "compiling {program}.cpp failed:\n{}",
        String::from_utf8_lossy(&build.stderr)
    );
    let run = Command::new(&exe).output().expect("running the emulated kernels");
    let out = String::from_utf8_lossy(&run.stdout);
    eprintln!("{out}");
    assert!(
        run.status.success(),
        "{program}: the emulated kernels disagree:\n{out}"
    );
}

#[test]
fn flash_attention_matches_attention_in_double_on_the_cpu_emulator() {
    emulate("flash_check");
}

#[test]
fn f32_attention_matches_attention_in_double_on_the_cpu_emulator() {
    emulate("attention_check");
}

#[test]
fn elementwise_softmax_moe_and_int8_kernels_match_on_the_cpu_emulator() {
    emulate("kernels_check");
}

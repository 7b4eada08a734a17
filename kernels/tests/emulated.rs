//! The flash-attention kernels run on the CPU: `emulate/flash_check.cpp` compiles
//! `cu/flash_attention.cu` with a C++ compiler against `emulate/cuda_shim.h` (one thread per
//! CUDA thread, warp barriers for shuffles, mma.m16n8k16 computed from the 32 lanes'
//! fragments as the PTX ISA lays them out) and compares forward and backward with causal
//! GQA attention in double on awkward shapes. This checks the kernels' tiling, masking,
//! fragment bookkeeping and online softmax without a GPU; the on-device tests check the
//! same kernels on hardware.
//!
//! Needs a C++20 compiler (`$CXX`, else `c++`); without one the test says so and skips,
//! unless `RB_REQUIRE_CXX=1` (CI).

use std::path::Path;
use std::process::Command;

#[test]
fn flash_attention_matches_attention_in_double_on_the_cpu_emulator() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join("flash_check");
    let build = Command::new(&cxx)
        .args(["-std=c++20", "-O2", "-pthread", "-DRB_HOST_EMULATION", "-I"])
        .arg(dir.join("cu"))
        .arg(dir.join("emulate/flash_check.cpp"))
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
        "compiling the emulated kernels failed:\n{}",
        String::from_utf8_lossy(&build.stderr)
    );
    let run = Command::new(&exe).output().expect("running the emulated kernels");
    let out = String::from_utf8_lossy(&run.stdout);
    eprintln!("{out}");
    assert!(
        run.status.success(),
        "the emulated flash attention disagrees:\n{out}"
    );
}

//! Every kernel file compiles under NVRTC for the architectures the backend targets, with
//! no GPU: CI installs NVRTC from the `nvidia-cuda-nvrtc-cu12` wheel and sets
//! `RB_REQUIRE_NVRTC=1`. Elsewhere, without the library, the test prints why and skips.
//! Also: a compile error names the file and carries NVRTC's log, and the disk cache is
//! keyed so a changed source is compiled again.

use rusting_brain_kernels::{probe, Compiler, KernelError, Library, Source, SOURCES};

fn nvrtc_here() -> bool {
    match probe(Library::Nvrtc) {
        Ok(()) => true,
        Err(e) if std::env::var("RB_REQUIRE_NVRTC").as_deref() != Ok("1") => {
            eprintln!("SKIPPED, no NVRTC here: {e}");
            false
        }
        Err(e) => panic!("RB_REQUIRE_NVRTC=1 but {e}"),
    }
}

#[test]
fn every_kernel_compiles_for_ampere_ada_and_hopper() {
    if !nvrtc_here() {
        return;
    }
    eprintln!("NVRTC {:?}", rusting_brain_kernels::nvrtc_version().unwrap());
    for arch in ["sm_80", "sm_86", "sm_89", "sm_90"] {
        let c = Compiler::new(arch, None).unwrap();
        for s in SOURCES {
            let ptx = c.compile(s).unwrap_or_else(|e| panic!("{e}"));
            assert!(ptx.contains(".entry"), "{} for {arch}: no kernel in the PTX", s.name);
        }
    }
}

#[test]
fn a_compile_error_names_the_file_and_carries_the_log() {
    if !nvrtc_here() {
        return;
    }
    let broken = Source {
        name: "broken",
        code: "extern \"C\" __global__ void k(float* x) { x[0] = undefined_name; }",
    };
    let e = Compiler::new("sm_80", None).unwrap().compile(&broken).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, KernelError::Compile { .. }), "{text}");
    assert!(text.contains("broken") && text.contains("undefined_name"), "{text}");
}

#[test]
fn the_cache_is_keyed_by_source_and_architecture() {
    if !nvrtc_here() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("rb_kernel_cache_{}", std::process::id()));
    let c80 = Compiler::new("sm_80", Some(dir.clone())).unwrap();
    let first = c80.ptx(&SOURCES[0]).unwrap();
    let files = || std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(files(), 1);
    assert_eq!(c80.ptx(&SOURCES[0]).unwrap(), first, "a hit returns the same PTX");
    assert_eq!(files(), 1);
    Compiler::new("sm_90", Some(dir.clone())).unwrap().ptx(&SOURCES[0]).unwrap();
    let changed = Source {
        name: SOURCES[0].name,
        code: "extern \"C\" __global__ void other(float* x) { x[0] = 1.0f; }",
    };
    assert!(c80.ptx(&changed).unwrap().contains("other"));
    assert_eq!(files(), 3, "another architecture and another source are other entries");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_architectures_are_errors() {
    for bad in ["", "sm_", "volta", "compute_x9"] {
        assert!(Compiler::new(bad, None).is_err(), "{bad}");
    }
    assert_eq!(Compiler::new("sm_90a", None).unwrap().arch(), "compute_90a");
    assert_eq!(Compiler::new("86", None).unwrap().arch(), "compute_86");
}

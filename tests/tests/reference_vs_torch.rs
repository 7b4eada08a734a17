//! The reference primitives against PyTorch (`tests/fixtures/gen_reference_primitives.py`).
//!
//! The fixture's inputs are f32; PyTorch's outputs were computed from them in float64. So:
//! - the reference run in f64 must agree to 1e-10 relative: the same formulas, differing
//!   only in summation order and libm's last bits (measured: worst ~1e-14);
//! - the reference run in f32 must agree to f32 rounding: rtol 1e-5 + atol 1e-6 (about 80
//!   f32 ulps; measured worst well below, see the printed reports).

use rusting_brain_core::ops::{
    attention::*, cross_entropy::*, embedding::*, matmul::*, rmsnorm::*, rope::*, swiglu::*,
};
use rusting_brain_core::Real;
use rusting_brain_tests::*;

const F64_TOL: Tolerance = Tolerance::new(1e-10, 1e-12);
const F32_TOL: Tolerance = Tolerance::new(1e-5, 1e-6);

fn fixture() -> Fixture {
    Fixture::named("reference_primitives.safetensors").expect("fixture present")
}

fn check<T: Real>(f: &Fixture, name: &str, actual: &[T], tol: Tolerance) {
    let actual: Vec<f64> = actual.iter().map(|v| v.to_f64()).collect();
    let r = assert_close(
        &format!("{name} ({})", core::any::type_name::<T>()),
        &actual,
        &f.get(name).unwrap(),
        tol,
    );
    println!(
        "{name:<12} {:<4} max abs error {:.2e}, worst {:.3} of allowance",
        core::any::type_name::<T>(),
        r.max_abs_error,
        r.worst_ratio
    );
}

fn run_all<T: Real>(tol: Tolerance) {
    let f = fixture();
    // matmul: C = A B and its gradients dA = dC B^T, dB = A^T dC
    let (a, b, w, dc) = (f.real::<T>("mm_a"), f.real::<T>("mm_b"), f.real::<T>("mm_w"), f.real::<T>("mm_dc"));
    let mut c = vec![T::ZERO; 15];
    matmul(&mut c, &a, &b, &MatmulSpec::new(5, 3, 7)).unwrap();
    check(&f, "mm_c", &c, tol);
    let mut da = vec![T::ZERO; 35];
    matmul(&mut da, &dc, &b, &MatmulSpec::new(5, 7, 3).trans_b(true)).unwrap();
    check(&f, "mm_da", &da, tol);
    let mut db = vec![T::ZERO; 21];
    matmul(&mut db, &a, &dc, &MatmulSpec::new(7, 3, 5).trans_a(true)).unwrap();
    check(&f, "mm_db", &db, tol);
    // C = A W^T (W stored (n, k)); dA = dC W; dW = dC^T A
    matmul(&mut c, &a, &w, &MatmulSpec::new(5, 3, 7).trans_b(true)).unwrap();
    check(&f, "mm_cw", &c, tol);
    matmul(&mut da, &dc, &w, &MatmulSpec::new(5, 7, 3)).unwrap();
    check(&f, "mm_cw_da", &da, tol);
    let mut dw = vec![T::ZERO; 21];
    matmul(&mut dw, &dc, &a, &MatmulSpec::new(3, 7, 5).trans_a(true)).unwrap();
    check(&f, "mm_cw_dw", &dw, tol);

    // RMSNorm
    let (x, g, dout) = (f.real::<T>("rms_x"), f.real::<T>("rms_w"), f.real::<T>("rms_dout"));
    let mut y = vec![T::ZERO; 60];
    let mut rstd = vec![T::ZERO; 6];
    rmsnorm_forward(&mut y, &mut rstd, &x, &g, 6, 10, 1e-5).unwrap();
    check(&f, "rms_out", &y, tol);
    let mut dx = vec![T::ZERO; 60];
    let mut dg = vec![T::ZERO; 10];
    rmsnorm_backward(&mut dx, &mut dg, &dout, &x, &g, &rstd, 6, 10).unwrap();
    check(&f, "rms_dx", &dx, tol);
    check(&f, "rms_dw", &dg, tol);

    // RoPE
    let spec = RopeSpec::unscaled(2, 5, 3, 8, 3, 10_000.0);
    let mut xr = f.real::<T>("rope_x");
    rope_forward(&mut xr, &spec).unwrap();
    check(&f, "rope_out", &xr, tol);
    let mut dr = f.real::<T>("rope_dout");
    rope_backward(&mut dr, &spec).unwrap();
    check(&f, "rope_dx", &dr, tol);

    // Causal GQA attention
    let spec = AttentionSpec::causal(2, 6, 4, 2, 8);
    let (q, k, v, da) =
        (f.real::<T>("att_q"), f.real::<T>("att_k"), f.real::<T>("att_v"), f.real::<T>("att_dout"));
    let (nq, nkv, nl) = spec.check("test").unwrap();
    let mut o = vec![T::ZERO; nq];
    let mut lse = vec![T::ZERO; nl];
    attention_forward(&mut o, &mut lse, &q, &k, &v, &spec).unwrap();
    check(&f, "att_out", &o, tol);
    let (mut dq, mut dk, mut dv) = (vec![T::ZERO; nq], vec![T::ZERO; nkv], vec![T::ZERO; nkv]);
    attention_backward(&mut dq, &mut dk, &mut dv, &da, &q, &k, &v, &o, &lse, &spec).unwrap();
    check(&f, "att_dq", &dq, tol);
    check(&f, "att_dk", &dk, tol);
    check(&f, "att_dv", &dv, tol);

    // SwiGLU
    let (gate, up, ds) = (f.real::<T>("swi_gate"), f.real::<T>("swi_up"), f.real::<T>("swi_dout"));
    let mut ys = vec![T::ZERO; 44];
    swiglu_forward(&mut ys, &gate, &up).unwrap();
    check(&f, "swi_out", &ys, tol);
    let (mut dgate, mut dup) = (vec![T::ZERO; 44], vec![T::ZERO; 44]);
    swiglu_backward(&mut dgate, &mut dup, &ds, &gate, &up).unwrap();
    check(&f, "swi_dgate", &dgate, tol);
    check(&f, "swi_dup", &dup, tol);

    // Embedding
    let ids: Vec<u32> = f.get("emb_ids").unwrap().data.iter().map(|&v| v as u32).collect();
    let table = f.real::<T>("emb_table");
    let mut ye = vec![T::ZERO; 28];
    embedding_forward(&mut ye, &table, &ids, 9, 4).unwrap();
    check(&f, "emb_out", &ye, tol);
    let mut dt = vec![T::ZERO; 36];
    embedding_backward(&mut dt, &f.real::<T>("emb_dout"), &ids, 9, 4).unwrap();
    check(&f, "emb_dtable", &dt, tol);

    // Cross-entropy with ignored rows (-100 in PyTorch, a mask here)
    let raw = f.get("ce_targets").unwrap().data;
    let mask: Vec<bool> = raw.iter().map(|&t| t >= 0.0).collect();
    let targets: Vec<u32> = raw.iter().map(|&t| t.max(0.0) as u32).collect();
    let count = mask.iter().filter(|&&m| m).count();
    let mut logits = f.real::<T>("ce_logits");
    let sum = cross_entropy(&mut logits, &targets, Some(&mask), 6, 13, Some(1.0 / count as f32)).unwrap();
    check(&f, "ce_loss", &[T::from_f64(sum.mean())], tol);
    check(&f, "ce_dlogits", &logits, tol);
}

#[test]
fn reference_primitives_in_f64_match_pytorch_float64() {
    run_all::<f64>(F64_TOL);
}

#[test]
fn reference_primitives_in_f32_match_pytorch_to_f32_rounding() {
    run_all::<f32>(F32_TOL);
}

#[test]
fn fixture_records_its_generator() {
    let f = fixture();
    assert_eq!(f.metadata("generator").as_deref(), Some("tests/fixtures/gen_reference_primitives.py"));
    assert!(f.metadata("torch").is_some());
}

/// The CPU backend, through the `Backend` trait, on the same fixture: it must meet the same
/// f32 tolerance as the reference does.
#[test]
fn cpu_backend_matches_pytorch_to_f32_rounding() {
    use rusting_brain::cpu::CpuBackend;

    let f = fixture();
    let cpu = CpuBackend::new();
    let x = |name: &str| f.real::<f32>(name);
    let mut c = vec![f32::NAN; 15];
    cpu.matmul(&mut c, &x("mm_a"), &x("mm_w"), &MatmulSpec::new(5, 3, 7).trans_b(true)).unwrap();
    check(&f, "mm_cw", &c, F32_TOL);
    let mut dw = vec![f32::NAN; 21];
    cpu.matmul(&mut dw, &x("mm_dc"), &x("mm_a"), &MatmulSpec::new(3, 7, 5).trans_a(true)).unwrap();
    check(&f, "mm_cw_dw", &dw, F32_TOL);

    let (mut y, mut rstd) = (vec![f32::NAN; 60], vec![f32::NAN; 6]);
    cpu.rmsnorm_forward(&mut y, &mut rstd, &x("rms_x"), &x("rms_w"), 6, 10, 1e-5).unwrap();
    check(&f, "rms_out", &y, F32_TOL);
    let (mut dx, mut dg) = (vec![f32::NAN; 60], vec![0.0; 10]);
    cpu.rmsnorm_backward(&mut dx, &mut dg, &x("rms_dout"), &x("rms_x"), &x("rms_w"), &rstd, 6, 10).unwrap();
    check(&f, "rms_dx", &dx, F32_TOL);
    check(&f, "rms_dw", &dg, F32_TOL);

    let spec = RopeSpec::unscaled(2, 5, 3, 8, 3, 10_000.0);
    let mut r = x("rope_x");
    cpu.rope_forward(&mut r, &spec).unwrap();
    check(&f, "rope_out", &r, F32_TOL);

    let spec = AttentionSpec::causal(2, 6, 4, 2, 8);
    let (nq, nkv, nl) = spec.check("test").unwrap();
    let (q, k, v) = (x("att_q"), x("att_k"), x("att_v"));
    let (mut o, mut lse) = (vec![f32::NAN; nq], vec![f32::NAN; nl]);
    cpu.attention_forward(&mut o, &mut lse, &q, &k, &v, &spec).unwrap();
    check(&f, "att_out", &o, F32_TOL);
    let (mut dq, mut dk, mut dv) = (vec![f32::NAN; nq], vec![f32::NAN; nkv], vec![f32::NAN; nkv]);
    cpu.attention_backward(&mut dq, &mut dk, &mut dv, &x("att_dout"), &q, &k, &v, &o, &lse, &spec).unwrap();
    check(&f, "att_dq", &dq, F32_TOL);
    check(&f, "att_dk", &dk, F32_TOL);
    check(&f, "att_dv", &dv, F32_TOL);

    let (mut dgate, mut dup) = (vec![f32::NAN; 44], vec![f32::NAN; 44]);
    cpu.swiglu_backward(&mut dgate, &mut dup, &x("swi_dout"), &x("swi_gate"), &x("swi_up")).unwrap();
    check(&f, "swi_dgate", &dgate, F32_TOL);
    check(&f, "swi_dup", &dup, F32_TOL);

    let raw = f.get("ce_targets").unwrap().data;
    let mask: Vec<bool> = raw.iter().map(|&t| t >= 0.0).collect();
    let targets: Vec<u32> = raw.iter().map(|&t| t.max(0.0) as u32).collect();
    let mut logits = x("ce_logits");
    let sum = cpu.cross_entropy(&mut logits, &targets, Some(&mask), 6, 13, Some(0.25)).unwrap();
    check(&f, "ce_loss", &[sum.mean() as f32], F32_TOL);
    check(&f, "ce_dlogits", &logits, F32_TOL);
}

//! The image-model primitives against PyTorch (`tests/fixtures/gen_image_primitives.py`):
//! conv2d, group and layer norm, the GELUs and SiLU, scaled dot-product attention, nearest
//! upsampling, patchify and the timestep embedding.
//!
//! As for the training primitives, PyTorch computed in float64 from f32 inputs, so:
//! - the reference in f64 must agree to 1e-10 relative (same formulas; measured ~1e-15);
//! - the reference in f32 and the CPU backend (f32, its own summation order, the fast exp
//!   in SiLU / tanh-GELU / softmax) must agree to f32 rounding, rtol 1e-5 + atol 1e-6;
//!   the attention and convolution outputs sum tens of products, hence atol 1e-6 * their
//!   magnitude ~1 rather than a pure relative bound.
//!
//! The timestep embedding is compared against diffusers' float32 output at 1e-4 absolute:
//! the angles `t * freq` reach 1000 radians, and PyTorch's vectorized `exp` and libm's
//! `expf` may round a frequency one ulp apart (6e-8 relative), which moves the angle by
//! up to 999 * 6e-8 = 6e-5 (the worst seen: 2.8e-5 at t = 999). Below t = 1 the bound is
//! far from reached; a wrong formula or order is off by whole units.

use rusting_brain::cpu::CpuBackend;
use rusting_brain_core::backend::*;
use rusting_brain_core::ops::spatial::{timestep_embedding, PatchOrder, TimestepSpec};
use rusting_brain_core::ops::{conv, norm, sdpa, spatial, unary};
use rusting_brain_core::Real;
use rusting_brain_tests::*;
use serde_json::Value;

const F64_TOL: Tolerance = Tolerance::new(1e-10, 1e-12);
const F32_TOL: Tolerance = Tolerance::new(1e-5, 1e-6);

fn fixture() -> Fixture {
    Fixture::named("image_primitives.safetensors").expect("fixture present")
}

fn cases(f: &Fixture, kind: &str) -> Vec<Value> {
    let all: Value = serde_json::from_str(&f.metadata("cases").expect("cases metadata")).unwrap();
    match &all[kind] {
        Value::Array(v) => v.clone(),
        other => vec![other.clone()],
    }
}

fn int(v: &Value, key: &str) -> usize {
    v[key].as_u64().unwrap_or_else(|| panic!("{key} in {v}")) as usize
}
fn pair(v: &Value, key: &str) -> (usize, usize) {
    (v[key][0].as_u64().unwrap() as usize, v[key][1].as_u64().unwrap() as usize)
}
fn num(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("{key} in {v}"))
}
fn flag(v: &Value, key: &str) -> bool {
    v[key].as_bool().unwrap_or_else(|| panic!("{key} in {v}"))
}

fn check<T: Real>(f: &Fixture, name: &str, what: &str, actual: &[T], tol: Tolerance) {
    let actual: Vec<f64> = actual.iter().map(|v| v.to_f64()).collect();
    let r = assert_close(&format!("{name} ({what})"), &actual, &f.get(name).unwrap(), tol);
    println!(
        "{name:<14} {what:<4} max abs error {:.2e}, worst {:.3} of allowance",
        r.max_abs_error, r.worst_ratio
    );
}

fn conv_spec(c: &Value) -> Conv2dSpec {
    Conv2dSpec {
        batch: int(c, "batch"),
        in_channels: int(c, "cin"),
        out_channels: int(c, "cout"),
        height: int(c, "h"),
        width: int(c, "w"),
        kernel: pair(c, "kernel"),
        stride: pair(c, "stride"),
        padding: pair(c, "padding"),
        pad_end: (int(c, "pad_end"), int(c, "pad_end")),
        dilation: pair(c, "dilation"),
        groups: int(c, "groups"),
        precision: OperandPrecision::F32,
    }
}

fn gn_spec(c: &Value) -> GroupNormSpec {
    GroupNormSpec {
        batch: int(c, "batch"),
        channels: int(c, "channels"),
        spatial: int(c, "spatial"),
        groups: int(c, "groups"),
        eps: num(c, "eps") as f32,
        act: None,
    }
}

fn sdpa_spec(c: &Value) -> SdpaSpec {
    SdpaSpec {
        batch: int(c, "batch"),
        q_len: int(c, "q_len"),
        kv_len: int(c, "kv_len"),
        heads: int(c, "heads"),
        kv_heads: int(c, "kv_heads"),
        head_dim: int(c, "head_dim"),
        scale: num(c, "scale") as f32,
        causal: flag(c, "causal"),
        precision: OperandPrecision::F32,
    }
}

fn mask(f: &Fixture, c: &Value) -> Option<Vec<bool>> {
    let name = c["name"].as_str().unwrap();
    flag(c, "mask").then(|| f.get(&format!("{name}_mask")).unwrap().data.iter().map(|&v| v != 0.0).collect())
}

/// Every case through the reference math in `T`.
fn reference<T: Real>(tol: Tolerance, what: &str) {
    let f = fixture();
    for c in cases(&f, "conv") {
        let name = c["name"].as_str().unwrap();
        let spec = conv_spec(&c);
        let (_, _, n, _) = spec.check().unwrap();
        let bias = flag(&c, "bias").then(|| f.real::<T>(&format!("{name}_b")));
        let mut y = vec![T::ZERO; n];
        let (x, w) = (f.real::<T>(&format!("{name}_x")), f.real::<T>(&format!("{name}_w")));
        conv::conv2d(&mut y, &x, &w, bias.as_deref(), &spec).unwrap();
        check(&f, &format!("{name}_y"), what, &y, tol);
    }
    for c in cases(&f, "group_norm") {
        let name = c["name"].as_str().unwrap();
        let spec = gn_spec(&c);
        let x = f.real::<T>(&format!("{name}_x"));
        let affine = flag(&c, "affine");
        let w = affine.then(|| f.real::<T>(&format!("{name}_w")));
        let b = affine.then(|| f.real::<T>(&format!("{name}_b")));
        let mut y = vec![T::ZERO; x.len()];
        norm::group_norm(&mut y, &x, w.as_deref(), b.as_deref(), &spec).unwrap();
        check(&f, &format!("{name}_y"), what, &y, tol);
    }
    for c in cases(&f, "layer_norm") {
        let name = c["name"].as_str().unwrap();
        let x = f.real::<T>(&format!("{name}_x"));
        let affine = flag(&c, "affine");
        let w = affine.then(|| f.real::<T>(&format!("{name}_w")));
        let b = affine.then(|| f.real::<T>(&format!("{name}_b")));
        let mut y = vec![T::ZERO; x.len()];
        let (rows, dim) = (int(&c, "rows"), int(&c, "dim"));
        norm::layer_norm(&mut y, &x, w.as_deref(), b.as_deref(), rows, dim, num(&c, "eps") as f32).unwrap();
        check(&f, &format!("{name}_y"), what, &y, tol);
    }
    let x = f.real::<T>("act_x");
    for (op, name) in activations() {
        let mut y = vec![T::ZERO; x.len()];
        unary::unary(op, &mut y, &x).unwrap();
        check(&f, name, what, &y, tol);
    }
    for c in cases(&f, "sdpa") {
        let name = c["name"].as_str().unwrap();
        let spec = sdpa_spec(&c);
        let [q, k, v] = ["q", "k", "v"].map(|t| f.real::<T>(&format!("{name}_{t}")));
        let bias = flag(&c, "bias").then(|| f.real::<T>(&format!("{name}_bias")));
        let mut y = vec![T::ZERO; q.len()];
        sdpa::sdpa(&mut y, &q, &k, &v, mask(&f, &c).as_deref(), bias.as_deref(), &spec).unwrap();
        check(&f, &format!("{name}_y"), what, &y, tol);
    }
    for c in cases(&f, "upsample") {
        let name = c["name"].as_str().unwrap();
        let x = f.real::<T>(&format!("{name}_x"));
        let s = int(&c, "scale");
        let mut y = vec![T::ZERO; x.len() * s * s];
        spatial::upsample_nearest2d(&mut y, &x, int(&c, "planes"), int(&c, "h"), int(&c, "w"), s).unwrap();
        check(&f, &format!("{name}_y"), what, &y, tol);
    }
    let x = f.real::<T>("patch_x");
    for (order, name) in [(PatchOrder::ChannelFirst, "patch_first"), (PatchOrder::ChannelLast, "patch_last")]
    {
        let spec = patch_spec(&f, order);
        let mut tokens = vec![T::ZERO; x.len()];
        spatial::patchify(&mut tokens, &x, &spec).unwrap();
        check(&f, name, what, &tokens, tol);
        let mut back = vec![T::ZERO; x.len()];
        spatial::unpatchify(&mut back, &tokens, &spec).unwrap();
        assert_eq!(back, x, "{name}: unpatchify(patchify(x)) is not x");
    }
}

fn activations() -> [(Unary, &'static str); 4] {
    [
        (Unary::Gelu, "act_gelu"),
        (Unary::GeluTanh, "act_gelu_tanh"),
        (Unary::QuickGelu, "act_quick_gelu"),
        (Unary::Silu, "act_silu"),
    ]
}

fn patch_spec(f: &Fixture, order: PatchOrder) -> PatchSpec {
    let c = &cases(f, "patch")[0];
    PatchSpec {
        batch: int(c, "batch"),
        channels: int(c, "channels"),
        height: int(c, "height"),
        width: int(c, "width"),
        patch: int(c, "patch"),
        order,
    }
}

#[test]
fn reference_in_f64_matches_torch() {
    reference::<f64>(F64_TOL, "f64");
}

#[test]
fn reference_in_f32_matches_torch() {
    reference::<f32>(F32_TOL, "f32");
}

/// The CPU backend's kernels (im2col + GEMM, tiled attention, SIMD activations) on the
/// same cases, through the `Backend` methods the models call.
#[test]
fn cpu_backend_matches_torch() {
    let (f, be) = (fixture(), CpuBackend::new());
    let up = |x: Vec<f32>| be.upload(&x).unwrap();
    for c in cases(&f, "conv") {
        let name = c["name"].as_str().unwrap();
        let spec = conv_spec(&c);
        let (_, _, n, _) = spec.check().unwrap();
        let bias = flag(&c, "bias").then(|| up(f.real(&format!("{name}_b"))));
        let mut y = up(vec![f32::NAN; n]);
        let (x, w) = (up(f.real(&format!("{name}_x"))), up(f.real(&format!("{name}_w"))));
        be.conv2d(&mut y, &x, &w, bias.as_ref(), &spec).unwrap();
        check(&f, &format!("{name}_y"), "cpu", &y, F32_TOL);
    }
    for c in cases(&f, "group_norm") {
        let name = c["name"].as_str().unwrap();
        let spec = gn_spec(&c);
        let x = up(f.real(&format!("{name}_x")));
        let affine = flag(&c, "affine");
        let w = affine.then(|| up(f.real(&format!("{name}_w"))));
        let b = affine.then(|| up(f.real(&format!("{name}_b"))));
        let mut y = up(vec![f32::NAN; x.len()]);
        be.group_norm(&mut y, &x, w.as_ref(), b.as_ref(), &spec).unwrap();
        check(&f, &format!("{name}_y"), "cpu", &y, F32_TOL);
    }
    for c in cases(&f, "layer_norm") {
        let name = c["name"].as_str().unwrap();
        let x = up(f.real(&format!("{name}_x")));
        let affine = flag(&c, "affine");
        let w = affine.then(|| up(f.real(&format!("{name}_w"))));
        let b = affine.then(|| up(f.real(&format!("{name}_b"))));
        let mut y = up(vec![f32::NAN; x.len()]);
        let (rows, dim, eps) = (int(&c, "rows"), int(&c, "dim"), num(&c, "eps") as f32);
        be.layer_norm(&mut y, &x, w.as_ref(), b.as_ref(), rows, dim, eps).unwrap();
        check(&f, &format!("{name}_y"), "cpu", &y, F32_TOL);
    }
    let x = up(f.real("act_x"));
    for (op, name) in activations() {
        let mut y = up(vec![f32::NAN; x.len()]);
        be.unary(op, &mut y, &x).unwrap();
        check(&f, name, "cpu", &y, F32_TOL);
    }
    for c in cases(&f, "sdpa") {
        let name = c["name"].as_str().unwrap();
        let spec = sdpa_spec(&c);
        let [q, k, v] = ["q", "k", "v"].map(|t| up(f.real(&format!("{name}_{t}"))));
        let bias = flag(&c, "bias").then(|| up(f.real(&format!("{name}_bias"))));
        let mut y = up(vec![f32::NAN; q.len()]);
        be.sdpa(&mut y, &q, &k, &v, mask(&f, &c).as_deref(), bias.as_ref(), &spec).unwrap();
        check(&f, &format!("{name}_y"), "cpu", &y, F32_TOL);
    }
    for c in cases(&f, "upsample") {
        let name = c["name"].as_str().unwrap();
        let x = up(f.real(&format!("{name}_x")));
        let s = int(&c, "scale");
        let mut y = up(vec![f32::NAN; x.len() * s * s]);
        be.upsample_nearest2d(&mut y, &x, int(&c, "planes"), int(&c, "h"), int(&c, "w"), s).unwrap();
        check(&f, &format!("{name}_y"), "cpu", &y, F32_TOL);
    }
    let x = up(f.real("patch_x"));
    for (order, name) in [(PatchOrder::ChannelFirst, "patch_first"), (PatchOrder::ChannelLast, "patch_last")]
    {
        let spec = patch_spec(&f, order);
        let mut tokens = up(vec![f32::NAN; x.len()]);
        be.patchify(&mut tokens, &x, &spec).unwrap();
        check(&f, name, "cpu", &tokens, F32_TOL);
        let mut back = up(vec![f32::NAN; x.len()]);
        be.unpatchify(&mut back, &tokens, &spec).unwrap();
        assert_eq!(back, x, "{name}: unpatchify(patchify(x)) is not x");
    }
}

#[test]
fn timestep_embedding_matches_diffusers_float32() {
    let f = fixture();
    for c in cases(&f, "timestep") {
        let name = c["name"].as_str().unwrap();
        let t: Vec<f32> = f.real(c["input"].as_str().unwrap_or("ts_t"));
        let spec = TimestepSpec {
            dim: int(&c, "dim"),
            flip_sin_to_cos: flag(&c, "flip"),
            downscale_freq_shift: num(&c, "shift") as f32,
            scale: num(&c, "scale") as f32,
            max_period: 10000.0,
        };
        let mut y = vec![f32::NAN; t.len() * spec.dim];
        timestep_embedding(&mut y, &t, &spec).unwrap();
        check(&f, name, "f32", &y, Tolerance::new(0.0, 1e-4));
    }
}

/// Shapes that do not fit are errors naming the problem, on the reference and the CPU
/// backend alike, and nothing is written.
#[test]
fn bad_shapes_are_errors() {
    let be = CpuBackend::new();
    let conv = Conv2dSpec::new(1, 2, 3, 2, 2, 3);
    let mut out = vec![f32::NAN; 3];
    let e = be.conv2d(&mut out, &vec![0.0; 8], &vec![0.0; 54], None, &conv).unwrap_err();
    assert!(e.to_string().contains("larger than the padded input"), "{e}");
    let e = conv::conv2d(&mut out, &[0.0; 8], &[0.0; 54], None, &conv).unwrap_err();
    assert!(e.to_string().contains("larger than the padded input"), "{e}");
    let grouped = Conv2dSpec::new(1, 3, 4, 4, 4, 1).groups(2);
    let e = be.conv2d(&mut vec![0.0; 64], &vec![0.0; 48], &vec![0.0; 8], None, &grouped).unwrap_err();
    assert!(e.to_string().contains("multiples of groups"), "{e}");
    let e = be
        .conv2d(&mut vec![0.0; 48], &vec![0.0; 47], &vec![0.0; 12], None, &Conv2dSpec::new(1, 3, 4, 4, 4, 1))
        .unwrap_err();
    assert!(e.to_string().contains("`inp` has 47 elements but the shape needs 48"), "{e}");
    assert!(out.iter().all(|v| v.is_nan()), "a failed call wrote its output");

    let gn = GroupNormSpec { batch: 1, channels: 6, spatial: 4, groups: 4, eps: 1e-6, act: None };
    let e = be.group_norm(&mut vec![0.0; 24], &vec![0.0; 24], None, None, &gn).unwrap_err();
    assert!(e.to_string().contains("multiple of groups"), "{e}");
    let e =
        be.layer_norm(&mut vec![0.0; 6], &vec![0.0; 6], Some(&vec![1.0; 2]), None, 2, 3, 1e-5).unwrap_err();
    assert!(e.to_string().contains("`weight` has 2 elements"), "{e}");

    let s = SdpaSpec::new(1, 4, 3, 8).kv_heads(2);
    let (q, kv) = (vec![0.0; 96], vec![0.0; 64]);
    let e = be.sdpa(&mut vec![0.0; 96], &q, &kv, &kv, None, None, &s).unwrap_err();
    assert!(e.to_string().contains("multiple of kv_heads"), "{e}");
    let s = SdpaSpec::new(1, 4, 2, 8);
    let (q, kv) = (vec![0.0; 64], vec![0.0; 64]);
    let e = be.sdpa(&mut vec![0.0; 64], &q, &kv, &kv, Some(&[true; 3]), None, &s).unwrap_err();
    assert!(e.to_string().contains("`key_mask` has 3 elements but the shape needs 4"), "{e}");
    let e = be.sdpa(&mut vec![0.0; 64], &q, &kv, &kv, None, None, &s.scale(f32::NAN)).unwrap_err();
    assert!(e.to_string().contains("scale is NaN"), "{e}");
    let e = be
        .sdpa(&mut vec![0.0; 64], &q, &vec![0.0; 48], &vec![0.0; 48], None, None, &s.kv_len(3).causal(true))
        .unwrap_err();
    assert!(e.to_string().contains("causal attention needs q_len"), "{e}");

    let p =
        PatchSpec { batch: 1, channels: 2, height: 5, width: 4, patch: 2, order: PatchOrder::ChannelFirst };
    let e = be.patchify(&mut vec![0.0; 40], &vec![0.0; 40], &p).unwrap_err();
    assert!(e.to_string().contains("not a whole number of 2x2 patches"), "{e}");
    let e = be.upsample_nearest2d(&mut vec![0.0; 4], &vec![0.0; 4], 1, 2, 2, 0).unwrap_err();
    assert!(e.to_string().contains("scale must be at least 1"), "{e}");
    let e = timestep_embedding(
        &mut [0.0; 4],
        &[1.0],
        &TimestepSpec { downscale_freq_shift: 2.0, ..TimestepSpec::new(4) },
    )
    .unwrap_err();
    assert!(e.to_string().contains("must not be zero"), "{e}");
}

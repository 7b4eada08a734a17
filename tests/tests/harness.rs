//! The parity harness itself: it must fail when it should and say where.

use rusting_brain_tests::*;

fn t(shape: &[usize], data: &[f64]) -> Tensor {
    Tensor { shape: shape.to_vec(), data: data.to_vec() }
}

#[test]
fn compare_reports_the_worst_element_with_its_index() {
    let e = t(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let a = [1.0f32, 2.0, 3.0, 4.0, 5.5, 6.0];
    let r = compare("x", &a, &e, Tolerance::new(1e-3, 1e-6));
    assert!(!r.passed());
    assert_eq!((r.failing, r.worst_index), (1, 4));
    let text = r.to_string();
    assert!(text.contains("worst at [1, 1]") && text.contains("got 5.5e0, expected 5e0"), "{text}");
    assert!(compare("x", &a, &e, Tolerance::new(0.2, 0.0)).passed());
}

#[test]
fn compare_fails_on_nan_and_on_length_mismatch() {
    let e = t(&[2], &[1.0, 2.0]);
    assert!(!compare("nan", &[1.0f32, f32::NAN], &e, Tolerance::new(1.0, 1.0)).passed());
    assert!(!compare("len", &[1.0f32], &e, Tolerance::new(1.0, 1.0)).passed());
}

#[test]
fn fixture_errors_name_the_file_and_tensor() {
    let missing = Fixture::open("/nonexistent/x.safetensors").err().unwrap().to_string();
    assert!(missing.contains("/nonexistent/x.safetensors"), "{missing}");
    let dir = std::env::temp_dir().join(format!("rb_harness_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("truncated.safetensors");
    std::fs::write(&bad, [200u8, 0, 0, 0, 0, 0, 0, 0, b'{']).unwrap();
    let err = Fixture::open(&bad).err().unwrap().to_string();
    assert!(err.contains("not a valid safetensors file"), "{err}");
    let f = Fixture::named("reference_primitives.safetensors").unwrap();
    let err = f.get("no_such_tensor").unwrap_err().to_string();
    assert!(err.contains("no tensor named `no_such_tensor`"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

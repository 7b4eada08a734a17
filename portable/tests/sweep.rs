//! The shared sweep of every primitive against the reference backend, on this backend.
//! Runs natively and, built for wasm32-wasip1, under Node's WASI, where the int8 product
//! takes its SIMD128 form (portable/wasi-run.mjs).
//!
//! Tolerance 2e-5 relative (as the native CPU backend's): this backend sums in f32 where
//! the reference sums in f64, so its distance is its own rounding. Its sums are on eight
//! lanes (matmul, attention) or plain running sums (core's other loops) over at most a
//! thousand terms in the sweep.

#[test]
fn the_shared_backend_sweep_passes_on_the_portable_backend() {
    rusting_brain_test_support::backend_sweep(&rusting_brain_portable::PortableBackend, 2e-5);
}

//! ONNX models (`OnnxModel::load`, feature `onnx`): a model that loads is run on inputs of
//! its declared shapes when they are fixed and small.
//!
//! tract asserts some graph invariants with panics; `OnnxModel` catches those and returns
//! an error (`guarded` in native/src/dense/onnx.rs). libFuzzer's panic hook would abort on them
//! even though they are caught, so panics raised inside tract's own crates pass here, and
//! the target checks the call returned (an error); a panic anywhere else still aborts.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(
    init: {
        let abort = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let in_tract = info.location().is_some_and(|l| l.file().contains("/tract-"));
            if !in_tract {
                abort(info);
            }
        }));
    },
    |data: &[u8]| {
        let path = rusting_brain_fuzz::put("model.onnx", data);
        if let Ok(mut model) = rusting_brain::OnnxModel::load(&path) {
            if let Some(shapes) = model.fixed_input_shapes() {
                let sizes: Vec<usize> = shapes.iter().map(|s| s.iter().product()).collect();
                if sizes.iter().all(|&n| n <= 1 << 16) {
                    let values: Vec<Vec<f32>> = sizes.iter().map(|&n| vec![0.25; n]).collect();
                    let inputs: Vec<(&[usize], &[f32])> = shapes
                        .iter()
                        .zip(&values)
                        .map(|(s, v)| (s.as_slice(), v.as_slice()))
                        .collect();
                    let _ = model.run(&inputs);
                }
            }
        }
    }
);

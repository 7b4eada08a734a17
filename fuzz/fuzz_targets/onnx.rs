//! ONNX models (`OnnxModel::load`, feature `onnx`): a model that loads is run on inputs of
//! its declared shapes when they are fixed and small.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
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
});

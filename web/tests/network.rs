//! The page's dense network, run natively: on the wasm CPU path's backend (portable) and on
//! the GPU path (`WgpuBackend`, lavapipe here; SwiftShader in the browser tests) it trains
//! to the weights the native `Network` reaches from the same seed, and its JSON file moves
//! to native `load_json` and back with the same predictions.
//!
//! Tolerance: 1e-6 of each tensor's largest magnitude. The backends differ from the native
//! CPU backend only in the order of their sums (f32, up to 40 terms here); after three Adam
//! steps of 0.01 the worst tensor was 3.4e-7 of its scale (lavapipe), 2.7e-7 on the
//! portable backend (each is printed). Skipping one zero_grad moves a loss by 2e-3.

use rusting_brain::core::models::dense::{DenseConfig, EpochOrder};
use rusting_brain::core::models::dense_file;
use rusting_brain::core::Rng;
use rusting_brain::{Activation, Dataset, Loss, Network, Optimizer, TrainConfig};
use rusting_brain_shaders::block_on;
use rusting_brain_test_support::{gpu_or_skip, rel_to_scale, TempDir};
use rusting_brain_web::{DenseNet, DeviceChoice, Rows, WebError};

const ROWS: usize = 40;

/// Four inputs, three classes (by which of three fixed directions the row leans towards).
fn data() -> (Vec<f32>, Vec<f32>) {
    let mut rng = Rng::new(3);
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for _ in 0..ROWS {
        let row: Vec<f32> = (0..4).map(|_| rng.uniform(-1.0, 1.0) as f32).collect();
        let scores = [row[0] + row[1], row[2] - row[0], row[3] - row[1]];
        let class = (0..3).fold(0, |b, i| if scores[i] > scores[b] { i } else { b });
        x.extend(&row);
        y.extend((0..3).map(|i| (i == class) as u8 as f32));
    }
    (x, y)
}

fn dataset(x: &[f32], y: &[f32]) -> Dataset {
    Dataset::new(x.chunks(4).map(<[f32]>::to_vec).collect(), y.chunks(3).map(<[f32]>::to_vec).collect())
        .unwrap()
}

fn native(seed: u64) -> Network {
    Network::builder()
        .input_size(4)
        .dense(16, Activation::Relu)
        .dense(8, Activation::Tanh)
        .dense(3, Activation::Softmax)
        .loss(Loss::CategoricalCrossEntropy)
        .optimizer(Optimizer::adam(0.01))
        .seed(seed)
        .try_build()
        .unwrap()
}

fn native_parameters(n: &Network, dir: &TempDir) -> Vec<(Vec<f32>, Vec<f32>)> {
    let path = dir.join("native.json");
    n.save_json(&path).unwrap();
    dense_file::from_json(&std::fs::read(&path).unwrap()).unwrap().parameters
}

/// The page's network on `choice`, or None (skip, with the reason) for the GPU where there
/// is no adapter and CI did not ask for one.
fn page_net(config: DenseConfig, seed: u64, choice: DeviceChoice) -> Option<DenseNet> {
    let built = block_on(DenseNet::new(config, Optimizer::adam(0.01), seed, choice));
    let n = gpu_or_skip(&format!("building on {choice:?} failed"), built, WebError::is_no_adapter)?;
    eprintln!("{}: {}", n.device(), n.reason());
    Some(n)
}

fn assert_same_parameters(what: &str, got: &[(Vec<f32>, Vec<f32>)], want: &[(Vec<f32>, Vec<f32>)]) {
    assert_eq!(got.len(), want.len(), "{what}: layer count");
    for (l, ((gw, gb), (ww, wb))) in got.iter().zip(want).enumerate() {
        let w = rel_to_scale(&format!("{what} layer {l} weights"), gw, ww);
        let b = rel_to_scale(&format!("{what} layer {l} bias"), gb, wb);
        eprintln!("{what} layer {l}: weights {w:.1e}, bias {b:.1e} of the scale");
        assert!(w <= 1e-6 && b <= 1e-6, "{what} layer {l}: weights {w:e}, bias {b:e} > 1e-6");
    }
}

#[test]
fn training_reaches_the_native_weights_on_each_device() {
    let (x, y) = data();
    let dir = TempDir::new("web_network_parity");
    // (epochs, batch size, shuffle): three full-batch steps, then shuffled minibatches.
    for (epochs, batch_size, shuffle) in [(3, ROWS, false), (2, 7, true)] {
        let mut want = native(11);
        let history =
            want.fit(&dataset(&x, &y), TrainConfig { epochs, batch_size, shuffle, seed: Some(5) }).unwrap();
        let want_params = native_parameters(&want, &dir);
        let config = want.config().unwrap().clone();
        for choice in [DeviceChoice::Cpu, DeviceChoice::WebGpu] {
            let Some(mut net) = page_net(config.clone(), 11, choice) else {
                continue;
            };
            let what = format!("{} after {epochs} epochs of {batch_size}", net.device());
            let data = Rows { x: &x, y: &y, rows: ROWS };
            let mut order = EpochOrder::new(ROWS, shuffle, 5);
            for (epoch, want_loss) in history.iter().enumerate() {
                let got = block_on(net.train_epoch(&data, order.next_epoch(), batch_size)).unwrap() as f32;
                let rel = rel_to_scale(&format!("{what}: epoch {epoch} loss"), &[got], &[*want_loss]);
                assert!(rel <= 1e-6, "{what}: epoch {epoch} loss {got} against native {want_loss}");
            }
            assert_same_parameters(&what, &block_on(net.parameters()).unwrap(), &want_params);
        }
    }
}

#[test]
fn the_json_file_moves_between_native_and_the_page_both_ways() {
    let (x, y) = data();
    let dir = TempDir::new("web_network_json");
    let mut trained = native(2);
    let cfg = TrainConfig { epochs: 20, batch_size: 8, shuffle: true, seed: Some(1) };
    trained.fit(&dataset(&x, &y), cfg).unwrap();
    let path = dir.join("trained.json");
    trained.save_json(&path).unwrap();
    let text = std::fs::read(&path).unwrap();
    let rows: Vec<Vec<f32>> = x.chunks(4).map(<[f32]>::to_vec).collect();
    let want: Vec<f32> = trained.predict_batch(&rows).unwrap().concat();

    // Native to the page: the same predictions, and the page writes the very same file.
    let mut page = block_on(DenseNet::from_json(&text, DeviceChoice::Cpu)).unwrap();
    let got = block_on(page.predict(&x, ROWS)).unwrap();
    let rel = rel_to_scale("page predictions of the native file", &got, &want);
    assert!(rel <= 1e-6, "{rel:e}");
    let written = dense_file::to_json(&block_on(page.snapshot()).unwrap()).unwrap();
    assert_eq!(written.as_bytes(), text.as_slice(), "the page writes native's file byte for byte");

    // The page to native: trained further in the page, loaded natively, the same outputs.
    let data = Rows { x: &x, y: &y, rows: ROWS };
    let mut order = EpochOrder::new(ROWS, true, 9);
    for _ in 0..5 {
        block_on(page.train_epoch(&data, order.next_epoch(), 8)).unwrap();
    }
    let from_page = dir.join("from_page.json");
    std::fs::write(&from_page, dense_file::to_json(&block_on(page.snapshot()).unwrap()).unwrap()).unwrap();
    let mut loaded = Network::load_json(&from_page).unwrap();
    let native_out = loaded.predict_batch(&rows).unwrap().concat();
    let page_out = block_on(page.predict(&x, ROWS)).unwrap();
    let rel = rel_to_scale("native predictions of the page's file", &native_out, &page_out);
    assert!(rel <= 1e-6, "{rel:e}");
    assert!(rel_to_scale("moved on", &page_out, &want) > 1e-4, "the page's five epochs changed the outputs");
}

#[test]
fn bad_data_and_files_are_errors_naming_the_place() {
    let (mut x, y) = data();
    let config = native(1).config().unwrap().clone();
    let mut net = page_net(config, 1, DeviceChoice::Cpu).unwrap();
    let order: Vec<usize> = (0..ROWS).collect();
    let before = block_on(net.parameters()).unwrap();
    let err = |r: Result<f64, WebError>| r.unwrap_err().to_string();

    let short = Rows { x: &x[..10], y: &y, rows: ROWS };
    assert!(err(block_on(net.train_epoch(&short, &order, 8))).contains("x has 10 values for 40 rows of 4"));
    x[4 * 7 + 2] = f32::NAN;
    let nan = Rows { x: &x, y: &y, rows: ROWS };
    let m = err(block_on(net.train_epoch(&nan, &order, 8)));
    assert!(m.contains("x row 7, column 2 is NaN"), "{m}");
    let empty = Rows { x: &[], y: &[], rows: 0 };
    assert!(err(block_on(net.loss(&empty))).contains("empty"));
    x[4 * 7 + 2] = 0.5;
    let ok = Rows { x: &x, y: &y, rows: ROWS };
    assert!(err(block_on(net.train_epoch(&ok, &order, 0))).contains("batchSize"));
    assert!(block_on(net.predict(&x[..7], 2)).is_err());
    assert_eq!(block_on(net.parameters()).unwrap(), before, "failed calls left the weights alone");

    // A file cut short, one that lies about a layer's width, and one from a newer version.
    let text = dense_file::to_json(&block_on(net.snapshot()).unwrap()).unwrap();
    let cut = block_on(DenseNet::from_json(&text.as_bytes()[..text.len() / 2], DeviceChoice::Cpu));
    assert!(matches!(cut, Err(WebError::File(ref m)) if m.contains("line")), "{:?}", cut.err());
    let lying = text.replacen("\"units\": 16", "\"units\": 15", 1);
    let m = block_on(DenseNet::from_json(lying.as_bytes(), DeviceChoice::Cpu)).err().unwrap().to_string();
    assert!(m.contains("layers[0].weights"), "{m}");
    let newer = text.replacen("\"version\": 1", "\"version\": 9", 1);
    let m = block_on(DenseNet::from_json(newer.as_bytes(), DeviceChoice::Cpu)).err().unwrap().to_string();
    assert!(m.contains("newer"), "{m}");
}

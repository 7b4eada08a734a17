//! The dense network behind the JS `Network`, in plain Rust so native tests run it: core's
//! `DenseModel` on WebGPU (`WgpuBackend`) or on the portable backend (the wasm CPU path),
//! trained with core's epoch order and core's loop, written and read in core's JSON file
//! format (`dense_file`), so a seed gives a page the weights a native run gets and a file
//! moves between the two both ways. Every read from the GPU is awaited, never blocked on.

use rusting_brain_core::models::dense::{gather_batch, train_epoch, DenseConfig, DenseModel, DenseOps};
use rusting_brain_core::models::dense_file::{self, DenseFile};
use rusting_brain_core::ops::loss::loss_forward;
use rusting_brain_core::{Backend, CoreError, Optimizer};
use rusting_brain_portable::PortableBackend;
use rusting_brain_shaders::WgpuBackend;

use crate::engine::{webgpu_for, DeviceChoice, OnDevice};
use crate::WebError;

type Device = OnDevice<DenseModel<PortableBackend>, DenseModel<WgpuBackend>>;

/// Rows run forward at once by `predict` and `loss`.
const EVAL_ROWS: usize = 256;

/// A dense network, its optimizer and where it computes.
pub struct DenseNet {
    device: Device,
    /// Read again at every step.
    pub optimizer: Optimizer,
    seed: u64,
    reason: String,
}

/// Rows of inputs and targets, row-major, checked against a network's widths.
pub struct Rows<'a> {
    /// Inputs, `rows x input_size`.
    pub x: &'a [f32],
    /// Targets, `rows x output_size`.
    pub y: &'a [f32],
    /// How many rows.
    pub rows: usize,
}

fn invalid(message: String) -> WebError {
    WebError::Invalid(message)
}

/// A model for `config` with `parameters` (or weights drawn from `seed` when `None`) on the
/// chosen device, and why that device.
async fn place(
    config: DenseConfig, parameters: Option<&[(Vec<f32>, Vec<f32>)]>, seed: u64, choice: DeviceChoice,
) -> Result<(Device, String), WebError> {
    fn build<B: Backend>(
        backend: B, config: DenseConfig, parameters: Option<&[(Vec<f32>, Vec<f32>)]>, seed: u64,
    ) -> Result<DenseModel<B>, CoreError> {
        match parameters {
            None => DenseModel::new(backend, config, seed),
            Some(p) => {
                let weights = p.iter().map(|(w, _)| backend.upload(w)).collect::<Result<_, _>>()?;
                let biases = p.iter().map(|(_, b)| backend.upload(b)).collect::<Result<_, _>>()?;
                DenseModel::from_parameters(backend, config, weights, biases)
            }
        }
    }
    // The configuration is checked before any device is touched.
    config.validate()?;
    Ok(match webgpu_for(choice).await? {
        Ok((backend, reason)) => (Device::Gpu(build(backend, config, parameters, seed)?), reason),
        Err(reason) => (Device::Cpu(build(PortableBackend, config, parameters, seed)?), reason),
    })
}

impl DenseNet {
    /// A new network, weights drawn from `seed` as natively (the same draws on either
    /// device: they are made on the host and uploaded).
    pub async fn new(
        config: DenseConfig, optimizer: Optimizer, seed: u64, choice: DeviceChoice,
    ) -> Result<DenseNet, WebError> {
        optimizer.validate()?;
        let (device, reason) = place(config, None, seed, choice).await?;
        Ok(DenseNet { device, optimizer, seed, reason })
    }

    /// A network from the text of a JSON file (native `save_json`'s format).
    pub async fn from_json(text: &[u8], choice: DeviceChoice) -> Result<DenseNet, WebError> {
        let file = dense_file::from_json(text).map_err(|e| match e {
            CoreError::Checkpoint { location, message } => {
                WebError::File(format!("network JSON, {location}: {message}"))
            }
            other => other.into(),
        })?;
        let (device, reason) = place(file.config, Some(&file.parameters), file.seed, choice).await?;
        Ok(DenseNet { device, optimizer: file.optimizer, seed: file.seed, reason })
    }

    /// The network's architecture.
    pub fn config(&self) -> &DenseConfig {
        match &self.device {
            Device::Cpu(m) => &m.config,
            Device::Gpu(m) => &m.config,
        }
    }

    /// "webgpu" or "cpu".
    pub fn device(&self) -> &'static str {
        self.device.name()
    }

    /// Why the device in use was chosen.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// The seed the weights were drawn from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Checks a data set's widths against the network and every value for NaN/inf, naming
    /// the first bad row and column.
    pub fn check(&self, data: &Rows<'_>, what: &str) -> Result<(), WebError> {
        let c = self.config();
        let (n_in, n_out) = (c.input_size, c.output_size());
        if data.rows == 0 {
            return Err(invalid(format!("{what}: the data set is empty")));
        }
        for (name, values, width) in [("x", data.x, n_in), ("y", data.y, n_out)] {
            if values.len() != data.rows * width {
                return Err(invalid(format!(
                    "{what}: {name} has {} values for {} rows of {width}",
                    values.len(),
                    data.rows
                )));
            }
            if let Some(i) = values.iter().position(|v| !v.is_finite()) {
                return Err(invalid(format!(
                    "{what}: {name} row {}, column {} is {} (the data must be finite)",
                    i / width,
                    i % width,
                    values[i]
                )));
            }
        }
        Ok(())
    }

    /// One epoch over the rows of `order`, `batch_size` at a time; the epoch's mean loss.
    /// A failing batch is named, and leaves the weights as they were before it.
    pub async fn train_epoch(
        &mut self, data: &Rows<'_>, order: &[usize], batch_size: usize,
    ) -> Result<f64, WebError> {
        self.check(data, "fit")?;
        if batch_size == 0 {
            return Err(invalid("fit: batchSize must be at least 1".into()));
        }
        let (n_in, n_out) = (self.config().input_size, self.config().output_size());
        let row = |r: usize| (&data.x[r * n_in..(r + 1) * n_in], &data.y[r * n_out..(r + 1) * n_out]);
        let at = |batch: usize, e: CoreError| invalid(format!("fit: batch {batch}: {e}"));
        let optimizer = self.optimizer;
        match &mut self.device {
            Device::Cpu(model) => {
                train_epoch(model as &mut dyn DenseOps, order, batch_size, &optimizer, &row)
                    .map_err(|(batch, e)| at(batch, e))
            }
            Device::Gpu(model) => {
                // Core's loop, with the loss read back without blocking: each batch's
                // outputs come back and the reference computes its loss, as the native
                // wgpu backend does, before the optimizer steps.
                let (mut x, mut y) = (Vec::new(), Vec::new());
                let mut total = 0.0f64;
                for (batch, rows) in order.chunks(batch_size).enumerate() {
                    gather_batch(rows, &row, &mut x, &mut y);
                    let n = rows.len();
                    model.zero_grad().map_err(|e| at(batch, e))?;
                    model.backward(&x, &y, n).map_err(|e| at(batch, e))?;
                    let out = read(model, n).await?;
                    let loss =
                        loss_forward(model.config.loss, &out, &y, n, n_out).map_err(|e| at(batch, e))?;
                    model.step(&optimizer, 1.0).map_err(|e| at(batch, e))?;
                    total += loss * n as f64;
                }
                Ok(total / order.len().max(1) as f64)
            }
        }
    }

    /// Outputs of `rows` rows (row-major, `rows x output_size`).
    pub async fn predict(&mut self, x: &[f32], rows: usize) -> Result<Vec<f32>, WebError> {
        let n_in = self.config().input_size;
        if x.len() != rows * n_in {
            return Err(invalid(format!("predict: {} values for {rows} rows of {n_in}", x.len())));
        }
        if let Some(i) = x.iter().position(|v| !v.is_finite()) {
            return Err(invalid(format!(
                "predict: row {}, column {} is {} (the data must be finite)",
                i / n_in,
                i % n_in,
                x[i]
            )));
        }
        let mut out = Vec::with_capacity(rows * self.config().output_size());
        for block in x.chunks(EVAL_ROWS * n_in) {
            let n = block.len() / n_in;
            match &mut self.device {
                Device::Cpu(model) => out.extend(model.predict(block, n)?),
                Device::Gpu(model) => {
                    model.forward(block, n)?;
                    out.extend(read(model, n).await?);
                }
            }
        }
        Ok(out)
    }

    /// The mean loss over the rows, forward only.
    pub async fn loss(&mut self, data: &Rows<'_>) -> Result<f64, WebError> {
        self.check(data, "evaluate")?;
        let c = self.config();
        let (n_out, kind) = (c.output_size(), c.loss);
        let out = self.predict(data.x, data.rows).await?;
        // Per block of EVAL_ROWS, as native `evaluate` sums it.
        let mut total = 0.0f64;
        for (o, y) in out.chunks(EVAL_ROWS * n_out).zip(data.y.chunks(EVAL_ROWS * n_out)) {
            let n = o.len() / n_out;
            total += loss_forward(kind, o, y, n, n_out)? * n as f64;
        }
        Ok(total / data.rows as f64)
    }

    /// Share of rows classified correctly: argmax of the outputs against argmax of the
    /// targets, or a 0.5 threshold on both for a one-output network (native `accuracy`).
    pub async fn accuracy(&mut self, data: &Rows<'_>) -> Result<f64, WebError> {
        self.check(data, "accuracy")?;
        let n_out = self.config().output_size();
        let out = self.predict(data.x, data.rows).await?;
        let class = |v: &[f32]| {
            if v.len() == 1 {
                (v[0] >= 0.5) as usize
            } else {
                v.iter().enumerate().fold(0, |best, (i, &x)| if x > v[best] { i } else { best })
            }
        };
        let right = out
            .chunks_exact(n_out)
            .zip(data.y.chunks_exact(n_out))
            .filter(|(p, t)| class(p) == class(t))
            .count();
        Ok(right as f64 / data.rows as f64)
    }

    /// Parameters on the host, layer by layer: (weights (out, in), bias).
    pub async fn parameters(&self) -> Result<Vec<(Vec<f32>, Vec<f32>)>, WebError> {
        match &self.device {
            Device::Cpu(model) => Ok(model.parameters()?),
            Device::Gpu(model) => {
                model.backend.flush()?;
                let gpu = model.backend.gpu();
                let mut out = Vec::new();
                for (w, b) in model.weights.iter().zip(&model.biases) {
                    out.push((gpu.read(w).await?, gpu.read(b).await?));
                }
                Ok(out)
            }
        }
    }

    /// Everything the JSON file holds, on the host.
    pub async fn snapshot(&self) -> Result<DenseFile, WebError> {
        Ok(DenseFile {
            config: self.config().clone(),
            optimizer: self.optimizer,
            seed: self.seed,
            parameters: self.parameters().await?,
        })
    }
}

/// The output of the last forward pass of `rows` rows, read back without blocking.
async fn read(model: &DenseModel<WgpuBackend>, rows: usize) -> Result<Vec<f32>, WebError> {
    model.backend.flush()?;
    Ok(model.backend.gpu().read(model.output(rows)?).await?)
}

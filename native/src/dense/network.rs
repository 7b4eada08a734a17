//! `Network`: a dense feed-forward network for tabular data — build, fit, predict, save.

use std::path::Path;

use rusting_brain_core::models::dense::{
    train_epoch, DenseConfig, DenseLayer, DenseModel, DenseOps, EpochOrder,
};
use rusting_brain_core::{Activation, Loss, Optimizer};

use crate::backend::cpu::CpuBackend;
use crate::{Dataset, NetworkError, Result};

/// How `fit` walks the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrainConfig {
    /// Passes over the data.
    pub epochs: usize,
    /// Rows per optimizer step (the last batch of an epoch may be shorter).
    pub batch_size: usize,
    /// Reshuffle the rows before every epoch.
    pub shuffle: bool,
    /// The shuffling seed: the same seed gives the same run, bit for bit. `None` draws one
    /// from the operating system.
    pub seed: Option<u64>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig { epochs: 10, batch_size: 32, shuffle: true, seed: None }
    }
}

/// The model on the device it lives on. One arm per backend; the arm is picked at run
/// time, so `Network` itself has no type parameter.
pub(crate) enum Engine {
    Cpu(DenseModel<CpuBackend>),
    #[cfg(feature = "gpu")]
    Gpu(DenseModel<rusting_brain_shaders::WgpuBackend>),
    #[cfg(feature = "cuda-backend")]
    Cuda(DenseModel<crate::backend::cuda::CudaBackend>),
}

/// A dense network. Build one with [`Network::builder`].
///
/// ```
/// use rusting_brain::{Activation, Dataset, Loss, Network, Optimizer, TrainConfig};
///
/// let data = Dataset::new(
///     vec![vec![0.0, 0.0], vec![0.0, 1.0], vec![1.0, 0.0], vec![1.0, 1.0]],
///     vec![vec![0.0], vec![1.0], vec![1.0], vec![0.0]],
/// )?;
/// let mut model = Network::builder()
///     .input_size(2)
///     .dense(8, Activation::Tanh)
///     .dense(1, Activation::Sigmoid)
///     .loss(Loss::BinaryCrossEntropy)
///     .optimizer(Optimizer::adam(0.05))
///     .seed(42)
///     .build();
/// let config = TrainConfig { epochs: 2_000, batch_size: 4, shuffle: true, seed: Some(42) };
/// let history = model.fit_with(&data, config, |_epoch, loss| loss > 1e-4)?;
/// assert!(history.len() <= 2_000);
/// assert_eq!(model.accuracy(&data)?, 1.0);
/// assert_eq!(model.confusion_matrix(&data)?, vec![vec![2, 0], vec![0, 2]]);
/// # Ok::<(), rusting_brain::NetworkError>(())
/// ```
pub struct Network {
    /// `Err` holds the reason `build()` could not make the model; every call reports it.
    engine: std::result::Result<Engine, String>,
    /// Read when `fit` or `fit_with` starts and used for that whole call: change its learning
    /// rate between calls (a schedule runs one `fit` call per epoch, each with a seed of its
    /// own in `TrainConfig::seed`, since each call starts its shuffle from that seed).
    pub optimizer: Optimizer,
    pub(crate) seed: u64,
}

/// Collects the architecture; see [`Network::builder`].
#[derive(Debug, Clone)]
pub struct NetworkBuilder {
    input_size: usize,
    layers: Vec<DenseLayer>,
    loss: Option<Loss>,
    optimizer: Optimizer,
    seed: u64,
}

impl NetworkBuilder {
    /// Width of an input row.
    pub fn input_size(mut self, n: usize) -> Self {
        self.input_size = n;
        self
    }
    /// Appends a fully connected layer of `units` outputs followed by `activation`.
    pub fn dense(mut self, units: usize, activation: Activation) -> Self {
        self.layers.push(DenseLayer { units, activation });
        self
    }
    /// The loss the network trains on (required).
    pub fn loss(mut self, loss: Loss) -> Self {
        self.loss = Some(loss);
        self
    }
    /// Default: `Optimizer::adam(1e-3)`.
    pub fn optimizer(mut self, optimizer: Optimizer) -> Self {
        self.optimizer = optimizer;
        self
    }
    /// Seed of the weight initialisation (default 0).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Builds the network, or says why not.
    pub fn try_build(self) -> Result<Network> {
        let loss =
            self.loss.ok_or_else(|| NetworkError::InvalidConfig("no loss: call .loss(Loss::...)".into()))?;
        let config = DenseConfig { input_size: self.input_size, layers: self.layers, loss };
        self.optimizer.validate().map_err(|e| NetworkError::InvalidConfig(e.to_string()))?;
        let model = DenseModel::new(CpuBackend::new(), config, self.seed)
            .map_err(|e| NetworkError::InvalidConfig(e.to_string()))?;
        Ok(Network { engine: Ok(Engine::Cpu(model)), optimizer: self.optimizer, seed: self.seed })
    }

    /// Builds the network. An invalid configuration does not panic: the network it returns
    /// answers every call with the configuration error (use [`Self::try_build`] to get the
    /// error at once).
    pub fn build(self) -> Network {
        let (optimizer, seed) = (self.optimizer, self.seed);
        match self.try_build() {
            Ok(n) => n,
            Err(e) => Network { engine: Err(e.to_string()), optimizer, seed },
        }
    }
}

/// Rows per forward pass when predicting or evaluating many rows.
const EVAL_ROWS: usize = 256;

fn os_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

fn argmax(v: &[f32]) -> usize {
    v.iter().enumerate().fold(0, |best, (i, &x)| if x > v[best] { i } else { best })
}

impl Network {
    /// A builder: `.input_size(n)`, `.dense(units, activation)` per layer, `.loss(...)`, then `build()`.
    pub fn builder() -> NetworkBuilder {
        NetworkBuilder {
            input_size: 0,
            layers: Vec::new(),
            loss: None,
            optimizer: Optimizer::adam(1e-3),
            seed: 0,
        }
    }

    pub(crate) fn from_model(model: DenseModel<CpuBackend>, optimizer: Optimizer, seed: u64) -> Network {
        Network { engine: Ok(Engine::Cpu(model)), optimizer, seed }
    }

    pub(crate) fn model(&self) -> Result<&dyn DenseOps> {
        match &self.engine {
            Ok(Engine::Cpu(m)) => Ok(m),
            #[cfg(feature = "gpu")]
            Ok(Engine::Gpu(m)) => Ok(m),
            #[cfg(feature = "cuda-backend")]
            Ok(Engine::Cuda(m)) => Ok(m),
            Err(e) => Err(NetworkError::InvalidConfig(e.clone())),
        }
    }

    fn model_mut(&mut self) -> Result<&mut dyn DenseOps> {
        match &mut self.engine {
            Ok(Engine::Cpu(m)) => Ok(m),
            #[cfg(feature = "gpu")]
            Ok(Engine::Gpu(m)) => Ok(m),
            #[cfg(feature = "cuda-backend")]
            Ok(Engine::Cuda(m)) => Ok(m),
            Err(e) => Err(NetworkError::InvalidConfig(e.clone())),
        }
    }

    /// Moves the network (weights, gradients, optimizer state, step count) to CUDA device
    /// `ordinal` (feature `cuda`), holding at most `budget_mib` MiB there; everything the
    /// network's parameters and optimizer need is counted against the budget before any of
    /// it is allocated. `fit`, `predict` and `evaluate` then run there. A missing driver,
    /// device or library is an error, never a silent CPU run. `to_cpu` brings it back.
    #[cfg(feature = "cuda-backend")]
    pub fn to_cuda(&mut self, ordinal: usize, budget_mib: usize) -> Result<()> {
        let model = match &self.engine {
            Ok(Engine::Cpu(m)) => m,
            Ok(Engine::Cuda(_)) => return Ok(()),
            #[cfg(feature = "gpu")]
            Ok(Engine::Gpu(_)) => {
                return Err(NetworkError::InvalidInput(
                    "the network is on a wgpu device; call to_cpu() before to_cuda()".into(),
                ))
            }
            Err(e) => return Err(NetworkError::InvalidConfig(e.clone())),
        };
        let cuda = crate::backend::cuda::CudaBackend::new(ordinal, budget_mib)?;
        // Weights, biases, their gradients and two optimizer moments each.
        let bytes = model.config.parameter_count() * 4 * 4;
        cuda.check_room(bytes, "the network's parameters, gradients and optimizer state")?;
        let moved = model.to_backend(cuda)?;
        self.engine = Ok(Engine::Cuda(moved));
        Ok(())
    }

    /// Moves the network (weights, gradients, optimizer state, step count) to the default
    /// GPU (feature `gpu`): Metal on a Mac, Vulkan or DX12 elsewhere. `fit`, `predict`,
    /// `evaluate` then run there, forward, backward and the optimizer in WGSL shaders.
    /// No adapter is an error, never a silent CPU run.
    #[cfg(feature = "gpu")]
    pub fn to_gpu(&mut self) -> Result<()> {
        self.to_gpu_with(&crate::GpuOptions { high_performance: true, ..Default::default() })
    }

    /// [`Network::to_gpu`] with adapter options (`software`: the fallback adapter, Mesa's
    /// lavapipe on Linux, what the tests use).
    #[cfg(feature = "gpu")]
    pub fn to_gpu_with(&mut self, options: &crate::GpuOptions) -> Result<()> {
        let model = match &self.engine {
            Ok(Engine::Cpu(m)) => m,
            Ok(Engine::Gpu(_)) => return Ok(()),
            #[cfg(feature = "cuda-backend")]
            Ok(Engine::Cuda(_)) => {
                return Err(NetworkError::InvalidInput(
                    "the network is on a CUDA device; call to_cpu() before to_gpu()".into(),
                ))
            }
            Err(e) => return Err(NetworkError::InvalidConfig(e.clone())),
        };
        let moved = model.to_backend(crate::backend::gpu::open(options)?)?;
        self.engine = Ok(Engine::Gpu(moved));
        Ok(())
    }

    /// Moves the network back to the CPU (weights, gradients, optimizer state).
    pub fn to_cpu(&mut self) -> Result<()> {
        #[cfg(feature = "gpu")]
        if let Ok(Engine::Gpu(m)) = &self.engine {
            let moved = m.to_backend(CpuBackend::new())?;
            self.engine = Ok(Engine::Cpu(moved));
        }
        #[cfg(feature = "cuda-backend")]
        if let Ok(Engine::Cuda(m)) = &self.engine {
            let moved = m.to_backend(CpuBackend::new())?;
            self.engine = Ok(Engine::Cpu(moved));
        }
        Ok(())
    }

    /// Where the network computes: "cpu", or the GPU adapter's name.
    pub fn device(&self) -> String {
        match &self.engine {
            #[cfg(feature = "gpu")]
            Ok(Engine::Gpu(m)) => {
                let info = m.backend.gpu().adapter_info();
                format!("{} ({:?})", info.name, info.backend)
            }
            #[cfg(feature = "cuda-backend")]
            Ok(Engine::Cuda(m)) => format!("{} (CUDA)", m.backend.device_name()),
            _ => "cpu".into(),
        }
    }

    /// The architecture.
    pub fn config(&self) -> Result<&DenseConfig> {
        Ok(self.model()?.config())
    }
    /// Weights plus biases.
    pub fn parameter_count(&self) -> Result<usize> {
        Ok(self.config()?.parameter_count())
    }

    fn check_data(&self, data: &Dataset, what: &str) -> Result<()> {
        let c = self.config()?;
        if data.is_empty() {
            return Err(NetworkError::InvalidInput(format!("{what}: the data set is empty")));
        }
        if data.input_size() != c.input_size || data.target_size() != c.output_size() {
            return Err(NetworkError::InvalidInput(format!(
                "{what}: the data has {} inputs and {} targets per row, the network takes {} and gives {}",
                data.input_size(),
                data.target_size(),
                c.input_size,
                c.output_size()
            )));
        }
        Ok(())
    }

    /// Trains for `config.epochs` epochs; returns the mean training loss of each epoch.
    pub fn fit(&mut self, data: &Dataset, config: TrainConfig) -> Result<Vec<f32>> {
        self.fit_with(data, config, |_, _| true)
    }

    /// [`Network::fit`], calling `on_epoch(epoch, mean_loss)` after each epoch (counted from
    /// 1); returning `false` stops the run. The history holds the epochs that ran.
    pub fn fit_with(
        &mut self, data: &Dataset, config: TrainConfig, mut on_epoch: impl FnMut(usize, f32) -> bool,
    ) -> Result<Vec<f32>> {
        self.check_data(data, "fit")?;
        if config.batch_size == 0 {
            return Err(NetworkError::InvalidInput("fit: batch_size must be at least 1".into()));
        }
        let optimizer = self.optimizer;
        optimizer.validate()?;
        let model = self.model_mut()?;
        let mut order = EpochOrder::new(data.len(), config.shuffle, config.seed.unwrap_or_else(os_seed));
        let row = |r: usize| (data.inputs()[r].as_slice(), data.targets()[r].as_slice());
        let mut history = Vec::new();
        for epoch in 1..=config.epochs {
            let mean = train_epoch(model, order.next_epoch(), config.batch_size, &optimizer, &row)
                .map_err(|(batch, source)| NetworkError::Training { epoch, batch, source })?;
            let mean = mean as f32;
            history.push(mean);
            if !on_epoch(epoch, mean) {
                break;
            }
        }
        Ok(history)
    }

    /// The network's output for one input row.
    pub fn predict(&mut self, input: &[f32]) -> Result<Vec<f32>> {
        let n_in = self.config()?.input_size;
        if input.len() != n_in {
            return Err(NetworkError::InvalidInput(format!(
                "predict: the input has {} values but the network takes {n_in}",
                input.len()
            )));
        }
        Ok(self.model_mut()?.predict(input, 1)?)
    }

    /// Outputs for many rows, computed a block of rows at a time.
    pub fn predict_batch(&mut self, inputs: &[Vec<f32>]) -> Result<Vec<Vec<f32>>> {
        let (n_in, n_out) = {
            let c = self.config()?;
            (c.input_size, c.output_size())
        };
        if let Some((i, r)) = inputs.iter().enumerate().find(|(_, r)| r.len() != n_in) {
            return Err(NetworkError::InvalidInput(format!(
                "predict_batch: row {i} has {} values but the network takes {n_in}",
                r.len()
            )));
        }
        let model = self.model_mut()?;
        let mut out = Vec::with_capacity(inputs.len());
        let mut x = Vec::new();
        for block in inputs.chunks(EVAL_ROWS) {
            x.clear();
            block.iter().for_each(|r| x.extend_from_slice(r));
            let y = model.predict(&x, block.len())?;
            out.extend(y.chunks_exact(n_out).map(<[f32]>::to_vec));
        }
        Ok(out)
    }

    /// The mean loss over `data`, forward only.
    pub fn evaluate(&mut self, data: &Dataset) -> Result<f32> {
        self.check_data(data, "evaluate")?;
        let model = self.model_mut()?;
        let (mut x, mut y, mut total) = (Vec::new(), Vec::new(), 0.0f64);
        for (xs, ys) in data.inputs().chunks(EVAL_ROWS).zip(data.targets().chunks(EVAL_ROWS)) {
            x.clear();
            y.clear();
            xs.iter().for_each(|r| x.extend_from_slice(r));
            ys.iter().for_each(|r| y.extend_from_slice(r));
            total += model.loss(&x, &y, xs.len())? * xs.len() as f64;
        }
        Ok((total / data.len() as f64) as f32)
    }

    /// (actual class, predicted class) of every row: argmax, or the 0.5 threshold for one
    /// output.
    fn classes(&mut self, data: &Dataset, what: &str) -> Result<Vec<(usize, usize)>> {
        self.check_data(data, what)?;
        let preds = self.predict_batch(data.inputs())?;
        Ok(data
            .targets()
            .iter()
            .zip(&preds)
            .map(|(t, p)| {
                if t.len() == 1 {
                    ((t[0] >= 0.5) as usize, (p[0] >= 0.5) as usize)
                } else {
                    (argmax(t), argmax(p))
                }
            })
            .collect())
    }

    /// Share of rows classified correctly (argmax, or a 0.5 threshold for one output).
    pub fn accuracy(&mut self, data: &Dataset) -> Result<f32> {
        let pairs = self.classes(data, "accuracy")?;
        Ok(pairs.iter().filter(|(a, p)| a == p).count() as f32 / pairs.len() as f32)
    }

    /// Counts indexed `[actual][predicted]`; two classes for a one-output network.
    pub fn confusion_matrix(&mut self, data: &Dataset) -> Result<Vec<Vec<usize>>> {
        let k = self.config()?.output_size().max(2);
        let mut m = vec![vec![0usize; k]; k];
        for (a, p) in self.classes(data, "confusion_matrix")? {
            m[a][p] += 1;
        }
        Ok(m)
    }

    /// Writes the architecture, weights and optimizer settings as readable JSON, atomically.
    pub fn save_json(&self, path: impl AsRef<Path>) -> Result<()> {
        crate::dense::network_json::save(self, path.as_ref())
    }

    /// Writes the network as ONNX (opset 13), atomically: per layer a `Gemm` and the
    /// activation's standard op (`Relu`, `LeakyRelu`, `Sigmoid`, `Tanh`, `Softmax`; none
    /// for identity), weights and biases as initializers, input `input` and output
    /// `output` with a symbolic batch dimension `batch`. ONNX Runtime, TensorRT, tract and
    /// the browser runtimes read it; no feature is needed to write it.
    pub fn save_onnx(&self, path: impl AsRef<Path>) -> Result<()> {
        crate::dense::onnx_export::save(self, path.as_ref())
    }

    /// Reads a network written by [`Network::save_json`].
    pub fn load_json(path: impl AsRef<Path>) -> Result<Network> {
        crate::dense::network_json::load(path.as_ref())
    }
}

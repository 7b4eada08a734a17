//! A dense feed-forward network: `z = a W^T + b`, `a = f(z)`, layer after layer.
//!
//! Weights are stored `(out, in)`, PyTorch's `nn.Linear` layout, so a checkpoint maps onto
//! `state_dict()` without transposes. Forward, backward and the optimizer step are plain
//! functions of the model's buffers on one backend (the llm.c way: no tape).

use alloc::vec::Vec;

use crate::ops::matmul::MatmulSpec;
use crate::{Activation, Backend, CoreError, Loss, Optimizer, Result, Rng};

/// One fully connected layer: its width and what follows it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DenseLayer {
    /// Outputs.
    pub units: usize,
    /// The activation after the affine map.
    pub activation: Activation,
}

/// The architecture: everything needed to rebuild the model but its weights.
#[derive(Debug, Clone, PartialEq)]
pub struct DenseConfig {
    /// Width of an input row.
    pub input_size: usize,
    /// The layers, input to output.
    pub layers: Vec<DenseLayer>,
    /// What training minimizes.
    pub loss: Loss,
}

fn invalid(message: alloc::string::String) -> CoreError {
    CoreError::InvalidArgument { op: "dense network", message }
}

impl DenseConfig {
    /// Checks the sizes and settings, naming the first bad one.
    pub fn validate(&self) -> Result<()> {
        if self.input_size == 0 {
            return Err(invalid("the input size must be at least 1 (call .input_size(n))".into()));
        }
        if self.layers.is_empty() {
            return Err(invalid("the network has no layers (add one with .dense(units, activation))".into()));
        }
        for (i, l) in self.layers.iter().enumerate() {
            if l.units == 0 {
                return Err(invalid(alloc::format!("layer {i} has 0 units")));
            }
            if let Activation::LeakyRelu(a) = l.activation {
                if !a.is_finite() {
                    return Err(invalid(alloc::format!("layer {i}: leaky ReLU slope {a} is not finite")));
                }
            }
            if l.activation == Activation::Softmax && l.units == 1 {
                return Err(invalid(alloc::format!(
                    "layer {i}: a softmax over 1 unit always outputs 1 and passes no gradient back \
                     (for one output use a sigmoid)"
                )));
            }
        }
        // The cross-entropies take logarithms of the outputs, and of one minus them: an output
        // layer whose values can leave (0, 1) makes the loss NaN or negative in the middle of
        // training, long after the mistake was made here.
        let last = self.layers[self.layers.len() - 1].activation;
        let probabilities = matches!(last, Activation::Sigmoid | Activation::Softmax);
        if !probabilities && matches!(self.loss, Loss::BinaryCrossEntropy | Loss::CategoricalCrossEntropy) {
            let (loss, fix) = if self.loss == Loss::BinaryCrossEntropy {
                ("binary cross-entropy", "a sigmoid")
            } else {
                ("categorical cross-entropy", "a softmax")
            };
            return Err(invalid(alloc::format!(
                "{loss} needs outputs between 0 and 1, but the last layer's activation is {last:?}: \
                 end with {fix} (or use mean squared error)"
            )));
        }
        Ok(())
    }
    /// (inputs, outputs) of layer `l`.
    pub fn fan(&self, l: usize) -> (usize, usize) {
        let fan_in = if l == 0 { self.input_size } else { self.layers[l - 1].units };
        (fan_in, self.layers[l].units)
    }
    /// Width of an output row (the last layer's units).
    pub fn output_size(&self) -> usize {
        self.layers.last().map_or(0, |l| l.units)
    }
    /// Weights plus biases.
    pub fn parameter_count(&self) -> usize {
        (0..self.layers.len())
            .map(|l| {
                let (i, o) = self.fan(l);
                i * o + o
            })
            .sum()
    }
    /// Multiply-adds of one sample's forward pass.
    pub fn forward_macs(&self) -> usize {
        (0..self.layers.len()).map(|l| self.fan(l).0 * self.fan(l).1).sum()
    }
}

/// Activations for one batch size, kept and reused while that size repeats.
struct Arena<B: Backend> {
    rows: usize,
    input: B::Buffer,
    target: B::Buffer,
    /// Per layer: pre-activation z, activation a, and their gradients.
    z: Vec<B::Buffer>,
    a: Vec<B::Buffer>,
    dz: Vec<B::Buffer>,
    da: Vec<B::Buffer>,
}

/// A dense network living on backend `B`: parameters, gradients, optimizer state and
/// activation arenas.
pub struct DenseModel<B: Backend> {
    /// Where the buffers live and the math runs.
    pub backend: B,
    /// The architecture.
    pub config: DenseConfig,
    /// Per layer, `(out, in)`.
    pub weights: Vec<B::Buffer>,
    /// Per layer, `(out)`.
    pub biases: Vec<B::Buffer>,
    /// Per layer, the accumulated gradient of the weights, `(out, in)`.
    pub grad_weights: Vec<B::Buffer>,
    /// Per layer, the accumulated gradient of the bias.
    pub grad_biases: Vec<B::Buffer>,
    /// Optimizer state mirroring the parameters: Adam's (m, v), or SGD's velocity in `.0`.
    state_weights: Vec<(B::Buffer, B::Buffer)>,
    state_biases: Vec<(B::Buffer, B::Buffer)>,
    /// Optimizer steps taken.
    pub step: u64,
    arenas: Vec<Arena<B>>,
}

/// How many batch sizes keep an arena at once (training uses two: the full batch and the
/// last, shorter one).
const ARENAS: usize = 3;

impl<B: Backend> DenseModel<B> {
    /// A new model with weights drawn from `seed`: He-uniform `U(±sqrt(6 / fan_in))` before
    /// ReLU-family activations, Glorot-uniform `U(±sqrt(6 / (fan_in + fan_out)))` before the
    /// others; biases zero.
    pub fn new(backend: B, config: DenseConfig, seed: u64) -> Result<Self> {
        config.validate()?;
        let mut rng = Rng::new(seed);
        let mut weights = Vec::new();
        let mut biases = Vec::new();
        for l in 0..config.layers.len() {
            let (fan_in, fan_out) = config.fan(l);
            let limit = match config.layers[l].activation {
                Activation::Relu | Activation::LeakyRelu(_) => libm::sqrt(6.0 / fan_in as f64),
                _ => libm::sqrt(6.0 / (fan_in + fan_out) as f64),
            };
            let w: Vec<f32> = (0..fan_in * fan_out).map(|_| rng.uniform(-limit, limit) as f32).collect();
            weights.push(backend.upload(&w)?);
            biases.push(backend.zeros(fan_out)?);
        }
        Self::from_parameters(backend, config, weights, biases)
    }

    /// A model around given parameter buffers (loading a checkpoint).
    pub fn from_parameters(
        backend: B, config: DenseConfig, weights: Vec<B::Buffer>, biases: Vec<B::Buffer>,
    ) -> Result<Self> {
        config.validate()?;
        let n = config.layers.len();
        if weights.len() != n || biases.len() != n {
            return Err(invalid(alloc::format!(
                "{n} layers but {} weight and {} bias tensors",
                weights.len(),
                biases.len()
            )));
        }
        let mut grad_weights = Vec::new();
        let mut grad_biases = Vec::new();
        let mut state_weights = Vec::new();
        let mut state_biases = Vec::new();
        for l in 0..n {
            let (i, o) = config.fan(l);
            crate::error::check_len("dense network", "layer weights", backend.len(&weights[l]), i * o)?;
            crate::error::check_len("dense network", "layer bias", backend.len(&biases[l]), o)?;
            grad_weights.push(backend.zeros(i * o)?);
            grad_biases.push(backend.zeros(o)?);
            state_weights.push((backend.zeros(i * o)?, backend.zeros(i * o)?));
            state_biases.push((backend.zeros(o)?, backend.zeros(o)?));
        }
        Ok(DenseModel {
            backend,
            config,
            weights,
            biases,
            grad_weights,
            grad_biases,
            state_weights,
            state_biases,
            step: 0,
            arenas: Vec::new(),
        })
    }

    fn arena_index(&mut self, rows: usize) -> Result<usize> {
        if let Some(i) = self.arenas.iter().position(|a| a.rows == rows) {
            return Ok(i);
        }
        if self.arenas.len() == ARENAS {
            self.arenas.remove(0);
        }
        let b = &self.backend;
        let mut arena = Arena {
            rows,
            input: b.zeros(rows * self.config.input_size)?,
            target: b.zeros(rows * self.config.output_size())?,
            z: Vec::new(),
            a: Vec::new(),
            dz: Vec::new(),
            da: Vec::new(),
        };
        for l in &self.config.layers {
            for v in [&mut arena.z, &mut arena.a, &mut arena.dz, &mut arena.da] {
                v.push(b.zeros(rows * l.units)?);
            }
        }
        self.arenas.push(arena);
        Ok(self.arenas.len() - 1)
    }

    /// Forward pass of `rows` samples (`inputs`: rows x input_size, row-major). Returns the
    /// arena holding the activations; the output is `arena.a.last()`.
    fn forward_into(&mut self, inputs: &[f32], rows: usize) -> Result<usize> {
        crate::error::check_len("dense forward", "inputs", inputs.len(), rows * self.config.input_size)?;
        let ai = self.arena_index(rows)?;
        let (b, cfg, arena) = (&self.backend, &self.config, &mut self.arenas[ai]);
        b.write(&mut arena.input, inputs)?;
        for l in 0..cfg.layers.len() {
            let (fan_in, fan_out) = cfg.fan(l);
            let x = if l == 0 { &arena.input } else { &arena.a[l - 1] };
            // z = x W^T + b   x: (rows, in), W: (out, in), z: (rows, out)
            b.matmul(
                &mut arena.z[l],
                x,
                &self.weights[l],
                &MatmulSpec::new(rows, fan_out, fan_in).trans_b(true),
            )?;
            b.add_bias(&mut arena.z[l], &self.biases[l], rows, fan_out)?;
            b.activation_forward(cfg.layers[l].activation, &mut arena.a[l], &arena.z[l], rows, fan_out)?;
        }
        Ok(ai)
    }

    /// The forward pass of `rows` samples, its output left on the device for
    /// [`Self::output`] (a browser reads it back without blocking; [`Self::predict`] reads it
    /// at once).
    pub fn forward(&mut self, inputs: &[f32], rows: usize) -> Result<()> {
        self.forward_into(inputs, rows).map(|_| ())
    }

    /// The output (`rows x output_size`) the last forward pass of `rows` rows left (by
    /// [`Self::forward`], [`Self::backward`] or [`Self::loss`]).
    pub fn output(&self, rows: usize) -> Result<&B::Buffer> {
        let arena = self
            .arenas
            .iter()
            .find(|a| a.rows == rows)
            .ok_or_else(|| invalid(alloc::format!("no forward pass of {rows} rows has run")))?;
        Ok(arena.a.last().expect("validated: at least one layer"))
    }

    /// Predictions for `rows` samples, on the host.
    pub fn predict(&mut self, inputs: &[f32], rows: usize) -> Result<Vec<f32>> {
        let ai = self.forward_into(inputs, rows)?;
        let out = self.arenas[ai].a.last().expect("validated: at least one layer");
        self.backend.download(out)
    }

    /// Mean loss of a batch, forward only.
    pub fn loss(&mut self, inputs: &[f32], targets: &[f32], rows: usize) -> Result<f64> {
        let n_out = self.config.output_size();
        crate::error::check_len("dense loss", "targets", targets.len(), rows * n_out)?;
        let ai = self.forward_into(inputs, rows)?;
        self.backend.write(&mut self.arenas[ai].target, targets)?;
        self.batch_loss(rows)
    }

    /// The mean loss of the last batch of `rows` rows run forward with its targets (by
    /// [`Self::loss`] or [`Self::backward`]), from the outputs and targets it left.
    fn batch_loss(&mut self, rows: usize) -> Result<f64> {
        let n_out = self.config.output_size();
        let ai = self.arena_index(rows)?;
        let arena = &self.arenas[ai];
        let out = arena.a.last().expect("validated: at least one layer");
        self.backend.loss_forward(self.config.loss, out, &arena.target, rows, n_out)
    }

    /// Forward and backward of one batch: accumulates the gradients of the batch's mean loss
    /// into `grad_*` and returns that mean loss.
    pub fn forward_backward(&mut self, inputs: &[f32], targets: &[f32], rows: usize) -> Result<f64> {
        self.backward(inputs, targets, rows)?;
        self.batch_loss(rows)
    }

    /// [`Self::forward_backward`] without the loss: nothing is read back from the device,
    /// so a browser can record a whole step and read the outputs when it chooses.
    pub fn backward(&mut self, inputs: &[f32], targets: &[f32], rows: usize) -> Result<()> {
        let n_out = self.config.output_size();
        crate::error::check_len("dense loss", "targets", targets.len(), rows * n_out)?;
        let ai = self.forward_into(inputs, rows)?;
        let (b, cfg, arena) = (&self.backend, &self.config, &mut self.arenas[ai]);
        b.write(&mut arena.target, targets)?;
        let last = cfg.layers.len() - 1;
        let out_act = cfg.layers[last].activation;
        if cfg.loss.fuses_with(out_act) {
            // softmax + CCE, sigmoid + BCE: dz = (a - y) / N, stable at saturation.
            b.fused_output_backward(
                cfg.loss,
                &mut arena.dz[last],
                &arena.a[last],
                &arena.target,
                rows,
                n_out,
            )?;
        } else {
            b.loss_backward(cfg.loss, &mut arena.da[last], &arena.a[last], &arena.target, rows, n_out)?;
            b.activation_backward(
                out_act,
                &mut arena.dz[last],
                &arena.da[last],
                &arena.z[last],
                &arena.a[last],
                rows,
                n_out,
            )?;
        }
        for l in (0..=last).rev() {
            let (fan_in, fan_out) = cfg.fan(l);
            let x = if l == 0 { &arena.input } else { &arena.a[l - 1] };
            // dW += dz^T x   dz: (rows, out), x: (rows, in), dW: (out, in)
            b.matmul(
                &mut self.grad_weights[l],
                &arena.dz[l],
                x,
                &MatmulSpec::new(fan_out, fan_in, rows).trans_a(true).accumulate(),
            )?;
            b.bias_backward(&mut self.grad_biases[l], &arena.dz[l], rows, fan_out)?;
            if l > 0 {
                // dx = dz W   (rows, out) x (out, in), then back through the activation.
                b.matmul(
                    &mut arena.da[l - 1],
                    &arena.dz[l],
                    &self.weights[l],
                    &MatmulSpec::new(rows, fan_in, fan_out),
                )?;
                b.activation_backward(
                    cfg.layers[l - 1].activation,
                    &mut arena.dz[l - 1],
                    &arena.da[l - 1],
                    &arena.z[l - 1],
                    &arena.a[l - 1],
                    rows,
                    fan_in,
                )?;
            }
        }
        Ok(())
    }

    /// Zeroes the accumulated gradients.
    pub fn zero_grad(&mut self) -> Result<()> {
        for g in self.grad_weights.iter_mut().chain(self.grad_biases.iter_mut()) {
            self.backend.fill(g, 0.0)?;
        }
        Ok(())
    }

    /// One optimizer step with the accumulated gradients times `grad_scale`.
    pub fn step(&mut self, optimizer: &Optimizer, grad_scale: f32) -> Result<()> {
        optimizer.validate()?;
        self.step += 1;
        let b = &self.backend;
        let params = self.weights.iter_mut().chain(self.biases.iter_mut());
        let grads = self.grad_weights.iter().chain(self.grad_biases.iter());
        let states = self.state_weights.iter_mut().chain(self.state_biases.iter_mut());
        for ((p, g), (s1, s2)) in params.zip(grads).zip(states) {
            if let Some(hp) = optimizer.adam_params(grad_scale) {
                b.adam_update(p, g, s1, s2, &hp, self.step)?;
            } else if let Some(hp) = optimizer.sgd_params(grad_scale) {
                let velocity = if hp.momentum != 0.0 { Some(s1) } else { None };
                b.sgd_update(p, g, velocity, &hp)?;
            }
        }
        Ok(())
    }

    /// Parameters on the host, layer by layer: (weights (out, in), bias).
    pub fn parameters(&self) -> Result<Vec<(Vec<f32>, Vec<f32>)>> {
        self.weights
            .iter()
            .zip(&self.biases)
            .map(|(w, b)| Ok((self.backend.download(w)?, self.backend.download(b)?)))
            .collect()
    }

    /// The same model on another backend: parameters, gradients, optimizer state and step
    /// count all travel, so training continues where it was.
    pub fn to_backend<C: Backend>(&self, backend: C) -> Result<DenseModel<C>> {
        let one = |x: &B::Buffer| backend.upload(&self.backend.download(x)?);
        let all = |xs: &[B::Buffer]| xs.iter().map(one).collect::<Result<Vec<_>>>();
        let pairs = |xs: &[(B::Buffer, B::Buffer)]| {
            xs.iter().map(|(a, b)| Ok((one(a)?, one(b)?))).collect::<Result<Vec<_>>>()
        };
        let (weights, biases) = (all(&self.weights)?, all(&self.biases)?);
        let (grad_weights, grad_biases) = (all(&self.grad_weights)?, all(&self.grad_biases)?);
        let (state_weights, state_biases) = (pairs(&self.state_weights)?, pairs(&self.state_biases)?);
        Ok(DenseModel {
            backend,
            config: self.config.clone(),
            weights,
            biases,
            grad_weights,
            grad_biases,
            state_weights,
            state_biases,
            step: self.step,
            arenas: Vec::new(),
        })
    }

    /// Gradients on the host, in the layout of [`Self::parameters`].
    pub fn gradients(&self) -> Result<Vec<(Vec<f32>, Vec<f32>)>> {
        self.grad_weights
            .iter()
            .zip(&self.grad_biases)
            .map(|(w, b)| Ok((self.backend.download(w)?, self.backend.download(b)?)))
            .collect()
    }
}

/// What a training loop needs of a dense model, whatever its backend: the model definition
/// is [`DenseModel<B>`], one for every backend, and this erases the `B` so a type without a
/// type parameter can hold any of them.
pub trait DenseOps {
    /// The architecture.
    fn config(&self) -> &DenseConfig;
    /// Zeroes the accumulated gradients.
    fn zero_grad(&mut self) -> Result<()>;
    /// Forward and backward of `rows` rows; adds the gradients of their mean loss and returns it.
    fn forward_backward(&mut self, x: &[f32], y: &[f32], rows: usize) -> Result<f64>;
    /// One optimizer step with the gradients times `grad_scale`.
    fn step(&mut self, optimizer: &Optimizer, grad_scale: f32) -> Result<()>;
    /// Outputs of `rows` rows, on the host.
    fn predict(&mut self, x: &[f32], rows: usize) -> Result<Vec<f32>>;
    /// Mean loss of `rows` rows, forward only.
    fn loss(&mut self, x: &[f32], y: &[f32], rows: usize) -> Result<f64>;
    /// Per layer: weights `(out, in)` and bias, on the host.
    fn parameters(&self) -> Result<Vec<(Vec<f32>, Vec<f32>)>>;
}

impl<B: Backend> DenseOps for DenseModel<B> {
    fn config(&self) -> &DenseConfig {
        &self.config
    }
    fn zero_grad(&mut self) -> Result<()> {
        DenseModel::zero_grad(self)
    }
    fn forward_backward(&mut self, x: &[f32], y: &[f32], rows: usize) -> Result<f64> {
        DenseModel::forward_backward(self, x, y, rows)
    }
    fn step(&mut self, optimizer: &Optimizer, grad_scale: f32) -> Result<()> {
        DenseModel::step(self, optimizer, grad_scale)
    }
    fn predict(&mut self, x: &[f32], rows: usize) -> Result<Vec<f32>> {
        DenseModel::predict(self, x, rows)
    }
    fn loss(&mut self, x: &[f32], y: &[f32], rows: usize) -> Result<f64> {
        DenseModel::loss(self, x, y, rows)
    }
    fn parameters(&self) -> Result<Vec<(Vec<f32>, Vec<f32>)>> {
        DenseModel::parameters(self)
    }
}

/// The order training walks the rows in: every row once an epoch, reshuffled before each
/// epoch when asked, by one generator seeded once, so a seed repeats a run on every backend,
/// natively and in a page.
pub struct EpochOrder {
    rng: Rng,
    order: Vec<usize>,
    shuffle: bool,
}

impl EpochOrder {
    /// The order of `rows` rows, reshuffled each epoch (when `shuffle`) from `seed`.
    pub fn new(rows: usize, shuffle: bool, seed: u64) -> EpochOrder {
        EpochOrder { rng: Rng::new(seed), order: (0..rows).collect(), shuffle }
    }

    /// The next epoch's row order.
    pub fn next_epoch(&mut self) -> &[usize] {
        if self.shuffle {
            self.rng.shuffle(&mut self.order);
        }
        &self.order
    }
}

/// The rows of one minibatch, gathered row-major: inputs into `x`, targets into `y`.
pub fn gather_batch<'a>(
    rows: &[usize], row: &dyn Fn(usize) -> (&'a [f32], &'a [f32]), x: &mut Vec<f32>, y: &mut Vec<f32>,
) {
    x.clear();
    y.clear();
    for &r in rows {
        let (input, target) = row(r);
        x.extend_from_slice(input);
        y.extend_from_slice(target);
    }
}

/// One epoch of minibatch training: the rows of `order`, `batch_size` at a time; for each
/// batch the gradients are zeroed, run forward and backward, and the optimizer steps.
/// `row(i)` gives row `i`'s input and target. Returns the epoch's mean loss (each batch's
/// mean loss weighted by its rows), or the index of the batch that failed and why; a batch
/// whose loss is not finite fails before its step, so the weights stay as they were.
pub fn train_epoch<'a>(
    model: &mut dyn DenseOps, order: &[usize], batch_size: usize, optimizer: &Optimizer,
    row: &dyn Fn(usize) -> (&'a [f32], &'a [f32]),
) -> core::result::Result<f64, (usize, CoreError)> {
    if batch_size == 0 {
        return Err((0, invalid("the batch size must be at least 1".into())));
    }
    let (mut x, mut y) = (Vec::new(), Vec::new());
    let mut total = 0.0f64;
    for (batch, rows) in order.chunks(batch_size).enumerate() {
        gather_batch(rows, row, &mut x, &mut y);
        let fail = |e| (batch, e);
        model.zero_grad().map_err(fail)?;
        let loss = model.forward_backward(&x, &y, rows.len()).map_err(fail)?;
        model.step(optimizer, 1.0).map_err(fail)?;
        total += loss * rows.len() as f64;
    }
    Ok(total / order.len().max(1) as f64)
}

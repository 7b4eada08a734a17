//! The JSON file of a dense network: readable, exact (an f32 is written with as many digits
//! as it takes to read it back bit for bit), versioned. One format for native `save_json` /
//! `load_json` and the page's `toJSON()` / `Network.fromJSON()`, so a network moves between
//! Rust and JavaScript both ways.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use serde::{Deserialize, Serialize};

use super::dense::{DenseConfig, DenseLayer};
use crate::{Activation, CoreError, Loss, Optimizer, OptimizerKind, Result};

/// The file's `format` field.
pub const FORMAT: &str = "rusting_brain.network";
/// The version this build writes and reads.
pub const VERSION: u32 = 1;

/// Everything the file holds, on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct DenseFile {
    /// The architecture.
    pub config: DenseConfig,
    /// The optimizer's settings (its state is not saved).
    pub optimizer: Optimizer,
    /// The seed the weights were drawn from.
    pub seed: u64,
    /// Per layer: weights `(out, in)` row-major, bias `(out)`.
    pub parameters: Vec<(Vec<f32>, Vec<f32>)>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct NetworkFile {
    format: String,
    version: u32,
    input_size: usize,
    /// "mean_squared_error", "binary_cross_entropy" or "categorical_cross_entropy".
    loss: String,
    optimizer: OptimizerFile,
    seed: u64,
    layers: Vec<LayerFile>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OptimizerFile {
    /// "sgd" or "adam".
    kind: String,
    learning_rate: f32,
    weight_decay: f32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    momentum: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nesterov: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    betas: Option<[f32; 2]>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    epsilon: Option<f32>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LayerFile {
    units: usize,
    /// "identity", "relu", "leaky_relu", "sigmoid", "tanh" or "softmax".
    activation: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    leaky_slope: Option<f32>,
    /// `units` rows of `inputs` values: PyTorch's `nn.Linear.weight` layout.
    weights: Vec<Vec<f32>>,
    bias: Vec<f32>,
}

/// The file's name of an activation, and the leaky ReLU slope where there is one.
pub fn activation_name(a: Activation) -> (&'static str, Option<f32>) {
    match a {
        Activation::Identity => ("identity", None),
        Activation::Relu => ("relu", None),
        Activation::LeakyRelu(s) => ("leaky_relu", Some(s)),
        Activation::Sigmoid => ("sigmoid", None),
        Activation::Tanh => ("tanh", None),
        Activation::Softmax => ("softmax", None),
    }
}

/// The activation a file (or a JS caller) names; `slope` is leaky ReLU's, its default when
/// `None`.
pub fn parse_activation(name: &str, slope: Option<f32>) -> Option<Activation> {
    Some(match name {
        "identity" => Activation::Identity,
        "relu" => Activation::Relu,
        "leaky_relu" => Activation::LeakyRelu(slope.unwrap_or(Activation::LEAKY_RELU_DEFAULT)),
        "sigmoid" => Activation::Sigmoid,
        "tanh" => Activation::Tanh,
        "softmax" => Activation::Softmax,
        _ => return None,
    })
}

/// The file's name of a loss.
pub fn loss_name(l: Loss) -> &'static str {
    match l {
        Loss::MeanSquaredError => "mean_squared_error",
        Loss::BinaryCrossEntropy => "binary_cross_entropy",
        Loss::CategoricalCrossEntropy => "categorical_cross_entropy",
    }
}

/// The loss a file (or a JS caller) names.
pub fn parse_loss(name: &str) -> Option<Loss> {
    Some(match name {
        "mean_squared_error" => Loss::MeanSquaredError,
        "binary_cross_entropy" => Loss::BinaryCrossEntropy,
        "categorical_cross_entropy" => Loss::CategoricalCrossEntropy,
        _ => return None,
    })
}

fn bad(location: impl Into<String>, message: impl Into<String>) -> CoreError {
    CoreError::Checkpoint { location: location.into(), message: message.into() }
}

/// The file's text (pretty-printed JSON). Fails only if the parameters do not match the
/// configuration.
pub fn to_json(file: &DenseFile) -> Result<String> {
    let config = &file.config;
    config.validate()?;
    if file.parameters.len() != config.layers.len() {
        return Err(bad(
            "layers",
            format!("{} layers but {} parameter pairs", config.layers.len(), file.parameters.len()),
        ));
    }
    let opt = &file.optimizer;
    let optimizer = match opt.kind {
        OptimizerKind::Sgd { momentum, nesterov } => OptimizerFile {
            kind: "sgd".into(),
            learning_rate: opt.learning_rate(),
            weight_decay: opt.decay(),
            momentum: Some(momentum),
            nesterov: Some(nesterov),
            betas: None,
            epsilon: None,
        },
        OptimizerKind::Adam { beta1, beta2, epsilon } => OptimizerFile {
            kind: "adam".into(),
            learning_rate: opt.learning_rate(),
            weight_decay: opt.decay(),
            momentum: None,
            nesterov: None,
            betas: Some([beta1, beta2]),
            epsilon: Some(epsilon),
        },
    };
    let mut layers = Vec::new();
    for (l, (w, b)) in file.parameters.iter().enumerate() {
        let (fan_in, fan_out) = config.fan(l);
        crate::error::check_len("dense network file", "layer weights", w.len(), fan_in * fan_out)?;
        crate::error::check_len("dense network file", "layer bias", b.len(), fan_out)?;
        let (activation, leaky_slope) = activation_name(config.layers[l].activation);
        layers.push(LayerFile {
            units: fan_out,
            activation: activation.into(),
            leaky_slope,
            weights: w.chunks_exact(fan_in).map(<[f32]>::to_vec).collect(),
            bias: b.clone(),
        });
    }
    let out = NetworkFile {
        format: FORMAT.into(),
        version: VERSION,
        input_size: config.input_size,
        loss: loss_name(config.loss).into(),
        optimizer,
        seed: file.seed,
        layers,
    };
    serde_json::to_string_pretty(&out).map_err(|e| bad("network", e.to_string()))
}

/// Reads a file written by [`to_json`]: every error names the field (or the line and
/// column) that is wrong.
pub fn from_json(bytes: &[u8]) -> Result<DenseFile> {
    let json_err =
        |e: serde_json::Error| bad(format!("line {}, column {}", e.line(), e.column()), e.to_string());
    // The format and version first, so a file from a newer version says so instead of
    // failing on whatever field it added.
    let header: serde_json::Value = serde_json::from_slice(bytes).map_err(json_err)?;
    let format = header.get("format").and_then(|v| v.as_str());
    if format != Some(FORMAT) {
        return Err(bad(
            "format",
            format!("not a rusting_brain network file (format {format:?}, expected \"{FORMAT}\")"),
        ));
    }
    match header.get("version").and_then(|v| v.as_u64()) {
        Some(v) if v == VERSION as u64 => {}
        Some(v) if v > VERSION as u64 => {
            return Err(bad(
                "version",
                format!(
                    "written by a newer rusting_brain (file version {v}); this build reads version {VERSION}"
                ),
            ))
        }
        other => {
            return Err(bad(
                "version",
                format!("unsupported file version {other:?} (this build reads {VERSION})"),
            ))
        }
    }
    let file: NetworkFile = serde_json::from_value(header).map_err(json_err)?;
    let loss =
        parse_loss(&file.loss).ok_or_else(|| bad("loss", format!("unknown loss \"{}\"", file.loss)))?;
    let o = &file.optimizer;
    let optimizer = match o.kind.as_str() {
        "sgd" => Optimizer::sgd_momentum(o.learning_rate, o.momentum.unwrap_or(0.0))
            .nesterov(o.nesterov.unwrap_or(false)),
        "adam" => {
            let [b1, b2] = o.betas.unwrap_or([0.9, 0.999]);
            Optimizer::adam(o.learning_rate).betas(b1, b2).epsilon(o.epsilon.unwrap_or(1e-8))
        }
        other => return Err(bad("optimizer", format!("unknown optimizer \"{other}\""))),
    }
    .weight_decay(o.weight_decay);
    optimizer.validate().map_err(|e| bad("optimizer", e.to_string()))?;
    let mut layers = Vec::new();
    let mut parameters = Vec::new();
    let mut fan_in = file.input_size;
    for (l, layer) in file.layers.iter().enumerate() {
        let at = |field: &str| format!("layers[{l}].{field}");
        let activation = parse_activation(&layer.activation, layer.leaky_slope)
            .ok_or_else(|| bad(at("activation"), format!("unknown activation \"{}\"", layer.activation)))?;
        if layer.weights.len() != layer.units {
            return Err(bad(
                at("weights"),
                format!("{} rows for {} units", layer.weights.len(), layer.units),
            ));
        }
        if let Some((r, row)) = layer.weights.iter().enumerate().find(|(_, r)| r.len() != fan_in) {
            return Err(bad(
                at(&format!("weights[{r}]")),
                format!("{} values, the layer has {fan_in} inputs", row.len()),
            ));
        }
        if layer.bias.len() != layer.units {
            return Err(bad(at("bias"), format!("{} values for {} units", layer.bias.len(), layer.units)));
        }
        let flat: Vec<f32> = layer.weights.concat();
        if flat.iter().chain(&layer.bias).any(|v| !v.is_finite()) {
            return Err(bad(at("weights"), "a weight or bias is not finite"));
        }
        parameters.push((flat, layer.bias.clone()));
        layers.push(DenseLayer { units: layer.units, activation });
        fan_in = layer.units;
    }
    let config = DenseConfig { input_size: file.input_size, layers, loss };
    config.validate().map_err(|e| bad("layers", e.to_string()))?;
    Ok(DenseFile { config, optimizer, seed: file.seed, parameters })
}

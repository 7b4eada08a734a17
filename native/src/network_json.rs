//! The JSON file of a dense network: readable, exact (f32 values are written with as many
//! digits as it takes to read them back bit for bit), versioned.

use std::path::Path;

use rusting_brain_core::models::dense::{DenseConfig, DenseLayer, DenseModel};
use rusting_brain_core::{Activation, Backend, Loss, Optimizer, OptimizerKind};
use serde::{Deserialize, Serialize};

use crate::cpu::CpuBackend;
use crate::{Network, NetworkError, Result};

pub const FORMAT: &str = "rusting_brain.network";
pub const VERSION: u32 = 1;

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

fn activation_name(a: Activation) -> (&'static str, Option<f32>) {
    match a {
        Activation::Identity => ("identity", None),
        Activation::Relu => ("relu", None),
        Activation::LeakyRelu(s) => ("leaky_relu", Some(s)),
        Activation::Sigmoid => ("sigmoid", None),
        Activation::Tanh => ("tanh", None),
        Activation::Softmax => ("softmax", None),
    }
}

fn loss_name(l: Loss) -> &'static str {
    match l {
        Loss::MeanSquaredError => "mean_squared_error",
        Loss::BinaryCrossEntropy => "binary_cross_entropy",
        Loss::CategoricalCrossEntropy => "categorical_cross_entropy",
    }
}

pub fn save(network: &Network, path: &Path) -> Result<()> {
    let model = network.model()?;
    let config = model.config();
    let opt = network.optimizer;
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
        OptimizerKind::Adam {
            beta1,
            beta2,
            epsilon,
        } => OptimizerFile {
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
    for (l, (w, b)) in model.parameters()?.into_iter().enumerate() {
        let (fan_in, _) = config.fan(l);
        let (activation, leaky_slope) = activation_name(config.layers[l].activation);
        layers.push(LayerFile {
            units: config.layers[l].units,
            activation: activation.into(),
            leaky_slope,
            weights: w.chunks_exact(fan_in).map(<[f32]>::to_vec).collect(),
            bias: b,
        });
    }
    let file = NetworkFile {
        format: FORMAT.into(),
        version: VERSION,
        input_size: config.input_size,
        loss: loss_name(config.loss).into(),
        optimizer,
        seed: network.seed,
        layers,
    };
    let text = serde_json::to_string_pretty(&file).map_err(|e| NetworkError::InvalidInput(e.to_string()))?;
    crate::files::write_atomic(path, text.as_bytes())
}

pub fn load(path: &Path) -> Result<Network> {
    let bytes = crate::files::read(path)?;
    let json_err = |e: serde_json::Error| {
        NetworkError::parse(
            path,
            format!("line {}, column {}", e.line(), e.column()),
            e.to_string(),
        )
    };
    // Read the format and version first, so a file from a newer version says so instead of
    // failing on whatever field it added.
    let header: serde_json::Value = serde_json::from_slice(&bytes).map_err(json_err)?;
    let format = header.get("format").and_then(|v| v.as_str());
    if format != Some(FORMAT) {
        return Err(NetworkError::parse(
            path,
            "format",
            format!("not a rusting_brain network file (format {format:?}, expected \"{FORMAT}\")"),
        ));
    }
    match header.get("version").and_then(|v| v.as_u64()) {
        Some(v) if v == VERSION as u64 => {}
        Some(v) if v > VERSION as u64 => {
            return Err(NetworkError::parse(
                path,
                "version",
                format!(
                    "written by a newer rusting_brain (file version {v}); this build reads version {VERSION}"
                ),
            ))
        }
        other => {
            return Err(NetworkError::parse(
                path,
                "version",
                format!("unsupported file version {other:?} (this build reads {VERSION})"),
            ))
        }
    }
    let file: NetworkFile = serde_json::from_value(header).map_err(json_err)?;
    let bad = |location: String, message: String| NetworkError::parse(path, location, message);
    let loss = match file.loss.as_str() {
        "mean_squared_error" => Loss::MeanSquaredError,
        "binary_cross_entropy" => Loss::BinaryCrossEntropy,
        "categorical_cross_entropy" => Loss::CategoricalCrossEntropy,
        other => return Err(bad("loss".into(), format!("unknown loss \"{other}\""))),
    };
    let o = &file.optimizer;
    let mut optimizer = match o.kind.as_str() {
        "sgd" => Optimizer::sgd_momentum(o.learning_rate, o.momentum.unwrap_or(0.0))
            .nesterov(o.nesterov.unwrap_or(false)),
        "adam" => {
            let [b1, b2] = o.betas.unwrap_or([0.9, 0.999]);
            Optimizer::adam(o.learning_rate)
                .betas(b1, b2)
                .epsilon(o.epsilon.unwrap_or(1e-8))
        }
        other => return Err(bad("optimizer".into(), format!("unknown optimizer \"{other}\""))),
    };
    optimizer = optimizer.weight_decay(o.weight_decay);
    optimizer
        .validate()
        .map_err(|e| bad("optimizer".into(), e.to_string()))?;
    let cpu = CpuBackend::new();
    let mut layers = Vec::new();
    let (mut weights, mut biases) = (Vec::new(), Vec::new());
    let mut fan_in = file.input_size;
    for (l, layer) in file.layers.iter().enumerate() {
        let at = |field: &str| format!("layers[{l}].{field}");
        let activation = match (layer.activation.as_str(), layer.leaky_slope) {
            ("identity", _) => Activation::Identity,
            ("relu", _) => Activation::Relu,
            ("leaky_relu", s) => Activation::LeakyRelu(s.unwrap_or(Activation::LEAKY_RELU_DEFAULT)),
            ("sigmoid", _) => Activation::Sigmoid,
            ("tanh", _) => Activation::Tanh,
            ("softmax", _) => Activation::Softmax,
            (other, _) => return Err(bad(at("activation"), format!("unknown activation \"{other}\""))),
        };
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
            return Err(bad(
                at("bias"),
                format!("{} values for {} units", layer.bias.len(), layer.units),
            ));
        }
        let flat: Vec<f32> = layer.weights.concat();
        if flat.iter().chain(&layer.bias).any(|v| !v.is_finite()) {
            return Err(bad(at("weights"), "a weight or bias is not finite".into()));
        }
        weights.push(cpu.upload(&flat)?);
        biases.push(cpu.upload(&layer.bias)?);
        layers.push(DenseLayer {
            units: layer.units,
            activation,
        });
        fan_in = layer.units;
    }
    let config = DenseConfig {
        input_size: file.input_size,
        layers,
        loss,
    };
    config
        .validate()
        .map_err(|e| bad("layers".into(), e.to_string()))?;
    let model = DenseModel::from_parameters(cpu, config, weights, biases)?;
    Ok(Network::from_model(model, optimizer, file.seed))
}

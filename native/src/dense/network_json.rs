//! `Network::save_json` / `load_json`: core's dense network file (`dense_file`, the same
//! format the npm package's `toJSON()` / `Network.fromJSON()` write and read), on disk.

use std::path::Path;

use rusting_brain_core::models::dense::DenseModel;
use rusting_brain_core::models::dense_file::{self, DenseFile};
use rusting_brain_core::CoreError;

use crate::backend::cpu::CpuBackend;
use crate::{Network, NetworkError, Result};
use rusting_brain_core::backend::Memory;

pub fn save(network: &Network, path: &Path) -> Result<()> {
    let model = network.model()?;
    let file = DenseFile {
        config: model.config().clone(),
        optimizer: network.optimizer,
        seed: network.seed,
        parameters: model.parameters()?,
    };
    let text = dense_file::to_json(&file)?;
    crate::io::files::write_atomic(path, text.as_bytes())
}

pub fn load(path: &Path) -> Result<Network> {
    let bytes = crate::io::files::read(path)?;
    let file = dense_file::from_json(&bytes).map_err(|e| match e {
        CoreError::Checkpoint { location, message } => NetworkError::parse(path, location, message),
        other => other.into(),
    })?;
    let cpu = CpuBackend::new();
    let mut weights = Vec::new();
    let mut biases = Vec::new();
    for (w, b) in &file.parameters {
        weights.push(cpu.upload(w)?);
        biases.push(cpu.upload(b)?);
    }
    let model = DenseModel::from_parameters(cpu, file.config, weights, biases)?;
    Ok(Network::from_model(model, file.optimizer, file.seed))
}

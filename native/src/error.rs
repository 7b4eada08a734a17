use std::path::PathBuf;

use rusting_brain_core::CoreError;

/// The error type of `rusting_brain`: everything a user call can fail with, with the file,
/// line, field or step it concerns.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// A primitive rejected its input (shape, id, hyper-parameter) or a device failed.
    #[error(transparent)]
    Core(#[from] CoreError),
    /// A file could not be opened, read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// A file was read but its contents are not what they claim to be.
    #[error("{path}: {location}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Where in it: a field, a tensor's name, a line and column.
        location: String,
        /// What is wrong there.
        message: String,
    },
    /// The model configuration cannot be built.
    #[error("invalid network configuration: {0}")]
    InvalidConfig(String),
    /// An argument does not fit the model or the data (wrong width, empty data set, ...).
    #[error("{0}")]
    InvalidInput(String),
    /// Training stopped: the loss or a gradient stopped being finite, or a step failed.
    #[error("epoch {epoch}, batch {batch}: {source}")]
    Training {
        /// The epoch, counted from 1.
        epoch: usize,
        /// The batch within it, counted from 0.
        batch: usize,
        /// Why.
        source: CoreError,
    },
    /// A language-model step failed: the loss or a gradient stopped being finite. The
    /// weights were left as they were before the step.
    #[error("step {step}: {source}")]
    Step {
        /// The step, counted from 1.
        step: u64,
        /// Why.
        source: CoreError,
    },
    /// The GPU could not be used: no adapter, a model over its limits, a device error.
    #[error("GPU: {0}")]
    Gpu(String),
}

impl NetworkError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        NetworkError::Io { path: path.into(), source }
    }
    pub(crate) fn parse(
        path: impl Into<PathBuf>, location: impl Into<String>, message: impl Into<String>,
    ) -> Self {
        NetworkError::Parse { path: path.into(), location: location.into(), message: message.into() }
    }
}

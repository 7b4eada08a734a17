use rusting_brain_core::CoreError;

/// The error type of `rusting_brain`: everything a user call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// A primitive rejected its input (shape, id, hyper-parameter) or a device failed.
    #[error(transparent)]
    Core(#[from] CoreError),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

//! The `gpu` feature's glue: the int8 language model on wgpu lives in
//! `rusting_brain_shaders::lm` (shared with the browser build, where its reads are
//! awaited by the page); natively `TransformerLm` awaits them on its own thread.

use rusting_brain_shaders::ShaderError;

use crate::NetworkError;

impl From<ShaderError> for NetworkError {
    fn from(e: ShaderError) -> Self {
        match e {
            ShaderError::Core(c) => NetworkError::Core(c),
            ShaderError::Invalid(m) => NetworkError::InvalidInput(m),
            other => NetworkError::Gpu(other.to_string()),
        }
    }
}

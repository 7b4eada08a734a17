//! Reading and writing files: `config.json` files, atomic writes, Hugging Face folders (safetensors, sharded or
//! not, through memory maps), llama.cpp's GGUF files, the weight tables the loaders fill, and the precision weights
//! are stored at.

pub(crate) mod config;
pub(crate) mod files;
pub(crate) mod gguf;
pub(crate) mod hf;
pub(crate) mod precision;
pub(crate) mod weights;

//! Dense networks: `Network` over core's dense model, datasets and their loaders, JSON
//! and ONNX in and out.

pub(crate) mod dataset;
pub(crate) mod network;
pub(crate) mod network_json;
#[cfg(feature = "onnx")]
pub(crate) mod onnx;
pub(crate) mod onnx_export;

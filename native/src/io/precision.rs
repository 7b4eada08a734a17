//! The precision weights are stored and run at, for language models and image pipelines alike.

/// How weights are stored and run: in a checkpoint, and for a model or pipeline loaded at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// 4 bytes per weight, exact: what to resume training from.
    F32,
    /// 1 byte per weight (int8, one f32 scale per row; norm weights stay f32): for
    /// shipping a model that will only be run. Loads as a quantized model.
    Q8,
}

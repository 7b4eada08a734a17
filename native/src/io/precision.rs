//! The precision weights are stored and run at, for language models and image pipelines alike.

/// How weights are stored and run: in a checkpoint, and for a model or pipeline loaded at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// 4 bytes per weight, exact: what to resume training from.
    F32,
    /// About 1 byte per weight (int8 in blocks of 32 values, an f32 scale a block; norm
    /// weights stay f32): for shipping a model that will only be run. Loads as a quantized
    /// model.
    Q8,
    /// About half a byte per weight: a language model's block matrices, or an image
    /// pipeline's denoiser and prompt encoders' `Linear` matrices, at 4 bits in blocks of 32
    /// with 6-bit coded scales and offsets; a language model's embedding and output head
    /// stay int8 (core's `ops::q4` says why). Runs on the CPU backends.
    Q4,
}

impl Precision {
    /// Core's format for a quantized precision; `None` at F32.
    pub fn format(self) -> Option<rusting_brain_core::models::transformer::QuantFormat> {
        use rusting_brain_core::models::transformer::QuantFormat;
        match self {
            Precision::F32 => None,
            Precision::Q8 => Some(QuantFormat::Q8),
            Precision::Q4 => Some(QuantFormat::Q4),
        }
    }
}

/// The format an image model's `Linear` matrices are rounded to at `precision` (`None`:
/// f32). Every precision loads: the image models run on the CPU backend, whose products
/// read int8 and 4-bit weights alike.
pub(crate) fn image_format(precision: Precision) -> Option<rusting_brain_core::ops::q8::QuantFormat> {
    precision.format()
}

//! The precision weights are stored and run at, for language models and image pipelines alike.

/// How weights are stored and run: in a checkpoint, and for a model or pipeline loaded at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// 4 bytes per weight, exact: what to resume training from.
    F32,
    /// About 1 byte per weight (int8 in blocks of 32 values, an f32 scale a block; norm
    /// weights stay f32): for shipping a model that will only be run. Loads as a quantized
    /// model. An image denoiser's (UNet's, DiT's) matrices take one scale a row instead,
    /// each activation row rounded to int8 to meet them: on CPUs with AVX-512 VNNI its
    /// fastest path.
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

/// The format a denoiser's (UNet's, DiT's) `Linear` matrices are rounded to: at
/// [`Precision::Q8`] int8 with one scale a row, each activation row meeting them rounded to
/// int8 with its own (W8A8), which the CPU's VNNI GEMM multiplies at about twice its BF16
/// rate: the denoiser runs every step, the prompt encoders once, so these keep the blocks
/// (and 13-bit activations) that a T5's or a Qwen3's outliers want.
pub(crate) fn denoiser_format(precision: Precision) -> Option<rusting_brain_core::ops::q8::QuantFormat> {
    use rusting_brain_core::ops::q8::QuantFormat;
    match precision.format() {
        Some(QuantFormat::Q8) => Some(QuantFormat::Q8Rows),
        other => other,
    }
}

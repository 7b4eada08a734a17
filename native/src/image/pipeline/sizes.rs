//! What a pipeline folder holds, read from its configurations alone: each component's size,
//! and the flow-matching scheduler's settings.

use super::*;

/// The size of one component, from its configuration alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentSize {
    /// The folder (`transformer`, `text_encoder`, ...).
    pub name: String,
    /// The class `model_index.json` gives it.
    pub class: String,
    /// Parameters, as PyTorch counts them (buffers such as batch-norm statistics excluded).
    pub parameters: usize,
    /// Bytes its weights take in f32.
    pub f32_bytes: usize,
    /// Bytes at [`Precision::Q8`] as [`ImagePipeline::load_at`] holds it (the autoencoder
    /// stays f32).
    pub q8_bytes: usize,
    /// Bytes at [`Precision::Q4`] as [`ImagePipeline::load_at`] holds it (the same
    /// matrices at 4 bits; a language-model encoder's embedding stays int8).
    pub q4_bytes: usize,
}

/// The size of every component of the pipeline in `dir` this library computes, read from
/// the `config.json` files alone: no weight file is opened, so a published pipeline's
/// folder with only its configurations is enough.
pub fn component_sizes(dir: impl AsRef<Path>) -> Result<Vec<ComponentSize>> {
    let folder = PipelineFolder::open(dir)?;
    let mut out = Vec::new();
    // Linear weights are quantized; embedding tables and T5's bias table stay f32, as loaded.
    let linear = |n: &str, shape: &[usize]| shape.len() == 2 && n.ends_with(".weight");
    use rusting_brain_core::ops::q8::QuantFormat::{Q8Rows, Q4, Q8};
    for (name, c) in folder.components() {
        let config = c.dir.join("config.json");
        let (parameters, f32_bytes, q8_bytes, q4_bytes) = match c.class.as_str() {
            "FluxTransformer2DModel" | "Flux2Transformer2DModel" | "SD3Transformer2DModel" => {
                let l = crate::image::dit::dit_config(&config)?.layout();
                // SD3's position table is a stored buffer, not a parameter.
                let table: usize = l
                    .tensors
                    .iter()
                    .filter(|(n, _)| n == "pos_embed.pos_embed")
                    .map(|(_, s)| s.iter().product::<usize>())
                    .sum();
                let all = l.parameter_count();
                (all - table, 4 * all, l.quant_bytes(Q8Rows, linear), l.quant_bytes(Q4, linear))
            }
            "UNet2DConditionModel" => {
                let l = crate::image::unet::unet_config(&config)?.layout();
                let all = l.parameter_count();
                // The convolutions' weights are int8 rows at Q8 and at Q4 alike: at Q4 the
                // matrices' 4-bit bytes, the convolutions' int8 ones, the rest f32.
                let conv = |n: &str, s: &[usize]| s.len() == 4 && n.ends_with(".weight");
                let both = |n: &str, s: &[usize]| linear(n, s) || conv(n, s);
                let q4 = l.quant_bytes(Q4, linear) + l.quant_bytes(Q8Rows, conv) - 4 * all;
                (all, 4 * all, l.quant_bytes(Q8Rows, both), q4)
            }
            "CLIPTextModel" | "CLIPTextModelWithProjection" => {
                let l = crate::image::encoders::clip_config(&config)?.layout();
                let pick = |n: &str, s: &[usize]| linear(n, s) && !n.contains("embedding");
                let all = l.parameter_count();
                (all, 4 * all, l.quant_bytes(Q8, pick), l.quant_bytes(Q4, pick))
            }
            "T5EncoderModel" => {
                let l = crate::image::encoders::t5_config(&config)?.layout();
                let pick = |n: &str, s: &[usize]| {
                    linear(n, s) && n != "shared.weight" && !n.contains("relative_attention_bias")
                };
                let all = l.parameter_count();
                (all, 4 * all, l.quant_bytes(Q8, pick), l.quant_bytes(Q4, pick))
            }
            "Qwen3ForCausalLM" | "Qwen2ForCausalLM" | "LlamaForCausalLM" => {
                use rusting_brain_core::models::transformer::{format_of, TensorKind};
                let cfg = crate::io::hf::read_config(&c.dir)?;
                let specs = cfg.layout().into_named();
                let count: usize = specs.iter().map(|(_, t)| t.len()).sum();
                // Each matrix in the format `from_pretrained_at` gives it (at Q4 the
                // embedding and the head stay int8).
                let bytes = |format| -> usize {
                    specs
                        .iter()
                        .map(|(name, t)| match (t.kind, t.shape.len(), format_of(format, name)) {
                            (TensorKind::Matrix, 2, Q8) => {
                                let (rows, cols) = t.rows_cols();
                                rusting_brain_core::ops::q8::q8_bytes(rows, cols)
                            }
                            (TensorKind::Matrix, 2, Q4) => {
                                let (rows, cols) = t.rows_cols();
                                rusting_brain_core::ops::q4::q4_bytes(rows, cols)
                            }
                            _ => 4 * t.len(),
                        })
                        .sum()
                };
                (count, 4 * count, bytes(Q8), bytes(Q4))
            }
            "AutoencoderKL" | "AutoencoderKLFlux2" => {
                let l = crate::image::vae::vae_config(&config)?.layout();
                // Batch-norm statistics are buffers, not parameters.
                let stats: usize = l
                    .tensors
                    .iter()
                    .filter(|(n, _)| n.starts_with("bn.running_"))
                    .map(|(_, s)| s.iter().product::<usize>())
                    .sum();
                let all = l.parameter_count();
                (all - stats, 4 * all, 4 * all, 4 * all)
            }
            _ => continue,
        };
        out.push(ComponentSize {
            name: name.clone(),
            class: c.class.clone(),
            parameters,
            f32_bytes,
            q8_bytes,
            q4_bytes,
        });
    }
    Ok(out)
}

/// Reads a `FlowMatchEulerDiscreteScheduler`'s `scheduler_config.json`, refusing the
/// options this sampler does not compute.
pub fn flow_match_config(path: &Path) -> Result<FlowMatchConfig> {
    match crate::image::scheduler::scheduler_config(path)? {
        crate::image::scheduler::SchedulerConfig::FlowMatch(c) => Ok(c),
        crate::image::scheduler::SchedulerConfig::Discrete(..) => Err(NetworkError::parse(
            path,
            "_class_name",
            "the transformer pipelines sample with FlowMatchEulerDiscreteScheduler",
        )),
    }
}

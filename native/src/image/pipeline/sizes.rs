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
}

/// The size of every component of the pipeline in `dir` this library computes, read from
/// the `config.json` files alone: no weight file is opened, so a published pipeline's
/// folder with only its configurations is enough.
pub fn component_sizes(dir: impl AsRef<Path>) -> Result<Vec<ComponentSize>> {
    let folder = PipelineFolder::open(dir)?;
    let mut out = Vec::new();
    // Linear weights go int8; embedding tables and T5's bias table stay f32, as loaded.
    let linear = |n: &str, shape: &[usize]| shape.len() == 2 && n.ends_with(".weight");
    for (name, c) in folder.components() {
        let config = c.dir.join("config.json");
        let (parameters, f32_bytes, q8_bytes) = match c.class.as_str() {
            "FluxTransformer2DModel" | "Flux2Transformer2DModel" | "SD3Transformer2DModel" => {
                let l = crate::image::dit::dit_config(&config)?.layout();
                // SD3's position table is a stored buffer, not a parameter.
                let table: usize = l
                    .tensors
                    .iter()
                    .filter(|(n, _)| n == "pos_embed.pos_embed")
                    .map(|(_, s)| s.iter().product::<usize>())
                    .sum();
                (l.parameter_count() - table, 4 * l.parameter_count(), l.q8_bytes(linear))
            }
            "UNet2DConditionModel" => {
                let l = crate::image::unet::unet_config(&config)?.layout();
                (l.parameter_count(), 4 * l.parameter_count(), l.q8_bytes(linear))
            }
            "CLIPTextModel" | "CLIPTextModelWithProjection" => {
                let l = crate::image::encoders::clip_config(&config)?.layout();
                let q = l.q8_bytes(|n, s| linear(n, s) && !n.contains("embedding"));
                (l.parameter_count(), 4 * l.parameter_count(), q)
            }
            "T5EncoderModel" => {
                let l = crate::image::encoders::t5_config(&config)?.layout();
                let q = l.q8_bytes(|n, s| {
                    linear(n, s) && n != "shared.weight" && !n.contains("relative_attention_bias")
                });
                (l.parameter_count(), 4 * l.parameter_count(), q)
            }
            "Qwen3ForCausalLM" | "Qwen2ForCausalLM" | "LlamaForCausalLM" => {
                let cfg = crate::io::hf::read_config(&c.dir)?;
                let specs = cfg.layout().into_leaves();
                let count: usize = specs.iter().map(|t| t.len()).sum();
                let q8: usize = specs
                    .iter()
                    .map(|t| match (t.kind, t.shape.len()) {
                        (rusting_brain_core::models::transformer::TensorKind::Matrix, 2) => {
                            let (rows, cols) = t.rows_cols();
                            rusting_brain_core::ops::q8::q8_bytes(rows, cols)
                        }
                        _ => 4 * t.len(),
                    })
                    .sum();
                (count, 4 * count, q8)
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
                (all - stats, 4 * all, 4 * all)
            }
            _ => continue,
        };
        out.push(ComponentSize {
            name: name.clone(),
            class: c.class.clone(),
            parameters,
            f32_bytes,
            q8_bytes,
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

//! Text to image with the rectified-flow transformers, from a published pipeline folder:
//! FLUX.1 (`FluxPipeline`: CLIP's pooled vector and T5's states), FLUX.2-klein
//! (`Flux2KleinPipeline`: Qwen3 layer states over the chat-templated prompt) and Stable
//! Diffusion 3 (`StableDiffusion3Pipeline`: two CLIP towers side by side, padded to T5's
//! width, T5's states after them in one sequence).
//!
//! A run is three parts, usable one at a time: [`ImagePipeline::condition`] (the prompt
//! encoders), [`ImagePipeline::sample_latent`] (the denoiser and the flow-matching
//! sampler) and [`ImagePipeline::decode`] (the autoencoder). Each mirrors diffusers'
//! pipeline of the same family step for step, so a seed gives diffusers' latent noise
//! (PyTorch's CPU generator, reproduced) and the same picture.

use std::path::Path;

use rusting_brain_core::diffusion::flow_match::{flux2_empirical_mu, FlowMatchConfig, FlowMatchEuler};
use rusting_brain_core::diffusion::torch_randn::TorchGenerator;
use rusting_brain_core::models::dit::{DitInput, DitKind, DitLatent};
use rusting_brain_core::ops::spatial::{patchify, unpatchify, PatchOrder, PatchSpec};

use crate::image::dit::Dit;
use crate::image::folder::PipelineFolder;
use crate::image::scheduler::SchedulerConfig;
use crate::image::unet::Unet;
use crate::image::vae::{Image, Vae};
use crate::io::config::Config;
use crate::{NetworkError, Precision, Result};
use rusting_brain_core::diffusion::discrete::DiscreteSampler;

// The pipeline's parts by job: what a folder holds, the prompt encoders of each family,
// and the denoising loop.
mod denoise;
mod prompts;
mod sizes;

use prompts::PromptEncoder;

pub use sizes::*;

use denoise::clock_seed;

/// How a sampling step is taken: DDIM, Euler, Euler ancestral or DPM++ 2M for the UNets;
/// the flow-matching transformers step with Euler (`FlowMatchEulerDiscreteScheduler`).
pub use rusting_brain_core::diffusion::discrete::Solver;

/// What diffusers takes as call arguments rather than configuration, with its defaults for
/// the folder's pipeline ([`ImagePipeline::load`] fills them in).
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineConfig {
    /// Denoising steps (FLUX.1 28, FLUX.2-klein 4 distilled or 50 base, SD3 28).
    pub steps: usize,
    /// FLUX.1 dev: the strength fed to the guidance embedding (3.5). FLUX.2 base and SD3:
    /// the classifier-free guidance scale (4.0, 7.0), off at 1 or below. Distilled
    /// FLUX.2-klein ignores it.
    pub guidance_scale: f32,
    /// Tokens of the T5 / Qwen3 prompt (512, SD3 256).
    pub max_sequence_length: usize,
    /// FLUX.2-klein: the Qwen3 layers whose states are stacked (9, 18, 27).
    pub text_encoder_layers: Vec<usize>,
    /// What the unconditional half of classifier-free guidance encodes ("" by default).
    pub negative_prompt: String,
    /// How the denoising steps are taken (the folder's scheduler unless changed).
    pub solver: Solver,
}

/// Which family a folder holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// FLUX.1 (dev, schnell): double- and single-stream blocks, CLIP + T5 prompts.
    Flux,
    /// FLUX.2 (klein): shared modulation, a Qwen3 prompt encoder.
    Flux2,
    /// Stable Diffusion 3 and 3.5 (MMDiT): two CLIP towers and T5.
    Sd3,
    /// Stable Diffusion 1.x and 2.x (`StableDiffusionPipeline`).
    Sd,
    /// Stable Diffusion XL (`StableDiffusionXLPipeline`).
    Sdxl,
}

impl Family {
    /// The family of a pipeline class (`model_index.json`'s `_class_name`).
    pub fn of_class(class_name: &str) -> Option<Family> {
        Some(match class_name {
            "FluxPipeline" | "FluxImg2ImgPipeline" => Family::Flux,
            "Flux2KleinPipeline" => Family::Flux2,
            "StableDiffusion3Pipeline" | "StableDiffusion3Img2ImgPipeline" => Family::Sd3,
            "StableDiffusionPipeline" | "StableDiffusionImg2ImgPipeline" => Family::Sd,
            "StableDiffusionXLPipeline" | "StableDiffusionXLImg2ImgPipeline" => Family::Sdxl,
            _ => return None,
        })
    }

    /// The transformer a flow-matching family denoises with; `None` for the UNet families.
    pub fn dit_kind(self) -> Option<DitKind> {
        match self {
            Family::Flux => Some(DitKind::Flux),
            Family::Flux2 => Some(DitKind::Flux2),
            Family::Sd3 => Some(DitKind::Sd3),
            Family::Sd | Family::Sdxl => None,
        }
    }

    /// FLUX: the side of the latent squares packed into one token (FLUX.1 2x2; FLUX.2's
    /// latents arrive patchified, one pixel a token); `None` where the denoiser takes the
    /// latent image.
    pub fn token_patch(self) -> Option<usize> {
        match self {
            Family::Flux => Some(2),
            Family::Flux2 => Some(1),
            Family::Sd3 | Family::Sd | Family::Sdxl => None,
        }
    }

    /// img2img: the autoencoder's latent mean is the start (FLUX.2), not a sample drawn from
    /// the seed's generator before the noise (FLUX.1, SD3, SD).
    pub fn img2img_from_mean(self) -> bool {
        self == Family::Flux2
    }

    /// FLUX.2: the prompt tokens' positions count along the last rotary axis (FLUX.1's are
    /// all zero).
    pub fn numbers_prompt_tokens(self) -> bool {
        self == Family::Flux2
    }

    /// What the sampler's timestep (0..1000) is divided by before the denoiser sees it:
    /// FLUX's pipelines pass t / 1000 (the model scales back), SD3's and the UNets' t.
    pub fn timestep_divisor(self) -> f32 {
        match self {
            Family::Flux | Family::Flux2 => 1000.0,
            Family::Sd3 | Family::Sd | Family::Sdxl => 1.0,
        }
    }

    /// diffusers' call defaults for the family (`distilled`: FLUX.2-klein's
    /// `is_distilled`; `solver`: the folder's scheduler).
    fn defaults(self, distilled: bool, solver: Solver) -> PipelineConfig {
        let (steps, guidance_scale, max_sequence_length) = match self {
            Family::Flux => (28, 3.5, 512),
            Family::Flux2 if distilled => (4, 1.0, 512),
            Family::Flux2 => (50, 4.0, 512),
            Family::Sd3 => (28, 7.0, 256),
            Family::Sd => (50, 7.5, 77),
            Family::Sdxl => (50, 5.0, 77),
        };
        PipelineConfig {
            steps,
            guidance_scale,
            max_sequence_length,
            text_encoder_layers: if self == Family::Flux2 { vec![9, 18, 27] } else { Vec::new() },
            negative_prompt: String::new(),
            solver: if self.dit_kind().is_some() { Solver::Euler } else { solver },
        }
    }
}

/// One prompt, encoded for the denoiser.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptEmbedding {
    /// `(tokens, width)`: the per-token states the transformer attends to.
    pub states: Vec<f32>,
    /// Rows of `states`.
    pub tokens: usize,
    /// The pooled vector (FLUX.1: CLIP's; SD3: both towers' projections side by side).
    pub pooled: Option<Vec<f32>>,
}

/// What [`ImagePipeline::condition`] returns: the prompt, and the negative prompt when the
/// run uses classifier-free guidance.
#[derive(Debug, Clone, PartialEq)]
pub struct Conditioning {
    /// The prompt's encoding.
    pub prompt: PromptEmbedding,
    /// The negative prompt's, with classifier-free guidance.
    pub negative: Option<PromptEmbedding>,
}

/// A latent picture as the denoiser sees it, `(channels, height, width)`: FLUX.1 and SD3,
/// the autoencoder's latent shifted and scaled; FLUX.2, patchified 2x2 and normalized.
#[derive(Debug, Clone, PartialEq)]
pub struct Latent {
    /// `channels x height x width` values.
    pub data: Vec<f32>,
    /// Latent channels.
    pub channels: usize,
    /// Latent rows.
    pub height: usize,
    /// Latent columns.
    pub width: usize,
}

/// Where the starting noise comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Noise {
    /// PyTorch's CPU `torch.Generator().manual_seed(seed)`, drawn in the order diffusers
    /// draws (img2img: the autoencoder's latent sample first, then the noise), so a seed
    /// gives diffusers' picture.
    Seed(u64),
    /// The noise itself, in the latent's layout; img2img then encodes the image to its
    /// latent mean rather than a sample.
    Given(Vec<f32>),
}

/// The training schedule the folder's scheduler describes.
#[derive(Debug, Clone)]
enum NoiseSchedule {
    Flow(FlowMatchConfig),
    /// The scheduler's file, read for whichever solver runs (as diffusers' `from_config`).
    Discrete(std::path::PathBuf),
}

/// A text-to-image pipeline on the CPU; see the module documentation.
pub struct ImagePipeline {
    family: Family,
    /// The call-time settings; change them between runs.
    pub config: PipelineConfig,
    scheduler: NoiseSchedule,
    distilled: bool,
    /// SD-XL: the negative prompt is zeros when it is empty.
    force_zeros_for_empty_prompt: bool,
    encoders: Option<Box<dyn PromptEncoder>>,
    dit: Option<Dit>,
    unet: Option<Unet>,
    vae: Vae,
}

impl ImagePipeline {
    /// The pipeline in `dir` (with `model_index.json`), every part in f32.
    pub fn load(dir: impl AsRef<Path>) -> Result<ImagePipeline> {
        ImagePipeline::load_at(dir, Precision::F32)
    }
    /// [`ImagePipeline::load`] with the denoiser and the prompt encoders at `precision`
    /// ([`Precision::Q8`]: one byte a weight for every matrix, a quarter of the memory).
    /// The autoencoder stays f32: it is small, and its convolutions are sensitive.
    pub fn load_at(dir: impl AsRef<Path>, precision: Precision) -> Result<ImagePipeline> {
        let folder = PipelineFolder::open(dir)?;
        let family = Family::of_class(folder.class_name()).ok_or_else(|| {
            NetworkError::InvalidInput(format!(
                "{}: a {}; this loader reads FluxPipeline, Flux2KleinPipeline, StableDiffusion3Pipeline, \
                 StableDiffusionPipeline and StableDiffusionXLPipeline",
                folder.root().display(),
                folder.class_name()
            ))
        })?;
        let unet_family = family.dit_kind().is_none();
        let index_path = folder.root().join("model_index.json");
        let index = Config::read(&index_path)?;
        let distilled = index.flag("is_distilled", false)?;
        let force_zeros_for_empty_prompt = index.flag("force_zeros_for_empty_prompt", true)?;
        let scheduler_classes = [
            "FlowMatchEulerDiscreteScheduler",
            "DDIMScheduler",
            "PNDMScheduler",
            "EulerDiscreteScheduler",
            "EulerAncestralDiscreteScheduler",
            "DPMSolverMultistepScheduler",
        ];
        let scheduler_dir = &folder.require("scheduler", &scheduler_classes)?.dir;
        let scheduler_path = scheduler_dir.join("scheduler_config.json");
        let (scheduler, solver) =
            match (crate::image::scheduler::scheduler_config(&scheduler_path)?, unet_family) {
                (SchedulerConfig::FlowMatch(c), false) => (NoiseSchedule::Flow(c), Solver::Euler),
                (SchedulerConfig::Discrete(solver, _), true) => {
                    (NoiseSchedule::Discrete(scheduler_path.clone()), solver)
                }
                _ => {
                    return Err(NetworkError::parse(
                        &scheduler_path,
                        "_class_name",
                        format!(
                            "a {} samples with {}",
                            folder.class_name(),
                            if unet_family {
                                "DDIM, Euler, Euler ancestral or DPM-Solver multistep"
                            } else {
                                "FlowMatchEulerDiscreteScheduler"
                            }
                        ),
                    ))
                }
            };
        let (dit, unet) = if unet_family {
            let dir = &folder.require("unet", &["UNet2DConditionModel"])?.dir;
            (None, Some(Unet::load_at(dir, precision)?))
        } else {
            let transformer_classes =
                ["FluxTransformer2DModel", "Flux2Transformer2DModel", "SD3Transformer2DModel"];
            let dit = Dit::load_at(&folder.require("transformer", &transformer_classes)?.dir, precision)?;
            if Some(dit.config().kind) != family.dit_kind() {
                return Err(NetworkError::InvalidInput(format!(
                    "{}: the transformer is a {:?} model in a {} folder",
                    folder.root().display(),
                    dit.config().kind,
                    folder.class_name()
                )));
            }
            (Some(dit), None)
        };
        let vae = folder.vae()?;
        let config = family.defaults(distilled, solver);
        let encoders = prompts::load(family, &folder, precision)?;
        Ok(ImagePipeline {
            family,
            config,
            scheduler,
            distilled,
            force_zeros_for_empty_prompt,
            encoders: Some(encoders),
            dit,
            unet,
            vae,
        })
    }
    /// Which model family the folder holds.
    pub fn family(&self) -> Family {
        self.family
    }
    /// The denoiser, while it is held.
    pub fn dit(&self) -> Option<&Dit> {
        self.dit.as_ref()
    }
    /// The autoencoder.
    pub fn vae(&self) -> &Vae {
        &self.vae
    }
    /// Bytes the weights of the parts still held take: the denoiser, the prompt encoders
    /// and the autoencoder.
    pub fn weight_bytes(&self) -> usize {
        let encoders = self.encoders.as_ref().map_or(0, |e| e.weight_bytes());
        encoders
            + self.dit.as_ref().map_or(0, Dit::weight_bytes)
            + self.unet.as_ref().map_or(0, Unet::weight_bytes)
            + self.vae.weight_bytes()
    }
    /// Bytes of the denoiser and the prompt encoders alone (what [`Precision::Q8`] shrinks).
    pub fn model_bytes(&self) -> usize {
        self.weight_bytes() - self.vae.weight_bytes()
    }
    /// Drops the prompt encoders (after [`ImagePipeline::condition`], when memory is short).
    pub fn drop_encoders(&mut self) {
        self.encoders = None;
    }
    /// Mixed precision for the denoiser and the autoencoder (see
    /// [`Unet::set_mixed_precision`]); the prompt encoders, run once a prompt, stay as
    /// loaded.
    pub fn set_mixed_precision(&mut self, on: bool) {
        if let Some(dit) = &mut self.dit {
            dit.set_mixed_precision(on);
        }
        if let Some(unet) = &mut self.unet {
            unet.set_mixed_precision(on);
        }
        self.vae.set_mixed_precision(on);
    }
    /// Drops the denoiser (after [`ImagePipeline::sample_latent`]).
    pub fn drop_denoiser(&mut self) {
        self.dit = None;
        self.unet = None;
    }
    /// The UNet, while it is held (Stable Diffusion 1.x, 2.x, XL).
    pub fn unet(&self) -> Option<&Unet> {
        self.unet.as_ref()
    }
    /// Whether a run takes classifier-free guidance (two denoiser passes a step).
    pub fn uses_cfg(&self) -> bool {
        match self.family {
            Family::Flux => false,
            Family::Flux2 => !self.distilled && self.config.guidance_scale > 1.0,
            Family::Sd3 | Family::Sd | Family::Sdxl => self.config.guidance_scale > 1.0,
        }
    }
    /// Encodes `prompt` (and the negative prompt when the run uses classifier-free
    /// guidance) as the family's pipeline does.
    pub fn condition(&mut self, prompt: &str) -> Result<Conditioning> {
        let negative = self.uses_cfg().then(|| self.config.negative_prompt.clone());
        let prompt = self.encode_prompt(prompt)?;
        let negative = match negative {
            // SD-XL's pipeline feeds zeros, not the empty prompt's states, by default.
            Some(n) if n.is_empty() && self.family == Family::Sdxl && self.force_zeros_for_empty_prompt => {
                Some(PromptEmbedding {
                    states: vec![0.0; prompt.states.len()],
                    tokens: prompt.tokens,
                    pooled: prompt.pooled.as_ref().map(|p| vec![0.0; p.len()]),
                })
            }
            Some(n) => Some(self.encode_prompt(&n)?),
            None => None,
        };
        Ok(Conditioning { prompt, negative })
    }
    fn encode_prompt(&mut self, prompt: &str) -> Result<PromptEmbedding> {
        let joint = self.dit.as_ref().map_or(0, |d| d.config().joint_attention_dim);
        let encoders = self.encoders.as_mut().ok_or_else(|| {
            NetworkError::InvalidInput("the prompt encoders were dropped (drop_encoders)".into())
        })?;
        encoders.encode(prompt, &self.config, joint)
    }
    /// The picture of a denoised latent, in [-1, 1].
    pub fn decode(&self, latent: &Latent) -> Result<Image> {
        let (z, h, w) = self.vae.from_denoiser(&latent.data, 1, latent.height, latent.width)?;
        self.vae.decode_image(&z, h, w)
    }
    /// `prompt` to a `width x height` picture in [-1, 1]: condition, sample, decode.
    /// `seed` `None` draws one from the clock.
    pub fn generate(
        &mut self, prompt: &str, width: usize, height: usize, seed: Option<u64>,
        progress: impl FnMut(usize, usize) -> bool,
    ) -> Result<Image> {
        self.latent_shape(width, height)?;
        let cond = self.condition(prompt)?;
        let latent =
            self.sample_latent(&cond, width, height, Noise::Seed(seed.unwrap_or_else(clock_seed)), progress)?;
        self.decode(&latent)
    }
    /// img2img: `image` (in [-1, 1]) repainted towards `prompt`; `strength` in [0, 1] is
    /// how far back up the schedule it starts (low keeps the composition).
    pub fn generate_from_image(
        &mut self, image: &Image, strength: f32, prompt: &str, seed: Option<u64>,
        progress: impl FnMut(usize, usize) -> bool,
    ) -> Result<Image> {
        self.latent_shape(image.width, image.height)?;
        let cond = self.condition(prompt)?;
        let noise = Noise::Seed(seed.unwrap_or_else(clock_seed));
        let latent = self.sample_latent_from_image(&cond, image, strength, noise, progress)?;
        self.decode(&latent)
    }
}

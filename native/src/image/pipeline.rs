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
use crate::image::encoders::Config;
use crate::image::folder::PipelineFolder;
use crate::image::scheduler::SchedulerConfig;
use crate::image::unet::Unet;
use crate::image::vae::{Image, Vae};
use crate::{
    ClipTextEncoder, ClipTokenizer, NetworkError, Precision, PromptTokenizer, Result, T5Encoder, TextEncoder,
};
use rusting_brain_core::diffusion::discrete::DiscreteSampler;

// The pipeline's parts by job: what a folder holds, and the denoising loop.
mod denoise;
mod sizes;

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

// One value a pipeline, held for its whole life: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
enum Encoders {
    Flux {
        clip: ClipTextEncoder,
        clip_tokenizer: ClipTokenizer,
        t5: T5Encoder,
        t5_tokenizer: PromptTokenizer,
    },
    Flux2 {
        qwen: TextEncoder,
        tokenizer: PromptTokenizer,
    },
    Sd3 {
        clip_l: ClipTextEncoder,
        clip_g: ClipTextEncoder,
        tokenizer_l: ClipTokenizer,
        tokenizer_g: ClipTokenizer,
        t5: Option<(T5Encoder, PromptTokenizer)>,
    },
    Sd {
        clip: ClipTextEncoder,
        tokenizer: ClipTokenizer,
    },
    Sdxl {
        clip_l: ClipTextEncoder,
        clip_g: ClipTextEncoder,
        tokenizer_l: ClipTokenizer,
        tokenizer_g: ClipTokenizer,
    },
}

/// The training schedule the folder's scheduler describes.
#[derive(Debug, Clone)]
enum Schedule {
    Flow(FlowMatchConfig),
    /// The scheduler's file, read for whichever solver runs (as diffusers' `from_config`).
    Discrete(std::path::PathBuf),
}

/// A text-to-image pipeline on the CPU; see the module documentation.
pub struct ImagePipeline {
    family: Family,
    /// The call-time settings; change them between runs.
    pub config: PipelineConfig,
    scheduler: Schedule,
    distilled: bool,
    /// SD-XL: the negative prompt is zeros when it is empty.
    force_zeros_for_empty_prompt: bool,
    encoders: Option<Encoders>,
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
        let family = match folder.class_name() {
            "FluxPipeline" | "FluxImg2ImgPipeline" => Family::Flux,
            "Flux2KleinPipeline" => Family::Flux2,
            "StableDiffusion3Pipeline" | "StableDiffusion3Img2ImgPipeline" => Family::Sd3,
            "StableDiffusionPipeline" | "StableDiffusionImg2ImgPipeline" => Family::Sd,
            "StableDiffusionXLPipeline" | "StableDiffusionXLImg2ImgPipeline" => Family::Sdxl,
            other => {
                return Err(NetworkError::InvalidInput(format!(
                    "{}: a {other}; this loader reads FluxPipeline, Flux2KleinPipeline, StableDiffusion3Pipeline, \
                     StableDiffusionPipeline and StableDiffusionXLPipeline",
                    folder.root().display()
                )))
            }
        };
        let unet_family = matches!(family, Family::Sd | Family::Sdxl);
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
                (SchedulerConfig::FlowMatch(c), false) => (Schedule::Flow(c), Solver::Euler),
                (SchedulerConfig::Discrete(solver, _), true) => {
                    (Schedule::Discrete(scheduler_path.clone()), solver)
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
            let want_kind = match family {
                Family::Flux => DitKind::Flux,
                Family::Flux2 => DitKind::Flux2,
                _ => DitKind::Sd3,
            };
            if dit.config().kind != want_kind {
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
        let config = match family {
            Family::Flux => PipelineConfig {
                steps: 28,
                guidance_scale: 3.5,
                max_sequence_length: 512,
                text_encoder_layers: Vec::new(),
                negative_prompt: String::new(),
                solver: Solver::Euler,
            },
            Family::Flux2 => PipelineConfig {
                steps: if distilled { 4 } else { 50 },
                guidance_scale: if distilled { 1.0 } else { 4.0 },
                max_sequence_length: 512,
                text_encoder_layers: vec![9, 18, 27],
                negative_prompt: String::new(),
                solver: Solver::Euler,
            },
            Family::Sd3 => PipelineConfig {
                steps: 28,
                guidance_scale: 7.0,
                max_sequence_length: 256,
                text_encoder_layers: Vec::new(),
                negative_prompt: String::new(),
                solver: Solver::Euler,
            },
            Family::Sd | Family::Sdxl => PipelineConfig {
                steps: 50,
                guidance_scale: if family == Family::Sd { 7.5 } else { 5.0 },
                max_sequence_length: 77,
                text_encoder_layers: Vec::new(),
                negative_prompt: String::new(),
                solver,
            },
        };
        let clip_classes = ["CLIPTextModel", "CLIPTextModelWithProjection"];
        let clip = |name: &str| -> Result<ClipTextEncoder> {
            ClipTextEncoder::load_at(&folder.require(name, &clip_classes)?.dir, precision)
        };
        let encoders = match family {
            Family::Flux => Encoders::Flux {
                clip: clip("text_encoder")?,
                clip_tokenizer: folder.clip_tokenizer("tokenizer")?,
                t5: T5Encoder::load_at(
                    &folder.require("text_encoder_2", &["T5EncoderModel"])?.dir,
                    precision,
                )?,
                t5_tokenizer: folder.prompt_tokenizer("tokenizer_2")?,
            },
            Family::Flux2 => {
                let classes = ["Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM"];
                let dir = &folder.require("text_encoder", &classes)?.dir;
                // Which layers are read is a call argument (config.text_encoder_layers),
                // set on the encoder at each condition().
                Encoders::Flux2 {
                    qwen: TextEncoder::load_at(dir, precision, &[1])?,
                    tokenizer: folder.prompt_tokenizer("tokenizer")?,
                }
            }
            Family::Sd3 => {
                let t5 = match folder.component("text_encoder_3") {
                    Some(_) => Some((
                        T5Encoder::load_at(
                            &folder.require("text_encoder_3", &["T5EncoderModel"])?.dir,
                            precision,
                        )?,
                        folder.prompt_tokenizer("tokenizer_3")?,
                    )),
                    None => None,
                };
                Encoders::Sd3 {
                    clip_l: clip("text_encoder")?,
                    clip_g: clip("text_encoder_2")?,
                    tokenizer_l: folder.clip_tokenizer("tokenizer")?,
                    tokenizer_g: folder.clip_tokenizer("tokenizer_2")?,
                    t5,
                }
            }
            Family::Sd => {
                Encoders::Sd { clip: clip("text_encoder")?, tokenizer: folder.clip_tokenizer("tokenizer")? }
            }
            Family::Sdxl => Encoders::Sdxl {
                clip_l: clip("text_encoder")?,
                clip_g: clip("text_encoder_2")?,
                tokenizer_l: folder.clip_tokenizer("tokenizer")?,
                tokenizer_g: folder.clip_tokenizer("tokenizer_2")?,
            },
        };
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
        let encoders = match &self.encoders {
            Some(Encoders::Flux { clip, t5, .. }) => clip.weight_bytes() + t5.weight_bytes(),
            Some(Encoders::Flux2 { qwen, .. }) => qwen.weight_bytes(),
            Some(Encoders::Sd { clip, .. }) => clip.weight_bytes(),
            Some(Encoders::Sdxl { clip_l, clip_g, .. }) => clip_l.weight_bytes() + clip_g.weight_bytes(),
            Some(Encoders::Sd3 { clip_l, clip_g, t5, .. }) => {
                clip_l.weight_bytes()
                    + clip_g.weight_bytes()
                    + t5.as_ref().map_or(0, |(t, _)| t.weight_bytes())
            }
            None => 0,
        };
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
        let max_len = self.config.max_sequence_length;
        let joint = match &self.dit {
            Some(d) => d.config().joint_attention_dim,
            None => 0,
        };
        let encoders = self.encoders.as_mut().ok_or_else(|| {
            NetworkError::InvalidInput("the prompt encoders were dropped (drop_encoders)".into())
        })?;
        match encoders {
            Encoders::Flux { clip, clip_tokenizer, t5, t5_tokenizer } => {
                // FluxPipeline passes neither tower a mask.
                let (ids, _) = clip_tokenizer.encode(prompt)?;
                let pooled = clip.encode(&ids, 1, None)?.pooled;
                let (ids, _) = t5_tokenizer.encode(prompt, max_len)?;
                let states = t5.encode(&ids, 1, None)?;
                Ok(PromptEmbedding { states, tokens: ids.len(), pooled: Some(pooled) })
            }
            Encoders::Flux2 { qwen, tokenizer } => {
                qwen.set_layers(&self.config.text_encoder_layers)?;
                let (ids, mask) = tokenizer.encode(&crate::klein_prompt(prompt), max_len)?;
                let states = qwen.encode(&ids, 1, Some(&mask))?;
                Ok(PromptEmbedding { states, tokens: ids.len(), pooled: None })
            }
            Encoders::Sd3 { clip_l, clip_g, tokenizer_l, tokenizer_g, t5 } => {
                // Each tower's second-to-last hidden states, side by side, zero-padded to
                // T5's width; the two projections side by side as the pooled vector.
                let (clip_tokens, [l, g]) =
                    two_towers(prompt, [(clip_l, tokenizer_l), (clip_g, tokenizer_g)], "SD3")?;
                let (hl, hg, wl, wg) = (&l.states, &g.states, l.width, g.width);
                let (t5_states, t5_tokens) = match t5 {
                    Some((model, tok)) => {
                        let (ids, _) = tok.encode(prompt, max_len)?;
                        (model.encode(&ids, 1, None)?, ids.len())
                    }
                    // Without T5 the pipeline stacks zeros in its place.
                    None => (vec![0.0; max_len * joint], max_len),
                };
                // diffusers pads the CLIP features to T5's width with `F.pad`, which crops
                // when they are wider (only in test-sized models; 768 + 1280 < 4096).
                if t5_states.len() != t5_tokens * joint {
                    return Err(NetworkError::InvalidInput(format!(
                        "T5's states are {} wide; the transformer takes {joint}",
                        t5_states.len() / t5_tokens.max(1)
                    )));
                }
                let mut states = vec![0f32; (clip_tokens + t5_tokens) * joint];
                for t in 0..clip_tokens {
                    let mut feats = hl[t * wl..(t + 1) * wl].to_vec();
                    feats.extend_from_slice(&hg[t * wg..(t + 1) * wg]);
                    feats.resize(joint, 0.0);
                    states[t * joint..(t + 1) * joint].copy_from_slice(&feats);
                }
                states[clip_tokens * joint..].copy_from_slice(&t5_states);
                let mut pooled = l.projection.ok_or_else(|| {
                    NetworkError::InvalidInput(
                        "SD3's text_encoder must be a CLIPTextModelWithProjection".into(),
                    )
                })?;
                pooled.extend(g.projection.ok_or_else(|| {
                    NetworkError::InvalidInput(
                        "SD3's text_encoder_2 must be a CLIPTextModelWithProjection".into(),
                    )
                })?);
                Ok(PromptEmbedding { states, tokens: clip_tokens + t5_tokens, pooled: Some(pooled) })
            }
            Encoders::Sd { clip, tokenizer } => {
                // The last layer's states after the final LayerNorm, no mask.
                let (ids, _) = tokenizer.encode(prompt)?;
                let out = clip.encode(&ids, 1, None)?;
                Ok(PromptEmbedding { states: out.last_hidden_state, tokens: ids.len(), pooled: None })
            }
            Encoders::Sdxl { clip_l, clip_g, tokenizer_l, tokenizer_g } => {
                // Each tower's second-to-last states side by side; the pooled vector is
                // the second tower's projection.
                let (tokens, [l, g]) =
                    two_towers(prompt, [(clip_l, tokenizer_l), (clip_g, tokenizer_g)], "SD-XL")?;
                let (wl, wg) = (l.width, g.width);
                let mut states = Vec::with_capacity(tokens * (wl + wg));
                for t in 0..tokens {
                    states.extend_from_slice(&l.states[t * wl..(t + 1) * wl]);
                    states.extend_from_slice(&g.states[t * wg..(t + 1) * wg]);
                }
                let pooled = g.projection.ok_or_else(|| {
                    NetworkError::InvalidInput(
                        "SD-XL's text_encoder_2 must be a CLIPTextModelWithProjection".into(),
                    )
                })?;
                Ok(PromptEmbedding { states, tokens, pooled: Some(pooled) })
            }
        }
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

/// One CLIP tower's part of SD3's and SD-XL's prompt embedding.
struct Tower {
    /// Second-to-last hidden states, (tokens, width).
    states: Vec<f32>,
    width: usize,
    /// The projected pooled vector (`CLIPTextModelWithProjection` only).
    projection: Option<Vec<f32>>,
}

/// Both CLIP towers on `prompt`: their tokens (which must pad to the same length, as the
/// towers' states are laid side by side) and each one's [`Tower`].
fn two_towers(
    prompt: &str, towers: [(&ClipTextEncoder, &ClipTokenizer); 2], family: &str,
) -> Result<(usize, [Tower; 2])> {
    let [a, b] = towers.map(|(clip, tokenizer)| -> Result<(usize, Tower)> {
        let (ids, _) = tokenizer.encode(prompt)?;
        let mut out = clip.encode(&ids, 1, None)?;
        let at = out.hidden_states.len().saturating_sub(2);
        let states = out.hidden_states.get_mut(at).map(std::mem::take).ok_or_else(|| {
            NetworkError::InvalidInput(format!("{family}'s CLIP tower returned no hidden states"))
        })?;
        let tower = Tower { states, width: clip.config().hidden_size, projection: out.text_embeds };
        Ok((ids.len(), tower))
    });
    let ((na, a), (nb, b)) = (a?, b?);
    if na != nb {
        return Err(NetworkError::InvalidInput(format!(
            "the CLIP tokenizers pad to {na} and {nb} tokens; {family} lays the towers side by side"
        )));
    }
    Ok((na, [a, b]))
}

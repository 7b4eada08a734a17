//! Each family's prompt encoders, behind one trait: the towers its diffusers pipeline
//! runs, loaded from the folder, and how their outputs become the denoiser's conditioning.

use super::{Family, PipelineConfig, PromptEmbedding};
use crate::image::folder::PipelineFolder;
use crate::{
    ClipTextEncoder, ClipTokenizer, NetworkError, Precision, PromptTokenizer, Result, T5Encoder, TextEncoder,
};

/// A family's prompt encoders.
pub(super) trait PromptEncoder: Send {
    /// `prompt` as the family's pipeline encodes it; `joint` is the transformer's
    /// `joint_attention_dim` (0 for the UNets).
    fn encode(&mut self, prompt: &str, config: &PipelineConfig, joint: usize) -> Result<PromptEmbedding>;
    /// Bytes their weights take.
    fn weight_bytes(&self) -> usize;
}

/// The prompt encoders `family`'s pipeline runs, from `folder`, at `precision`.
pub(super) fn load(
    family: Family, folder: &PipelineFolder, precision: Precision,
) -> Result<Box<dyn PromptEncoder>> {
    let clip = |name: &str| -> Result<ClipTextEncoder> {
        let classes = ["CLIPTextModel", "CLIPTextModelWithProjection"];
        ClipTextEncoder::load_at(&folder.require(name, &classes)?.dir, precision)
    };
    let t5 = |name: &str| -> Result<T5Encoder> {
        T5Encoder::load_at(&folder.require(name, &["T5EncoderModel"])?.dir, precision)
    };
    Ok(match family {
        Family::Flux => Box::new(Flux {
            clip: clip("text_encoder")?,
            clip_tokenizer: folder.clip_tokenizer("tokenizer")?,
            t5: t5("text_encoder_2")?,
            t5_tokenizer: folder.prompt_tokenizer("tokenizer_2")?,
        }),
        Family::Flux2 => {
            let classes = ["Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM"];
            let dir = &folder.require("text_encoder", &classes)?.dir;
            // Which layers are read is a call argument (config.text_encoder_layers), set on
            // the encoder at each encode.
            Box::new(Flux2 {
                qwen: TextEncoder::load_at(dir, precision, &[1])?,
                tokenizer: folder.prompt_tokenizer("tokenizer")?,
            })
        }
        Family::Sd3 => Box::new(Sd3 {
            towers: ClipPair::load(folder, clip)?,
            t5: match folder.component("text_encoder_3") {
                Some(_) => Some((t5("text_encoder_3")?, folder.prompt_tokenizer("tokenizer_3")?)),
                None => None,
            },
        }),
        Family::Sd => {
            Box::new(Sd { clip: clip("text_encoder")?, tokenizer: folder.clip_tokenizer("tokenizer")? })
        }
        Family::Sdxl => Box::new(Sdxl { towers: ClipPair::load(folder, clip)? }),
    })
}

/// FLUX.1: CLIP's pooled vector and T5's states.
struct Flux {
    clip: ClipTextEncoder,
    clip_tokenizer: ClipTokenizer,
    t5: T5Encoder,
    t5_tokenizer: PromptTokenizer,
}

impl PromptEncoder for Flux {
    fn encode(&mut self, prompt: &str, config: &PipelineConfig, _joint: usize) -> Result<PromptEmbedding> {
        // FluxPipeline passes neither tower a mask.
        let (ids, _) = self.clip_tokenizer.encode(prompt)?;
        let pooled = self.clip.encode(&ids, 1, None)?.pooled;
        let (ids, _) = self.t5_tokenizer.encode(prompt, config.max_sequence_length)?;
        let states = self.t5.encode(&ids, 1, None)?;
        Ok(PromptEmbedding { states, tokens: ids.len(), pooled: Some(pooled) })
    }
    fn weight_bytes(&self) -> usize {
        self.clip.weight_bytes() + self.t5.weight_bytes()
    }
}

/// FLUX.2-klein: Qwen3's layer states over the chat-templated prompt.
struct Flux2 {
    qwen: TextEncoder,
    tokenizer: PromptTokenizer,
}

impl PromptEncoder for Flux2 {
    fn encode(&mut self, prompt: &str, config: &PipelineConfig, _joint: usize) -> Result<PromptEmbedding> {
        self.qwen.set_layers(&config.text_encoder_layers)?;
        let (ids, mask) = self.tokenizer.encode(&crate::klein_prompt(prompt), config.max_sequence_length)?;
        let states = self.qwen.encode(&ids, 1, Some(&mask))?;
        Ok(PromptEmbedding { states, tokens: ids.len(), pooled: None })
    }
    fn weight_bytes(&self) -> usize {
        self.qwen.weight_bytes()
    }
}

/// Stable Diffusion 1.x and 2.x: the last layer's states after the final LayerNorm.
struct Sd {
    clip: ClipTextEncoder,
    tokenizer: ClipTokenizer,
}

impl PromptEncoder for Sd {
    fn encode(&mut self, prompt: &str, _config: &PipelineConfig, _joint: usize) -> Result<PromptEmbedding> {
        // No mask.
        let (ids, _) = self.tokenizer.encode(prompt)?;
        let out = self.clip.encode(&ids, 1, None)?;
        Ok(PromptEmbedding { states: out.last_hidden_state, tokens: ids.len(), pooled: None })
    }
    fn weight_bytes(&self) -> usize {
        self.clip.weight_bytes()
    }
}

/// Stable Diffusion XL: both CLIP towers' second-to-last states side by side, the second
/// tower's projection as the pooled vector.
struct Sdxl {
    towers: ClipPair,
}

impl PromptEncoder for Sdxl {
    fn encode(&mut self, prompt: &str, _config: &PipelineConfig, _joint: usize) -> Result<PromptEmbedding> {
        let (tokens, [l, g]) = self.towers.encode(prompt, "SD-XL")?;
        let (wl, wg) = (l.width, g.width);
        let mut states = Vec::with_capacity(tokens * (wl + wg));
        for t in 0..tokens {
            states.extend_from_slice(&l.states[t * wl..(t + 1) * wl]);
            states.extend_from_slice(&g.states[t * wg..(t + 1) * wg]);
        }
        let pooled = g.projection("SD-XL's text_encoder_2")?;
        Ok(PromptEmbedding { states, tokens, pooled: Some(pooled) })
    }
    fn weight_bytes(&self) -> usize {
        self.towers.weight_bytes()
    }
}

/// Stable Diffusion 3: two CLIP towers side by side, zero-padded to T5's width, T5's
/// states after them in one sequence; both projections side by side as the pooled vector.
struct Sd3 {
    towers: ClipPair,
    t5: Option<(T5Encoder, PromptTokenizer)>,
}

impl PromptEncoder for Sd3 {
    fn encode(&mut self, prompt: &str, config: &PipelineConfig, joint: usize) -> Result<PromptEmbedding> {
        let max_len = config.max_sequence_length;
        let (clip_tokens, [l, g]) = self.towers.encode(prompt, "SD3")?;
        let (hl, hg, wl, wg) = (&l.states, &g.states, l.width, g.width);
        let (t5_states, t5_tokens) = match &mut self.t5 {
            Some((model, tok)) => {
                let (ids, _) = tok.encode(prompt, max_len)?;
                (model.encode(&ids, 1, None)?, ids.len())
            }
            // Without T5 the pipeline stacks zeros in its place.
            None => (vec![0.0; max_len * joint], max_len),
        };
        // diffusers pads the CLIP features to T5's width with `F.pad`, which crops when
        // they are wider (only in test-sized models; 768 + 1280 < 4096).
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
        let mut pooled = l.projection("SD3's text_encoder")?;
        pooled.extend(g.projection("SD3's text_encoder_2")?);
        Ok(PromptEmbedding { states, tokens: clip_tokens + t5_tokens, pooled: Some(pooled) })
    }
    fn weight_bytes(&self) -> usize {
        self.towers.weight_bytes() + self.t5.as_ref().map_or(0, |(t, _)| t.weight_bytes())
    }
}

/// SD3's and SD-XL's two CLIP towers (`text_encoder`, `text_encoder_2`) with their tokenizers.
struct ClipPair {
    towers: [(ClipTextEncoder, ClipTokenizer); 2],
}

/// One CLIP tower's part of SD3's and SD-XL's prompt embedding.
struct Tower {
    /// Second-to-last hidden states, (tokens, width).
    states: Vec<f32>,
    width: usize,
    /// The projected pooled vector (`CLIPTextModelWithProjection` only).
    projection: Option<Vec<f32>>,
}

impl Tower {
    fn projection(&self, which: &str) -> Result<Vec<f32>> {
        self.projection.clone().ok_or_else(|| {
            NetworkError::InvalidInput(format!("{which} must be a CLIPTextModelWithProjection"))
        })
    }
}

impl ClipPair {
    fn load(folder: &PipelineFolder, clip: impl Fn(&str) -> Result<ClipTextEncoder>) -> Result<Self> {
        Ok(ClipPair {
            towers: [
                (clip("text_encoder")?, folder.clip_tokenizer("tokenizer")?),
                (clip("text_encoder_2")?, folder.clip_tokenizer("tokenizer_2")?),
            ],
        })
    }

    fn weight_bytes(&self) -> usize {
        self.towers.iter().map(|(c, _)| c.weight_bytes()).sum()
    }

    /// Both towers on `prompt`: their tokens (which must pad to the same length, as the
    /// towers' states are laid side by side) and each one's [`Tower`].
    fn encode(&self, prompt: &str, family: &str) -> Result<(usize, [Tower; 2])> {
        let [a, b] = self.towers.each_ref().map(|(clip, tokenizer)| -> Result<(usize, Tower)> {
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
}

//! A published diffusers pipeline folder: `model_index.json` names the pipeline class and,
//! for each component, the library and class that saved it into the folder of the same
//! name. [`PipelineFolder`] reads that index, checks that every named component's folder
//! is there, and loads the components this library computes by their class: the
//! autoencoder, the CLIP, T5 and LLaMA-family prompt encoders and their tokenizers. The
//! denoisers (`transformer/`, `unet/`) are listed but not loaded yet.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::image::vae::Vae;
use crate::{ClipTextEncoder, ClipTokenizer, NetworkError, PromptTokenizer, Result, T5Encoder, TextEncoder};

/// One component of a pipeline folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Component {
    /// The library that saved it (`diffusers`, `transformers`).
    pub library: String,
    /// Its class (`AutoencoderKL`, `CLIPTextModel`, `T5TokenizerFast`, ...).
    pub class: String,
    /// Its folder.
    pub dir: PathBuf,
}

/// A pipeline folder's index and components.
#[derive(Debug, Clone)]
pub struct PipelineFolder {
    root: PathBuf,
    class_name: String,
    components: BTreeMap<String, Component>,
}

impl PipelineFolder {
    /// Reads `dir/model_index.json` and checks each component it names has its folder.
    pub fn open(dir: impl AsRef<Path>) -> Result<PipelineFolder> {
        let root = dir.as_ref().to_path_buf();
        let path = root.join("model_index.json");
        let bytes = crate::io::files::read(&path)?;
        let v: Value =
            serde_json::from_slice(&bytes).map_err(|e| NetworkError::parse(&path, "json", e.to_string()))?;
        let obj = v.as_object().ok_or_else(|| NetworkError::parse(&path, "json", "not an object"))?;
        let class_name = obj
            .get("_class_name")
            .and_then(Value::as_str)
            .ok_or_else(|| NetworkError::parse(&path, "_class_name", "missing: which pipeline is this?"))?
            .to_string();
        let mut components = BTreeMap::new();
        for (name, entry) in obj {
            if name.starts_with('_') {
                continue;
            }
            // [library, class], or [null, null] for an optional part the pipeline lacks;
            // other keys are pipeline settings (booleans, numbers).
            let Some(pair) = entry.as_array() else { continue };
            match pair.as_slice() {
                [Value::Null, Value::Null] => continue,
                [Value::String(library), Value::String(class)] => {
                    let plain = Path::new(name).components().count() == 1
                        && matches!(
                            Path::new(name).components().next(),
                            Some(std::path::Component::Normal(_))
                        );
                    if !plain {
                        return Err(NetworkError::parse(
                            &path,
                            name,
                            "not a folder name inside the pipeline",
                        ));
                    }
                    let dir = root.join(name);
                    if !dir.is_dir() {
                        return Err(NetworkError::parse(
                            &path,
                            name,
                            format!("{library} {class}: the folder {} is missing", dir.display()),
                        ));
                    }
                    components.insert(
                        name.clone(),
                        Component { library: library.clone(), class: class.clone(), dir },
                    );
                }
                _ => {
                    return Err(NetworkError::parse(&path, name, format!("{entry} is not [library, class]")))
                }
            }
        }
        Ok(PipelineFolder { root, class_name, components })
    }

    /// The folder.
    pub fn root(&self) -> &Path {
        &self.root
    }
    /// The pipeline class (`FluxPipeline`, `Flux2KleinPipeline`, `StableDiffusionXLPipeline`...).
    pub fn class_name(&self) -> &str {
        &self.class_name
    }
    /// Every component the index names, by folder name.
    pub fn components(&self) -> &BTreeMap<String, Component> {
        &self.components
    }
    /// The component in folder `name` (`transformer`, `vae`, `text_encoder`...), if the index names it.
    pub fn component(&self, name: &str) -> Option<&Component> {
        self.components.get(name)
    }

    pub(crate) fn require(&self, name: &str, classes: &[&str]) -> Result<&Component> {
        let c = self.components.get(name).ok_or_else(|| {
            NetworkError::InvalidInput(format!("{}: model_index.json names no {name}", self.root.display()))
        })?;
        if !classes.contains(&c.class.as_str()) {
            return Err(NetworkError::InvalidInput(format!(
                "{}: {name} is a {} {}; this loader reads {}",
                self.root.display(),
                c.library,
                c.class,
                classes.join(", ")
            )));
        }
        Ok(c)
    }

    /// The autoencoder (`vae/`).
    pub fn vae(&self) -> Result<Vae> {
        Vae::load(&self.require("vae", &["AutoencoderKL", "AutoencoderKLFlux2"])?.dir)
    }
    /// A CLIP text tower (`text_encoder`, `text_encoder_2`).
    pub fn clip(&self, name: &str) -> Result<ClipTextEncoder> {
        ClipTextEncoder::load(&self.require(name, &["CLIPTextModel", "CLIPTextModelWithProjection"])?.dir)
    }
    /// A T5 encoder (FLUX.1's `text_encoder_2`, SD3's `text_encoder_3`).
    pub fn t5(&self, name: &str) -> Result<T5Encoder> {
        T5Encoder::load(&self.require(name, &["T5EncoderModel"])?.dir)
    }
    /// A LLaMA-family decoder read at `layers` (FLUX.2-klein's Qwen3 `text_encoder`).
    pub fn text_encoder(&self, name: &str, layers: &[usize]) -> Result<TextEncoder> {
        let classes = ["Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM"];
        TextEncoder::load(&self.require(name, &classes)?.dir, layers)
    }
    /// A CLIP tokenizer (`tokenizer`, `tokenizer_2`).
    pub fn clip_tokenizer(&self, name: &str) -> Result<ClipTokenizer> {
        ClipTokenizer::load(&self.require(name, &["CLIPTokenizer", "CLIPTokenizerFast"])?.dir)
    }
    /// A T5 or Qwen tokenizer read from its `tokenizer.json`.
    pub fn prompt_tokenizer(&self, name: &str) -> Result<PromptTokenizer> {
        let classes = ["T5Tokenizer", "T5TokenizerFast", "Qwen2Tokenizer", "Qwen2TokenizerFast"];
        PromptTokenizer::load(&self.require(name, &classes)?.dir)
    }
}

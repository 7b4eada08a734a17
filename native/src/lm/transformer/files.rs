//! A `TransformerLm`'s files: `.rbw` checkpoints, Hugging Face folders, optimizer state, and
//! its tensors by name.

use super::*;

impl TransformerLm {
    /// Writes the configuration and weights (safetensors, atomically). With adapters
    /// attached this is the frozen base alone: `save_lora` writes the adapters, or
    /// `merge_lora` first makes one checkpoint of both.
    pub fn save_bin(&self, path: impl AsRef<std::path::Path>, precision: crate::Precision) -> Result<()> {
        if self.is_quantized() && precision == crate::Precision::F32 {
            return Err(NetworkError::InvalidInput(
                "save_bin(F32): the model is quantized and its f32 weights are gone; save the f32 model before quantize()".into(),
            ));
        }
        self.host_current("save_bin")?;
        crate::lm::checkpoint::save_weights(self.model(), path.as_ref(), precision)
    }
    /// Reads a checkpoint written by [`TransformerLm::save_bin`]; the optimizer starts at
    /// the builder's default until [`TransformerLm::load_optimizer_state`].
    pub fn load_bin(path: impl AsRef<std::path::Path>) -> Result<TransformerLm> {
        let model = crate::lm::checkpoint::load_weights(path.as_ref())?;
        Ok(TransformerLm {
            engine: LmEngine::Cpu(model),
            optimizer: Optimizer::adam(3e-4),
            origin: None,
            decode_steps: Default::default(),
        })
    }
    /// Reads a Hugging Face directory (`config.json` and `model.safetensors`, or shards with
    /// `model.safetensors.index.json`) of a `LlamaForCausalLM`, `MistralForCausalLM`,
    /// `Qwen2ForCausalLM`, `Qwen3ForCausalLM`, `MixtralForCausalLM` or
    /// `Qwen3MoeForCausalLM`, in f32. Tensors may be F32, BF16 or F16; RoPE may be scaled
    /// (`linear`, `llama3`). Whatever the configuration asks for that this model does not
    /// compute (a sliding window shorter than the context, an output-projection bias,
    /// another RoPE type, Qwen2-MoE's gated shared expert) is an error naming the file and
    /// the key.
    pub fn from_pretrained(dir: impl AsRef<std::path::Path>) -> Result<TransformerLm> {
        Self::from_pretrained_at(dir, crate::Precision::F32)
    }
    /// [`TransformerLm::from_pretrained`] at a precision: `Precision::Q8` rounds each
    /// matrix to int8 a slab of rows at a time as it is read, so the f32 model is never held
    /// (the peak is the int8 model plus the f32 norms and biases).
    pub fn from_pretrained_at(
        dir: impl AsRef<std::path::Path>, precision: crate::Precision,
    ) -> Result<TransformerLm> {
        let (model, origin) = crate::io::hf::load(dir.as_ref(), precision)?;
        Ok(Self::loaded(model, origin))
    }
    /// A model read from a file, on the CPU, with the default optimizer.
    fn loaded(model: TransformerModel<CpuBackend>, origin: crate::io::hf::Origin) -> TransformerLm {
        TransformerLm {
            engine: LmEngine::Cpu(model),
            optimizer: Optimizer::adam(3e-4),
            origin: Some(origin),
            decode_steps: Default::default(),
        }
    }
    /// Reads a GGUF file (llama.cpp's format, version 2 or 3) of architecture `llama`
    /// (Llama, Mistral, SmolLM), `qwen2` or `qwen3`, dense, in f32: tensors F32, F16, BF16,
    /// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K or Q6_K, decoded as llama.cpp decodes them.
    /// The metadata becomes the `config.json` a Hugging Face folder of the model would
    /// have, checked as [`TransformerLm::from_pretrained`] checks it; a tensor, key or type
    /// this reader does not map is an error naming it.
    pub fn from_gguf(path: impl AsRef<std::path::Path>) -> Result<TransformerLm> {
        Self::from_gguf_at(path, crate::Precision::F32)
    }
    /// [`TransformerLm::from_gguf`] at a precision. A matrix whose blocks our quantized
    /// layout holds exactly is taken as it is, with no decode and no second rounding:
    /// Q4_0, Q4_1 and Q4_K at `Precision::Q4`; Q8_0, Q4_0 and Q5_0 at `Precision::Q8`
    /// (and at Q4 for the embedding, the head and routed experts, which stay int8). At Q4
    /// the matrices a 4-bit file keeps wider (a Q4_K_M file's Q5_0, Q6_K and Q8_0) are
    /// held in int8 rather than rounded down to 4. Every other matrix is decoded and
    /// rounded before the next, so the f32 model is never held.
    pub fn from_gguf_at(
        path: impl AsRef<std::path::Path>, precision: crate::Precision,
    ) -> Result<TransformerLm> {
        let (model, origin) = crate::io::gguf::load(path.as_ref(), precision)?;
        Ok(Self::loaded(model, origin))
    }
    /// Writes a GGUF file llama.cpp and ollama run: llama.cpp's names and metadata, the
    /// tokenizer and chat template of the file or folder the model was read from, F32 or
    /// (`Precision::Q8`, `Precision::Q4`) every matrix whose rows hold whole blocks of 32
    /// in Q8_0 or Q4_0, rounded as `llama-quantize` rounds them (norms F32; at Q4 the
    /// embedding and head Q8_0). The model must hold its f32 weights (a quantized model
    /// would be rounded twice) and be a dense `llama`, `qwen2` or `qwen3` model; merge
    /// LoRA adapters first. Written through a temporary file: a failure leaves `path` as
    /// it was.
    pub fn save_gguf(&self, path: impl AsRef<std::path::Path>, precision: crate::Precision) -> Result<()> {
        self.save_gguf_as(path, crate::gguf::GgufType::of(precision))
    }
    /// [`TransformerLm::save_gguf`] with the file's tensor type named: `GgufType::Q4K`
    /// writes Q4_K blocks (Q5_0 where a row is not whole 256-value super-blocks), the
    /// embedding and head Q8_0, as `llama-quantize` rounds them.
    pub fn save_gguf_as(&self, path: impl AsRef<std::path::Path>, file: crate::gguf::GgufType) -> Result<()> {
        if self.lora_config().is_some() {
            return Err(NetworkError::InvalidInput(
                "save_gguf: the model has LoRA adapters; merge_lora() first (llama.cpp reads whole weights)"
                    .into(),
            ));
        }
        self.host_current("save_gguf")?;
        crate::io::gguf::save(self.model(), self.origin.as_ref(), path.as_ref(), file)
    }
    /// Writes a Hugging Face directory that `transformers`' `AutoModelForCausalLM` loads:
    /// F32 `model.safetensors` (sharded past 5 GB), `config.json` and
    /// `generation_config.json`. The class is the one the model was loaded as, else the
    /// one that computes it: `LlamaForCausalLM` (dense), `Qwen2ForCausalLM` (q/k/v biases),
    /// `Qwen3ForCausalLM` (per-head q/k norms), `MixtralForCausalLM` (every block sparse,
    /// top-k renormalized, no shared expert) or `Qwen3MoeForCausalLM` (sparse with q/k
    /// norms). Files already in `dir` (a tokenizer) stay.
    pub fn save_pretrained(&self, dir: impl AsRef<std::path::Path>) -> Result<()> {
        self.save_pretrained_sharded(dir, 5_000_000_000)
    }
    /// [`TransformerLm::save_pretrained`] with shards of at most `max_shard_bytes` (one
    /// tensor larger than that gets a shard of its own).
    pub fn save_pretrained_sharded(
        &self, dir: impl AsRef<std::path::Path>, max_shard_bytes: usize,
    ) -> Result<()> {
        if self.is_quantized() {
            return Err(NetworkError::InvalidInput(
                "save_pretrained: the model is quantized and its f32 weights are gone; save before quantize()".into(),
            ));
        }
        self.host_current("save_pretrained")?;
        crate::io::hf::save(self.model(), self.origin.as_ref(), dir.as_ref(), max_shard_bytes)
    }
    /// Writes Adam's moments, the step count and the optimizer settings.
    pub fn save_optimizer_state(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        if self.lora_config().is_some() {
            return Err(NetworkError::InvalidInput(
                "save_optimizer_state: adapters are attached and the base has no optimizer state; save the adapters with save_lora".into(),
            ));
        }
        if self.is_quantized() {
            return Err(NetworkError::InvalidInput(
                "save_optimizer_state: a quantized model has no optimizer state".into(),
            ));
        }
        self.host_current("save_optimizer_state")?;
        crate::lm::checkpoint::save_optimizer(self.model(), &self.optimizer, path.as_ref())
    }
    /// Restores what [`TransformerLm::save_optimizer_state`] wrote, settings included.
    pub fn load_optimizer_state(&mut self, path: impl AsRef<std::path::Path>) -> Result<()> {
        self.refuse_on_device("load_optimizer_state", "load it before moving the model, or after to_cpu()")?;
        if self.lora_config().is_some() {
            return Err(NetworkError::InvalidInput(
                "load_optimizer_state: adapters are attached and the base is frozen; the state belongs to the model before add_lora".into(),
            ));
        }
        let opt = crate::lm::checkpoint::load_optimizer(self.model_mut(), path.as_ref())?;
        self.optimizer = opt;
        Ok(())
    }
    /// Overwrites one parameter by its Hugging Face name (`model.layers.2.mlp.gate.weight`):
    /// model surgery, a weight brought from elsewhere, an experiment's starting point. The
    /// values must match the tensor's size and be finite; the optimizer state is kept.
    pub fn set_parameter(&mut self, name: &str, values: &[f32]) -> Result<()> {
        #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
        if let Some(d) = self.on_device_mut() {
            return Ok(d.set_parameter(name, values)?);
        }
        Ok(self.model_mut().set_parameter(name, values)?)
    }
    /// Every parameter with its Hugging Face name (`LlamaForCausalLM`'s; sparse layers use
    /// the Qwen-MoE names: `mlp.gate.weight` is the router, `mlp.experts.{j}.*` the experts,
    /// `mlp.shared_expert.*` the shared expert).
    pub fn named_parameters(&self) -> Result<Vec<(String, Vec<f32>)>> {
        #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
        if let Some(d) = self.on_device() {
            return Ok(d.named_parameters()?);
        }
        Ok(self.model().named_parameters()?)
    }
    /// Every accumulated gradient (since the last `zero_grad`) under its parameter's name,
    /// in the order of [`TransformerLm::named_parameters`]: for checking a backward pass
    /// against another framework's, or watching which weights learn. An int8 model has none.
    pub fn named_gradients(&self) -> Result<Vec<(String, Vec<f32>)>> {
        if self.is_quantized() {
            return Err(NetworkError::InvalidInput(
                "named_gradients: a quantized model has no gradients".into(),
            ));
        }
        #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
        if let Some(d) = self.on_device() {
            return Ok(d.named_gradients()?);
        }
        Ok(self.model().named_gradients()?)
    }
}

//! LoRA on a `TransformerLm`: attach adapters, train them, merge them, save and load them
//! (ours and PEFT's).

use super::*;

impl TransformerLm {
    /// Attaches a low-rank adapter (LoRA) to every projection `config` targets (by default
    /// all attention and feed-forward projections, a mixture-of-experts layer's experts
    /// and shared expert included) and freezes every other weight: the base keeps its
    /// values but its gradients and Adam moments are freed, so training holds the weights
    /// once plus the adapters four times. `A` starts Kaiming-uniform and `B` at zero, as
    /// PEFT makes them, so the model predicts exactly what it did; `zero_grad`,
    /// `accumulate_step`, `step` and `step_clipped` then train the adapters alone.
    ///
    /// An int8 base (after [`TransformerLm::quantize`] or a Q8 checkpoint) works too: the
    /// adapters train in f32 on it, and the backward pass dequantizes one matrix at a
    /// time. A host operation: call it before `to_cuda`/`to_gpu`, or after `to_cpu`.
    ///
    /// ```
    /// use rusting_brain::{LoraConfig, TokenBatch, TransformerLm};
    ///
    /// let mut model = TransformerLm::builder()
    ///     .vocab_size(64).d_model(32).n_layers(2).heads(4, 2, 8).d_ff(64).max_seq_len(16)
    ///     .build()?;
    /// let batch = TokenBatch::new(&[vec![1, 2, 3, 4, 5]])?;
    /// let before = model.forward_batch(&batch)?;
    /// model.add_lora(LoraConfig::new(4).alpha(8.0))?;
    /// assert_eq!(model.forward_batch(&batch)?, before); // B starts at zero
    /// assert_eq!(model.trainable_parameters(), 2 * 4 * (64 + 48 + 48 + 64 + 3 * 96));
    /// model.train_step_batch(&batch)?; // the adapters move, the base does not
    /// let path = std::env::temp_dir().join("rb-doc-adapter.rbl");
    /// model.save_lora(&path)?;
    /// model.merge_lora()?; // an ordinary model again
    /// # std::fs::remove_file(path).ok();
    /// # Ok::<(), rusting_brain::NetworkError>(())
    /// ```
    pub fn add_lora(&mut self, config: LoraConfig) -> Result<()> {
        self.refuse_on_device(
            "add_lora",
            "attach adapters on the host: call to_cpu() first, or attach before moving",
        )?;
        Ok(self.model_mut().add_lora(config, 0x10_4a)?)
    }
    /// The attached adapters' settings, if any.
    pub fn lora_config(&self) -> Option<&LoraConfig> {
        self.model().lora.as_ref().map(|l| &l.config)
    }
    /// Values the optimizer updates: the adapters' when attached, else every parameter.
    pub fn trainable_parameters(&self) -> usize {
        self.model().trainable_parameters()
    }
    /// Folds the adapters into the weights they adapt (`W += alpha/r * B A`) and unfreezes
    /// the model: an ordinary model, with fresh optimizer state, that predicts what the
    /// adapted one did at no extra cost. A host operation, refused on an int8 base.
    pub fn merge_lora(&mut self) -> Result<()> {
        self.refuse_on_device("merge_lora", "merge on the host: call to_cpu() first")?;
        Ok(self.model_mut().merge_lora()?)
    }
    /// Writes the adapters alone (safetensors with PEFT's tensor names, the settings in
    /// the metadata), atomically: a few megabytes that [`TransformerLm::load_lora`] puts
    /// back on the same base.
    pub fn save_lora(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        self.host_current("save_lora")?;
        crate::lm::lora::save(self.model(), path.as_ref())
    }
    /// Writes a PEFT adapter directory (`adapter_config.json`, `adapter_model.safetensors`)
    /// that `peft.PeftModel.from_pretrained(base, dir)` loads onto the base in PyTorch.
    pub fn save_lora_peft(&self, dir: impl AsRef<std::path::Path>) -> Result<()> {
        self.host_current("save_lora_peft")?;
        let base = self.origin.as_ref().map(|o| o.name_or_path());
        crate::lm::lora::save_peft(self.model(), dir.as_ref(), base.as_deref())
    }
    /// Reads adapters written by [`TransformerLm::save_lora`], or a PEFT adapter directory
    /// (LoRA on these projections, biases untrained). Attaches them if none are attached;
    /// otherwise the file must have the same rank, alpha, scaling and targets. A missing,
    /// extra or misshapen tensor is an error naming it, and changes nothing. A host
    /// operation.
    pub fn load_lora(&mut self, path: impl AsRef<std::path::Path>) -> Result<()> {
        self.refuse_on_device(
            "load_lora",
            "load adapters on the host: call to_cpu() first, or load before moving",
        )?;
        crate::lm::lora::load(self.model_mut(), path.as_ref())
    }
    /// The adapters under PEFT's names (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`),
    /// read from wherever the model is; empty without adapters.
    pub fn lora_parameters(&self) -> Result<Vec<(String, Vec<f32>)>> {
        #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
        if let Some(d) = self.on_device() {
            return Ok(d.named_adapters(false)?);
        }
        Ok(self.model().named_adapters(false)?)
    }
    /// The adapters' accumulated gradients, named as in [`TransformerLm::lora_parameters`].
    pub fn lora_gradients(&self) -> Result<Vec<(String, Vec<f32>)>> {
        #[cfg(any(feature = "gpu", feature = "cuda-backend"))]
        if let Some(d) = self.on_device() {
            return Ok(d.named_adapters(true)?);
        }
        Ok(self.model().named_adapters(true)?)
    }
    /// Loads adapters (ours from [`TransformerLm::save_lora`], or a PEFT directory) beside
    /// the model under `name`, leaving the model unadapted: `forward_cached_with` and
    /// `forward_cached_rows_with` then pick them per sequence, so one base serves several
    /// adapters, and requests for different ones share a decode step. Each set has its own
    /// rank, alpha and targets; the file is checked as [`TransformerLm::load_lora`] checks
    /// it, and a refused file or taken name changes nothing. A host operation, on a model
    /// with no adapters attached (adapters on routed experts are picked per step, not per
    /// sequence).
    ///
    /// ```
    /// use rusting_brain::{LoraConfig, TransformerLm};
    ///
    /// let base = || {
    ///     TransformerLm::builder()
    ///         .vocab_size(64).d_model(32).n_layers(2).heads(4, 2, 8).d_ff(64).max_seq_len(16)
    ///         .build()
    /// };
    /// let (mut model, mut tuned) = (base()?, base()?);
    /// tuned.add_lora(LoraConfig::new(4))?;
    /// let path = std::env::temp_dir().join("rb-doc-named.rbl");
    /// tuned.save_lora(&path)?;
    /// model.load_named_lora("tuned", &path)?;
    /// let (mut a, mut b) = (model.new_kv_caches(), model.new_kv_caches());
    /// model.forward_cached_with(&[1, 2], &mut a, Some("tuned"))?;
    /// model.forward_cached_with(&[3], &mut b, None)?;
    /// let logits = model.forward_cached_rows_with(&[4, 5], &mut [&mut a, &mut b], &[Some("tuned"), None])?;
    /// assert_eq!(logits.len(), 2 * 64);
    /// # std::fs::remove_file(path).ok();
    /// # Ok::<(), rusting_brain::NetworkError>(())
    /// ```
    pub fn load_named_lora(&mut self, name: &str, path: impl AsRef<std::path::Path>) -> Result<()> {
        self.refuse_on_device(
            "load_named_lora",
            "load adapters on the host: call to_cpu() first, or load before moving",
        )?;
        crate::lm::lora::load_named(self.model_mut(), name, path.as_ref())
    }
    /// The names [`TransformerLm::load_named_lora`] loaded, in loading order.
    pub fn named_loras(&self) -> Vec<String> {
        self.model().named_lora.iter().map(|n| n.name.clone()).collect()
    }
    /// The index of the adapters named `name`, or an error listing the names held.
    pub(crate) fn pick_lora(&self, name: Option<&str>) -> Result<Option<usize>> {
        let Some(name) = name else { return Ok(None) };
        let held = &self.model().named_lora;
        match held.iter().position(|n| n.name == name) {
            Some(k) => Ok(Some(k)),
            None => Err(NetworkError::InvalidInput(format!(
                "no adapters are loaded under `{name}`; loaded: [{}]",
                held.iter().map(|n| n.name.as_str()).collect::<Vec<_>>().join(", ")
            ))),
        }
    }
}

//! Low-rank adapters on a transformer's projections (LoRA): which projections take one, the
//! adapters' tensors, and PEFT's names for them.
//!
//! An adapter on a projection `W (d_out, d_in)` is `A (rank, d_in)` and `B (d_out, rank)`;
//! the projection computes `x W^T + scale * (x A^T) B^T` (see [`crate::ops::lora`]). The
//! adapters live in a [`Tree`] of the model's layout whose leaves are `Some` where a
//! projection is adapted, so they walk, move and save like the parameters.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use super::{Params, Tree};
use crate::backend::Memory;
use crate::{Backend, CoreError, Result, Rng};

/// The projections an adapter can attach to, by module name (as PEFT's `target_modules`
/// names them): the attention projections and the SwiGLU ones, which in a sparse block
/// are every expert's and the shared expert's.
pub const LORA_TARGETS: [&str; 7] =
    ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];

/// How adapters are attached: `LoraConfig::new(16).alpha(32.0)`.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    /// Rank of each adapter.
    pub rank: usize,
    /// The adapters' output is scaled by `alpha / rank` (or `alpha / sqrt(rank)`).
    pub alpha: f32,
    /// Module names from [`LORA_TARGETS`], in that order.
    pub targets: Vec<String>,
    /// Rank-stabilized scaling, `alpha / sqrt(rank)` (PEFT's `use_rslora`).
    pub rslora: bool,
}

impl LoraConfig {
    /// Rank `rank` on every projection, `alpha` 8 (PEFT's default), plain `alpha / rank`.
    pub fn new(rank: usize) -> LoraConfig {
        LoraConfig {
            rank,
            alpha: 8.0,
            targets: LORA_TARGETS.iter().map(|s| s.to_string()).collect(),
            rslora: false,
        }
    }
    /// The adapters' alpha (their output is scaled by alpha / rank).
    pub fn alpha(mut self, alpha: f32) -> LoraConfig {
        self.alpha = alpha;
        self
    }
    /// Only these projections (`["q_proj", "v_proj"]`); checked by `add_lora`.
    pub fn targets<S: AsRef<str>>(mut self, names: &[S]) -> LoraConfig {
        let mut t: Vec<String> = names.iter().map(|s| s.as_ref().to_string()).collect();
        // Canonical order, so two configs naming the same set compare equal.
        t.sort_by_key(|n| LORA_TARGETS.iter().position(|k| k == n).unwrap_or(usize::MAX));
        t.dedup();
        self.targets = t;
        self
    }
    /// rsLoRA: scale by alpha / sqrt(rank) instead.
    pub fn rslora(mut self, on: bool) -> LoraConfig {
        self.rslora = on;
        self
    }
    /// The factor on the adapters' output.
    pub fn scale(&self) -> f32 {
        if self.rslora {
            self.alpha / libm::sqrtf(self.rank as f32)
        } else {
            self.alpha / self.rank as f32
        }
    }
    /// Checks the rank, alpha and targets, naming the first bad one.
    pub fn validate(&self) -> Result<()> {
        let bad = |message: String| CoreError::InvalidArgument { op: "LoraConfig", message };
        if self.rank == 0 {
            return Err(bad("rank must be at least 1".into()));
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(bad(format!("alpha {} must be finite and above 0", self.alpha)));
        }
        if self.targets.is_empty() {
            return Err(bad("no projection is targeted".into()));
        }
        if let Some(t) = self.targets.iter().find(|t| !LORA_TARGETS.contains(&t.as_str())) {
            return Err(bad(format!(
                "`{t}` is not a projection adapters attach to; the targets are {}",
                LORA_TARGETS.join(", ")
            )));
        }
        Ok(())
    }
    /// Whether the parameter called `name` (`model.layers.3.self_attn.q_proj.weight`) is
    /// targeted.
    pub fn targets_parameter(&self, name: &str) -> bool {
        module_of(name).is_some_and(|m| self.targets.iter().any(|t| t == m))
    }
}

/// The module a weight belongs to: `q_proj` for `model.layers.3.self_attn.q_proj.weight`.
fn module_of(name: &str) -> Option<&str> {
    let stem = name.strip_suffix(".weight")?;
    stem.rsplit('.').next()
}

/// PEFT's names of an adapter's two tensors for the parameter `name`:
/// `base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight` and `...lora_B.weight`.
pub fn peft_names(name: &str) -> (String, String) {
    let stem = name.strip_suffix(".weight").unwrap_or(name);
    (format!("base_model.model.{stem}.lora_A.weight"), format!("base_model.model.{stem}.lora_B.weight"))
}

/// An adapter's two tensors: `A (rank, d_in)`, `B (d_out, rank)`.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraPair<T> {
    /// `(rank, d_in)`.
    pub a: T,
    /// `(d_out, rank)`, zero at the start.
    pub b: T,
}

/// Adapters, or their gradients or optimizer moments: `Some` where a projection is adapted.
pub type Adapters<B> = Tree<Option<LoraPair<<B as Memory>::Buffer>>>;

/// Adapters held beside a model under a name, for serving several from one base (see
/// [`super::TransformerModel::add_named_lora`]).
pub struct NamedLora<B: Backend> {
    /// What requests call them by.
    pub name: String,
    /// Rank, alpha and targets.
    pub config: LoraConfig,
    /// The adapters.
    pub weights: Adapters<B>,
}

/// A model's adapters with their gradients and AdamW moments.
pub struct LoraState<B: Backend> {
    /// Rank, alpha and targets.
    pub config: LoraConfig,
    /// The adapters.
    pub weights: Adapters<B>,
    /// Their accumulated gradients.
    pub grads: Adapters<B>,
    /// AdamW's first moments.
    pub m: Adapters<B>,
    /// AdamW's second moments.
    pub v: Adapters<B>,
}

/// `(d_out, d_in)` of every targeted matrix of `layout`, `None` elsewhere.
pub fn adapted_shapes(config: &LoraConfig, layout: &Tree<super::TensorSpec>) -> Tree<Option<(usize, usize)>> {
    let shapes: Result<_, ()> = layout.as_ref().try_map(|name, t| {
        Ok((t.kind == super::TensorKind::Matrix && config.targets_parameter(name)).then(|| t.rows_cols()))
    });
    shapes.unwrap_or_else(|_| unreachable!("the closure never fails"))
}

impl<B: Backend> LoraState<B> {
    /// Fresh adapters as PEFT makes them: `A` Kaiming-uniform (bound `1 / sqrt(d_in)`, what
    /// `kaiming_uniform_(a = sqrt(5))` gives), `B` zero, so the adapted model predicts
    /// exactly what the base does. Drawn in [`Tree::into_leaves`] order from `seed`.
    pub fn new(b: &B, config: LoraConfig, layout: &Tree<super::TensorSpec>, seed: u64) -> Result<Self> {
        config.validate()?;
        let shapes = adapted_shapes(&config, layout);
        if shapes.as_ref().into_leaves().iter().all(|s| s.is_none()) {
            return Err(CoreError::InvalidArgument {
                op: "add_lora",
                message: format!(
                    "the model has none of the targeted projections ({})",
                    config.targets.join(", ")
                ),
            });
        }
        let mut rng = Rng::new(seed);
        let r = config.rank;
        let weights = shapes.as_ref().try_map(|_, s| match s {
            Some((d_out, d_in)) => {
                let bound = 1.0 / libm::sqrt(*d_in as f64);
                let a: Vec<f32> = (0..r * *d_in).map(|_| rng.uniform(-bound, bound) as f32).collect();
                Ok(Some(LoraPair { a: b.upload(&a)?, b: b.zeros(d_out * r)? }))
            }
            None => Ok(None),
        })?;
        let zeros = |_: &str, s: &Option<(usize, usize)>| -> Result<_> {
            Ok(match s {
                Some((d_out, d_in)) => Some(LoraPair { a: b.zeros(r * d_in)?, b: b.zeros(d_out * r)? }),
                None => None,
            })
        };
        Ok(LoraState {
            grads: shapes.as_ref().try_map(zeros)?,
            m: shapes.as_ref().try_map(zeros)?,
            v: shapes.as_ref().try_map(zeros)?,
            weights,
            config,
        })
    }

    /// Every adapter tensor with PEFT's name, `A` then `B` per projection, in
    /// [`Tree::into_leaves`] order.
    pub fn named<'a>(&self, tree: &'a Adapters<B>) -> Vec<(String, &'a B::Buffer)> {
        let mut out = Vec::new();
        for (name, pair) in tree.as_ref().into_named() {
            if let Some(p) = pair {
                let (na, nb) = peft_names(&name);
                out.push((na, &p.a));
                out.push((nb, &p.b));
            }
        }
        out
    }

    /// Trainable values: every `A` and `B`.
    pub fn parameter_count(&self, b: &B) -> usize {
        self.named(&self.weights).iter().map(|(_, t)| b.len(t)).sum()
    }

    /// The same adapters, gradients and moments on another backend.
    pub fn copy_to<C: Backend>(&self, from: &B, to: &C) -> Result<LoraState<C>> {
        let tree = |t: &Adapters<B>| copy_adapters(from, to, t);
        Ok(LoraState {
            config: self.config.clone(),
            weights: tree(&self.weights)?,
            grads: tree(&self.grads)?,
            m: tree(&self.m)?,
            v: tree(&self.v)?,
        })
    }
}

/// The same adapters on another backend.
pub fn copy_adapters<B: Backend, C: Backend>(from: &B, to: &C, t: &Adapters<B>) -> Result<Adapters<C>> {
    t.as_ref().try_map(|_, p| match p {
        Some(p) => {
            Ok(Some(LoraPair { a: to.upload(&from.download(&p.a)?)?, b: to.upload(&from.download(&p.b)?)? }))
        }
        None => Ok(None),
    })
}

/// Flat list of the `Some` leaves' buffers, `A` then `B`, in [`Tree::into_leaves`] order.
pub fn adapter_buffers<T>(tree: &Tree<Option<LoraPair<T>>>) -> Vec<&T> {
    tree.as_ref().into_leaves().into_iter().flatten().flat_map(|p| [&p.a, &p.b]).collect()
}

/// [`adapter_buffers`], mutable.
pub fn adapter_buffers_mut<T>(tree: &mut Tree<Option<LoraPair<T>>>) -> Vec<&mut T> {
    tree.as_mut().into_leaves().into_iter().flatten().flat_map(|p| [&mut p.a, &mut p.b]).collect()
}

/// The parameter tree's matrices with the adapters folded in (`W += scale * B A`), on the
/// host; see [`crate::ops::lora::lora_merge`].
pub fn merge_into<B: Backend>(b: &B, params: &mut Params<B>, lora: &LoraState<B>) -> Result<()> {
    let r = lora.config.rank;
    let scale = lora.config.scale();
    let pairs = params.as_mut().zip(lora.weights.as_ref()).ok_or_else(|| CoreError::InvalidArgument {
        op: "merge_lora",
        message: "the adapters are laid out differently from the parameters".into(),
    })?;
    for (w, pair) in pairs.into_leaves() {
        if let Some(p) = pair {
            let (a, bm) = (b.download(&p.a)?, b.download(&p.b)?);
            let d_in = a.len() / r;
            let d_out = bm.len() / r;
            let mut host = b.download(w)?;
            crate::ops::lora::lora_merge(&mut host, &a, &bm, d_out, d_in, r, scale)?;
            b.write(w, &host)?;
        }
    }
    Ok(())
}

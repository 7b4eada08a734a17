//! The transformer's tensors as one tree: the token embedding, the blocks, the final norm.
//!
//! The same tree holds the parameters, their gradients and both optimizer moments (leaves
//! are buffers), the shapes of a configuration (leaves are [`TensorSpec`]s), and an int8
//! model's matrices (leaves are optional (packed, scales) pairs), so checkpoints, the
//! optimizer and quantization walk one layout instead of each repeating it. Names are
//! Hugging Face's: `LlamaForCausalLM` for dense blocks, the Qwen-MoE spelling for sparse
//! ones (`mlp.gate.weight` is the router, `mlp.experts.{j}.gate_proj.weight` an expert,
//! `mlp.shared_expert.up_proj.weight` the shared expert).

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use super::TransformerConfig;

/// What a tensor is, which decides its initialization, weight decay and int8 storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorKind {
    /// An RMSNorm weight: starts at one, never decayed, stays f32 in int8 models.
    Norm,
    /// A projection or the embedding: decayed, int8 in quantized models.
    Matrix,
    /// A projection's bias: starts at zero, never decayed, stays f32 in int8 models.
    Bias,
    /// A sparse block's router `(n_experts, d_model)`: decayed like a matrix, but kept in
    /// f32 by quantization, since flipping a routing decision costs more than its bytes.
    Router,
}

/// Shape and kind of one tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// What the tensor is (which decides how it is stored and quantized).
    pub kind: TensorKind,
}

impl TensorSpec {
    /// Elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }
    /// No elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// `(rows, cols)` of a matrix; a vector is one row.
    pub fn rows_cols(&self) -> (usize, usize) {
        match self.shape.as_slice() {
            [r, c] => (*r, *c),
            [c] => (1, *c),
            _ => (0, 0),
        }
    }
}

/// A SwiGLU feed-forward: a dense block's, one expert, or the shared expert.
#[derive(Debug, Clone, PartialEq)]
pub struct Swiglu<T> {
    /// `(f, d_model)`.
    pub gate: T,
    /// `(f, d_model)`.
    pub up: T,
    /// `(d_model, f)`.
    pub down: T,
}

/// A sparse block's router and routed experts.
#[derive(Debug, Clone, PartialEq)]
pub struct Experts<T> {
    /// `(n_experts, d_model)`.
    pub router: T,
    /// The routed experts.
    pub experts: Vec<Swiglu<T>>,
}

/// One block.
#[derive(Debug, Clone, PartialEq)]
pub struct Block<T> {
    /// `(d_model)`: RMSNorm before attention.
    pub attn_norm: T,
    /// `(q_dim, d_model)`: the query projection.
    pub wq: T,
    /// `(kv_dim, d_model)`: the key projection.
    pub wk: T,
    /// `(kv_dim, d_model)`: the value projection.
    pub wv: T,
    /// `(d_model, q_dim)`: the output projection.
    pub wo: T,
    /// `(q_dim)`, `(kv_dim)`, `(kv_dim)`: biases of the query, key and value projections
    /// (`qkv_bias`, as Qwen2 has them).
    pub q_bias: Option<T>,
    /// The key projection's bias.
    pub k_bias: Option<T>,
    /// The value projection's bias.
    pub v_bias: Option<T>,
    /// `(head_dim)`: RMSNorm weights over each query and each key head, applied before
    /// RoPE (`qk_norm`, as Qwen3 has them).
    pub q_norm: Option<T>,
    /// The key heads' norm.
    pub k_norm: Option<T>,
    /// `(d_model)`: RMSNorm before the feed-forward.
    pub ffn_norm: T,
    /// The dense feed-forward; in a sparse block, the shared expert (if it has one).
    pub mlp: Option<Swiglu<T>>,
    /// A sparse block's router and experts.
    pub moe: Option<Experts<T>>,
}

/// The whole model.
#[derive(Debug, Clone, PartialEq)]
pub struct Tree<T> {
    /// `(vocab, d_model)`; also the output head when `lm_head` is `None` (tied).
    pub embed: T,
    /// The blocks.
    pub layers: Vec<Block<T>>,
    /// `(d_model)`: RMSNorm before the head.
    pub final_norm: T,
    /// `(vocab, d_model)`: an output head of its own (`tie_embeddings: false`).
    pub lm_head: Option<T>,
}

impl<T> Swiglu<T> {
    /// Borrows each tensor.
    pub fn as_ref(&self) -> Swiglu<&T> {
        Swiglu { gate: &self.gate, up: &self.up, down: &self.down }
    }
    /// Borrows each tensor mutably.
    pub fn as_mut(&mut self) -> Swiglu<&mut T> {
        Swiglu { gate: &mut self.gate, up: &mut self.up, down: &mut self.down }
    }
    /// Each tensor through `f`.
    pub fn map<U>(self, f: &mut impl FnMut(T) -> U) -> Swiglu<U> {
        Swiglu { gate: f(self.gate), up: f(self.up), down: f(self.down) }
    }
    fn try_map<U, E>(
        self, prefix: &str, f: &mut impl FnMut(&str, T) -> Result<U, E>,
    ) -> Result<Swiglu<U>, E> {
        Ok(Swiglu {
            gate: f(&format!("{prefix}gate_proj.weight"), self.gate)?,
            up: f(&format!("{prefix}up_proj.weight"), self.up)?,
            down: f(&format!("{prefix}down_proj.weight"), self.down)?,
        })
    }
    fn zip<U>(self, o: Swiglu<U>) -> Swiglu<(T, U)> {
        Swiglu { gate: (self.gate, o.gate), up: (self.up, o.up), down: (self.down, o.down) }
    }
}

impl<T> Block<T> {
    /// Borrows each tensor.
    pub fn as_ref(&self) -> Block<&T> {
        Block {
            attn_norm: &self.attn_norm,
            wq: &self.wq,
            wk: &self.wk,
            wv: &self.wv,
            wo: &self.wo,
            q_bias: self.q_bias.as_ref(),
            k_bias: self.k_bias.as_ref(),
            v_bias: self.v_bias.as_ref(),
            q_norm: self.q_norm.as_ref(),
            k_norm: self.k_norm.as_ref(),
            ffn_norm: &self.ffn_norm,
            mlp: self.mlp.as_ref().map(Swiglu::as_ref),
            moe: self.moe.as_ref().map(|m| Experts {
                router: &m.router,
                experts: m.experts.iter().map(Swiglu::as_ref).collect(),
            }),
        }
    }
    /// Borrows each tensor mutably.
    pub fn as_mut(&mut self) -> Block<&mut T> {
        Block {
            attn_norm: &mut self.attn_norm,
            wq: &mut self.wq,
            wk: &mut self.wk,
            wv: &mut self.wv,
            wo: &mut self.wo,
            q_bias: self.q_bias.as_mut(),
            k_bias: self.k_bias.as_mut(),
            v_bias: self.v_bias.as_mut(),
            q_norm: self.q_norm.as_mut(),
            k_norm: self.k_norm.as_mut(),
            ffn_norm: &mut self.ffn_norm,
            mlp: self.mlp.as_mut().map(Swiglu::as_mut),
            moe: self.moe.as_mut().map(|m| Experts {
                router: &mut m.router,
                experts: m.experts.iter_mut().map(Swiglu::as_mut).collect(),
            }),
        }
    }
    /// Every leaf through `f`, without names (the per-token paths use this).
    pub fn map<U>(self, mut f: impl FnMut(T) -> U) -> Block<U> {
        Block {
            attn_norm: f(self.attn_norm),
            wq: f(self.wq),
            wk: f(self.wk),
            wv: f(self.wv),
            wo: f(self.wo),
            q_bias: self.q_bias.map(&mut f),
            k_bias: self.k_bias.map(&mut f),
            v_bias: self.v_bias.map(&mut f),
            q_norm: self.q_norm.map(&mut f),
            k_norm: self.k_norm.map(&mut f),
            ffn_norm: f(self.ffn_norm),
            mlp: self.mlp.map(|m| m.map(&mut f)),
            moe: self.moe.map(|m| Experts {
                router: f(m.router),
                experts: m.experts.into_iter().map(|e| e.map(&mut f)).collect(),
            }),
        }
    }
    /// Every leaf through `f` with its name under `prefix` (`model.layers.3.`), in the
    /// order of [`Tree::into_leaves`].
    pub fn try_map<U, E>(
        self, prefix: &str, f: &mut impl FnMut(&str, T) -> Result<U, E>,
    ) -> Result<Block<U>, E> {
        let mut g = |name: &str, t: T| f(&format!("{prefix}{name}"), t);
        let attn_norm = g("input_layernorm.weight", self.attn_norm)?;
        let wq = g("self_attn.q_proj.weight", self.wq)?;
        let wk = g("self_attn.k_proj.weight", self.wk)?;
        let wv = g("self_attn.v_proj.weight", self.wv)?;
        let wo = g("self_attn.o_proj.weight", self.wo)?;
        let mut opt = |name: &str, t: Option<T>| t.map(|t| g(name, t)).transpose();
        let q_bias = opt("self_attn.q_proj.bias", self.q_bias)?;
        let k_bias = opt("self_attn.k_proj.bias", self.k_bias)?;
        let v_bias = opt("self_attn.v_proj.bias", self.v_bias)?;
        let q_norm = opt("self_attn.q_norm.weight", self.q_norm)?;
        let k_norm = opt("self_attn.k_norm.weight", self.k_norm)?;
        let ffn_norm = g("post_attention_layernorm.weight", self.ffn_norm)?;
        let sparse = self.moe.is_some();
        let moe = match self.moe {
            None => None,
            Some(m) => {
                let router = f(&format!("{prefix}mlp.gate.weight"), m.router)?;
                let experts = m
                    .experts
                    .into_iter()
                    .enumerate()
                    .map(|(j, e)| e.try_map(&format!("{prefix}mlp.experts.{j}."), f))
                    .collect::<Result<_, E>>()?;
                Some(Experts { router, experts })
            }
        };
        let mlp_prefix = if sparse { format!("{prefix}mlp.shared_expert.") } else { format!("{prefix}mlp.") };
        let mlp = match self.mlp {
            None => None,
            Some(m) => Some(m.try_map(&mlp_prefix, f)?),
        };
        Ok(Block { attn_norm, wq, wk, wv, wo, q_bias, k_bias, v_bias, q_norm, k_norm, ffn_norm, mlp, moe })
    }
    /// Pairs the leaves of two blocks of the same layout; `None` when the layouts differ.
    pub fn zip<U>(self, o: Block<U>) -> Option<Block<(T, U)>> {
        let mlp = match (self.mlp, o.mlp) {
            (None, None) => None,
            (Some(a), Some(b)) => Some(a.zip(b)),
            _ => return None,
        };
        let moe = match (self.moe, o.moe) {
            (None, None) => None,
            (Some(a), Some(b)) if a.experts.len() == b.experts.len() => Some(Experts {
                router: (a.router, b.router),
                experts: a.experts.into_iter().zip(b.experts).map(|(x, y)| x.zip(y)).collect(),
            }),
            _ => return None,
        };
        fn pair<A, B>(a: Option<A>, b: Option<B>) -> Result<Option<(A, B)>, ()> {
            match (a, b) {
                (None, None) => Ok(None),
                (Some(a), Some(b)) => Ok(Some((a, b))),
                _ => Err(()),
            }
        }
        Some(Block {
            q_bias: pair(self.q_bias, o.q_bias).ok()?,
            k_bias: pair(self.k_bias, o.k_bias).ok()?,
            v_bias: pair(self.v_bias, o.v_bias).ok()?,
            q_norm: pair(self.q_norm, o.q_norm).ok()?,
            k_norm: pair(self.k_norm, o.k_norm).ok()?,
            attn_norm: (self.attn_norm, o.attn_norm),
            wq: (self.wq, o.wq),
            wk: (self.wk, o.wk),
            wv: (self.wv, o.wv),
            wo: (self.wo, o.wo),
            ffn_norm: (self.ffn_norm, o.ffn_norm),
            mlp,
            moe,
        })
    }
    /// Every leaf, in the order of [`Block::try_map`] (no names are built: the optimizer
    /// and the gradient norm walk this every step).
    pub fn into_leaves(self) -> Vec<T> {
        let mut out = alloc::vec![self.attn_norm, self.wq, self.wk, self.wv, self.wo];
        out.extend(self.q_bias);
        out.extend(self.k_bias);
        out.extend(self.v_bias);
        out.extend(self.q_norm);
        out.extend(self.k_norm);
        out.push(self.ffn_norm);
        if let Some(m) = self.moe {
            out.push(m.router);
            for e in m.experts {
                out.extend([e.gate, e.up, e.down]);
            }
        }
        if let Some(m) = self.mlp {
            out.extend([m.gate, m.up, m.down]);
        }
        out
    }
}

impl<T> Tree<T> {
    /// Borrows each tensor.
    pub fn as_ref(&self) -> Tree<&T> {
        Tree {
            embed: &self.embed,
            layers: self.layers.iter().map(Block::as_ref).collect(),
            final_norm: &self.final_norm,
            lm_head: self.lm_head.as_ref(),
        }
    }
    /// The output head: `lm_head` when the model has one, else the tied embedding.
    pub fn head(&self) -> &T {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }
    /// Borrows each tensor mutably.
    pub fn as_mut(&mut self) -> Tree<&mut T> {
        Tree {
            embed: &mut self.embed,
            layers: self.layers.iter_mut().map(Block::as_mut).collect(),
            final_norm: &mut self.final_norm,
            lm_head: self.lm_head.as_mut(),
        }
    }
    /// Every leaf through `f` with its Hugging Face name, in the order of
    /// [`Tree::into_leaves`]; the first error stops the walk.
    pub fn try_map<U, E>(self, mut f: impl FnMut(&str, T) -> Result<U, E>) -> Result<Tree<U>, E> {
        let embed = f("model.embed_tokens.weight", self.embed)?;
        let layers = self
            .layers
            .into_iter()
            .enumerate()
            .map(|(i, l)| l.try_map(&format!("model.layers.{i}."), &mut f))
            .collect::<Result<_, E>>()?;
        let final_norm = f("model.norm.weight", self.final_norm)?;
        let lm_head = match self.lm_head {
            Some(h) => Some(f("lm_head.weight", h)?),
            None => None,
        };
        Ok(Tree { embed, layers, final_norm, lm_head })
    }
    /// Pairs the leaves of two trees of the same layout; `None` when the layouts differ.
    pub fn zip<U>(self, o: Tree<U>) -> Option<Tree<(T, U)>> {
        if self.layers.len() != o.layers.len() {
            return None;
        }
        let layers = self.layers.into_iter().zip(o.layers).map(|(a, b)| a.zip(b)).collect::<Option<_>>()?;
        let lm_head = match (self.lm_head, o.lm_head) {
            (None, None) => None,
            (Some(a), Some(b)) => Some((a, b)),
            _ => return None,
        };
        Some(Tree {
            embed: (self.embed, o.embed),
            layers,
            final_norm: (self.final_norm, o.final_norm),
            lm_head,
        })
    }
    /// Every leaf: the embedding; per block the norms and attention projections, then the
    /// router and experts, then the dense feed-forward or shared expert; the final norm;
    /// the untied output head.
    pub fn into_leaves(self) -> Vec<T> {
        let mut out = alloc::vec![self.embed];
        for l in self.layers {
            out.extend(l.into_leaves());
        }
        out.push(self.final_norm);
        out.extend(self.lm_head);
        out
    }
    /// Every leaf with its name, in the order of [`Tree::into_leaves`].
    pub fn into_named(self) -> Vec<(String, T)> {
        let mut out = Vec::new();
        let _ = self.try_map(|name, t| {
            out.push((String::from(name), t));
            Ok::<(), ()>(())
        });
        out
    }
    /// Builds a tree of this layout from `leaves` in [`Tree::into_leaves`] order; `None`
    /// when the count differs.
    pub fn with_leaves<U>(&self, leaves: Vec<U>) -> Option<Tree<U>> {
        let n = leaves.len();
        let mut it = leaves.into_iter();
        let tree = self.as_ref().try_map(|_, _| it.next().ok_or(())).ok()?;
        (it.next().is_none() && self.as_ref().into_leaves().len() == n).then_some(tree)
    }
}

impl TransformerConfig {
    /// The shape and kind of every tensor.
    pub fn layout(&self) -> Tree<TensorSpec> {
        let (d, q, kv) = (self.d_model, self.q_dim(), self.kv_dim());
        let t = |shape: &[usize], kind| TensorSpec { shape: shape.to_vec(), kind };
        let norm = || t(&[d], TensorKind::Norm);
        let mat = |r: usize, c: usize| t(&[r, c], TensorKind::Matrix);
        let swiglu = |f: usize| Swiglu { gate: mat(f, d), up: mat(f, d), down: mat(d, f) };
        let layers = (0..self.n_layers)
            .map(|l| Block {
                attn_norm: norm(),
                wq: mat(q, d),
                wk: mat(kv, d),
                wv: mat(kv, d),
                wo: mat(d, q),
                q_bias: self.qkv_bias.then(|| t(&[q], TensorKind::Bias)),
                k_bias: self.qkv_bias.then(|| t(&[kv], TensorKind::Bias)),
                v_bias: self.qkv_bias.then(|| t(&[kv], TensorKind::Bias)),
                q_norm: self.qk_norm.then(|| t(&[self.head_dim], TensorKind::Norm)),
                k_norm: self.qk_norm.then(|| t(&[self.head_dim], TensorKind::Norm)),
                ffn_norm: norm(),
                mlp: self.mlp_width(l).map(swiglu),
                moe: self.sparse(l).map(|m| Experts {
                    router: t(&[m.n_experts, d], TensorKind::Router),
                    experts: (0..m.n_experts).map(|_| swiglu(m.expert_d_ff)).collect(),
                }),
            })
            .collect();
        Tree {
            embed: mat(self.vocab_size, d),
            layers,
            final_norm: norm(),
            lm_head: (!self.tie_embeddings).then(|| mat(self.vocab_size, d)),
        }
    }
}

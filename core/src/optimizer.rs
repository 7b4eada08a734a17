//! The optimizer a model trains with: a small value type, read again at every step, so a
//! schedule is one `set_learning_rate` call and nothing has to be registered.

use crate::ops::optim::{AdamParams, SgdParams};
use crate::Result;

/// The update rule and its own settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OptimizerKind {
    /// Plain or momentum SGD, PyTorch semantics (no dampening); weight decay is L2.
    Sgd {
        /// Momentum (0: none).
        momentum: f32,
        /// Nesterov momentum.
        nesterov: bool,
    },
    /// Adam with bias correction; weight decay is decoupled (AdamW).
    Adam {
        /// First moment's decay.
        beta1: f32,
        /// Second moment's decay.
        beta2: f32,
        /// Added to the second moment's square root.
        epsilon: f32,
    },
}

/// Which update rule, at which learning rate, with which settings.
///
/// ```
/// use rusting_brain_core::Optimizer;
/// let mut opt = Optimizer::adam(3e-4).betas(0.9, 0.95).weight_decay(0.1);
/// opt.set_learning_rate(1e-4); // keeps the betas and the decay
/// assert_eq!(opt.learning_rate(), 1e-4);
/// assert_eq!(opt, Optimizer::adam(1e-4).betas(0.9, 0.95).weight_decay(0.1));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Optimizer {
    /// The rule (SGD or Adam) and its settings.
    pub kind: OptimizerKind,
    learning_rate: f32,
    weight_decay: f32,
}

impl Optimizer {
    /// Plain SGD: `p -= lr * g`.
    pub fn sgd(learning_rate: f32) -> Self {
        Optimizer {
            kind: OptimizerKind::Sgd { momentum: 0.0, nesterov: false },
            learning_rate,
            weight_decay: 0.0,
        }
    }
    /// SGD with momentum (PyTorch's: no dampening).
    pub fn sgd_momentum(learning_rate: f32, momentum: f32) -> Self {
        Optimizer { kind: OptimizerKind::Sgd { momentum, nesterov: false }, learning_rate, weight_decay: 0.0 }
    }
    /// Adam with PyTorch's defaults: betas (0.9, 0.999), epsilon 1e-8, no weight decay.
    pub fn adam(learning_rate: f32) -> Self {
        Optimizer {
            kind: OptimizerKind::Adam { beta1: 0.9, beta2: 0.999, epsilon: 1e-8 },
            learning_rate,
            weight_decay: 0.0,
        }
    }
    /// Adam's betas; ignored by SGD.
    pub fn betas(mut self, beta1: f32, beta2: f32) -> Self {
        if let OptimizerKind::Adam { epsilon, .. } = self.kind {
            self.kind = OptimizerKind::Adam { beta1, beta2, epsilon };
        }
        self
    }
    /// Adam's epsilon; ignored by SGD.
    pub fn epsilon(mut self, eps: f32) -> Self {
        if let OptimizerKind::Adam { beta1, beta2, .. } = self.kind {
            self.kind = OptimizerKind::Adam { beta1, beta2, epsilon: eps };
        }
        self
    }
    /// Nesterov momentum; ignored by Adam.
    pub fn nesterov(mut self, on: bool) -> Self {
        if let OptimizerKind::Sgd { momentum, .. } = self.kind {
            self.kind = OptimizerKind::Sgd { momentum, nesterov: on };
        }
        self
    }
    /// Decoupled for Adam (AdamW), L2 for SGD.
    pub fn weight_decay(mut self, decay: f32) -> Self {
        self.weight_decay = decay;
        self
    }
    /// The rate the next step uses.
    pub fn learning_rate(&self) -> f32 {
        self.learning_rate
    }
    /// The weight decay (decoupled for Adam, L2 for SGD).
    pub fn decay(&self) -> f32 {
        self.weight_decay
    }
    /// Changes only the learning rate; betas, epsilon, momentum and decay stay.
    pub fn set_learning_rate(&mut self, learning_rate: f32) {
        self.learning_rate = learning_rate;
    }
    /// Whether the update keeps per-weight state (and how many buffers of it).
    pub fn state_buffers(&self) -> usize {
        match self.kind {
            OptimizerKind::Adam { .. } => 2,
            OptimizerKind::Sgd { momentum, .. } if momentum != 0.0 => 1,
            OptimizerKind::Sgd { .. } => 0,
        }
    }
    /// Checks the hyper-parameters as the update primitives will.
    pub fn validate(&self) -> Result<()> {
        match (self.adam_params(1.0), self.sgd_params(1.0)) {
            (Some(p), _) => p.validate("optimizer"),
            (_, Some(p)) => p.validate("optimizer"),
            (None, None) => Ok(()),
        }
    }
    /// Adam's parameters with gradients scaled by `grad_scale`, or None for SGD.
    pub fn adam_params(&self, grad_scale: f32) -> Option<AdamParams> {
        match self.kind {
            OptimizerKind::Adam { beta1, beta2, epsilon } => Some(AdamParams {
                lr: self.learning_rate,
                beta1,
                beta2,
                eps: epsilon,
                weight_decay: self.weight_decay,
                decoupled: true,
                grad_scale,
            }),
            OptimizerKind::Sgd { .. } => None,
        }
    }
    /// SGD's parameters with gradients scaled by `grad_scale`, or None for Adam.
    pub fn sgd_params(&self, grad_scale: f32) -> Option<SgdParams> {
        match self.kind {
            OptimizerKind::Sgd { momentum, nesterov } => Some(SgdParams {
                lr: self.learning_rate,
                momentum,
                nesterov,
                weight_decay: self.weight_decay,
                grad_scale,
            }),
            OptimizerKind::Adam { .. } => None,
        }
    }
}

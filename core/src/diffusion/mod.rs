//! Samplers of the image pipelines: the noise schedules and the update that moves a latent
//! from one noise level to the next, as diffusers defines them.

pub mod discrete;
pub mod flow_match;
pub mod torch_randn;

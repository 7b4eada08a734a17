//! The denoising loop: the schedule and its sampler, the starting noise, and the steps of the
//! diffusion transformers and of the UNets (with classifier-free guidance).

use super::*;

/// A flow-matching run's sampler: diffusers' Euler, or (SD3) DPM-Solver++ 2M over flow
/// sigmas.
pub(super) enum FlowStepper {
    Euler(FlowMatchEuler),
    Dpm(DiscreteSampler),
}

impl FlowStepper {
    pub(super) fn steps(&self) -> usize {
        match self {
            FlowStepper::Euler(s) => s.steps(),
            FlowStepper::Dpm(s) => s.steps(),
        }
    }
    /// The model's timestep, in training units (0..1000).
    pub(super) fn timestep(&self, i: usize) -> f32 {
        match self {
            FlowStepper::Euler(s) => s.timestep(i),
            FlowStepper::Dpm(s) => s.timesteps[i] as f32,
        }
    }
    pub(super) fn step(&mut self, i: usize, x: &mut [f32], v: &[f32]) -> Result<()> {
        match self {
            FlowStepper::Euler(s) => s.step(i, x, v)?,
            FlowStepper::Dpm(s) => s.step(i, x, v, None)?,
        }
        Ok(())
    }
    pub(super) fn sigmas(&self) -> Vec<f32> {
        match self {
            FlowStepper::Euler(s) => s.sigmas.clone(),
            FlowStepper::Dpm(s) => s.sigmas.iter().map(|&x| x as f32).collect(),
        }
    }
}

impl ImagePipeline {
    /// The latent shape a `width x height` picture has, checking the sides.
    pub fn latent_shape(&self, width: usize, height: usize) -> Result<(usize, usize, usize)> {
        let f = self.vae.config().downscale();
        let (multiple, channels) = match self.family {
            Family::Sd | Family::Sdxl => {
                let unet = self.unet_ref()?;
                (f * unet.config().downscale(), unet.config().in_channels)
            }
            Family::Flux => (2 * f, self.denoiser()?.config().in_channels / 4),
            Family::Flux2 => (2 * f, self.denoiser()?.config().in_channels),
            Family::Sd3 => {
                let dit = self.denoiser()?;
                (f * dit.config().patch_size, dit.config().in_channels)
            }
        };
        if width == 0 || height == 0 || !width.is_multiple_of(multiple) || !height.is_multiple_of(multiple) {
            return Err(NetworkError::InvalidInput(format!(
                "{width}x{height}: both sides must be positive multiples of {multiple} for this model"
            )));
        }
        Ok(match self.family {
            Family::Flux2 => (channels, height / multiple, width / multiple),
            _ => (channels, height / f, width / f),
        })
    }
    pub(super) fn unet_ref(&self) -> Result<&Unet> {
        self.unet
            .as_ref()
            .ok_or_else(|| NetworkError::InvalidInput("the denoiser was dropped (drop_denoiser)".into()))
    }
    pub(super) fn denoiser(&self) -> Result<&Dit> {
        self.dit
            .as_ref()
            .ok_or_else(|| NetworkError::InvalidInput("the denoiser was dropped (drop_denoiser)".into()))
    }
    /// The schedule for `steps` steps at a latent of `(h, w)`.
    pub(super) fn schedule(&self, h: usize, w: usize) -> Result<FlowStepper> {
        let n = self.config.steps;
        if n == 0 {
            return Err(NetworkError::InvalidInput("0 steps".into()));
        }
        let NoiseSchedule::Flow(flow) = &self.scheduler else {
            return Err(NetworkError::InvalidInput("a UNet pipeline has no flow-matching schedule".into()));
        };
        match (self.config.solver, self.family) {
            (Solver::Euler, _) => {}
            // diffusers' SD3 pipeline takes DPM-Solver++ over flow sigmas; its FLUX
            // pipelines pass sigmas of their own, which only the Euler scheduler takes.
            (Solver::DpmPlusPlus2M, Family::Sd3) => {
                let shift = if flow.use_dynamic_shifting {
                    let p = self.dit.as_ref().map(|d| d.config().patch_size).unwrap_or(2);
                    flow.flux1_mu((h / p) * (w / p)).exp()
                } else {
                    flow.shift
                };
                return Ok(FlowStepper::Dpm(DiscreteSampler::flow_dpm(n, shift, flow.num_train_timesteps)?));
            }
            (solver, family) => {
                return Err(NetworkError::InvalidInput(format!(
                    "{solver:?}: {family:?} steps with Euler (SD3 also with DPM++ 2M)"
                )))
            }
        }
        let linspace: Vec<f64> = (0..n)
            .map(|i| if n == 1 { 1.0 } else { 1.0 + (1.0 / n as f64 - 1.0) * i as f64 / (n - 1) as f64 })
            .collect();
        Ok(match self.family {
            Family::Flux => {
                let tokens = (h / 2) * (w / 2);
                let mu = flow.use_dynamic_shifting.then(|| flow.flux1_mu(tokens));
                FlowStepper::Euler(FlowMatchEuler::new(flow, n, Some(&linspace), mu)?)
            }
            Family::Flux2 => {
                let mu = flux2_empirical_mu(h * w, n);
                FlowStepper::Euler(FlowMatchEuler::new(flow, n, Some(&linspace), Some(mu))?)
            }
            _ => {
                let mu = flow.use_dynamic_shifting.then(|| {
                    let p = self.dit.as_ref().map(|d| d.config().patch_size).unwrap_or(2);
                    flow.flux1_mu((h / p) * (w / p))
                });
                FlowStepper::Euler(FlowMatchEuler::new(flow, n, None, mu)?)
            }
        })
    }
    pub(super) fn is_unet(&self) -> bool {
        self.family.dit_kind().is_none()
    }
    /// A fresh run of the UNet pipelines' sampler (`config.solver` over the folder's
    /// training schedule).
    pub(super) fn discrete_sampler(&self) -> Result<DiscreteSampler> {
        let NoiseSchedule::Discrete(path) = &self.scheduler else {
            return Err(NetworkError::InvalidInput(
                "a flow-matching pipeline has no discrete schedule".into(),
            ));
        };
        let config = crate::image::scheduler::discrete_config_for(path, self.config.solver)?;
        Ok(DiscreteSampler::new(self.config.solver, config, self.config.steps)?)
    }
    /// The `steps + 1` sigmas (the last 0) a `width x height` run steps through, as the
    /// family's pipeline sets its scheduler.
    pub fn sigmas(&self, width: usize, height: usize) -> Result<Vec<f32>> {
        let (_, h, w) = self.latent_shape(width, height)?;
        if self.is_unet() {
            return Ok(self.discrete_sampler()?.sigmas.iter().map(|&s| s as f32).collect());
        }
        Ok(self.schedule(h, w)?.sigmas())
    }
    /// Denoises from noise to a `width x height` picture's latent, calling
    /// `progress(step, total)` after each step (`false` stops the run with an error).
    pub fn sample_latent(
        &self, cond: &Conditioning, width: usize, height: usize, noise: Noise,
        progress: impl FnMut(usize, usize) -> bool,
    ) -> Result<Latent> {
        let (c, h, w) = self.latent_shape(width, height)?;
        let n = c * h * w;
        let mut generator = None;
        let noise = match noise {
            Noise::Seed(seed) => {
                let mut g = TorchGenerator::new(seed);
                let v = g.randn(n);
                generator = Some(g);
                v
            }
            Noise::Given(v) => check_noise(v, n)?,
        };
        let mut start = Latent { data: noise, channels: c, height: h, width: w };
        if self.is_unet() {
            let sampler = self.discrete_sampler()?;
            let k = sampler.init_noise_sigma() as f32;
            start.data.iter_mut().for_each(|v| *v *= k);
            return self.denoise_unet(cond, start, sampler, 0, generator, progress);
        }
        let mut schedule = self.schedule(h, w)?;
        self.denoise(cond, start, &mut schedule, 0, progress)
    }
    /// img2img: `image` (in [-1, 1], sides multiples of the model's) encoded, pushed
    /// `strength` of the way back up the schedule and denoised from there.
    pub fn sample_latent_from_image(
        &self, cond: &Conditioning, image: &Image, strength: f32, noise: Noise,
        progress: impl FnMut(usize, usize) -> bool,
    ) -> Result<Latent> {
        if !(0.0..=1.0).contains(&strength) {
            return Err(NetworkError::InvalidInput(format!("strength {strength} is outside [0, 1]")));
        }
        let (c, h, w) = self.latent_shape(image.width, image.height)?;
        if image.data.len() != image.channels * image.height * image.width {
            return Err(NetworkError::InvalidInput(format!(
                "the image holds {} values; {} channels of {}x{} need {}",
                image.data.len(),
                image.channels,
                image.width,
                image.height,
                image.channels * image.height * image.width
            )));
        }
        let dist = self.vae.encode_image(image)?;
        let n = c * h * w;
        // diffusers' img2img pipelines sample the latent with the same generator as the
        // noise, first, or take the mean (see Family::img2img_from_mean).
        let mut generator = None;
        let (z, noise) = match noise {
            Noise::Seed(seed) => {
                let mut g = TorchGenerator::new(seed);
                let z = if self.family.img2img_from_mean() {
                    dist.mean.clone()
                } else {
                    dist.sample(&g.randn(dist.mean.len()))?
                };
                let noise = g.randn(n);
                generator = Some(g);
                (z, noise)
            }
            Noise::Given(v) => (dist.mean.clone(), check_noise(v, n)?),
        };
        let (x0, dc, dh, dw) = self.vae.to_denoiser(&z, 1, dist.h, dist.w)?;
        if (dc, dh, dw) != (c, h, w) {
            return Err(NetworkError::InvalidInput(format!(
                "the autoencoder gives a ({dc}, {dh}, {dw}) latent; the denoiser takes ({c}, {h}, {w})"
            )));
        }
        if self.is_unet() {
            // Stable Diffusion's rule: int(N * strength) steps run.
            let sampler = self.discrete_sampler()?;
            let steps = sampler.steps();
            let first = steps - ((steps as f64 * strength as f64) as usize).min(steps);
            if first >= steps {
                return Err(NetworkError::InvalidInput(format!(
                    "strength {strength} over {steps} steps leaves no step to run"
                )));
            }
            let data = sampler.add_noise(first, &x0, &noise)?;
            let start = Latent { data, channels: c, height: h, width: w };
            return self.denoise_unet(cond, start, sampler, first, generator, progress);
        }
        // diffusers' img2img pipelines noise the start with the Euler scheduler's
        // scale_noise, which only it has.
        let FlowStepper::Euler(schedule) = self.schedule(h, w)? else {
            return Err(NetworkError::InvalidInput(format!(
                "img2img of a flow model steps with Euler, not {:?}",
                self.config.solver
            )));
        };
        let first = schedule.start_for_strength(strength as f64)?;
        if first >= schedule.steps() {
            return Err(NetworkError::InvalidInput(format!(
                "strength {strength} over {} steps leaves no step to run",
                schedule.steps()
            )));
        }
        let data = schedule.scale_noise(first, &x0, &noise)?;
        let start = Latent { data, channels: c, height: h, width: w };
        self.denoise(cond, start, &mut FlowStepper::Euler(schedule), first, progress)
    }
    /// The flow-matching loop from step `first`.
    pub(super) fn denoise(
        &self, cond: &Conditioning, mut latent: Latent, schedule: &mut FlowStepper, first: usize,
        mut progress: impl FnMut(usize, usize) -> bool,
    ) -> Result<Latent> {
        let dit = self.denoiser()?;
        let cfg = dit.config();
        let (c, h, w) = (latent.channels, latent.height, latent.width);
        let embeddings: Vec<&PromptEmbedding> = match &cond.negative {
            Some(neg) if self.uses_cfg() => vec![neg, &cond.prompt],
            _ => vec![&cond.prompt],
        };
        let batch = embeddings.len();
        let tokens = cond.prompt.tokens;
        if embeddings.iter().any(|e| e.tokens != tokens) {
            return Err(NetworkError::InvalidInput(
                "the prompt and the negative prompt have different token counts".into(),
            ));
        }
        let mut context = Vec::with_capacity(batch * tokens * cfg.joint_attention_dim);
        let mut pooled = Vec::new();
        for e in &embeddings {
            if e.states.len() != tokens * cfg.joint_attention_dim {
                return Err(NetworkError::InvalidInput(format!(
                    "the prompt states are {} values; {tokens} tokens of {} are {}",
                    e.states.len(),
                    cfg.joint_attention_dim,
                    tokens * cfg.joint_attention_dim
                )));
            }
            context.extend_from_slice(&e.states);
            if let Some(p) = &e.pooled {
                pooled.extend_from_slice(p);
            }
        }
        let pooled = (cfg.kind != DitKind::Flux2).then_some(pooled);
        // Token packing and positions.
        let pack = self.family.token_patch().map(|patch| PatchSpec {
            batch: 1,
            channels: c,
            height: h,
            width: w,
            patch,
            order: PatchOrder::ChannelFirst,
        });
        let axes = cfg.axes_dims_rope.len();
        let (img_ids, txt_ids) = match pack {
            Some(p) => {
                let (gh, gw) = (h / p.patch, w / p.patch);
                let mut img = vec![0f32; gh * gw * axes];
                for r in 0..gh {
                    for col in 0..gw {
                        img[(r * gw + col) * axes + 1] = r as f32;
                        img[(r * gw + col) * axes + 2] = col as f32;
                    }
                }
                let mut txt = vec![0f32; tokens * axes];
                if self.family.numbers_prompt_tokens() {
                    for l in 0..tokens {
                        txt[l * axes + 3] = l as f32;
                    }
                }
                (img, txt)
            }
            None => (Vec::new(), Vec::new()),
        };
        let guidance = cfg.guidance_embeds.then(|| vec![self.config.guidance_scale; batch]);
        let total = schedule.steps() - first;
        let n = c * h * w;
        for i in first..schedule.steps() {
            let t = schedule.timestep(i);
            let timestep = t / self.family.timestep_divisor();
            let timesteps = vec![timestep; batch];
            let mut input_latent = Vec::with_capacity(batch * n);
            let packed = match pack {
                Some(p) => {
                    let mut tok = vec![0f32; n];
                    patchify(&mut tok, &latent.data, &p)?;
                    for _ in 0..batch {
                        input_latent.extend_from_slice(&tok);
                    }
                    true
                }
                None => {
                    for _ in 0..batch {
                        input_latent.extend_from_slice(&latent.data);
                    }
                    false
                }
            };
            let input = DitInput {
                batch,
                latent: if packed {
                    DitLatent::Tokens { data: &input_latent, ids: &img_ids }
                } else {
                    DitLatent::Image { data: &input_latent, height: h, width: w }
                },
                context: &context,
                context_ids: &txt_ids,
                pooled: pooled.as_deref(),
                timestep: &timesteps,
                guidance: guidance.as_deref(),
            };
            let out = dit.forward(&input)?;
            let mut v = if batch == 2 {
                // uncond + scale * (cond - uncond)
                let g = self.config.guidance_scale;
                let (un, co) = out.split_at(n);
                un.iter().zip(co).map(|(&u, &c)| u + g * (c - u)).collect()
            } else {
                out
            };
            if let Some(p) = pack {
                let mut img = vec![0f32; n];
                unpatchify(&mut img, &v, &p)?;
                v = img;
            }
            schedule.step(i, &mut latent.data, &v)?;
            let done = i + 1 - first;
            if !progress(done, total) {
                return Err(NetworkError::InvalidInput(format!(
                    "stopped by the progress callback after step {done} of {total}"
                )));
            }
        }
        Ok(latent)
    }
    /// The UNet loop from step `first`: classifier-free guidance as one batch of two
    /// (negative first), as diffusers runs it; the ancestral samplers' noise continues the
    /// seed's generator.
    pub(super) fn denoise_unet(
        &self, cond: &Conditioning, mut latent: Latent, mut sampler: DiscreteSampler, first: usize,
        mut generator: Option<TorchGenerator>, mut progress: impl FnMut(usize, usize) -> bool,
    ) -> Result<Latent> {
        let unet = self.unet_ref()?;
        let cfg = unet.config();
        if sampler.needs_noise() && generator.is_none() {
            return Err(NetworkError::InvalidInput(format!(
                "{:?} draws noise at every step: start it from Noise::Seed",
                self.config.solver
            )));
        }
        let embeddings: Vec<&PromptEmbedding> = match &cond.negative {
            Some(neg) if self.uses_cfg() => vec![neg, &cond.prompt],
            _ => vec![&cond.prompt],
        };
        let batch = embeddings.len();
        let tokens = cond.prompt.tokens;
        let width = cfg.cross_attention_dim;
        let mut context = Vec::with_capacity(batch * tokens * width);
        let mut pooled = Vec::new();
        for e in &embeddings {
            if e.tokens != tokens || e.states.len() != tokens * width {
                return Err(NetworkError::InvalidInput(format!(
                    "prompt states of {} values; the UNet takes {tokens} tokens of {width}",
                    e.states.len()
                )));
            }
            context.extend_from_slice(&e.states);
            if let Some(p) = &e.pooled {
                pooled.extend_from_slice(p);
            }
        }
        let (c, h, w) = (latent.channels, latent.height, latent.width);
        let f = self.vae.config().downscale() as f32;
        // SD-XL's size conditioning: original size, crop corner (0, 0), target size.
        let time_ids: Vec<f32> = (0..batch)
            .flat_map(|_| [h as f32 * f, w as f32 * f, 0.0, 0.0, h as f32 * f, w as f32 * f])
            .collect();
        let xl = cfg.addition_time_embed_dim.is_some();
        let n = c * h * w;
        let total = sampler.steps() - first;
        for i in first..sampler.steps() {
            let scaled = sampler.scale_model_input(i, &latent.data);
            let mut input = Vec::with_capacity(batch * n);
            for _ in 0..batch {
                input.extend_from_slice(&scaled);
            }
            let t = vec![sampler.timesteps[i] as f32; batch];
            let out = unet.forward(&rusting_brain_core::models::unet::UnetInput {
                sample: &input,
                batch,
                h,
                w,
                timestep: &t,
                context: &context,
                text_embeds: xl.then_some(&pooled[..]),
                time_ids: xl.then_some(&time_ids[..]),
            })?;
            let v: Vec<f32> = if batch == 2 {
                let g = self.config.guidance_scale;
                let (un, co) = out.split_at(n);
                un.iter().zip(co).map(|(&u, &c)| u + g * (c - u)).collect()
            } else {
                out
            };
            let noise = match (&mut generator, sampler.needs_noise()) {
                (Some(g), true) => Some(g.randn(n)),
                _ => None,
            };
            sampler.step(i, &mut latent.data, &v, noise.as_deref())?;
            let done = i + 1 - first;
            if !progress(done, total) {
                return Err(NetworkError::InvalidInput(format!(
                    "stopped by the progress callback after step {done} of {total}"
                )));
            }
        }
        Ok(latent)
    }
}

pub(super) fn check_noise(v: Vec<f32>, n: usize) -> Result<Vec<f32>> {
    if v.len() != n {
        return Err(NetworkError::InvalidInput(format!(
            "the noise holds {} values; the latent has {n}",
            v.len()
        )));
    }
    if v.iter().any(|x| !x.is_finite()) {
        return Err(NetworkError::InvalidInput("the noise holds NaN or infinite values".into()));
    }
    Ok(v)
}

pub(super) fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

//! Recording kernels into one command encoder: shapes are checked here, on the host,
//! before anything is queued, so a wrong size is an error and never a GPU fault. Each op
//! family's recording functions live in the file of its name, beside its WGSL files.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use rusting_brain_core::ops::q8::packed_cols;

use crate::{Gpu, GpuBuffer, ShaderError};

/// One WGSL kernel: defined as a constant in the family file that dispatches it, listed in
/// that file's `KERNELS`, gathered here in [`KERNELS`]. Its pipeline is built when the
/// [`Gpu`] opens and found by name. Its interface (the `Params` uniform at binding 0 and
/// the storage buffers from binding 1, in the order the dispatch passes them) is declared
/// with it, beside that dispatch, and written ahead of the body as WGSL.
#[derive(Clone, Copy)]
pub(crate) struct Kernel {
    /// The file's stem under `wgsl/`: the pipeline's key and the label in GPU tools.
    pub(crate) name: &'static str,
    /// The fields of `Params`, WGSL syntax (`rows: u32, eps: f32`).
    params: &'static str,
    /// The storage buffers in binding order.
    buffers: &'static [Binding],
    /// The WGSL body, preludes included.
    body: &'static str,
    /// Uses subgroup operations: built only on adapters that have them.
    pub(crate) needs_subgroups: bool,
    /// The variant with subgroup operations, dispatched in this one's place where the
    /// device uses subgroups.
    pub(crate) subgroup_twin: Option<&'static Kernel>,
}

/// A storage buffer of a [`Kernel`]: `read` or `read_write`, its name in the WGSL body,
/// its element type.
#[derive(Clone, Copy)]
pub(crate) struct Binding {
    pub(crate) access: &'static str,
    pub(crate) name: &'static str,
    pub(crate) ty: &'static str,
}

impl Kernel {
    /// A kernel without subgroups or a twin (see [`kernel!`]).
    pub(crate) const fn new(
        name: &'static str, params: &'static str, buffers: &'static [Binding], body: &'static str,
    ) -> Kernel {
        Kernel { name, params, buffers, body, needs_subgroups: false, subgroup_twin: None }
    }

    /// This kernel, marked as using subgroup operations.
    pub(crate) const fn with_subgroups(self) -> Kernel {
        Kernel { needs_subgroups: true, ..self }
    }

    /// This kernel, dispatched as `twin` (a subgroup kernel) where the device has subgroups.
    pub(crate) const fn with_subgroup_twin(self, twin: &'static Kernel) -> Kernel {
        assert!(twin.needs_subgroups, "a subgroup twin uses subgroups");
        Kernel { subgroup_twin: Some(twin), ..self }
    }

    /// The storage buffers a dispatch binds.
    pub(crate) fn buffer_count(&self) -> usize {
        self.buffers.len()
    }

    /// The whole WGSL module: `Params`, the bindings, then the body.
    pub(crate) fn source(&self) -> String {
        let mut s =
            format!("struct Params {{ {} }}\n@group(0) @binding(0) var<uniform> p: Params;\n", self.params);
        for (i, b) in self.buffers.iter().enumerate() {
            s += &format!(
                "@group(0) @binding({}) var<storage, {}> {}: array<{}>;\n",
                i + 1,
                b.access,
                b.name,
                b.ty
            );
        }
        s + self.body
    }
}

/// The [`Kernel`] of `wgsl/<name>.wgsl`, after the named files of `wgsl/prelude/` if any,
/// with its `Params` fields (or a constant holding them) and its storage buffers in binding
/// order:
///
/// ```text
/// kernel!("rmsnorm", { rows: u32, dim: u32, eps: f32, pad: u32 },
///     [read inp: f32, read weight: f32, read_write out: f32, read_write rstd: f32])
/// ```
///
/// The name is written once: it finds the file and names the pipeline.
macro_rules! kernel {
    ($name:literal, { $($field:ident: $fty:ident),* $(,)? }, $($rest:tt)*) => {
        kernel!(@ $name, stringify!($($field: $fty),*), $($rest)*)
    };
    ($name:literal, $params:ident, $($rest:tt)*) => {
        kernel!(@ $name, $params, $($rest)*)
    };
    (@ $name:literal, $params:expr, [$($access:ident $buf:ident: $bty:ident),* $(,)?]
        $(, prelude $($prelude:literal),+)?) => {
        $crate::ops::Kernel::new(
            $name,
            $params,
            &[$($crate::ops::Binding {
                access: stringify!($access),
                name: stringify!($buf),
                ty: stringify!($bty),
            }),*],
            concat!(
                $($(include_str!(concat!("../wgsl/prelude/", $prelude, ".wgsl")),)+)?
                include_str!(concat!("../wgsl/", $name, ".wgsl"))
            ),
        )
    };
}

mod activation;
mod attention;
mod cross_entropy;
mod dense;
mod elementwise;
mod embedding;
mod l2norm;
mod lora;
mod loss;
mod matmul;
mod memory;
mod moe;
mod optim;
mod q8;
mod rmsnorm;
mod rope;
mod sampling;
mod softmax;
mod swiglu;

pub use dense::DenseOp;
pub use l2norm::SUM_OF_SQUARES_CHUNK;
pub use lora::LORA_MAX_RANK;
pub use q8::activation_words;
pub use rope::rope_table;
pub use sampling::{check_ids, context_ids, NAN_ROW, NO_ID};

/// Every family's kernels (the families that dispatch none have no list).
const KERNELS: &[&[Kernel]] = &[
    attention::KERNELS,
    cross_entropy::KERNELS,
    dense::KERNELS,
    embedding::KERNELS,
    l2norm::KERNELS,
    lora::KERNELS,
    moe::KERNELS,
    q8::KERNELS,
    rmsnorm::KERNELS,
    rope::KERNELS,
    sampling::KERNELS,
    swiglu::KERNELS,
];

/// Every kernel, in the order their pipelines are built.
pub(crate) fn kernels() -> impl Iterator<Item = &'static Kernel> {
    KERNELS.iter().flat_map(|family| family.iter())
}

/// Rows from which the int8 product takes the register-tiled kernel (a prefill); below,
/// one invocation per output reads each weight once, which is all a decode step needs.
pub const TILED_ROWS: usize = 8;

/// Workgroups one grid dimension may hold (WebGPU's minimum limit).
const MAX_GROUPS: usize = 65_535;
/// Invocations per workgroup in every kernel.
const WG: usize = 64;

/// The scratch row attention keeps its scores in: `batch * q_len * q_heads * kv_capacity`
/// words.
pub type AttentionScratch = GpuBuffer;

/// Kernels recorded into one command encoder and submitted together.
pub struct Batch<'g> {
    gpu: &'g Gpu,
    encoder: wgpu::CommandEncoder,
    cache: CacheMode<'g>,
}

/// Where a dispatch finds its uniform buffer and bind group.
enum CacheMode<'g> {
    /// Made for this dispatch.
    Fresh,
    /// The i-th entry of a recurring sequence (see [`DispatchCache`]).
    Sequence(&'g mut DispatchCache, usize),
    /// Looked up by kernel and buffers (see [`KeyedCache`]).
    Keyed(&'g mut KeyedCache),
}

/// The uniform buffers and bind groups of a sequence of dispatches that recurs (one decode
/// step after another): the i-th dispatch of a cached batch reuses the i-th entry when its
/// kernel and buffers are the same, and only writes its parameters if they changed. A
/// decode step then creates no GPU object at all.
#[derive(Default)]
pub struct DispatchCache {
    entries: Vec<CacheEntry>,
}

/// A binding as [`GpuBuffer::key`] tells it apart: the buffer, the first word, the words.
pub(crate) type BindingKey = (wgpu::Buffer, usize, usize);

struct CacheEntry {
    /// The kernel's name.
    kernel: &'static str,
    /// Each binding's [`GpuBuffer::key`].
    buffers: Vec<BindingKey>,
    params: Vec<u32>,
    uniform: wgpu::Buffer,
    group: wgpu::BindGroup,
}

impl DispatchCache {
    /// Entries held (one per dispatch of the longest batch so far).
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    /// Nothing held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Uniform buffers and bind groups found by (kernel, buffers), for work whose dispatches
/// do not come in a fixed sequence (the backend's primitives, called by model code). The
/// n-th dispatch of a key within one submission takes the key's n-th entry, so each
/// uniform buffer is written at most once per submission and the queued write lands before
/// the commands that read it. Entries unused for [`KeyedCache::KEEP`] submissions are
/// dropped (their buffers with them: an arena that was replaced).
#[derive(Default)]
pub struct KeyedCache {
    /// By kernel name and bindings.
    entries: HashMap<(&'static str, Vec<BindingKey>), Keyed>,
    submission: u64,
}

struct Keyed {
    list: Vec<(Vec<u32>, wgpu::Buffer, wgpu::BindGroup)>,
    used: usize,
    last: u64,
}

impl KeyedCache {
    /// Submissions an entry survives unused.
    pub const KEEP: u64 = 64;

    /// Bind groups held.
    pub fn len(&self) -> usize {
        self.entries.values().map(|k| k.list.len()).sum()
    }
    /// Nothing held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Marks the end of a submission: every key's entries are free again.
    pub fn submitted(&mut self) {
        self.submission += 1;
        let now = self.submission;
        self.entries.retain(|_, k| {
            k.used = 0;
            now - k.last <= Self::KEEP
        });
    }
}

fn u(v: usize, what: &str) -> Result<u32, ShaderError> {
    u32::try_from(v)
        .map_err(|_| ShaderError::Invalid(format!("{what} = {v} does not fit the GPU's 32-bit indices")))
}

fn need(op: &str, name: &str, buf: &GpuBuffer, words: usize) -> Result<(), ShaderError> {
    if buf.len < words {
        return Err(ShaderError::Invalid(format!(
            "{op}: {name} holds {} words, the shape needs {words}",
            buf.len
        )));
    }
    Ok(())
}

/// A 2-D grid, each side within the per-dimension limit.
fn grid2(x: usize, y: usize) -> Result<(u32, u32), ShaderError> {
    if x > MAX_GROUPS || y > MAX_GROUPS {
        return Err(ShaderError::Invalid(format!(
            "a {x} x {y} grid of workgroups is over the limit of {MAX_GROUPS}"
        )));
    }
    Ok((x as u32, y as u32))
}

/// A grid of `groups` workgroups as (x, y) within the per-dimension limit.
fn grid(groups: usize) -> (u32, u32) {
    let x = groups.clamp(1, MAX_GROUPS);
    (x as u32, groups.div_ceil(x).max(1) as u32)
}

impl Gpu {
    /// Starts recording kernels.
    pub fn batch(&self) -> Batch<'_> {
        Batch {
            gpu: self,
            encoder: self.device.create_command_encoder(&Default::default()),
            cache: CacheMode::Fresh,
        }
    }

    /// Starts recording kernels that reuse `cache`'s bind groups (see [`DispatchCache`]).
    pub fn batch_cached<'g>(&'g self, cache: &'g mut DispatchCache) -> Batch<'g> {
        Batch {
            gpu: self,
            encoder: self.device.create_command_encoder(&Default::default()),
            cache: CacheMode::Sequence(cache, 0),
        }
    }

    /// Goes on recording into `encoder` with bind groups from `cache`; [`Batch::finish`]
    /// hands the encoder back unsubmitted.
    pub fn batch_keyed<'g>(&'g self, encoder: wgpu::CommandEncoder, cache: &'g mut KeyedCache) -> Batch<'g> {
        Batch { gpu: self, encoder, cache: CacheMode::Keyed(cache) }
    }
}

impl Batch<'_> {
    fn dispatch(
        &mut self, kernel: &'static Kernel, params: &[u32], buffers: &[&GpuBuffer], groups: (u32, u32),
    ) -> Result<(), ShaderError> {
        self.dispatch3(kernel, params, buffers, (groups.0, groups.1, 1))
    }

    fn dispatch3(
        &mut self, kernel: &'static Kernel, params: &[u32], buffers: &[&GpuBuffer], groups: (u32, u32, u32),
    ) -> Result<(), ShaderError> {
        if buffers.len() != kernel.buffer_count() {
            return Err(ShaderError::Invalid(format!(
                "{} binds {} buffers; the dispatch passed {}",
                kernel.name,
                kernel.buffer_count(),
                buffers.len()
            )));
        }
        // A buffer over one binding is bound only through a slab view (the int8 products
        // and lookups make them); anything else would be a validation error on the device.
        let limit = self.gpu.max_binding();
        if let Some(b) = buffers.iter().find(|b| b.bound_bytes() > limit) {
            return Err(ShaderError::TooLarge {
                what: format!("{}'s operand of {} words", kernel.name, b.len),
                bytes: b.bound_bytes(),
                limit,
            });
        }
        // The subgroup twin where the device has subgroups.
        let kernel = match kernel.subgroup_twin {
            Some(twin) if self.gpu.subgroups => twin,
            _ => kernel,
        };
        let Some(pipeline) = self.gpu.pipelines.get(kernel.name) else {
            unreachable!("only subgroup kernels are missing, and only where they are not picked")
        };
        let mut padded = params.to_vec();
        padded.resize(params.len().div_ceil(4).max(1) * 4, 0);
        let make = |gpu: &Gpu| {
            let uniform = gpu.params(&padded);
            let mut entries =
                vec![wgpu::BindGroupEntry { binding: 0, resource: uniform.as_entire_binding() }];
            for (i, b) in buffers.iter().enumerate() {
                entries.push(wgpu::BindGroupEntry { binding: i as u32 + 1, resource: b.binding() });
            }
            let group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(kernel.name),
                layout: &pipeline.get_bind_group_layout(0),
                entries: &entries,
            });
            gpu.counters.bind_groups.fetch_add(1, Ordering::Relaxed);
            (uniform, group)
        };
        let gpu = self.gpu;
        let group = match &mut self.cache {
            CacheMode::Fresh => make(gpu).1,
            CacheMode::Sequence(cache, at) => {
                let i = *at;
                *at += 1;
                let same = cache.entries.get(i).is_some_and(|e| {
                    e.kernel == kernel.name
                        && e.buffers.len() == buffers.len()
                        && e.buffers.iter().zip(buffers).all(|(a, b)| *a == b.key())
                });
                if same {
                    let e = &mut cache.entries[i];
                    if e.params != padded {
                        // Queued writes land before the next submission's commands.
                        gpu.write_params(&e.uniform, &padded);
                        e.params = padded.clone();
                    }
                    e.group.clone()
                } else {
                    let (uniform, group) = make(gpu);
                    let entry = CacheEntry {
                        kernel: kernel.name,
                        buffers: buffers.iter().map(|b| b.key()).collect(),
                        params: padded.clone(),
                        uniform,
                        group: group.clone(),
                    };
                    if i < cache.entries.len() {
                        cache.entries[i] = entry;
                    } else {
                        cache.entries.push(entry);
                    }
                    group
                }
            }
            CacheMode::Keyed(cache) => {
                let now = cache.submission;
                let key = (kernel.name, buffers.iter().map(|b| b.key()).collect());
                let k = cache.entries.entry(key).or_insert_with(|| Keyed {
                    list: Vec::new(),
                    used: 0,
                    last: now,
                });
                k.last = now;
                let i = k.used;
                k.used += 1;
                match k.list.get_mut(i) {
                    Some((params, uniform, group)) => {
                        if *params != padded {
                            gpu.write_params(uniform, &padded);
                            *params = padded.clone();
                        }
                        group.clone()
                    }
                    None => {
                        let (uniform, group) = make(gpu);
                        k.list.push((padded.clone(), uniform, group.clone()));
                        group
                    }
                }
            }
        };
        gpu.count_dispatch();
        let mut pass = self.encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(kernel.name),
            timestamp_writes: None,
        });
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, &group, &[]);
        pass.dispatch_workgroups(groups.0, groups.1, groups.2);
        Ok(())
    }

    /// Copies `n` words from `src[src_at..]` to `dst[dst_at..]` (the KV-cache append).
    pub fn copy(
        &mut self, dst: &GpuBuffer, dst_at: usize, src: &GpuBuffer, src_at: usize, n: usize,
    ) -> Result<(), ShaderError> {
        need("copy", "src", src, src_at + n)?;
        need("copy", "dst", dst, dst_at + n)?;
        if n > 0 {
            self.encoder.copy_buffer_to_buffer(
                &src.buf,
                (src.at + src_at) as u64 * 4,
                &dst.buf,
                (dst.at + dst_at) as u64 * 4,
                n as u64 * 4,
            );
        }
        Ok(())
    }

    /// Queues everything recorded.
    pub fn submit(self) -> Result<(), ShaderError> {
        self.gpu.submit(self.encoder)
    }

    /// The encoder with everything recorded, not yet submitted.
    pub fn finish(self) -> wgpu::CommandEncoder {
        self.encoder
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_has_its_own_name_and_every_twin_is_listed() {
        let mut names = std::collections::HashSet::new();
        for k in kernels() {
            assert!(names.insert(k.name), "two kernels named {}", k.name);
            assert!(k.source().contains("fn main"), "{}: no entry point", k.name);
        }
        for k in kernels() {
            if let Some(twin) = k.subgroup_twin {
                assert!(
                    kernels().any(|l| l.name == twin.name && l.needs_subgroups),
                    "{}'s subgroup twin {} is in no family's KERNELS",
                    k.name,
                    twin.name
                );
            }
        }
    }
}

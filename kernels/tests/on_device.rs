//! Every CUDA kernel against its core twin on awkward shapes, on a device. Without a CUDA
//! driver and device the tests are reported as ignored with the reason (a custom harness:
//! libtest cannot decide that at run time), never as passed.
//!
//! Outputs are poisoned with NaN before each launch. Tolerances: f32 kernels against core
//! in f64 differ by summation order and `expf`/`rsqrtf` (a few ULP), so 1e-5 relative to
//! the largest value for element-wise and row-wise kernels, 1e-4 for attention (sums over
//! up to 1000 keys); the deterministic kernels (embedding backward, column sums) must give
//! the same bits on two runs.

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use libtest_mimic::{Arguments, Failed, Trial};
use rusting_brain_core::ops::{attention, cross_entropy, embedding, optim, rmsnorm, rope, swiglu};
use rusting_brain_core::{AdamParams, AttentionSpec, Rng, RopeScaling, RopeSpec};
use rusting_brain_kernels::{probe, Compiler, Library, SOURCES};

type R<T = ()> = Result<T, Failed>;
/// A test: its name and the check it runs on the device.
type Case = (&'static str, fn(&Dev) -> R);

struct Dev {
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    compiler: Compiler,
}

impl Dev {
    fn open() -> Result<Dev, String> {
        probe(Library::Driver).map_err(|e| e.to_string())?;
        probe(Library::Nvrtc).map_err(|e| e.to_string())?;
        let n = CudaContext::device_count().map_err(|e| format!("{e:?}"))?;
        if n < 1 {
            return Err("no CUDA device".into());
        }
        let ctx = CudaContext::new(0).map_err(|e| format!("{e:?}"))?;
        let (major, minor) = ctx.compute_capability().map_err(|e| format!("{e:?}"))?;
        let compiler = Compiler::new(&format!("sm_{major}{minor}"), None).map_err(|e| e.to_string())?;
        Ok(Dev { stream: ctx.default_stream(), ctx, compiler })
    }

    fn func(&self, file: &str, name: &str) -> R<CudaFunction> {
        let src = SOURCES.iter().find(|s| s.name == file).ok_or("no such kernel file")?;
        let ptx = self.compiler.ptx(src).map_err(|e| e.to_string())?;
        let module = self.ctx.load_module(Ptx::from_src(ptx)).map_err(|e| format!("{e:?}"))?;
        Ok(module.load_function(name).map_err(|e| format!("{e:?}"))?)
    }

    fn up<T: DeviceRepr + Clone>(&self, x: &[T]) -> R<CudaSlice<T>> {
        Ok(self.stream.clone_htod(x).map_err(|e| format!("{e:?}"))?)
    }

    fn poisoned(&self, n: usize) -> R<CudaSlice<f32>> {
        self.up(&vec![f32::NAN; n])
    }

    fn down<T: DeviceRepr + Clone + Default>(&self, x: &CudaSlice<T>) -> R<Vec<T>> {
        Ok(self.stream.clone_dtoh(x).map_err(|e| format!("{e:?}"))?)
    }
}

fn close(what: &str, got: &[f32], want: &[f64], rel: f64) -> R {
    close_to(what, got, want, rel, 0.0)
}

/// [`close`] with the scale at least `floor` (the size of the terms a cancelling result
/// was computed from).
fn close_to(what: &str, got: &[f32], want: &[f64], rel: f64, floor: f64) -> R {
    if got.len() != want.len() {
        return Err(format!("{what}: {} values, want {}", got.len(), want.len()).into());
    }
    let scale = want.iter().fold(floor.max(1e-30), |m, v| m.max(v.abs()));
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        // Written so NaN (a poisoned output left unwritten) fails too.
        let within = (g as f64 - w).abs() <= rel * scale;
        if !within {
            return Err(format!("{what}[{i}]: {g} vs {w} (scale {scale:.3e}, tolerance {rel})").into());
        }
    }
    Ok(())
}

fn wide(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

fn rows_cfg(rows: usize, threads: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 }
}

fn elems_cfg(n: usize) -> LaunchConfig {
    LaunchConfig::for_num_elems(n.max(1) as u32)
}

macro_rules! launch {
    ($dev:expr, $f:expr, $cfg:expr, $($arg:expr),+ $(,)?) => {{
        let mut b = $dev.stream.launch_builder(&$f);
        $(b.arg($arg);)+
        // SAFETY: the argument list matches the kernel's signature in cu/, and every
        // buffer holds the elements the shape arguments imply.
        unsafe { b.launch($cfg) }.map_err(|e| format!("launch: {e:?}"))?;
        $dev.stream.synchronize().map_err(|e| format!("{e:?}"))?;
    }};
}

const ROWS: [usize; 6] = [1, 3, 7, 33, 127, 1000];

fn rmsnorm_matches(d: &Dev) -> R {
    let (fwd, bwd, colsum) = (
        d.func("rmsnorm", "rmsnorm_forward")?,
        d.func("rmsnorm", "rmsnorm_backward")?,
        d.func("rmsnorm", "column_sum")?,
    );
    let mut rng = Rng::new(1);
    for rows in ROWS {
        for dim in [1usize, 33, 768, 1000] {
            let x = rng.normal_vec(rows * dim, 1.0);
            let w = rng.normal_vec(dim, 1.0);
            let dy = rng.normal_vec(rows * dim, 1.0);
            let (mut out, mut rstd) = (vec![0.0; rows * dim], vec![0.0; rows]);
            rmsnorm::rmsnorm_forward(&mut out, &mut rstd, &wide(&x), &wide(&w), rows, dim, 1e-5)?;
            let (mut dx, mut dw) = (vec![0.0; rows * dim], vec![0.0; dim]);
            rmsnorm::rmsnorm_backward(&mut dx, &mut dw, &wide(&dy), &wide(&x), &wide(&w), &rstd, rows, dim)?;
            let (xg, wg, dyg) = (d.up(&x)?, d.up(&w)?, d.up(&dy)?);
            let (mut og, mut rg) = (d.poisoned(rows * dim)?, d.poisoned(rows)?);
            let (r, n) = (rows as i32, dim as i32);
            launch!(d, fwd, rows_cfg(rows, 256), &mut og, &mut rg, &xg, &wg, &r, &n, &1e-5f32);
            close("rmsnorm out", &d.down(&og)?, &out, 1e-5)?;
            let (mut dxg, mut dwr) = (d.poisoned(rows * dim)?, d.poisoned(rows * dim)?);
            launch!(d, bwd, rows_cfg(rows, 256), &mut dxg, &mut dwr, &dyg, &xg, &wg, &rg, &r, &n);
            // dx is a difference of terms of size |dy w rstd|; where dim is 1 they cancel
            // to ~1e-6 of that, so the error is measured against the terms, not the result.
            let terms = (0..rows * dim)
                .fold(0.0f64, |m, i| m.max((dy[i] * w[i % dim] * rstd[i / dim] as f32).abs() as f64));
            close_to("rmsnorm dx", &d.down(&dxg)?, &dx, 1e-5, terms)?;
            let mut dwg = d.up(&vec![0.0f32; dim])?;
            launch!(d, colsum, elems_cfg(dim), &mut dwg, &dwr, &r, &n);
            close("rmsnorm dweight", &d.down(&dwg)?, &dw, 1e-4)?;
        }
    }
    Ok(())
}

fn swiglu_matches(d: &Dev) -> R {
    let (fwd, bwd) = (d.func("swiglu", "swiglu_forward")?, d.func("swiglu", "swiglu_backward")?);
    let mut rng = Rng::new(2);
    for n in [1usize, 7, 1000, 100_003] {
        let (g, u, dy) = (rng.normal_vec(n, 3.0), rng.normal_vec(n, 1.0), rng.normal_vec(n, 1.0));
        let mut out = vec![0.0; n];
        swiglu::swiglu_forward(&mut out, &wide(&g), &wide(&u))?;
        let (mut dg, mut du) = (vec![0.0; n], vec![0.0; n]);
        swiglu::swiglu_backward(&mut dg, &mut du, &wide(&dy), &wide(&g), &wide(&u))?;
        let (gg, ug, dyg) = (d.up(&g)?, d.up(&u)?, d.up(&dy)?);
        let mut og = d.poisoned(n)?;
        let nn = n as i64;
        launch!(d, fwd, elems_cfg(n), &mut og, &gg, &ug, &nn);
        close("swiglu out", &d.down(&og)?, &out, 1e-5)?;
        let (mut dgg, mut dug) = (d.poisoned(n)?, d.poisoned(n)?);
        launch!(d, bwd, elems_cfg(n), &mut dgg, &mut dug, &dyg, &gg, &ug, &nn);
        close("swiglu dgate", &d.down(&dgg)?, &dg, 1e-5)?;
        close("swiglu dup", &d.down(&dug)?, &du, 1e-5)?;
    }
    Ok(())
}

fn rope_matches(d: &Dev) -> R {
    let (fwd, bwd) = (d.func("rope", "rope_forward")?, d.func("rope", "rope_backward")?);
    let mut rng = Rng::new(3);
    // Llama 3.1's scaling with a short original context, so every band (stretched,
    // blended, kept) has pairs at head size 64 and 128.
    let llama3 = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position: 64,
    };
    for (batch, seq, heads, head_dim, offset, scaling) in [
        (1, 1, 1, 2, 0, RopeScaling::None),
        (2, 7, 3, 64, 5, RopeScaling::Linear { factor: 4.0 }),
        (1, 127, 12, 64, 1000, llama3),
        (3, 33, 4, 128, 0, llama3),
    ] {
        let n = batch * seq * heads * head_dim;
        let x = rng.normal_vec(n, 1.0);
        let spec = RopeSpec { batch, seq, heads, head_dim, pos_offset: offset, theta: 10000.0, scaling };
        let (kind, k) = scaling.kernel_constants();
        for sign in [1.0f32, -1.0] {
            let mut want = wide(&x);
            if sign > 0.0 {
                rope::rope_forward(&mut want, &spec)?;
            } else {
                rope::rope_backward(&mut want, &spec)?;
            }
            let mut xg = d.up(&x)?;
            let dims = [batch as i32, seq as i32, heads as i32, head_dim as i32, offset as i32];
            let f = if sign > 0.0 { &fwd } else { &bwd };
            launch!(
                d,
                *f,
                elems_cfg(n / 2),
                &mut xg,
                &dims[0],
                &dims[1],
                &dims[2],
                &dims[3],
                &dims[4],
                &10000.0f32,
                &kind,
                &k[0],
                &k[1],
                &k[2],
                &k[3],
                &k[4],
                &k[5]
            );
            // Angles up to ~1100 rad: sinf/cosf of an f32 angle, as core forms it, then the
            // rotation; 1e-4 covers the argument reduction's last bits.
            close("rope", &d.down(&xg)?, &want, 1e-4)?;
        }
    }
    Ok(())
}

fn cross_entropy_matches(d: &Dev) -> R {
    let f = d.func("cross_entropy", "cross_entropy")?;
    let mut rng = Rng::new(4);
    for rows in ROWS {
        for vocab in [2usize, 33, 32000] {
            if rows * vocab > 8_000_000 {
                continue;
            }
            let logits = rng.normal_vec(rows * vocab, 4.0);
            let targets: Vec<u32> = (0..rows).map(|_| rng.below(vocab as u64) as u32).collect();
            let mask: Vec<u8> = (0..rows).map(|r| (r % 5 != 3) as u8).collect();
            let flags: Vec<bool> = mask.iter().map(|&m| m == 1).collect();
            let mut want = wide(&logits);
            let sum =
                cross_entropy::cross_entropy(&mut want, &targets, Some(&flags), rows, vocab, Some(0.5))?;
            let (mut lg, mut losses, tg, mg) =
                (d.up(&logits)?, d.poisoned(rows)?, d.up(&targets)?, d.up(&mask)?);
            let (r, v, write) = (rows as i32, vocab as i32, 1i32);
            launch!(d, f, rows_cfg(rows, 256), &mut lg, &mut losses, &tg, &mg, &r, &v, &write, &0.5f32);
            close("cross-entropy gradient", &d.down(&lg)?, &want, 1e-5)?;
            let total: f64 = d.down(&losses)?.iter().map(|&l| l as f64).sum();
            if (total - sum.loss_sum).abs() > 1e-4 * sum.loss_sum.abs().max(1.0) {
                return Err(format!("loss sum {total} vs {}", sum.loss_sum).into());
            }
        }
    }
    Ok(())
}

fn adam_update_matches(d: &Dev) -> R {
    let f = d.func("optim", "adam_update")?;
    let mut rng = Rng::new(5);
    let hp = AdamParams {
        lr: 3e-3,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
        decoupled: true,
        grad_scale: 0.5,
    };
    for n in [1usize, 1000, 100_003] {
        let (mut p, g) = (rng.normal_vec(n, 1.0), rng.normal_vec(n, 1.0));
        let (mut m, mut v) = (vec![0.0f32; n], vec![0.0f32; n]);
        let (mut pg, gg, mut mg, mut vg) = (d.up(&p)?, d.up(&g)?, d.up(&m)?, d.up(&v)?);
        for step in 1..=3u64 {
            optim::adam_update(&mut p, &g, &mut m, &mut v, &hp, step)?;
            let c = optim::AdamConstants::<f32>::new(&hp, step);
            let (nn, decoupled, no_scale) = (n as i64, 1i32, 0u64);
            launch!(
                d,
                f,
                elems_cfg(n),
                &mut pg,
                &gg,
                &mut mg,
                &mut vg,
                &nn,
                &c.lr,
                &c.beta1,
                &c.beta2,
                &c.one_minus_beta1,
                &c.one_minus_beta2,
                &c.eps,
                &c.weight_decay,
                &decoupled,
                &c.grad_scale,
                &no_scale,
                &c.step_size,
                &c.bias_correction2_sqrt
            );
        }
        // Term by term in f32 on both sides: the same to a few ULP (sqrt and division).
        close("adam_update weights", &d.down(&pg)?, &wide(&p), 1e-6)?;
    }
    Ok(())
}

fn sum_of_squares_matches(d: &Dev) -> R {
    let sq = d.func("l2norm", "sum_of_squares")?;
    let mut rng = Rng::new(6);
    let tensors: Vec<Vec<f32>> = [1usize, 1000, 100_003].iter().map(|&n| rng.normal_vec(n, 1.0)).collect();
    let want =
        rusting_brain_core::ops::l2norm::global_l2_norm(&tensors.iter().map(|t| &t[..]).collect::<Vec<_>>());
    let blocks = 64usize;
    let mut partials = d.up(&vec![0.0f32; blocks])?;
    for t in &tensors {
        let (tg, n) = (d.up(t)?, t.len() as i64);
        let cfg =
            LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        launch!(d, sq, cfg, &mut partials, &tg, &n);
    }
    // The partial sums added in f64 in slot order, as the backend adds them.
    let total: f64 = d.down(&partials)?.iter().map(|&p| p as f64).sum();
    close("global norm", &[total.sqrt() as f32], &[want], 1e-6)?;
    Ok(())
}

fn embedding_matches(d: &Dev) -> R {
    let (fwd, bwd) = (d.func("embedding", "embedding_forward")?, d.func("embedding", "embedding_backward")?);
    let mut rng = Rng::new(7);
    for (vocab, dim, rows) in [(1usize, 1usize, 1usize), (33, 7, 127), (32000, 768, 1000)] {
        let table = rng.normal_vec(vocab * dim, 1.0);
        let ids: Vec<u32> =
            (0..rows).map(|i| if i % 3 == 0 { 0 } else { rng.below(vocab as u64) as u32 }).collect();
        let dy = rng.normal_vec(rows * dim, 1.0);
        let mut out = vec![0.0; rows * dim];
        embedding::embedding_forward(&mut out, &wide(&table), &ids, vocab, dim)?;
        let mut dt = vec![0.0; vocab * dim];
        embedding::embedding_backward(&mut dt, &wide(&dy), &ids, vocab, dim)?;
        let (tg, ig, dyg) = (d.up(&table)?, d.up(&ids)?, d.up(&dy)?);
        let mut og = d.poisoned(rows * dim)?;
        let (r, n) = (rows as i32, dim as i32);
        launch!(d, fwd, elems_cfg(rows * dim), &mut og, &tg, &ig, &r, &n);
        close("embedding out", &d.down(&og)?, &out, 0.0)?;
        let mut runs = Vec::new();
        // Rows grouped by id on the host, in position order within an id, as the backend
        // groups them.
        let mut order: Vec<u32> = (0..rows as u32).collect();
        order.sort_by_key(|&p| ids[p as usize]);
        let (mut uniq, mut offsets) = (Vec::new(), Vec::new());
        for (p, &row) in order.iter().enumerate() {
            if uniq.last() != Some(&ids[row as usize]) {
                uniq.push(ids[row as usize]);
                offsets.push(p as u32);
            }
        }
        offsets.push(rows as u32);
        let (ug, offg, pg) = (d.up(&uniq)?, d.up(&offsets)?, d.up(&order)?);
        let nu = uniq.len() as i32;
        for _ in 0..2 {
            let mut dtg = d.up(&vec![0.0f32; vocab * dim])?;
            launch!(d, bwd, elems_cfg(uniq.len() * dim), &mut dtg, &dyg, &ug, &offg, &pg, &nu, &n);
            runs.push(d.down(&dtg)?);
        }
        close("embedding dtable", &runs[0], &dt, 1e-5)?;
        if runs[0].iter().zip(&runs[1]).any(|(a, b)| a.to_bits() != b.to_bits()) {
            return Err("embedding backward is not deterministic".into());
        }
    }
    Ok(())
}

/// The kernel's shape argument (`struct Shape` in attention.cu).
#[repr(C)]
#[derive(Clone, Copy)]
struct Shape {
    batch: i32,
    q_len: i32,
    kv_len: i32,
    kv_capacity: i32,
    q_heads: i32,
    kv_heads: i32,
    head_dim: i32,
}
// SAFETY: plain i32 fields, #[repr(C)], the same layout as the C struct.
unsafe impl DeviceRepr for Shape {}

fn attention_matches(d: &Dev) -> R {
    let fwd = d.func("attention", "attention_forward")?;
    let (bq, bkv) =
        (d.func("attention", "attention_backward_dq")?, d.func("attention", "attention_backward_dkv")?);
    let mut rng = Rng::new(8);
    // (batch, q_len, kv_len, capacity, q_heads, kv_heads, head_dim): training shapes,
    // decode over a partly filled cache, GQA groups of 1, 3 and 4.
    for (b, ql, kl, cap, qh, kh, hd) in [
        (1, 1, 1, 1, 1, 1, 32),
        (2, 7, 7, 7, 6, 2, 64),
        (1, 1, 127, 200, 12, 4, 64),
        (1, 33, 100, 128, 4, 4, 128),
        (1, 1000, 1000, 1000, 2, 1, 64),
    ] {
        let spec = AttentionSpec {
            batch: b,
            q_len: ql,
            kv_len: kl,
            kv_capacity: cap,
            q_heads: qh,
            kv_heads: kh,
            head_dim: hd,
        };
        let shape = Shape {
            batch: b as i32,
            q_len: ql as i32,
            kv_len: kl as i32,
            kv_capacity: cap as i32,
            q_heads: qh as i32,
            kv_heads: kh as i32,
            head_dim: hd as i32,
        };
        let (nq, nkv, nl) = (b * ql * qh * hd, b * cap * kh * hd, b * ql * qh);
        let (q, k, v, dy) = (
            rng.normal_vec(nq, 1.0),
            rng.normal_vec(nkv, 1.0),
            rng.normal_vec(nkv, 1.0),
            rng.normal_vec(nq, 1.0),
        );
        let (mut out, mut lse) = (vec![0.0; nq], vec![0.0; nl]);
        attention::attention_forward(&mut out, &mut lse, &wide(&q), &wide(&k), &wide(&v), &spec)?;
        let (mut dq, mut dk, mut dv) = (vec![0.0; nq], vec![0.0; nkv], vec![0.0; nkv]);
        attention::attention_backward(
            &mut dq,
            &mut dk,
            &mut dv,
            &wide(&dy),
            &wide(&q),
            &wide(&k),
            &wide(&v),
            &out,
            &lse,
            &spec,
        )?;
        let (qg, kg, vg, dyg) = (d.up(&q)?, d.up(&k)?, d.up(&v)?, d.up(&dy)?);
        let (mut og, mut lg) = (d.poisoned(nq)?, d.poisoned(nl)?);
        let warps = |rows: usize| rows_cfg(rows.div_ceil(4), 128);
        launch!(d, fwd, warps(nl), &mut og, &mut lg, &qg, &kg, &vg, &shape);
        close("attention out", &d.down(&og)?, &out, 1e-4)?;
        close("attention lse", &d.down(&lg)?, &lse, 1e-5)?;
        let mut dqg = d.poisoned(nq)?;
        launch!(d, bq, warps(nl), &mut dqg, &dyg, &qg, &kg, &vg, &og, &lg, &shape);
        close("attention dq", &d.down(&dqg)?, &dq, 1e-4)?;
        let (mut dkg, mut dvg) = (d.poisoned(nkv)?, d.poisoned(nkv)?);
        launch!(d, bkv, warps(b * cap * kh), &mut dkg, &mut dvg, &dyg, &qg, &kg, &vg, &og, &lg, &shape);
        close("attention dk", &d.down(&dkg)?, &dk, 1e-4)?;
        close("attention dv", &d.down(&dvg)?, &dv, 1e-4)?;
    }
    Ok(())
}

fn main() {
    let args = Arguments::from_args();
    let device = Dev::open().map(Arc::new);
    let cases: [Case; 8] = [
        ("rmsnorm_matches_core", rmsnorm_matches),
        ("swiglu_matches_core", swiglu_matches),
        ("rope_matches_core", rope_matches),
        ("cross_entropy_matches_core", cross_entropy_matches),
        ("adam_update_matches_core", adam_update_matches),
        ("sum_of_squares_matches_core", sum_of_squares_matches),
        ("embedding_matches_core_and_is_deterministic", embedding_matches),
        ("attention_matches_core", attention_matches),
    ];
    if let Err(why) = &device {
        eprintln!("skipped: no CUDA device ({why})");
    }
    let trials = cases
        .into_iter()
        .map(|(name, f)| match &device {
            Ok(dev) => {
                let dev = dev.clone();
                Trial::test(name, move || f(&dev))
            }
            // RB_REQUIRE_CUDA=1 (the device check sets it): no device is a failure.
            Err(why) if std::env::var("RB_REQUIRE_CUDA").as_deref() == Ok("1") => {
                let why = why.to_string();
                Trial::test(name, move || Err(format!("no CUDA device: {why}").into()))
            }
            Err(_) => Trial::test(name, || Ok(())).with_ignored_flag(true),
        })
        .collect();
    libtest_mimic::run(&args, trials).exit();
}

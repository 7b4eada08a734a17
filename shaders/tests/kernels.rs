//! Every WGSL kernel against its reference twin in `rusting_brain_core::ops`, on awkward
//! shapes (1, 3, 7, 33, 127, 1000 rows; widths that are not multiples of 4 or of the
//! workgroup), with outputs poisoned (NaN) before each run so a kernel that skips an
//! element fails.
//!
//! The adapter is the software one (lavapipe in CI: `.ci/run` installs
//! mesa-vulkan-drivers). A machine with no adapter prints why and skips, unless
//! `RB_REQUIRE_GPU=1` (CI sets it), where that is a failure: a pass that tested nothing.
//!
//! Tolerances: the integer parts (int8 rounding, dot4I8Packed sums, argmax, gathers) are
//! compared exactly. The float kernels are compared at 1e-5 relative to the row's scale
//! (1e-4 for attention): the GPU sums in another order than the reference and may fuse
//! multiply-adds, and exp/log on Vulkan are specified to a few ULP; the largest errors
//! measured on lavapipe are printed by each test.

use rusting_brain_core::ops::attention::{attention_forward, AttentionSpec};
use rusting_brain_core::ops::q8::{
    packed_cols, q8_block, q8_embedding, q8_matmul, quantize_activations, quantize_activations_wide,
    quantize_blocks, quantize_rows,
};
use rusting_brain_core::ops::rope::{rope_forward, RopeSpec};
use rusting_brain_core::ops::{rmsnorm, swiglu};
use rusting_brain_core::Rng;
use rusting_brain_shaders::{rope_table, Gpu, GpuBuffer, GpuOptions, ShaderError};
use rusting_brain_test_support::rel_to_scale;

fn gpu() -> Option<Gpu> {
    gpu_with(false)
}

/// The software adapter; `no_subgroups` forces the workgroup-reduction kernels.
fn gpu_with(no_subgroups: bool) -> Option<Gpu> {
    let g = Gpu::new_blocking(&GpuOptions { software: true, no_subgroups, ..Default::default() });
    let g = rusting_brain_test_support::gpu_or_skip("the GPU did not open", g, |e| {
        matches!(e, ShaderError::NoAdapter(_))
    })?;
    let info = g.adapter_info();
    eprintln!(
        "adapter: {} ({:?}, {}), subgroups {}",
        info.name,
        info.backend,
        info.driver_info,
        g.uses_subgroups()
    );
    // Where the adapter offers subgroups, the default path must use them, so the subgroup
    // kernels are what the first pass of each test measures.
    if !no_subgroups && std::env::var("RB_EXPECT_SUBGROUPS").as_deref() == Ok("1") {
        assert!(g.uses_subgroups(), "RB_EXPECT_SUBGROUPS=1 but the device has none");
    }
    Some(g)
}

fn randn(rng: &mut Rng, n: usize, std: f32) -> Vec<f32> {
    rng.normal_vec(n, std)
}

/// A buffer of NaN, so every element a kernel should write is checked.
fn poisoned(g: &Gpu, n: usize) -> GpuBuffer {
    g.upload("poisoned", &vec![f32::NAN; n]).unwrap()
}

const ROWS: [usize; 6] = [1, 3, 7, 33, 127, 1000];

#[test]
fn every_kernel_passes_naga_validation() {
    for (name, source, subgroups) in rusting_brain_shaders::sources() {
        let module = naga::front::wgsl::parse_str(&source)
            .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(&source)));
        // Only the subgroup variants may use subgroups: the rest must pass without.
        let caps =
            if subgroups { naga::valid::Capabilities::SUBGROUP } else { naga::valid::Capabilities::empty() };
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
            .validate(&module)
            .unwrap_or_else(|e| panic!("{name}: {e:?}"));
    }
}

#[test]
fn rmsnorm_matches_reference() {
    for no_subgroups in [false, true] {
        rmsnorm_on(no_subgroups);
    }
}

fn rmsnorm_on(no_subgroups: bool) {
    let Some(g) = gpu_with(no_subgroups) else { return };
    let mut rng = Rng::new(1);
    let mut worst = 0.0f32;
    for (rows, dim) in ROWS.iter().zip([1usize, 7, 64, 33, 300, 129]) {
        let x = randn(&mut rng, rows * dim, 2.0);
        let w = randn(&mut rng, dim, 1.0);
        let (mut out, mut rstd) = (vec![0.0; rows * dim], vec![0.0; *rows]);
        rmsnorm::rmsnorm_forward(&mut out, &mut rstd, &x, &w, *rows, dim, 1e-5).unwrap();
        let (go, gr) = (poisoned(&g, rows * dim), poisoned(&g, *rows));
        let (gx, gw) = (g.upload("x", &x).unwrap(), g.upload("w", &w).unwrap());
        let mut b = g.batch();
        b.rmsnorm(&go, &gr, &gx, &gw, *rows, dim, 1e-5).unwrap();
        b.submit().unwrap();
        let e = rel_to_scale("rmsnorm on", &g.read_blocking(&go).unwrap(), &out).max(rel_to_scale(
            "rmsnorm on",
            &g.read_blocking(&gr).unwrap(),
            &rstd,
        ));
        assert!(e < 1e-5, "rows {rows} dim {dim}: {e}");
        worst = worst.max(e);
    }
    eprintln!("rmsnorm worst relative error {worst:e}");
}

#[test]
fn quantize_activations_and_q8_matmul_match_reference_exactly() {
    for no_subgroups in [false, true] {
        q8_on(no_subgroups);
    }
}

fn q8_on(no_subgroups: bool) {
    let Some(g) = gpu_with(no_subgroups) else { return };
    let mut rng = Rng::new(2);
    // (m, n, k): k not a multiple of 4 or of the workgroup; n up to 1000.
    for (m, (n, k)) in ROWS.iter().zip([(1usize, 1usize), (3, 7), (33, 65), (7, 130), (1000, 33), (5, 257)]) {
        let m = (*m).min(64);
        let mut x = randn(&mut rng, m * k, 1.5);
        if k >= 6 {
            // Row 0 scaled by exactly 1 (absmax 127): ties that round away from zero, where
            // WGSL's round() would go to even, and the float just below one half.
            x[..6].copy_from_slice(&[127.0, 2.5, -2.5, 0.5, -1.5, 0.49999997]);
        }
        let w = randn(&mut rng, n * k, 0.3);
        // Per-row weights (int8 files before blocks), then blocks of 32.
        for blocked in [false, true] {
            let (packed, scales) =
                if blocked { quantize_blocks(&w, n, k) } else { quantize_rows(&w, n, k) }.unwrap();
            let block = q8_block("test", n, k, scales.len()).unwrap();
            let nb = k.div_ceil(block);
            let mut out = vec![0.0; m * n];
            q8_matmul(&mut out, &x, &packed, &scales, m, n, k, 0.0).unwrap();
            let words = rusting_brain_shaders::activation_words(k, nb);
            let (gxq, gxs) = (g.zeros("xq", m * words).unwrap(), poisoned(&g, m * nb));
            let gx = g.upload("x", &x).unwrap();
            let (gw, gws) = (g.upload("w", &packed).unwrap(), g.upload("ws", &scales).unwrap());
            let go = poisoned(&g, m * n);
            let mut b = g.batch();
            b.quantize_activation_blocks(&gxq, &gxs, &gx, m, k, block).unwrap();
            b.q8_matmul(&go, &gxq, &gxs, &gw, &gws, m, n, k, 0.0).unwrap();
            b.submit().unwrap();
            // The rounded activations and their scales equal the CPU's, byte for byte: int8
            // for one block a row, 13-bit two to a word (i16 pairs in memory order) for blocks.
            let xq = g.read_blocking(&gxq).unwrap();
            let xs = g.read_blocking(&gxs).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for i in 0..m {
                let row: Vec<u8> =
                    xq[i * words..(i + 1) * words].iter().flat_map(|v| v.to_ne_bytes()).collect();
                let s = if nb > 1 {
                    let (q, s) = quantize_activations_wide(&x[i * k..(i + 1) * k], block);
                    let got: Vec<i16> = row.chunks(2).map(|b| i16::from_ne_bytes([b[0], b[1]])).collect();
                    assert!(got[k..].iter().all(|&v| v == 0), "padding of row {i}");
                    assert_eq!(&got[..k], &q[..], "row {i} of ({m}, {k}), blocks of {block}");
                    s
                } else {
                    let (q, s) = quantize_activations(&x[i * k..(i + 1) * k]);
                    let got: Vec<i8> = row.iter().map(|&b| b as i8).take(k).collect();
                    assert_eq!(got, q, "row {i} of ({m}, {k})");
                    vec![s]
                };
                assert_eq!(bits(&xs[i * nb..(i + 1) * nb]), bits(&s), "scales of row {i}");
            }
            // Exact i32 sums and the same two f32 multiplies: the same bits.
            let got = g.read_blocking(&go).unwrap();
            for (i, (a, e)) in got.iter().zip(&out).enumerate() {
                assert_eq!(a.to_bits(), e.to_bits(), "({m}, {n}, {k}) element {i}: {a} vs {e}");
            }
            // beta accumulates into what is there.
            let mut b = g.batch();
            b.q8_matmul(&go, &gxq, &gxs, &gw, &gws, m, n, k, 1.0).unwrap();
            b.submit().unwrap();
            let twice = g.read_blocking(&go).unwrap();
            for (a, e) in twice.iter().zip(&out) {
                assert_eq!(*a, e + e);
            }
        }
    }
}

#[test]
fn elementwise_kernels_match_reference() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(3);
    for n in [1usize, 3, 7, 33, 127, 1000, 64 * 70_000 + 5] {
        let (gate, up) = (randn(&mut rng, n, 3.0), randn(&mut rng, n, 1.0));
        let mut out = vec![0.0; n];
        swiglu::swiglu_forward(&mut out, &gate, &up).unwrap();
        let go = poisoned(&g, n);
        let (gg, gu) = (g.upload("gate", &gate).unwrap(), g.upload("up", &up).unwrap());
        let mut b = g.batch();
        b.swiglu(&go, &gg, &gu, n).unwrap();
        b.submit().unwrap();
        let e = rel_to_scale("elementwise kernels match reference", &g.read_blocking(&go).unwrap(), &out);
        assert!(e < 1e-5, "swiglu n {n}: {e}");
    }
}

#[test]
fn rope_matches_reference_and_inverts() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(4);
    for (seq, (heads, d, off)) in ROWS.iter().zip([
        (1usize, 2usize, 0usize),
        (3, 8, 5),
        (2, 32, 0),
        (1, 6, 900),
        (4, 64, 17),
        (2, 16, 0),
    ]) {
        let spec = RopeSpec {
            batch: 1 + seq % 2,
            seq: *seq,
            heads,
            head_dim: d,
            pos_offset: off,
            theta: 10_000.0,
            scaling: Default::default(),
        };
        let n = spec.batch * seq * heads * d;
        let x = randn(&mut rng, n, 1.0);
        let mut want = x.clone();
        rope_forward(&mut want, &spec).unwrap();
        let table = g.upload("rope", &rope_table(off + seq, d, 10_000.0, Default::default())).unwrap();
        let gx = g.upload("x", &x).unwrap();
        let mut b = g.batch();
        b.rope(&gx, &table, &spec, false).unwrap();
        b.submit().unwrap();
        let e = rel_to_scale("rope matches reference and inverts", &g.read_blocking(&gx).unwrap(), &want);
        assert!(e < 1e-5, "{spec:?}: {e}");
        let mut b = g.batch();
        b.rope(&gx, &table, &spec, true).unwrap();
        b.submit().unwrap();
        let e = rel_to_scale("rope matches reference and inverts", &g.read_blocking(&gx).unwrap(), &x);
        assert!(e < 1e-5, "inverse {spec:?}: {e}");
        // A table too short for the positions is an error, not an out-of-bounds read.
        let short = g.upload("rope", &rope_table(off + seq - 1, d, 10_000.0, Default::default())).unwrap();
        assert!(g.batch().rope(&gx, &short, &spec, false).is_err());
    }
}

#[test]
fn attention_matches_reference_with_gqa_and_caches() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(5);
    let specs = [
        AttentionSpec::causal(1, 1, 1, 1, 1),
        AttentionSpec::causal(2, 7, 4, 2, 3),
        AttentionSpec::causal(1, 33, 3, 1, 8),
        AttentionSpec::causal(1, 127, 2, 2, 32),
        // Decoding one row against a partly filled cache, heads not a power of two.
        AttentionSpec {
            batch: 1,
            q_len: 1,
            kv_len: 1000,
            kv_capacity: 1003,
            q_heads: 6,
            kv_heads: 3,
            head_dim: 64,
        },
        AttentionSpec {
            batch: 2,
            q_len: 3,
            kv_len: 33,
            kv_capacity: 40,
            q_heads: 4,
            kv_heads: 1,
            head_dim: 7,
        },
    ];
    let mut worst = 0.0f32;
    for spec in specs {
        let (nq, nkv, nl) = spec.check("test").unwrap();
        let (q, k, v) = (randn(&mut rng, nq, 1.0), randn(&mut rng, nkv, 1.0), randn(&mut rng, nkv, 1.0));
        let (mut out, mut lse) = (vec![0.0; nq], vec![0.0; nl]);
        attention_forward(&mut out, &mut lse, &q, &k, &v, &spec).unwrap();
        let (go, gl) = (poisoned(&g, nq), poisoned(&g, nl));
        let scratch = g.zeros("scores", nl * spec.kv_capacity).unwrap();
        let (gq, gk, gv) =
            (g.upload("q", &q).unwrap(), g.upload("k", &k).unwrap(), g.upload("v", &v).unwrap());
        let mut b = g.batch();
        b.attention(&go, &gl, &gq, &gk, &gv, &scratch, &spec).unwrap();
        b.submit().unwrap();
        let e = rel_to_scale(
            "attention matches reference with gqa and caches",
            &g.read_blocking(&go).unwrap(),
            &out,
        )
        .max(rel_to_scale(
            "attention matches reference with gqa and caches",
            &g.read_blocking(&gl).unwrap(),
            &lse,
        ));
        assert!(e < 1e-4, "{spec:?}: {e}");
        worst = worst.max(e);
        // A scratch row too small for the cache is an error.
        let small = g.zeros("scores", nl * spec.kv_capacity - 1).unwrap();
        assert!(g.batch().attention(&go, &gl, &gq, &gk, &gv, &small, &spec).is_err());
    }
    eprintln!("attention worst relative error {worst:e}");
}

#[test]
fn q8_embedding_and_argmax_match_reference_exactly() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(6);
    for (rows, (vocab, dim)) in
        ROWS.iter().zip([(1usize, 1usize), (5, 7), (50, 33), (1000, 64), (3, 130), (77, 3)])
    {
        let table = randn(&mut rng, vocab * dim, 1.0);
        let (packed, scales) = quantize_rows(&table, vocab, dim).unwrap();
        let ids: Vec<u32> = (0..*rows).map(|_| rng.below(vocab as u64) as u32).collect();
        let mut out = vec![0.0; rows * dim];
        q8_embedding(&mut out, &packed, &scales, &ids, vocab, dim).unwrap();
        let go = poisoned(&g, rows * dim);
        let gids = g.upload_u32("ids", &ids).unwrap();
        let (gt, gs) = (g.upload("table", &packed).unwrap(), g.upload("scales", &scales).unwrap());
        let mut b = g.batch();
        b.q8_embedding(&go, &gids, &gt, &gs, *rows, vocab, dim).unwrap();
        b.submit().unwrap();
        assert_eq!(g.read_blocking(&go).unwrap(), out, "embedding rows {rows} vocab {vocab} dim {dim}");
        // The same table in blocks of 32.
        let (packed, scales) = quantize_blocks(&table, vocab, dim).unwrap();
        q8_embedding(&mut out, &packed, &scales, &ids, vocab, dim).unwrap();
        let (gt, gs) = (g.upload("table", &packed).unwrap(), g.upload("scales", &scales).unwrap());
        let mut b = g.batch();
        b.q8_embedding(&go, &gids, &gt, &gs, *rows, vocab, dim).unwrap();
        b.submit().unwrap();
        assert_eq!(
            g.read_blocking(&go).unwrap(),
            out,
            "blocked embedding rows {rows} vocab {vocab} dim {dim}"
        );
        assert!(rusting_brain_shaders::check_ids(&[vocab as u32], vocab).is_err());

        // argmax over rows of `dim` values, with a tie planted: the lower index wins.
        let mut logits = randn(&mut rng, rows * vocab, 1.0);
        if vocab > 2 {
            logits[vocab - 1] = 50.0;
            logits[1] = 50.0;
        }
        let want: Vec<u32> = logits
            .chunks(vocab)
            .map(|r| (0..r.len()).fold(0, |b, i| if r[i] > r[b] { i } else { b }) as u32)
            .collect();
        let gl = g.upload("logits", &logits).unwrap();
        let gi = g.upload_u32("ids", &vec![u32::MAX; *rows]).unwrap();
        let mut b = g.batch();
        b.argmax(&gi, &gl, *rows, vocab).unwrap();
        b.submit().unwrap();
        assert_eq!(g.read_u32_blocking(&gi).unwrap(), want, "argmax rows {rows} vocab {vocab}");
    }
}

#[test]
fn shape_errors_are_errors() {
    let Some(g) = gpu() else { return };
    let small = g.zeros("small", 10).unwrap();
    let mut b = g.batch();
    assert!(b.rmsnorm(&small, &small, &small, &small, 3, 4, 1e-5).is_err());
    assert!(b.swiglu(&small, &small, &small, 11).is_err());
    assert!(b.q8_matmul(&small, &small, &small, &small, &small, 1, 11, 4, 0.0).is_err());
    assert!(b.copy(&small, 5, &small, 0, 6).is_err());
    assert!(g.write(&small, 9, &[1.0, 2.0]).is_err());
    // A buffer over the adapter's buffer limit is refused before allocating.
    let words = (g.max_buffer() / 4 + 1) as usize;
    let err = g.zeros("huge", words).unwrap_err().to_string();
    assert!(err.contains("over this adapter's limit"), "{err}");
    // One over a binding is made (an int8 weight is bound in row slabs), but a kernel
    // that binds its operands whole refuses it.
    let Some(capped) = capped_gpu(4 << 10) else { return };
    let big = capped.zeros("big", 2048).unwrap();
    let mut b = capped.batch();
    let err = b.swiglu(&big, &big, &big, 2048).unwrap_err().to_string();
    assert!(err.contains("over this adapter's limit"), "{err}");
}

/// The software adapter with at most `bytes` per binding.
fn capped_gpu(bytes: u64) -> Option<Gpu> {
    gpu()?;
    Some(
        Gpu::new_blocking(&GpuOptions { software: true, max_binding: Some(bytes), ..Default::default() })
            .unwrap(),
    )
}

#[test]
fn int8_weights_over_a_binding_go_in_row_slabs_with_the_same_bits() {
    // 4 KiB a binding, 256-byte offsets: slabs of a multiple of 64 rows, the last one
    // short; both product kernels and the lookup, into columns of a wider output.
    let Some(g) = capped_gpu(4 << 10) else { return };
    let mut rng = Rng::new(12);
    let shapes = [(1usize, 300usize, 37usize), (8, 100, 64), (1, 700, 5)];
    for ((m, n, k), blocked) in shapes.into_iter().flat_map(|s| [(s, false), (s, true)]) {
        let pc = packed_cols(k);
        assert!(n * pc * 4 > 4 << 10, "({n}, {k}) must be over one binding");
        let x = randn(&mut rng, m * k, 1.5);
        let w = randn(&mut rng, n * k, 0.3);
        let (packed, scales) =
            if blocked { quantize_blocks(&w, n, k) } else { quantize_rows(&w, n, k) }.unwrap();
        let block = q8_block("test", n, k, scales.len()).unwrap();
        let mut part = vec![0.0; m * n];
        q8_matmul(&mut part, &x, &packed, &scales, m, n, k, 0.0).unwrap();
        let base = randn(&mut rng, m * (n + 3), 1.0);
        let mut want = base.clone();
        for i in 0..m {
            for j in 0..n {
                let o = i * (n + 3) + 1 + j;
                want[o] = part[i * n + j] + 0.5 * base[o];
            }
        }
        let words = rusting_brain_shaders::activation_words(k, k.div_ceil(block));
        let (gxq, gxs) = (g.zeros("xq", m * words).unwrap(), g.zeros("xs", m * k.div_ceil(block)).unwrap());
        let gx = g.upload("x", &x).unwrap();
        let (gw, gws) = (g.upload("w", &packed).unwrap(), g.upload("ws", &scales).unwrap());
        let go = g.upload("out", &base).unwrap();
        let mut b = g.batch();
        b.quantize_activation_blocks(&gxq, &gxs, &gx, m, k, block).unwrap();
        b.q8_matmul_cols(&go, (n + 3, 1), &gxq, &gxs, &gw, &gws, m, n, k, 0.5).unwrap();
        b.submit().unwrap();
        let got = g.read_blocking(&go).unwrap();
        assert_eq!(got.len(), want.len());
        for (i, (a, e)) in got.iter().zip(&want).enumerate() {
            assert_eq!(a.to_bits(), e.to_bits(), "({m}, {n}, {k}) element {i}: {a} vs {e}");
        }

        // The same weight as an embedding table, ids in every slab.
        let ids: Vec<u32> = (0..m + 4).map(|_| rng.below(n as u64) as u32).collect();
        let mut rows = vec![0.0; ids.len() * k];
        q8_embedding(&mut rows, &packed, &scales, &ids, n, k).unwrap();
        let gids = g.upload_u32("ids", &ids).unwrap();
        let ge = poisoned(&g, ids.len() * k);
        let mut b = g.batch();
        b.q8_embedding(&ge, &gids, &gw, &gws, ids.len(), n, k).unwrap();
        b.submit().unwrap();
        assert_eq!(g.read_blocking(&ge).unwrap(), rows, "embedding ({n}, {k})");
    }
}

#[test]
fn moe_routing_expert_products_and_combine_match_reference() {
    use rusting_brain_core::ops::moe::{moe_combine, Routing};
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(7);
    // (tokens, experts, top_k, renormalize, d, f)
    let cases = [
        (1usize, 1usize, 1usize, false, 7usize, 5usize),
        (3, 4, 2, true, 33, 17),
        (7, 8, 2, false, 16, 65),
        (33, 5, 3, true, 9, 3),
        (127, 16, 1, false, 64, 32),
    ];
    for (n, e_n, k, renorm, d, f) in cases {
        let logits = randn(&mut rng, n * e_n, 2.0);
        let mut routing = Routing::default();
        routing.route(&logits, n, e_n, k, renorm).unwrap();
        let (ge, gw) = (g.zeros("expert", n * k).unwrap(), poisoned(&g, n * k));
        let gl = g.upload("logits", &logits).unwrap();
        let mut b = g.batch();
        b.moe_route(&ge, &gw, &gl, n, e_n, k, renorm).unwrap();
        b.submit().unwrap();
        // The choices exactly (random logits have no near-ties); weights to f32 rounding
        // of the reference's f64 softmax.
        assert_eq!(g.read_u32_blocking(&ge).unwrap(), routing.expert, "experts ({n}, {e_n}, {k})");
        let e = rel_to_scale(
            "moe routing expert products and combine match reference",
            &g.read_blocking(&gw).unwrap(),
            &routing.weight,
        );
        assert!(e < 1e-6, "weights ({n}, {e_n}, {k}): {e}");

        // Each slot through its own expert's gate weights (f rows of d), one dispatch per
        // expert, each filling only the slots routed to it.
        // Per-row weights, then blocked ones (13-bit activations).
        let x = randn(&mut rng, n * d, 1.0);
        for blocked in [false, true] {
            let quantize = if blocked { quantize_blocks } else { quantize_rows };
            let experts: Vec<(Vec<f32>, Vec<f32>)> =
                (0..e_n).map(|_| quantize(&randn(&mut rng, f * d, 0.5), f, d).unwrap()).collect();
            let block = q8_block("test", f, d, experts[0].1.len()).unwrap();
            let nb = d.div_ceil(block);
            let mut want = vec![0.0; n * k * f];
            for slot in 0..n * k {
                let (t, ex) = (slot / k, routing.expert[slot] as usize);
                let (packed, scales) = &experts[ex];
                q8_matmul(
                    &mut want[slot * f..(slot + 1) * f],
                    &x[t * d..(t + 1) * d],
                    packed,
                    scales,
                    1,
                    f,
                    d,
                    0.0,
                )
                .unwrap();
            }
            let words = rusting_brain_shaders::activation_words(d, nb);
            let (gxq, gxs) = (g.zeros("xq", n * words).unwrap(), g.zeros("xs", n * nb).unwrap());
            let gx = g.upload("x", &x).unwrap();
            let gexperts: Vec<_> = experts
                .iter()
                .map(|(p, s)| (g.upload("w", p).unwrap(), g.upload("ws", s).unwrap()))
                .collect();
            let gy = poisoned(&g, n * k * f);
            let mut b = g.batch();
            b.quantize_activation_blocks(&gxq, &gxs, &gx, n, d, block).unwrap();
            for (ex, (gwp, gws)) in gexperts.iter().enumerate() {
                b.q8_expert(&gy, &gxq, &gxs, gwp, gws, &ge, (n * k, f, d, k), true, ex).unwrap();
            }
            b.submit().unwrap();
            let got = g.read_blocking(&gy).unwrap();
            for (i, (a, e)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    e.to_bits(),
                    "expert product ({n}, {e_n}, {k}) blocked {blocked} element {i}"
                );
            }
        }

        // Combine: x += sum_s w_s y_s, the reference indexing slots by row_of_slot.
        let y = randn(&mut rng, n * k * d, 1.0);
        let base = randn(&mut rng, n * d, 1.0);
        let mut want = base.clone();
        let identity: Vec<u32> = (0..(n * k) as u32).collect();
        moe_combine(&mut want, &y, &identity, &routing.weight, k, d).unwrap();
        let (gxo, gyy) = (g.upload("x", &base).unwrap(), g.upload("y", &y).unwrap());
        let gwt = g.upload("weights", &routing.weight).unwrap();
        let gid = g.upload_u32("rows", &identity).unwrap();
        let mut b = g.batch();
        b.moe_combine(&gxo, &gid, &gwt, &gyy, n, d, k).unwrap();
        b.submit().unwrap();
        let e = rel_to_scale(
            "moe routing expert products and combine match reference",
            &g.read_blocking(&gxo).unwrap(),
            &want,
        );
        assert!(e < 1e-6, "combine ({n}, {k}, {d}): {e}");
    }
    // More experts than the GPU router holds is an error, not a wrong route.
    let big = g.zeros("logits", 300).unwrap();
    let (e1, w1) = (g.zeros("e", 2).unwrap(), g.zeros("w", 2).unwrap());
    assert!(g.batch().moe_route(&e1, &w1, &big, 1, 300, 2, false).is_err());
}

#[test]
fn penalty_and_top_k_ranking_match_the_core_sampler() {
    use rusting_brain_core::Sampler;
    use rusting_brain_shaders::{context_ids, NAN_ROW, NO_ID};
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(8);
    for (cols, k) in [(1usize, 1usize), (7, 3), (33, 33), (127, 40), (1000, 64), (5000, 7)] {
        let mut logits = randn(&mut rng, cols, 2.0);
        if cols > 10 {
            logits[3] = f32::NEG_INFINITY;
            logits[9] = logits[4]; // a tie: 4 ranks before 9
        }
        let context: Vec<u32> = (0..20).map(|i| (i * 7 % (cols + 3)) as u32).collect();
        let sampler = Sampler::greedy().repetition_penalty(1.7);
        let want_pen = sampler.penalized(&logits, &context);
        let ids = context_ids(&context, cols);
        let (gl, gi) =
            (g.upload("logits", &logits).unwrap(), g.upload_u32("ids", &ids.clone().max(vec![0])).unwrap());
        let (tid, tval, scratch) = (
            g.upload_u32("top ids", &vec![7; k]).unwrap(),
            poisoned(&g, k),
            g.zeros("scratch", cols).unwrap(),
        );
        let best = g.upload_u32("best", &[7]).unwrap();
        let mut b = g.batch();
        b.penalize(&gl, &gi, ids.len(), 1.7).unwrap();
        b.topk(&tid, &tval, &scratch, &gl, cols, k).unwrap();
        b.argmax(&best, &gl, 1, cols).unwrap();
        b.submit().unwrap();
        assert_eq!(g.read_blocking(&gl).unwrap(), want_pen, "penalty ({cols})");
        let mut order: Vec<u32> =
            (0..cols as u32).filter(|&i| want_pen[i as usize] > f32::NEG_INFINITY).collect();
        order.sort_by(|&a, &b| want_pen[b as usize].total_cmp(&want_pen[a as usize]).then(a.cmp(&b)));
        let got_ids = g.read_u32_blocking(&tid).unwrap();
        let got_vals = g.read_blocking(&tval).unwrap();
        for s in 0..k {
            match order.get(s) {
                Some(&id) => {
                    assert_eq!(got_ids[s], id, "rank {s} of ({cols}, {k})");
                    assert_eq!(got_vals[s], want_pen[id as usize]);
                }
                None => assert_eq!(got_ids[s], NO_ID, "rank {s} of ({cols}, {k}) is empty"),
            }
        }
        let greedy = Sampler::greedy().sample(&want_pen, &[]).unwrap();
        assert_eq!(g.read_u32_blocking(&best).unwrap(), vec![greedy]);
    }
    // A NaN logit is reported, not ranked.
    let gl = g.upload("logits", &[1.0, f32::NAN, 0.5]).unwrap();
    let (tid, tval, scratch, best) = (
        g.zeros("ids", 2).unwrap(),
        g.zeros("vals", 2).unwrap(),
        g.zeros("scratch", 3).unwrap(),
        g.zeros("best", 1).unwrap(),
    );
    let mut b = g.batch();
    b.topk(&tid, &tval, &scratch, &gl, 3, 2).unwrap();
    b.argmax(&best, &gl, 1, 3).unwrap();
    b.submit().unwrap();
    assert_eq!(g.read_u32_blocking(&tid).unwrap(), vec![NAN_ROW; 2]);
    assert_eq!(g.read_u32_blocking(&best).unwrap(), vec![NAN_ROW]);
}

/// The register-tiled int8 product (prefill, `TILED_ROWS` rows and up) against the
/// reference, bit for bit, on shapes off its 32 x 32 tile and 32-value depth step, and into
/// a column window of a wider output with beta.
#[test]
fn tiled_q8_matmul_matches_reference_exactly() {
    use rusting_brain_shaders::TILED_ROWS;
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(9);
    for (m, n, k) in [
        (TILED_ROWS, 1usize, 1usize),
        (33, 127, 130),
        (127, 33, 7),
        (64, 64, 256),
        (1000, 3, 65),
        (9, 70, 33),
    ] {
        let x = randn(&mut rng, m * k, 1.5);
        let w = randn(&mut rng, n * k, 0.3);
        for blocked in [false, true] {
            let (packed, scales) =
                if blocked { quantize_blocks(&w, n, k) } else { quantize_rows(&w, n, k) }.unwrap();
            let block = q8_block("test", n, k, scales.len()).unwrap();
            let base = randn(&mut rng, m * (n + 5), 1.0);
            // Columns 2..2 + n of rows of n + 5, beta 0.5.
            let mut want = base.clone();
            let mut part = vec![0.0; m * n];
            q8_matmul(&mut part, &x, &packed, &scales, m, n, k, 0.0).unwrap();
            for i in 0..m {
                for j in 0..n {
                    let o = i * (n + 5) + 2 + j;
                    want[o] = part[i * n + j] + 0.5 * base[o];
                }
            }
            let words = rusting_brain_shaders::activation_words(k, k.div_ceil(block));
            let (gxq, gxs) =
                (g.zeros("xq", m * words).unwrap(), g.zeros("xs", m * k.div_ceil(block)).unwrap());
            let gx = g.upload("x", &x).unwrap();
            let (gw, gws) = (g.upload("w", &packed).unwrap(), g.upload("ws", &scales).unwrap());
            let go = g.upload("out", &base).unwrap();
            let mut b = g.batch();
            b.quantize_activation_blocks(&gxq, &gxs, &gx, m, k, block).unwrap();
            b.q8_matmul_cols(&go, (n + 5, 2), &gxq, &gxs, &gw, &gws, m, n, k, 0.5).unwrap();
            b.submit().unwrap();
            let got = g.read_blocking(&go).unwrap();
            for (i, (a, e)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    e.to_bits(),
                    "({m}, {n}, {k}) blocks of {block} element {i}: {a} vs {e}"
                );
            }
        }
    }
}

/// The 4-bit products (one invocation an output below `TILED_ROWS` rows, register tiles
/// from there) against core's `q4_matmul`, bit for bit: rows of one short block (k < 32,
/// still 13-bit activations), a short last block, an odd block count (a group's high
/// nibbles unused), into a column window of a wider output with beta; and a weight over
/// one binding, in row slabs.
#[test]
fn q4_matmul_matches_reference_exactly() {
    use rusting_brain_core::ops::q4::{q4_matmul, quantize_q4};
    let Some(g) = gpu() else { return };
    let Some(capped) = capped_gpu(4 << 10) else { return };
    let mut rng = Rng::new(13);
    // (m, n, k, whether through 4 KiB bindings: the weight over one, its slabs of 64 rows).
    let shapes =
        [(1usize, 5usize, 7usize, false), (3, 70, 33, false), (7, 64, 576, false), (1, 300, 100, true)];
    let tiled = [
        (8, 1, 1, false),
        (33, 127, 130, false),
        (127, 33, 31, false),
        (9, 70, 96, false),
        (8, 70, 100, true),
    ];
    for (m, n, k, slabs) in shapes.into_iter().chain(tiled) {
        let mut x = randn(&mut rng, m * k, 1.5);
        if k >= 6 {
            x[..6].copy_from_slice(&[4095.0, 2.5, -2.5, 0.5, -1.5, 0.49999997]);
        }
        let w = randn(&mut rng, n * k, 0.3);
        let (packed, scales) = quantize_q4(&w, n, k).unwrap();
        let mut part = vec![0.0; m * n];
        q4_matmul(&mut part, &x, &packed, &scales, m, n, k, 0.0).unwrap();
        let base = randn(&mut rng, m * (n + 5), 1.0);
        let mut want = base.clone();
        for i in 0..m {
            for j in 0..n {
                let o = i * (n + 5) + 2 + j;
                want[o] = part[i * n + j] + 0.5 * base[o];
            }
        }
        let g = if slabs { &capped } else { &g };
        assert!(!slabs || packed.len() * 4 > 4 << 10, "({n}, {k}) must be over one binding");
        let nb = k.div_ceil(32);
        let (gxq, gxs) = (g.zeros("xq", m * 2 * packed_cols(k)).unwrap(), poisoned(g, m * nb));
        let gx = g.upload("x", &x).unwrap();
        let (gw, gws) = (g.upload("w", &packed).unwrap(), g.upload("ws", &scales).unwrap());
        let go = g.upload("out", &base).unwrap();
        let mut b = g.batch();
        b.quantize_activations_wide(&gxq, &gxs, &gx, m, k).unwrap();
        b.q4_matmul_cols(&go, (n + 5, 2), &gxq, &gxs, &gw, &gws, m, n, k, 0.5).unwrap();
        b.submit().unwrap();
        // The activations are core's 13-bit rounding in blocks of 32, one block or many.
        let (xs, xq) = (g.read_blocking(&gxs).unwrap(), g.read_blocking(&gxq).unwrap());
        let (q, s) = quantize_activations_wide(&x[..k], 32);
        let got: Vec<i16> = xq[..2 * packed_cols(k)]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect::<Vec<u8>>()
            .chunks(2)
            .map(|b| i16::from_ne_bytes([b[0], b[1]]))
            .collect();
        assert_eq!(&got[..k], &q[..], "row 0 of ({m}, {k})");
        assert_eq!(xs[..nb], s[..], "scales of row 0 of ({m}, {k})");
        let got = g.read_blocking(&go).unwrap();
        assert_eq!(got.len(), want.len());
        for (i, (a, e)) in got.iter().zip(&want).enumerate() {
            assert_eq!(a.to_bits(), e.to_bits(), "({m}, {n}, {k}) element {i}: {a} vs {e}");
        }
    }
}

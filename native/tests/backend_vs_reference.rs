//! Every CPU-backend primitive against the reference backend on awkward shapes (1, 3, 7,
//! 33, 127, 1000; non-square; every transpose). Outputs that a primitive overwrites are
//! poisoned with NaN first, so an element it forgets to write fails the comparison; outputs
//! that accumulate start from the same random values on both sides.
//!
//! Tolerance: |cpu - ref| <= 2e-5 * (|ref| + rms(ref)). The reference sums in f64 and
//! rounds once, so the distance is the CPU backend's own f32 error: summation order (SIMD
//! lanes, blocked GEMM, per-task partial sums) and its polynomial exp (2 ulp). Measured
//! worst: 0.22 of the tolerance (softmax backward at 33x1000; every case prints its ratio
//! with --nocapture). An indexing or formula error shows up at O(1), far above it.

use rusting_brain::cpu::CpuBackend;
use rusting_brain_core::backend::*;
use rusting_brain_core::{Activation, Backend, Loss, ReferenceBackend, Rng, RopeScaling};

type Dyn = dyn Backend<Buffer = Vec<f32>>;
const TOL: f64 = 2e-5;

fn backends() -> (&'static Dyn, &'static Dyn) {
    (&CpuBackend, &ReferenceBackend)
}

fn randn(rng: &mut Rng, n: usize) -> Vec<f32> {
    rng.normal_vec(n, 1.0)
}

fn nan(n: usize) -> Vec<f32> {
    vec![f32::NAN; n]
}

fn rms(x: &[f32]) -> f64 {
    (x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / x.len().max(1) as f64).sqrt()
}

#[track_caller]
fn close(what: &str, got: &[f32], want: &[f32]) {
    close_scaled(what, got, want, 0.0)
}

/// `close` where the result is a difference of terms of size about `term_scale` that can
/// cancel (RMSNorm's input gradient at dim 1 is `w * eps / (x^2 + eps)`, computed as a
/// difference of two O(w) terms): no f32 code can do better than eps * term_scale there.
#[track_caller]
fn close_scaled(what: &str, got: &[f32], want: &[f32], term_scale: f64) {
    // |cpu - ref| <= TOL * (|ref| + rms), failing on NaN and on a length mismatch.
    let rms = rms(want).max(term_scale);
    let worst = rusting_brain_test_support::assert_close(what, got, want, TOL, TOL * rms + 1e-30);
    println!("{what}: worst {worst:.3} of the tolerance");
}

#[test]
fn matmul_matches_reference_on_awkward_shapes_and_every_transpose() {
    let (cpu, rf) = backends();
    let mut rng = Rng::new(100);
    let shapes = [
        (1, 1, 1),
        (1, 7, 33),
        (33, 1, 7),
        (3, 7, 1),
        (7, 33, 127),
        (127, 33, 1000),
        (1, 1000, 127),
        (1000, 1, 127),
        (33, 127, 7),
        (1000, 3, 33),
        (64, 64, 64),
        // A few rows against a (n, k) weight (a batched decode step), n off the quads and
        // large enough to split across the thread team.
        (2, 5, 3),
        (32, 1027, 129),
    ];
    for &(m, n, k) in &shapes {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            for (alpha, beta) in [(1.0, 0.0), (0.5, 1.0), (-2.0, 0.25)] {
                let a = randn(&mut rng, m * k);
                let b = randn(&mut rng, k * n);
                let spec = MatmulSpec::new(m, n, k).trans_a(ta).trans_b(tb).alpha(alpha).beta(beta);
                let init = if beta == 0.0 { nan(m * n) } else { randn(&mut rng, m * n) };
                let (mut c1, mut c2) = (init.clone(), init);
                cpu.matmul(&mut c1, &a, &b, &spec).unwrap();
                rf.matmul(&mut c2, &a, &b, &spec).unwrap();
                close(&format!("matmul {m}x{n}x{k} ta={ta} tb={tb} alpha={alpha} beta={beta}"), &c1, &c2);
            }
        }
    }
}

/// BF16 products through every transpose and epilogue on shapes around the BF16 GEMM's
/// tiles (8 rows x 32 columns, k in pairs): odd k, partial tiles in both directions, a
/// long k, batches. Where the CPU has AVX512_BF16 this is `vdpbf16ps`'s kernel, else the
/// rounded f32 path; the test says which.
#[test]
fn bf16_products_match_reference_on_the_tiles_edges() {
    let (cpu, rf) = backends();
    println!(
        "BF16 GEMM kernel: {}",
        if rusting_brain::cpu::bf16::available() {
            "vdpbf16ps (AVX512_BF16)"
        } else {
            "rounded operands through the f32 GEMM (no AVX512_BF16 here)"
        }
    );
    let mut rng = Rng::new(102);
    for &(m, n, k, batch) in &[
        (2, 2, 1, 1),
        (3, 33, 7, 1),
        (9, 31, 17, 2),
        (8, 32, 2, 1),
        (33, 65, 33, 1),
        (40, 100, 257, 1),
        (127, 33, 1000, 1),
        (1000, 3, 33, 1),
    ] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            for (alpha, beta) in [(1.0, 0.0), (0.5, 1.0), (-2.0, 0.25)] {
                let a = randn(&mut rng, batch * m * k);
                let b = randn(&mut rng, batch * k * n);
                let spec = MatmulSpec::new(m, n, k)
                    .trans_a(ta)
                    .trans_b(tb)
                    .alpha(alpha)
                    .beta(beta)
                    .batch(batch)
                    .precision(OperandPrecision::Bf16);
                let init = if beta == 0.0 { nan(batch * m * n) } else { randn(&mut rng, batch * m * n) };
                let (mut c1, mut c2) = (init.clone(), init);
                cpu.matmul(&mut c1, &a, &b, &spec).unwrap();
                rf.matmul(&mut c2, &a, &b, &spec).unwrap();
                close(
                    &format!("bf16 matmul {batch}x{m}x{n}x{k} ta={ta} tb={tb} alpha={alpha} beta={beta}"),
                    &c1,
                    &c2,
                );
            }
        }
    }
}

/// A few rows times a `(n, k)` weight (a decode step over several sequences): each row of
/// the product is, bit for bit, that row's product alone, at every row count up to the
/// few-rows path's 32 and with `n` off the quads and split across the thread team.
#[test]
fn few_row_products_give_each_row_its_bits_alone() {
    let mut rng = Rng::new(104);
    for (n, k) in [(1027, 129), (13, 40)] {
        let w = randn(&mut rng, n * k);
        let x = randn(&mut rng, 32 * k);
        let init = randn(&mut rng, 32 * n);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for beta in [0.0, 1.0] {
            let alone: Vec<Vec<u32>> = (0..32)
                .map(|r| {
                    let mut c = init[r * n..(r + 1) * n].to_vec();
                    let spec = MatmulSpec::new(1, n, k).trans_b(true).beta(beta);
                    CpuBackend.matmul(&mut c, &x[r * k..(r + 1) * k].to_vec(), &w, &spec).unwrap();
                    bits(&c)
                })
                .collect();
            for m in [2, 3, 5, 16, 32] {
                let mut c = init[..m * n].to_vec();
                let spec = MatmulSpec::new(m, n, k).trans_b(true).beta(beta);
                CpuBackend.matmul(&mut c, &x[..m * k].to_vec(), &w, &spec).unwrap();
                for r in 0..m {
                    assert_eq!(
                        bits(&c[r * n..(r + 1) * n]),
                        alone[r],
                        "n {n}, k {k}, beta {beta}: row {r} of {m}"
                    );
                }
            }
        }
    }
}

/// The BF16 product's bits do not depend on the thread count: each output is summed
/// along k by one thread, in order.
#[test]
fn bf16_products_are_the_same_bits_on_one_thread_and_on_three() {
    let mut rng = Rng::new(103);
    let (m, n, k) = (200, 150, 300);
    let a = randn(&mut rng, m * k);
    let b = randn(&mut rng, k * n);
    let spec = MatmulSpec::new(m, n, k).trans_b(true).precision(OperandPrecision::Bf16);
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        let mut c = nan(m * n);
        pool.install(|| CpuBackend.matmul(&mut c, &a, &b, &spec)).unwrap();
        c.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    };
    assert_eq!(run(1), run(3));
}

#[test]
fn batched_and_bf16_matmul_match_reference() {
    let (cpu, rf) = backends();
    let mut rng = Rng::new(101);
    for &(m, n, k, batch) in &[(7, 33, 3, 3), (1, 127, 33, 2), (33, 33, 33, 2)] {
        for precision in [OperandPrecision::F32, OperandPrecision::Bf16] {
            let a = randn(&mut rng, batch * m * k);
            let b = randn(&mut rng, batch * k * n);
            let spec = MatmulSpec::new(m, n, k).trans_b(true).batch(batch).precision(precision);
            let (mut c1, mut c2) = (nan(batch * m * n), nan(batch * m * n));
            cpu.matmul(&mut c1, &a, &b, &spec).unwrap();
            rf.matmul(&mut c2, &a, &b, &spec).unwrap();
            close(&format!("matmul batch {batch} {precision:?}"), &c1, &c2);
        }
    }
    // k = 0: the product is empty, C = beta * C.
    let mut c = vec![2.0f32; 6];
    cpu.matmul(&mut c, &vec![], &vec![], &MatmulSpec::new(2, 3, 0).beta(0.5)).unwrap();
    assert_eq!(c, vec![1.0; 6]);
    let mut c = nan(6);
    cpu.matmul(&mut c, &vec![], &vec![], &MatmulSpec::new(2, 3, 0)).unwrap();
    assert_eq!(c, vec![0.0; 6]);
}

#[test]
fn rmsnorm_matches_reference() {
    let (cpu, rf) = backends();
    let mut rng = Rng::new(102);
    for &(rows, dim) in &[(1, 1), (3, 7), (33, 127), (1000, 33), (7, 1000), (600, 64)] {
        let x = randn(&mut rng, rows * dim);
        let w = randn(&mut rng, dim);
        let dy = randn(&mut rng, rows * dim);
        let dw0 = randn(&mut rng, dim);
        let mut outs = Vec::new();
        for be in [cpu, rf] {
            let (mut y, mut r) = (nan(rows * dim), nan(rows));
            be.rmsnorm_forward(&mut y, &mut r, &x, &w, rows, dim, 1e-5).unwrap();
            let (mut dx, mut dw) = (nan(rows * dim), dw0.clone());
            be.rmsnorm_backward(&mut dx, &mut dw, &dy, &x, &w, &r, rows, dim).unwrap();
            outs.push((y, r, dx, dw));
        }
        let tag = format!("rmsnorm {rows}x{dim}");
        close(&format!("{tag} out"), &outs[0].0, &outs[1].0);
        close(&format!("{tag} rstd"), &outs[0].1, &outs[1].1);
        let terms: Vec<f32> = (0..rows * dim).map(|i| outs[1].1[i / dim] * w[i % dim] * dy[i]).collect();
        close_scaled(&format!("{tag} dinp"), &outs[0].2, &outs[1].2, rms(&terms));
        close(&format!("{tag} dweight"), &outs[0].3, &outs[1].3);
    }
}

#[test]
fn rope_matches_reference() {
    let (cpu, rf) = backends();
    let mut rng = Rng::new(103);
    let llama3 = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position: 64,
    };
    for &(batch, seq, heads, head_dim, pos_offset, theta, scaling) in &[
        (1, 1, 1, 2, 0, 10_000.0, RopeScaling::None),
        (2, 7, 3, 8, 5, 10_000.0, RopeScaling::Linear { factor: 4.0 }),
        (1, 33, 2, 64, 0, 500_000.0, llama3),
        (3, 127, 1, 6, 1000, 10_000.0, llama3),
    ] {
        let spec = RopeSpec { batch, seq, heads, head_dim, pos_offset, theta, scaling };
        let x = randn(&mut rng, batch * seq * heads * head_dim);
        let (mut a, mut b) = (x.clone(), x.clone());
        cpu.rope_forward(&mut a, &spec).unwrap();
        rf.rope_forward(&mut b, &spec).unwrap();
        close(&format!("rope fwd {spec:?}"), &a, &b);
        cpu.rope_backward(&mut a, &spec).unwrap();
        rf.rope_backward(&mut b, &spec).unwrap();
        close(&format!("rope bwd {spec:?}"), &a, &b);
        close("rope bwd undoes fwd", &a, &x);
    }
}

#[test]
fn softmax_matches_reference() {
    let (cpu, rf) = backends();
    let mut rng = Rng::new(104);
    for &(rows, cols) in &[(1, 1), (3, 7), (33, 1000), (1000, 3), (2, 127)] {
        let x: Vec<f32> = randn(&mut rng, rows * cols).iter().map(|v| v * 4.0).collect();
        let dy = randn(&mut rng, rows * cols);
        let mut outs = Vec::new();
        for be in [cpu, rf] {
            let mut y = nan(rows * cols);
            be.softmax_forward(&mut y, &x, rows, cols).unwrap();
            let mut dx = nan(rows * cols);
            be.softmax_backward(&mut dx, &dy, &y, rows, cols).unwrap();
            outs.push((y, dx));
        }
        close(&format!("softmax fwd {rows}x{cols}"), &outs[0].0, &outs[1].0);
        close(&format!("softmax bwd {rows}x{cols}"), &outs[0].1, &outs[1].1);
    }
}

#[test]
fn swiglu_matches_reference() {
    let (cpu, rf) = backends();
    let mut rng = Rng::new(105);
    for n in [1usize, 3, 7, 33, 127, 1000, 100_003] {
        let g: Vec<f32> = randn(&mut rng, n).iter().map(|v| v * 5.0).collect();
        let u = randn(&mut rng, n);
        let dy = randn(&mut rng, n);
        let mut outs = Vec::new();
        for be in [cpu, rf] {
            let mut y = nan(n);
            be.swiglu_forward(&mut y, &g, &u).unwrap();
            let (mut dg, mut du) = (nan(n), nan(n));
            be.swiglu_backward(&mut dg, &mut du, &dy, &g, &u).unwrap();
            outs.push((y, dg, du));
        }
        close(&format!("swiglu fwd {n}"), &outs[0].0, &outs[1].0);
        close(&format!("swiglu dgate {n}"), &outs[0].1, &outs[1].1);
        close(&format!("swiglu dup {n}"), &outs[0].2, &outs[1].2);
    }
}

#[test]
fn attention_matches_reference_with_gqa_and_caches() {
    let (cpu, rf) = backends();
    let mut rng = Rng::new(106);
    let specs = [
        AttentionSpec::causal(1, 1, 1, 1, 1),
        AttentionSpec::causal(2, 7, 4, 2, 3),
        AttentionSpec::causal(1, 33, 3, 1, 8),
        AttentionSpec::causal(2, 127, 2, 2, 32),
        AttentionSpec {
            batch: 2,
            q_len: 3,
            kv_len: 33,
            kv_capacity: 40,
            q_heads: 4,
            kv_heads: 1,
            head_dim: 7,
        },
        AttentionSpec {
            batch: 1,
            q_len: 1,
            kv_len: 127,
            kv_capacity: 127,
            q_heads: 8,
            kv_heads: 2,
            head_dim: 16,
        },
        // Decoding with heads that do not split evenly over the threads.
        AttentionSpec {
            batch: 1,
            q_len: 1,
            kv_len: 100,
            kv_capacity: 1000,
            q_heads: 7,
            kv_heads: 1,
            head_dim: 33,
        },
        // A long cache at one query row (the row path at every length now), and a short
        // query block against a long cache.
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
            kv_len: 301,
            kv_capacity: 301,
            q_heads: 4,
            kv_heads: 2,
            head_dim: 8,
        },
        // A prompt piece after cached positions, over several query blocks of the
        // blocked path with a partial last one.
        AttentionSpec {
            batch: 1,
            q_len: 45,
            kv_len: 100,
            kv_capacity: 120,
            q_heads: 4,
            kv_heads: 2,
            head_dim: 16,
        },
    ];
    for spec in specs {
        let (nq, nkv, nl) = spec.check("test").unwrap();
        let q = randn(&mut rng, nq);
        let k = randn(&mut rng, nkv);
        let v = randn(&mut rng, nkv);
        let dy = randn(&mut rng, nq);
        let mut outs = Vec::new();
        for be in [cpu, rf] {
            let (mut o, mut l) = (nan(nq), nan(nl));
            be.attention_forward(&mut o, &mut l, &q, &k, &v, &spec).unwrap();
            let (mut dq, mut dk, mut dv) = (nan(nq), nan(nkv), nan(nkv));
            be.attention_backward(&mut dq, &mut dk, &mut dv, &dy, &q, &k, &v, &o, &l, &spec).unwrap();
            outs.push([o, l, dq, dk, dv]);
        }
        for (i, name) in ["out", "lse", "dq", "dk", "dv"].iter().enumerate() {
            close(&format!("attention {name} {spec:?}"), &outs[0][i], &outs[1][i]);
        }
    }
}

/// Several sequences' query rows over their own caches in one call (a decode step over
/// several requests): the CPU's one job bit for bit its own definition (a row at a time
/// through `attention_forward`), and near the reference's; rows seeing 1 position and the
/// whole capacity, a sequence with several rows and one with none, grouped heads, more
/// rows than the team has parts and one. Bad rows are errors that write nothing.
#[test]
fn attention_rows_match_their_definition() {
    let (cpu, rf) = backends();
    let mut rng = Rng::new(107);
    for &(q_heads, kv_heads, head_dim, capacity) in
        &[(9, 3, 64, 40), (4, 4, 7, 5), (2, 1, 33, 17), (1, 1, 1, 1)]
    {
        let spec = AttentionSpec {
            batch: 1,
            q_len: 1,
            kv_len: 1,
            kv_capacity: capacity,
            q_heads,
            kv_heads,
            head_dim,
        };
        let (qd, kvd) = (q_heads * head_dim, kv_heads * head_dim);
        let caches: Vec<(Vec<f32>, Vec<f32>)> =
            (0..4).map(|_| (randn(&mut rng, capacity * kvd), randn(&mut rng, capacity * kvd))).collect();
        let refs: Vec<(&Vec<f32>, &Vec<f32>)> = caches.iter().map(|(k, v)| (k, v)).collect();
        let full =
            [(0, 1), (2, capacity), (0, capacity.min(3)), (3, capacity.div_ceil(2)), (2, 1), (0, capacity)];
        for n in [1, 2, 3, 6] {
            let rows = &full[..n];
            let q = randn(&mut rng, n * qd);
            let mut outs = Vec::new();
            for (be, fused) in [(cpu, true), (cpu, false), (rf, false)] {
                let mut out = nan(n * qd);
                let (mut q1, mut att, mut lse) = (nan(qd), nan(qd), nan(q_heads));
                let a = AttentionRows {
                    out: &mut out,
                    q: &q,
                    caches: &refs,
                    rows,
                    spec,
                    scratch: [&mut q1, &mut att, &mut lse],
                };
                if fused { be.attention_rows(a) } else { attention_rows_each(be, a) }.unwrap();
                outs.push(out);
            }
            let what = format!("attention_rows {q_heads}/{kv_heads}x{head_dim}, {n} rows");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&outs[0]), bits(&outs[1]), "{what}: not the definition's bits");
            close(&what, &outs[0], &outs[2]);
        }
        for (bad, why) in [((4, 1), "sequence"), ((0, 0), "kv_len"), ((1, capacity + 1), "kv_capacity")] {
            for be in [cpu, rf] {
                let mut out = nan(2 * qd);
                let (mut q1, mut att, mut lse) = (nan(qd), nan(qd), nan(q_heads));
                let q = randn(&mut rng, 2 * qd);
                let rows = [(0, 1), bad];
                let a = AttentionRows {
                    out: &mut out,
                    q: &q,
                    caches: &refs,
                    rows: &rows,
                    spec,
                    scratch: [&mut q1, &mut att, &mut lse],
                };
                let e = be.attention_rows(a).unwrap_err().to_string();
                assert!(e.contains(why), "{e}");
                assert!(out.iter().all(|v| v.is_nan()), "a refused call wrote its output: {e}");
            }
        }
    }
}

#[test]
fn embedding_matches_reference() {
    let (cpu, rf) = backends();
    let mut rng = Rng::new(107);
    for &(vocab, dim, n) in &[(1, 1, 1), (1000, 33, 127), (7, 127, 1000)] {
        let table = randn(&mut rng, vocab * dim);
        let ids: Vec<u32> = (0..n).map(|_| rng.below(vocab as u64) as u32).collect();
        let dy = randn(&mut rng, n * dim);
        let dt0 = randn(&mut rng, vocab * dim);
        let mut outs = Vec::new();
        for be in [cpu, rf] {
            let mut o = nan(n * dim);
            be.embedding_forward(&mut o, &table, &ids, vocab, dim).unwrap();
            let mut dt = dt0.clone();
            be.embedding_backward(&mut dt, &dy, &ids, vocab, dim).unwrap();
            outs.push((o, dt));
        }
        assert_eq!(outs[0].0, outs[1].0, "embedding lookup is a copy");
        close(&format!("embedding dtable {vocab}x{dim}"), &outs[0].1, &outs[1].1);
    }
}

#[test]
fn cross_entropy_matches_reference_with_and_without_gradient() {
    let (cpu, rf) = backends();
    let mut rng = Rng::new(108);
    for &(rows, vocab) in &[(1, 1), (3, 7), (33, 1000), (127, 33)] {
        let logits: Vec<f32> = randn(&mut rng, rows * vocab).iter().map(|v| v * 3.0).collect();
        let targets: Vec<u32> = (0..rows).map(|_| rng.below(vocab as u64) as u32).collect();
        let mask: Vec<bool> = (0..rows).map(|r| r % 3 != 1).collect();
        for grad in [None, Some(0.25f32)] {
            let mut outs = Vec::new();
            for be in [cpu, rf] {
                let mut l = logits.clone();
                let s = be.cross_entropy(&mut l, &targets, Some(&mask), rows, vocab, grad).unwrap();
                outs.push((l, s));
            }
            let (a, b) = (&outs[0], &outs[1]);
            assert_eq!(a.1.count, b.1.count);
            assert!(
                (a.1.loss_sum - b.1.loss_sum).abs() <= 1e-5 * b.1.loss_sum.abs().max(1.0),
                "{rows}x{vocab} loss"
            );
            close(&format!("cross_entropy {rows}x{vocab} grad={grad:?}"), &a.0, &b.0);
        }
    }
}

#[test]
fn optimizers_match_reference_bit_for_bit() {
    let (cpu, rf) = backends();
    let mut rng = Rng::new(109);
    for n in [1usize, 33, 100_003] {
        let p0 = randn(&mut rng, n);
        let g = randn(&mut rng, n);
        for hp in [
            AdamParams::default(),
            AdamParams { weight_decay: 0.1, decoupled: true, grad_scale: 0.5, ..AdamParams::default() },
            AdamParams { weight_decay: 0.1, decoupled: false, ..AdamParams::default() },
        ] {
            let mut outs = Vec::new();
            for be in [cpu, rf] {
                let (mut p, mut m, mut v) = (p0.clone(), vec![0.0; n], vec![0.0; n]);
                for step in 1..=3 {
                    be.adam_update(&mut p, &g, &mut m, &mut v, &hp, step).unwrap();
                }
                outs.push((p, m, v));
            }
            assert_eq!(outs[0], outs[1], "adam n={n} {hp:?}");
        }
        for hp in [
            SgdParams::new(0.1),
            SgdParams { momentum: 0.9, nesterov: true, weight_decay: 0.01, ..SgdParams::new(0.1) },
        ] {
            let mut outs = Vec::new();
            for be in [cpu, rf] {
                let mut p = p0.clone();
                let mut buf = vec![0.0; n];
                for _ in 0..3 {
                    be.sgd_update(&mut p, &g, if hp.momentum > 0.0 { Some(&mut buf) } else { None }, &hp)
                        .unwrap();
                }
                outs.push(p);
            }
            assert_eq!(outs[0], outs[1], "sgd n={n} {hp:?}");
        }
    }
}

#[test]
fn elementwise_bias_and_norm_match_reference() {
    let (cpu, rf) = backends();
    let mut rng = Rng::new(110);
    for &(rows, cols) in &[(1, 1), (3, 7), (1000, 33), (33, 1000)] {
        let x = randn(&mut rng, rows * cols);
        let y0 = randn(&mut rng, rows * cols);
        let bias = randn(&mut rng, cols);
        let db0 = randn(&mut rng, cols);
        let mut outs = Vec::new();
        for be in [cpu, rf] {
            let mut y = y0.clone();
            be.axpy(&mut y, -0.75, &x).unwrap();
            be.scale(&mut y, 1.5).unwrap();
            be.add_bias(&mut y, &bias, rows, cols).unwrap();
            let mut db = db0.clone();
            be.bias_backward(&mut db, &x, rows, cols).unwrap();
            let ss = be.sum_of_squares(&y).unwrap();
            outs.push((y, db, ss));
        }
        close(&format!("axpy/scale/add_bias {rows}x{cols}"), &outs[0].0, &outs[1].0);
        close(&format!("bias_backward {rows}x{cols}"), &outs[0].1, &outs[1].1);
        assert!((outs[0].2 - outs[1].2).abs() <= 1e-6 * outs[1].2, "sum_of_squares {rows}x{cols}");
    }
    let bufs = [vec![3.0f32, 4.0], vec![12.0]];
    let refs: Vec<&Vec<f32>> = bufs.iter().collect();
    assert_eq!(global_l2_norm(&CpuBackend, &refs).unwrap(), 13.0);
}

#[test]
fn dense_activations_and_losses_match_reference() {
    let (cpu, rf) = backends();
    let mut rng = Rng::new(111);
    for &(rows, cols) in &[(1, 1), (3, 7), (1000, 33), (2000, 10)] {
        let z = randn(&mut rng, rows * cols);
        let dy = randn(&mut rng, rows * cols);
        for act in Activation::every(0.01) {
            let mut outs = Vec::new();
            for be in [cpu, rf] {
                let mut y = nan(rows * cols);
                be.activation_forward(act, &mut y, &z, rows, cols).unwrap();
                let mut dz = nan(rows * cols);
                be.activation_backward(act, &mut dz, &dy, &z, &y, rows, cols).unwrap();
                outs.push((y, dz));
            }
            close(&format!("{act:?} fwd {rows}x{cols}"), &outs[0].0, &outs[1].0);
            close(&format!("{act:?} bwd {rows}x{cols}"), &outs[0].1, &outs[1].1);
        }
        let mut probs = nan(rows * cols);
        rf.activation_forward(Activation::Softmax, &mut probs, &z, rows, cols).unwrap();
        let mut target = vec![0.0f32; rows * cols];
        for r in 0..rows {
            target[r * cols + rng.below(cols as u64) as usize] = 1.0;
        }
        for loss in [Loss::MeanSquaredError, Loss::BinaryCrossEntropy, Loss::CategoricalCrossEntropy] {
            let mut outs = Vec::new();
            for be in [cpu, rf] {
                let l = be.loss_forward(loss, &probs, &target, rows, cols).unwrap();
                let mut d = nan(rows * cols);
                be.loss_backward(loss, &mut d, &probs, &target, rows, cols).unwrap();
                let mut f = nan(rows * cols);
                be.fused_output_backward(loss, &mut f, &probs, &target, rows, cols).unwrap();
                outs.push((l, d, f));
            }
            assert!(
                (outs[0].0 - outs[1].0).abs() <= 1e-6 * outs[1].0.abs().max(1e-3),
                "{loss:?} {rows}x{cols} value"
            );
            close(&format!("{loss:?} bwd {rows}x{cols}"), &outs[0].1, &outs[1].1);
            close(&format!("{loss:?} fused {rows}x{cols}"), &outs[0].2, &outs[1].2);
        }
    }
}

#[test]
fn q8_products_and_lookups_match_reference() {
    use rusting_brain_core::ops::q8::{dequantize_row, q8_block, quantize_blocks, quantize_rows};
    let (cpu, rf) = backends();
    let mut rng = Rng::new(112);
    for quantize in [quantize_rows, quantize_blocks] {
        for &(m, n, k) in &[
            (1, 1, 1),
            (1, 33, 7),
            (3, 7, 127),
            (1, 1000, 33),
            (7, 127, 1000),
            (1, 64, 256),
            // Decode: sixteen rows a pass, whole and short 64-byte steps, rows left over,
            // and products big enough to split over the team.
            (1, 48, 130),
            (1, 35, 704),
            (1, 4096, 256),
            (1, 1000, 200),
            // The int8 GEMM's tiles: rows and weight rows that are not multiples of four,
            // lengths that are and are not whole 64-byte chunks, bands split over the team.
            (13, 130, 200),
            (16, 64, 512),
            (9, 67, 64),
            (21, 1000, 130),
            // SmolLM2's widths (576, 1536, 192) in blocks of 32: odd block counts per 64-byte step.
            (1, 192, 576),
            (1, 576, 1536),
            (6, 64, 96),
            (5, 33, 32),
            // A server's decode step over two and three requests: the panels, weight rows
            // left over past the sixteens.
            (2, 50, 576),
            (3, 1000, 130),
            // One scale a row from 32 rows: the VNNI GEMM (8 x 32 tiles over packed
            // panels): k off a multiple of four, n off the panels, m off the tiles, big
            // enough to split over the team.
            (32, 1, 5),
            (45, 33, 130),
            (77, 70, 321),
        ] {
            let w = randn(&mut rng, n * k);
            let (packed, scales) = quantize(&w, n, k).unwrap();
            // |w - q * scale| <= scale / 2 for every weight (its row's or its block's scale)
            let block = q8_block("test", n, k, scales.len()).unwrap();
            let nb = k.div_ceil(block);
            for r in 0..n {
                let d = dequantize_row(&packed, &scales, r, k);
                for c in 0..k {
                    let s = scales[r * nb + c / block];
                    assert!((d[c] - w[r * k + c]).abs() <= s * 0.5 + 1e-6, "rounding of ({r}, {c})");
                }
            }
            let x = randn(&mut rng, m * k);
            for beta in [0.0, 1.0] {
                let init = if beta == 0.0 { nan(m * n) } else { randn(&mut rng, m * n) };
                let (mut a, mut b) = (init.clone(), init);
                let spec = MatmulSpec::new(m, n, k).trans_b(true).beta(beta);
                cpu.q8_matmul(&mut a, &x, &packed, &scales, &spec).unwrap();
                rf.q8_matmul(&mut b, &x, &packed, &scales, &spec).unwrap();
                close(&format!("q8_matmul {m}x{n}x{k} beta={beta}"), &a, &b);
                // Exact integer sums, the same float steps: the same bits.
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&a),
                    bits(&b),
                    "q8_matmul {m}x{n}x{k} beta={beta}, {} scales: not core's bits",
                    scales.len()
                );
            }
            let ids: Vec<u32> = (0..5).map(|_| rng.below(n as u64) as u32).collect();
            let (mut a, mut b) = (nan(5 * k), nan(5 * k));
            cpu.q8_embedding(&mut a, &packed, &scales, &ids, n, k).unwrap();
            rf.q8_embedding(&mut b, &packed, &scales, &ids, n, k).unwrap();
            assert_eq!(a, b, "q8_embedding {n}x{k}");
        }
    }
    assert!(quantize_rows(&[1.0, f32::NAN], 1, 2).is_err());
}

/// 4-bit products and lookups: the CPU's (VNNI sixteen rows a pass where the CPU has it,
/// the plain loop for the rest) bit for bit the reference's, on widths with a short last
/// block, an odd block count per 64-value group, SmolLM2's widths, and decode products big
/// enough to split over the team; and near the f32 product of the dequantized weight (the
/// activations' 13-bit rounding is the only difference: 1/8190 of a block's largest value
/// a value, so 1e-3 relative to the output's scale is loose by ~10x).
#[test]
fn q4_products_and_lookups_match_reference() {
    use rusting_brain_core::ops::q4::{q4_dequantize_row, quantize_q4};
    let (cpu, rf) = backends();
    let mut rng = Rng::new(114);
    for &(m, n, k) in &[
        (1, 1, 1),
        (1, 17, 31),
        (2, 16, 32),
        (3, 33, 33),
        (1, 48, 96),
        (1, 192, 576),
        (1, 576, 1536),
        (1, 1000, 200),
        (5, 70, 130),
        (13, 130, 576),
        (21, 64, 64),
        // Short prompts split by output columns over the team (panels and the row kernel),
        // and a longer one split by rows.
        (3, 200, 600),
        (40, 130, 576),
    ] {
        let w = randn(&mut rng, n * k);
        let (packed, scales) = quantize_q4(&w, n, k).unwrap();
        let deq: Vec<f32> = (0..n).flat_map(|r| q4_dequantize_row(&packed, &scales, r, k)).collect();
        let x = randn(&mut rng, m * k);
        for beta in [0.0, 1.0] {
            let init = if beta == 0.0 { nan(m * n) } else { randn(&mut rng, m * n) };
            let (mut a, mut b) = (init.clone(), init.clone());
            let spec = MatmulSpec::new(m, n, k).trans_b(true).beta(beta);
            cpu.q8_matmul(&mut a, &x, &packed, &scales, &spec).unwrap();
            rf.q8_matmul(&mut b, &x, &packed, &scales, &spec).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "q4 product {m}x{n}x{k} beta={beta}: not core's bits");
            let mut f = init.clone();
            rf.matmul(&mut f, &x, &deq, &spec).unwrap();
            let scale = f.iter().fold(1.0f32, |acc, v| acc.max(v.abs()));
            for (i, (got, want)) in a.iter().zip(&f).enumerate() {
                assert!(
                    (got - want).abs() <= 1e-3 * scale,
                    "q4 product {m}x{n}x{k} [{i}]: {got} vs f32 {want}"
                );
            }
        }
        let ids: Vec<u32> = (0..5).map(|_| rng.below(n as u64) as u32).collect();
        let (mut a, mut b) = (nan(5 * k), nan(5 * k));
        cpu.q8_embedding(&mut a, &packed, &scales, &ids, n, k).unwrap();
        rf.q8_embedding(&mut b, &packed, &scales, &ids, n, k).unwrap();
        assert_eq!(a, b, "q4 lookup {n}x{k}");
        let want: Vec<f32> =
            ids.iter().flat_map(|&id| deq[id as usize * k..(id as usize + 1) * k].to_vec()).collect();
        assert_eq!(a, want, "q4 lookup {n}x{k} against the dequantized rows");
    }
    // A 4-bit weight one slot short is neither layout: an error, not a guess.
    let (mut packed, scales) = quantize_q4(&randn(&mut rng, 4 * 64), 4, 64).unwrap();
    packed.pop();
    let spec = MatmulSpec::new(1, 4, 64).trans_b(true);
    assert!(cpu.q8_matmul(&mut nan(4), &randn(&mut rng, 64), &packed, &scales, &spec).is_err());
}

/// The fused int8 calls against their definitions (the trait's defaults, which the
/// reference runs): several products of one input, and SwiGLU's two products with the
/// gating. At one activation row the CPU runs them as one job of the team; those rows must
/// be the very numbers its `q8_matmul` and `swiglu_forward` give one call at a time. The
/// other specs (several rows, a window) go the default way. Bad lengths are errors.
#[test]
fn fused_q8_calls_match_their_definitions() {
    use rusting_brain_core::ops::q4::quantize_q4;
    use rusting_brain_core::ops::q8::{quantize_blocks, quantize_rows};
    let (cpu, rf) = backends();
    let mut rng = Rng::new(113);
    // (rows, input width, the products' widths): q, k, v at the 5.3M and README shapes,
    // odd widths and rows left over after the sixteen-row passes, a batch of rows, one
    // product alone, and more products than one job takes.
    for quantize in [quantize_rows, quantize_blocks, quantize_q4] {
        for &(m, k, ns) in &[
            (1, 256, &[256, 64, 64][..]),
            (1, 512, &[512, 128, 128]),
            (1, 33, &[7, 1, 40]),
            (1, 130, &[1000, 17, 48]),
            (3, 70, &[33, 16, 5]),
            // A server's step over several requests: the rows rounded once (over the team,
            // in unequal halves for nine) for every product, SmolLM2's q, k and v.
            (16, 576, &[576, 192, 192]),
            (9, 1000, &[130, 48]),
            (1, 300, &[700]),
            (1, 64, &[16, 300, 48, 7, 100]),
            // Four products, the most one job takes, split over the team with three too small
            // to give every part rows.
            (1, 512, &[1024, 5, 7, 16]),
        ] {
            let x = randn(&mut rng, m * k);
            let weights: Vec<(Vec<f32>, Vec<f32>)> =
                ns.iter().map(|&n| quantize(&randn(&mut rng, n * k), n, k).unwrap()).collect();
            for beta in [0.0, 1.0] {
                let init: Vec<Vec<f32>> = ns
                    .iter()
                    .map(|&n| if beta == 0.0 { nan(m * n) } else { randn(&mut rng, m * n) })
                    .collect();
                let run = |be: &Dyn| {
                    let mut outs = init.clone();
                    let mut products =
                        rusting_brain_test_support::q8_products(&mut outs, &weights, (m, k, beta));
                    be.q8_matmul_many(&x, &mut products).unwrap();
                    outs
                };
                let (got, want) = (run(cpu), run(rf));
                for (i, n) in ns.iter().enumerate() {
                    close(&format!("q8_matmul_many {m}x{n}x{k} beta {beta}"), &got[i], &want[i]);
                    let mut one = init[i].clone();
                    let spec = MatmulSpec::new(m, *n, k).trans_b(true).beta(beta);
                    cpu.q8_matmul(&mut one, &x, &weights[i].0, &weights[i].1, &spec).unwrap();
                    assert_eq!(got[i], one, "q8_matmul_many {m}x{n}x{k}: not the single product's numbers");
                }
            }
            // SwiGLU: gate and up of the first width.
            let f = ns[0];
            let spec = MatmulSpec::new(m, f, k).trans_b(true);
            let (wg, wu) = (&weights[0], quantize(&randn(&mut rng, f * k), f, k).unwrap());
            let run = |be: &Dyn| {
                let (mut out, mut gate, mut up) = (nan(m * f), nan(m * f), nan(m * f));
                be.q8_swiglu(&mut out, &mut gate, &mut up, &x, (&wg.0, &wg.1), (&wu.0, &wu.1), &spec)
                    .unwrap();
                (out, gate, up)
            };
            let (got, want) = (run(cpu), run(rf));
            close(&format!("q8_swiglu {m}x{f}x{k} gate"), &got.1, &want.1);
            close(&format!("q8_swiglu {m}x{f}x{k} up"), &got.2, &want.2);
            close(&format!("q8_swiglu {m}x{f}x{k}"), &got.0, &want.0);
            let (mut gate, mut up, mut out) = (nan(m * f), nan(m * f), nan(m * f));
            cpu.q8_matmul(&mut gate, &x, &wg.0, &wg.1, &spec).unwrap();
            cpu.q8_matmul(&mut up, &x, &wu.0, &wu.1, &spec).unwrap();
            cpu.swiglu_forward(&mut out, &gate, &up).unwrap();
            assert_eq!(
                (&got.0, &got.1, &got.2),
                (&out, &gate, &up),
                "q8_swiglu {m}x{f}x{k}: not the unfused numbers"
            );
        }
    }
    // Lengths that do not fit the spec are errors on both, fused or not.
    let (packed, scales) = quantize_rows(&randn(&mut rng, 32 * 64), 32, 64).unwrap();
    let x = randn(&mut rng, 64);
    for be in [cpu, rf] {
        let (mut short, mut right) = (vec![0.0; 31], vec![0.0; 32]);
        let spec = MatmulSpec::new(1, 32, 64).trans_b(true);
        let mut products = [
            Q8Product { out: &mut right, packed: &packed, scales: &scales, spec },
            Q8Product { out: &mut short, packed: &packed, scales: &scales, spec },
        ];
        assert!(be.q8_matmul_many(&x, &mut products).is_err(), "{}: a short output", be.name());
        let mut products =
            [Q8Product { out: &mut right, packed: &packed, scales: &scales[..31].to_vec(), spec }];
        assert!(be.q8_matmul_many(&x, &mut products).is_err(), "{}: a short scale", be.name());
        let (mut out, mut gate, mut up) = (vec![0.0; 32], vec![0.0; 32], vec![0.0; 31]);
        let r = be.q8_swiglu(&mut out, &mut gate, &mut up, &x, (&packed, &scales), (&packed, &scales), &spec);
        assert!(r.is_err(), "{}: a short up", be.name());
        let r = be.q8_swiglu(
            &mut out,
            &mut gate,
            &mut vec![0.0; 32],
            &x[..63].to_vec(),
            (&packed, &scales),
            (&packed, &scales),
            &spec,
        );
        assert!(r.is_err(), "{}: a short input", be.name());
    }
}

/// The int8 feed-forward (SwiGLU's products and gating, then the down product added to
/// the residual) against its definition: at one activation row the CPU runs it as one
/// phased job of the team, and every output (gate, up, s and the residual) must be the
/// very numbers of the two calls it fuses; other shapes go the default way. Bad lengths
/// are errors.
#[test]
fn fused_q8_feed_forward_matches_its_definition() {
    use rusting_brain_core::backend::q8_mlp_unfused;
    use rusting_brain_core::ops::q4::quantize_q4;
    use rusting_brain_core::ops::q8::{quantize_blocks, quantize_rows};
    let (cpu, rf) = backends();
    let mut rng = Rng::new(114);
    // (rows, d, f): the 5.3M and README shapes; widths that leave rows over after the
    // sixteen-row passes or give a part no rows; too small to split; several rows.
    for quantize in [quantize_rows, quantize_blocks, quantize_q4] {
        for &(m, d, f) in &[
            (1, 256, 704),
            (1, 512, 1408),
            (1, 130, 1000),
            (1, 40, 2000),
            (1, 300, 33),
            (1, 64, 300),
            (1, 33, 40),
            (1, 16, 4096),
            (3, 70, 33),
        ] {
            let x = randn(&mut rng, m * d);
            let residual = randn(&mut rng, m * d);
            let wg = quantize(&randn(&mut rng, f * d), f, d).unwrap();
            let wu = quantize(&randn(&mut rng, f * d), f, d).unwrap();
            let wd = quantize(&randn(&mut rng, d * f), d, f).unwrap();
            let spec = MatmulSpec::new(m, f, d).trans_b(true);
            let run = |be: &Dyn, fused: bool| {
                let mut out = residual.clone();
                let (mut gate, mut up, mut s) = (nan(m * f), nan(m * f), nan(m * f));
                let (g, u, w) = ((&wg.0, &wg.1), (&wu.0, &wu.1), (&wd.0, &wd.1));
                if fused {
                    be.q8_mlp(&mut out, [&mut gate, &mut up, &mut s], &x, g, u, w, &spec)
                } else {
                    q8_mlp_unfused(be, &mut out, [&mut gate, &mut up, &mut s], &x, g, u, w, &spec)
                }
                .unwrap();
                (out, gate, up, s)
            };
            let (got, want) = (run(cpu, true), run(rf, true));
            close(&format!("q8_mlp {m}x{d}x{f} gate"), &got.1, &want.1);
            close(&format!("q8_mlp {m}x{d}x{f} s"), &got.3, &want.3);
            close(&format!("q8_mlp {m}x{d}x{f}"), &got.0, &want.0);
            assert_eq!(got, run(cpu, false), "q8_mlp {m}x{d}x{f}: not the unfused numbers");
        }
    }
    // Lengths that do not fit the spec are errors on both, fused or not.
    let (d, f) = (64, 48);
    let (pg, sg) = quantize_rows(&randn(&mut rng, f * d), f, d).unwrap();
    let (pd, sd) = quantize_rows(&randn(&mut rng, d * f), d, f).unwrap();
    let x = randn(&mut rng, d);
    let spec = MatmulSpec::new(1, f, d).trans_b(true);
    for be in [cpu, rf] {
        let bad: [(&str, usize, usize, usize, usize); 4] = [
            ("a short residual", d - 1, f, f, sd.len()),
            ("a short s", d, f, f - 1, sd.len()),
            ("a short gate", d, f - 1, f, sd.len()),
            ("a short down scale", d, f, f, sd.len() - 1),
        ];
        for (what, out_len, gate_len, s_len, scales_len) in bad {
            let (mut out, mut gate, mut up, mut s) =
                (vec![0.0; out_len], vec![0.0; gate_len], vec![0.0; f], vec![0.0; s_len]);
            let r = be.q8_mlp(
                &mut out,
                [&mut gate, &mut up, &mut s],
                &x,
                (&pg, &sg),
                (&pg, &sg),
                (&pd, &sd[..scales_len].to_vec()),
                &spec,
            );
            assert!(r.is_err(), "{}: {what}", be.name());
        }
    }
}

/// The specs of one decode position `pos` in a cache of `cap`: attention, and the
/// rotations of q and k.
fn decode_specs(
    hq: usize, hkv: usize, hd: usize, pos: usize, cap: usize,
) -> (AttentionSpec, RopeSpec, RopeSpec) {
    let spec = AttentionSpec {
        batch: 1,
        q_len: 1,
        kv_len: pos + 1,
        kv_capacity: cap,
        q_heads: hq,
        kv_heads: hkv,
        head_dim: hd,
    };
    let rope = |heads| RopeSpec {
        batch: 1,
        seq: 1,
        heads,
        head_dim: hd,
        pos_offset: pos,
        theta: 10_000.0,
        scaling: RopeScaling::None,
    };
    (spec, rope(hq), rope(hkv))
}

/// `q8_attention` (or, not `fused`, its definition) on `bufs` = `[x, q, k, v, cache_k,
/// cache_v, att, lse]`.
fn run_q8_attention(
    be: &Dyn, fused: bool, bufs: &mut [Vec<f32>; 8], h: &[f32], w: &[(Vec<f32>, Vec<f32>)], pos: usize,
    (spec, rope_q, rope_k): &(AttentionSpec, RopeSpec, RopeSpec),
) -> rusting_brain_core::Result<()> {
    use rusting_brain_core::backend::{q8_attention_unfused, Q8Attention};
    let h = h.to_vec();
    let [x, q, k, v, cache_k, cache_v, att, lse] = bufs;
    let a = Q8Attention {
        x,
        h: &h,
        q,
        k,
        v,
        cache_k,
        cache_v,
        pos,
        att,
        lse,
        weights: [(&w[0].0, &w[0].1), (&w[1].0, &w[1].1), (&w[2].0, &w[2].1), (&w[3].0, &w[3].1)],
        rope_q,
        rope_k,
        spec,
    };
    if fused {
        be.q8_attention(a)
    } else {
        q8_attention_unfused(be, a)
    }
}

/// The attention half of a decode step on int8 weights (projections, rotations, the cache
/// rows, attention, Wo's product added to the residual) against its definition, the calls
/// one by one: at one position the CPU runs it as one phased job of the team, and every
/// output must be the very numbers of those calls. Shapes: the 5.3M and README blocks,
/// head counts that leave a part no key/value head or no query head, heads off the 16-lane
/// multiple, one head per group, the cache's first and last positions, and one too small
/// to split. Bad operands are errors on both ways.
#[test]
fn fused_q8_attention_matches_its_definition() {
    use rusting_brain_core::ops::q8::{dequantize_row, quantize_blocks, quantize_rows};
    let (cpu, rf) = backends();
    let mut rng = Rng::new(115);
    let weights = |rng: &mut Rng, d: usize, q_dim: usize, kv_dim: usize| -> Vec<(Vec<f32>, Vec<f32>)> {
        [(q_dim, d), (kv_dim, d), (kv_dim, d), (d, q_dim)]
            .iter()
            .map(|&(n, k)| quantize_rows(&randn(rng, n * k), n, k).unwrap())
            .collect()
    };
    // (d, q heads, kv heads, head size, position, capacity)
    for &(d, hq, hkv, hd, pos, cap) in &[
        (256, 8, 2, 32, 15, 64),
        (512, 8, 2, 64, 100, 513),
        (192, 6, 2, 32, 0, 16),
        (192, 6, 2, 32, 15, 16),
        (200, 5, 1, 40, 3, 10),
        (160, 3, 3, 48, 9, 12),
        (130, 9, 3, 18, 2, 5),
        (32, 2, 1, 16, 1, 4),
    ] {
        let (q_dim, kv_dim) = (hq * hd, hkv * hd);
        let h = randn(&mut rng, d);
        let start = [
            randn(&mut rng, d),
            nan(q_dim),
            nan(kv_dim),
            nan(kv_dim),
            randn(&mut rng, cap * kv_dim),
            randn(&mut rng, cap * kv_dim),
            nan(q_dim),
            nan(hq),
        ];
        // Per-row weights, then blocked ones, then 4-bit ones.
        let blocked = weights(&mut rng, d, q_dim, kv_dim)
            .iter()
            .zip([(q_dim, d), (kv_dim, d), (kv_dim, d), (d, q_dim)])
            .map(|((p, s), (n, k))| {
                let w: Vec<f32> = (0..n).flat_map(|r| dequantize_row(p, s, r, k)).collect();
                quantize_blocks(&w, n, k).unwrap()
            })
            .collect::<Vec<_>>();
        // And 4-bit ones (of the same values).
        let four = blocked
            .iter()
            .zip([(q_dim, d), (kv_dim, d), (kv_dim, d), (d, q_dim)])
            .map(|((p, s), (n, k))| {
                let w: Vec<f32> = (0..n).flat_map(|r| dequantize_row(p, s, r, k)).collect();
                rusting_brain_core::ops::q4::quantize_q4(&w, n, k).unwrap()
            })
            .collect::<Vec<_>>();
        for w in [weights(&mut rng, d, q_dim, kv_dim), blocked, four] {
            let specs = decode_specs(hq, hkv, hd, pos, cap);
            let run = |be: &Dyn, fused: bool| {
                let mut bufs = start.clone();
                run_q8_attention(be, fused, &mut bufs, &h, &w, pos, &specs).unwrap();
                bufs
            };
            let what = format!(
                "q8_attention d {d}, heads {hq}/{hkv} of {hd}, position {pos} of {cap}, {} scales",
                w[0].1.len()
            );
            let (got, want) = (run(cpu, true), run(rf, true));
            close(&format!("{what}: att"), &got[6], &want[6]);
            close(&format!("{what}: x"), &got[0], &want[0]);
            assert_eq!(got, run(cpu, false), "{what}: not the numbers of the calls one by one");
        }
    }
    // Rotations laid out otherwise than the attention's heads (each pair of heads rotated
    // as one head twice as wide): the calls one by one take them, and so does the fused
    // call, with the same numbers.
    {
        let (d, hq, hkv, hd, pos, cap) = (256, 8, 2, 32, 5, 16);
        let (q_dim, kv_dim) = (hq * hd, hkv * hd);
        let h = randn(&mut rng, d);
        let start = [
            randn(&mut rng, d),
            nan(q_dim),
            nan(kv_dim),
            nan(kv_dim),
            randn(&mut rng, cap * kv_dim),
            randn(&mut rng, cap * kv_dim),
            nan(q_dim),
            nan(hq),
        ];
        let w = weights(&mut rng, d, q_dim, kv_dim);
        let (spec, mut rope_q, mut rope_k) = decode_specs(hq, hkv, hd, pos, cap);
        (rope_q.heads, rope_q.head_dim, rope_k.heads, rope_k.head_dim) = (hq / 2, 2 * hd, hkv / 2, 2 * hd);
        let run = |fused: bool| {
            let mut bufs = start.clone();
            run_q8_attention(cpu, fused, &mut bufs, &h, &w, pos, &(spec, rope_q, rope_k)).unwrap();
            bufs
        };
        assert_eq!(run(true), run(false), "q8_attention with rotations of other heads");
    }
    // Bad operands: a position past the cache, a short residual, a short Wo scale.
    let (d, hq, hkv, hd, cap) = (256, 8, 2, 32, 4);
    let (q_dim, kv_dim) = (hq * hd, hkv * hd);
    let w = weights(&mut rng, d, q_dim, kv_dim);
    let h = randn(&mut rng, d);
    for be in [cpu, rf] {
        for (what, pos, x_len, wo_scales) in [
            ("a position past the cache", cap, d, d),
            ("a short residual", 1, d - 1, d),
            ("a short Wo scale", 1, d, d - 1),
        ] {
            let mut w = w.clone();
            w[3].1.truncate(wo_scales);
            let mut bufs = [
                vec![0.0; x_len],
                vec![0.0; q_dim],
                vec![0.0; kv_dim],
                vec![0.0; kv_dim],
                vec![0.0; cap * kv_dim],
                vec![0.0; cap * kv_dim],
                vec![0.0; q_dim],
                vec![0.0; hq],
            ];
            let specs = decode_specs(hq, hkv, hd, pos, cap);
            let r = run_q8_attention(be, true, &mut bufs, &h, &w, pos, &specs);
            assert!(r.is_err(), "{}: {what}", be.name());
        }
    }
}

/// A windowed product touches exactly its rows: the same numbers as the product of the
/// cut-out operands, and every element outside the window unchanged.
#[test]
fn windowed_products_touch_only_their_rows() {
    use rusting_brain_core::ops::q8::quantize_rows;
    let (cpu, rf) = backends();
    let mut rng = Rng::new(131);
    // (rows before, rows in the window, rows after, n, k)
    for &(before, m, after, n, k) in
        &[(0, 1, 3, 7, 33), (5, 3, 0, 33, 7), (2, 7, 4, 127, 33), (1, 1, 1, 1000, 33)]
    {
        let rows = before + m + after;
        let x = randn(&mut rng, rows * k);
        let w = randn(&mut rng, n * k);
        let (packed, scales) = quantize_rows(&w, n, k).unwrap();
        let cut = x[before * k..(before + m) * k].to_vec();
        for beta in [0.0, 1.0] {
            let init = randn(&mut rng, rows * n);
            let windowed =
                MatmulSpec::new(m, n, k).trans_b(true).beta(beta).window(before * k, 0, before * n);
            let whole = MatmulSpec::new(m, n, k).trans_b(true).beta(beta);
            for be in [cpu, rf] {
                let mut c = init.clone();
                be.matmul(&mut c, &x, &w, &windowed).unwrap();
                let mut want = init[before * n..(before + m) * n].to_vec();
                rf.matmul(&mut want, &cut, &w, &whole).unwrap();
                close(
                    &format!("{} windowed matmul {before}+{m}+{after}", be.name()),
                    &c[before * n..(before + m) * n],
                    &want,
                );
                assert_eq!(&c[..before * n], &init[..before * n], "rows before the window");
                assert_eq!(&c[(before + m) * n..], &init[(before + m) * n..], "rows after the window");
                let mut q = init.clone();
                be.q8_matmul(&mut q, &x, &packed, &scales, &windowed).unwrap();
                let mut want = init[before * n..(before + m) * n].to_vec();
                rf.q8_matmul(&mut want, &cut, &packed, &scales, &whole).unwrap();
                assert_eq!(&q[before * n..(before + m) * n], &want[..], "windowed q8_matmul");
                assert_eq!(&q[..before * n], &init[..before * n]);
                assert_eq!(&q[(before + m) * n..], &init[(before + m) * n..]);
            }
        }
        // A transposed-A window (a weight gradient over an expert's rows).
        let dy = randn(&mut rng, rows * n);
        let acc = MatmulSpec::new(n, k, m).trans_a(true).accumulate().window(before * n, before * k, 0);
        let init = randn(&mut rng, n * k);
        let (mut g1, mut g2) = (init.clone(), init.clone());
        cpu.matmul(&mut g1, &dy, &x, &acc).unwrap();
        let whole = MatmulSpec::new(n, k, m).trans_a(true).accumulate();
        rf.matmul(&mut g2, &dy[before * n..(before + m) * n].to_vec(), &cut, &whole).unwrap();
        close("windowed trans_a matmul", &g1, &g2);
    }
    // A window past the end is an error, not a read out of bounds.
    let mut c = vec![0.0; 8];
    let spec = MatmulSpec::new(2, 2, 2).window(6, 0, 0);
    assert!(cpu.matmul(&mut c, &vec![0.0; 8], &vec![0.0; 4], &spec).is_err());
    assert!(rf.matmul(&mut c, &vec![0.0; 8], &vec![0.0; 4], &spec).is_err());
    let spec = MatmulSpec::new(2, 2, 2).batch(2).window(0, 0, 0);
    assert!(cpu.matmul(&mut c, &vec![0.0; 8], &vec![0.0; 8], &spec).is_err());
    // The int8 product is x W^T: a spec without trans_b is refused.
    let (packed, scales) = quantize_rows(&[1.0; 4], 2, 2).unwrap();
    let mut out = vec![0.0; 4];
    let plain = MatmulSpec::new(2, 2, 2);
    assert!(cpu.q8_matmul(&mut out, &vec![1.0; 4], &packed, &scales, &plain).is_err());
    assert!(rf.q8_matmul(&mut out, &vec![1.0; 4], &packed, &scales, &plain).is_err());
}

#[test]
fn moe_combine_matches_reference() {
    use rusting_brain_core::ops::moe::Routing;
    let (cpu, rf) = backends();
    let mut rng = Rng::new(141);
    for &(n, experts, top_k, dim) in
        &[(1, 1, 1, 1), (7, 4, 2, 33), (33, 8, 2, 7), (127, 3, 3, 127), (3, 5, 1, 1000)]
    {
        let logits = randn(&mut rng, n * experts);
        let mut r = Routing::default();
        r.route(&logits, n, experts, top_k, true).unwrap();
        let y = randn(&mut rng, n * top_k * dim);
        let init = randn(&mut rng, n * dim);
        let (mut a, mut b) = (init.clone(), init.clone());
        cpu.moe_combine(&mut a, &y, &r.row_of_slot, &r.weight, top_k, dim).unwrap();
        rf.moe_combine(&mut b, &y, &r.row_of_slot, &r.weight, top_k, dim).unwrap();
        close(&format!("moe_combine n={n} e={experts} k={top_k} dim={dim}"), &a, &b);
        let dout = randn(&mut rng, n * dim);
        let (mut da, mut db) = (nan(n * top_k * dim), nan(n * top_k * dim));
        let wa = cpu.moe_combine_backward(&mut da, &dout, &y, &r.row_of_slot, &r.weight, top_k, dim).unwrap();
        let wb = rf.moe_combine_backward(&mut db, &dout, &y, &r.row_of_slot, &r.weight, top_k, dim).unwrap();
        close(&format!("moe_combine_backward dy n={n} dim={dim}"), &da, &db);
        close(&format!("moe_combine_backward dweight n={n} dim={dim}"), &wa, &wb);
    }
    // A row index outside y is an error on both backends.
    let mut out = vec![0.0; 4];
    for be in [cpu, rf] {
        assert!(be.moe_combine(&mut out, &vec![0.0; 4], &[0, 5], &[1.0, 1.0], 1, 2).is_err());
    }
}

/// The adapter pair (two of the CPU's GEMMs each way, the scale in an alpha) against the
/// reference's loops, on row windows as the experts run them; `t`/`dt` poisoned, `y`, `dx`,
/// `dA`, `dB` accumulate from random values; rows outside the windows stay as they were.
#[test]
fn lora_pair_matches_reference_on_windows() {
    let (cpu, reference) = backends();
    let mut rng = Rng::new(77);
    for (rows, d_in, d_out, rank, (xo, yo, to)) in [
        (1, 1, 1, 1, (0, 0, 0)),
        (3, 7, 33, 2, (7, 0, 6)),
        (33, 127, 7, 8, (254, 66, 0)),
        (127, 33, 1000, 16, (33, 3000, 32)),
    ] {
        let s = LoraSpec::new(rows, d_in, d_out, rank, 0.625).offsets(xo, yo, to);
        let (lx, ly, lt) = (xo + rows * d_in + 5, yo + rows * d_out + 3, to + rows * rank + 2);
        let (x, a, b, y0, dy) = (
            randn(&mut rng, lx),
            randn(&mut rng, rank * d_in),
            randn(&mut rng, d_out * rank),
            randn(&mut rng, ly),
            randn(&mut rng, ly),
        );
        let (dx0, da0, db0) =
            (randn(&mut rng, lx), randn(&mut rng, rank * d_in), randn(&mut rng, d_out * rank));
        let mut outs = Vec::new();
        for be in [cpu, reference] {
            let (mut y, mut t) = (y0.clone(), nan(lt));
            be.lora_forward(&mut y, &mut t, &x, &a, &b, &s).unwrap();
            let (mut dx, mut da, mut db, mut dt) = (dx0.clone(), da0.clone(), db0.clone(), nan(lt));
            be.lora_backward(Some(&mut dx), &mut da, &mut db, &mut dt, &dy, &x, &t, &a, &b, &s).unwrap();
            // Only the windows are written: the rest of t and dt keeps its NaN poison.
            let window = to..to + rows * rank;
            for (i, (tv, dv)) in t.iter().zip(&dt).enumerate() {
                assert_eq!(window.contains(&i), !tv.is_nan() && !dv.is_nan(), "{} t[{i}]", be.name());
            }
            outs.push((y, t[window.clone()].to_vec(), dx, da, db, dt[window].to_vec()));
        }
        let tag = format!("lora {rows}x{d_in}->{d_out} r{rank}");
        let (c, r) = (&outs[0], &outs[1]);
        close(&format!("{tag} y"), &c.0, &r.0);
        close(&format!("{tag} t"), &c.1, &r.1);
        close(&format!("{tag} dx"), &c.2, &r.2);
        close(&format!("{tag} dA"), &c.3, &r.3);
        close(&format!("{tag} dB"), &c.4, &r.4);
        close(&format!("{tag} dt"), &c.5, &r.5);
        // Outside the windows y and dx are untouched.
        assert_eq!(&c.0[..yo], &y0[..yo]);
        assert_eq!(&c.2[xo + rows * d_in..], &dx0[xo + rows * d_in..]);
    }
    // Shapes are checked, not trusted.
    let s = LoraSpec::new(2, 3, 4, 2, 1.0);
    let err = cpu
        .lora_forward(&mut vec![0.0; 8], &mut vec![0.0; 4], &vec![0.0; 5], &vec![0.0; 6], &vec![0.0; 8], &s)
        .unwrap_err();
    assert!(err.to_string().contains('x'), "{err}");
}

/// The sweep every backend runs (rusting_brain_test_support::sweep), at this file's
/// tolerance.
#[test]
fn the_shared_backend_sweep_passes_on_the_cpu() {
    rusting_brain_test_support::backend_sweep(&CpuBackend, TOL);
}

/// `Profiled` forwards each image primitive to the backend it wraps (a method it forgot
/// would run the trait's host default instead and go untimed), and the results still
/// pass the sweep.
#[test]
fn profiled_forwards_the_image_primitives() {
    let p = rusting_brain::profile::Profiled::new(CpuBackend::new());
    rusting_brain_test_support::sweep::image(&p, 2e-5);
    let timed: Vec<&str> = p.report().iter().map(|r| r.0).collect();
    for op in [
        "conv2d",
        "conv2d_q8",
        "group_norm",
        "layer_norm",
        "unary",
        "gated",
        "sdpa",
        "upsample_nearest2d",
        "patchify",
        "unpatchify",
    ] {
        assert!(timed.contains(&op), "{op} was not timed: Profiled does not forward it");
    }
}

//! Determinism across thread counts: the same training run on a rayon pool of 1 and of 2
//! threads (and 3, more than this machine's cores) gives the same bits: every weight after
//! the steps, the losses, the logits and a cached decode. The CPU backend splits its
//! reductions at fixed sizes and its GEMMs over output tiles only, so the thread count
//! changes who computes a value, never the order of its sum.
//!
//! The matrix test runs the same in child processes under `RAYON_NUM_THREADS` (which also
//! sizes the decode team, fixed per process) crossed with every instruction-set path this
//! CPU has (`RB_CPU_ISA`, `RB_CPU_VNNI=0`), and prints the matrix.

use std::collections::BTreeMap;
use std::process::Command;

use rusting_brain::{LoraConfig, Optimizer, Sampler, TokenBatch, TransformerLm};

/// (per-step losses, every weight's bits, logits' bits, greedy ids) of a short run.
type Run = (Vec<u32>, Vec<Vec<u32>>, Vec<u32>, Vec<u32>);

fn run(threads: usize, moe: bool, lora: bool) -> Run {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    pool.install(|| run_here(moe, lora))
}

/// The run on the current pool.
fn run_here(moe: bool, lora: bool) -> Run {
    {
        let mut b = TransformerLm::builder()
            .shape(256, 128, 2, (4, 2, 32), 256, 80)
            .optimizer(Optimizer::adam(1e-3).weight_decay(0.1))
            .seed(21);
        if moe {
            b = b.experts(4, 2).expert_d_ff(96).shared_expert(true);
        }
        let mut m = b.build().unwrap();
        if lora {
            m.add_lora(LoraConfig::new(8).alpha(16.0)).unwrap();
        }
        let rows: Vec<Vec<u32>> =
            (0..4u32).map(|r| (0..65u32).map(|t| (t * 7 + r * 13 + t * t) % 256).collect()).collect();
        let tb = TokenBatch::new(&rows).unwrap();
        let mut losses = Vec::new();
        for _ in 0..3 {
            m.zero_grad().unwrap();
            losses.push(m.accumulate_step(&tb).unwrap().lm_loss.to_bits());
            m.step_clipped(1.0, 1.0).unwrap();
        }
        let weights = m
            .named_parameters()
            .unwrap()
            .into_iter()
            .chain(m.lora_parameters().unwrap())
            .map(|(_, v)| v.iter().map(|x| x.to_bits()).collect())
            .collect();
        let logits = m.forward_batch(&tb).unwrap().iter().map(|x| x.to_bits()).collect();
        let mut ids = m.generate(&rows[0][..40], 16, &mut Sampler::greedy()).unwrap();
        // The int8 path too (activation rounding, int8 products, VNNI or not).
        if !lora {
            m.quantize().unwrap();
            let mut caches = m.new_kv_caches();
            let q8 = m.forward_cached(&rows[1][..24], &mut caches).unwrap();
            ids.extend(q8.iter().map(|x| x.to_bits()));
            ids.extend(m.generate(&rows[0][..40], 16, &mut Sampler::greedy()).unwrap());
        }
        (losses, weights, logits, ids)
    }
}

#[test]
fn training_and_decoding_are_bitwise_the_same_on_1_2_and_3_threads() {
    for (moe, lora) in [(false, false), (true, false), (false, true)] {
        let one = run(1, moe, lora);
        for threads in [2, 3] {
            let other = run(threads, moe, lora);
            let tag = format!("moe={moe} lora={lora}, 1 vs {threads} threads");
            assert_eq!(one.0, other.0, "{tag}: losses");
            assert!(one.1 == other.1, "{tag}: weights after 3 steps");
            assert!(one.2 == other.2, "{tag}: logits");
            assert_eq!(one.3, other.3, "{tag}: greedy ids");
        }
    }
}

const CHILD: &str = "RB_DETERMINISM_CHILD";

/// FNV-1a over the bits of a run, so a child reports one number per case.
fn digest(run: &Run) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let words = run.0.iter().chain(run.1.iter().flatten()).chain(&run.2).chain(&run.3);
    for w in words {
        for b in w.to_le_bytes() {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

#[test]
fn determinism_matrix_over_threads_and_instruction_sets() {
    const CASES: [(&str, bool, bool); 3] =
        [("dense+q8", false, false), ("moe+q8", true, false), ("lora", false, true)];
    if std::env::var(CHILD).is_ok() {
        // A line of its own: libtest has printed the test name without a newline.
        println!("\nisa {}", rusting_brain::cpu::CpuBackend::new().isa());
        for (name, moe, lora) in CASES {
            println!("case {name} {:016x}", digest(&run_here(moe, lora)));
        }
        return;
    }
    let exe = std::env::current_exe().unwrap();
    // (RB_CPU_ISA, RB_CPU_VNNI) requests; the CPU lowers what it lacks, and the child
    // says which path it ran.
    let paths = [("native", "1"), ("avx512", "0"), ("avx2", "1"), ("baseline", "1")];
    // path actually run -> threads -> case digests
    let mut matrix: BTreeMap<String, BTreeMap<usize, Vec<String>>> = BTreeMap::new();
    for (isa, vnni) in paths {
        for threads in [1, 2, 3] {
            let out = Command::new(&exe)
                .args([
                    "--exact",
                    "determinism_matrix_over_threads_and_instruction_sets",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD, "1")
                .env("RB_CPU_ISA", isa)
                .env("RB_CPU_VNNI", vnni)
                .env("RAYON_NUM_THREADS", threads.to_string())
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "child {isa}/{vnni}/{threads}: {text}");
            let ran = text
                .lines()
                .find_map(|l| l.strip_prefix("isa "))
                .expect("the child names its path")
                .to_string();
            let digests: Vec<String> =
                text.lines().filter_map(|l| l.strip_prefix("case ")).map(str::to_string).collect();
            assert_eq!(digests.len(), CASES.len(), "child {isa}/{threads}: {text}");
            matrix.entry(ran).or_default().insert(threads, digests);
        }
    }
    eprintln!(
        "determinism matrix (digest of losses, weights after 3 steps, logits, greedy and int8 decoding):"
    );
    eprintln!("{:<14} {:<9} {:>18} {:>18} {:>18}", "path", "threads", CASES[0].0, CASES[1].0, CASES[2].0);
    for (path, by_threads) in &matrix {
        for (threads, d) in by_threads {
            let strip = |s: &String| s.split(' ').nth(1).unwrap_or("").to_string();
            eprintln!(
                "{path:<14} {threads:<9} {:>18} {:>18} {:>18}",
                strip(&d[0]),
                strip(&d[1]),
                strip(&d[2])
            );
        }
        let first = by_threads.values().next().unwrap();
        for (threads, d) in by_threads {
            assert_eq!(d, first, "{path}: {threads} threads differ from 1");
        }
    }
    // The machine ran the paths it has; an x86-64 CI host has at least AVX2 and baseline.
    if cfg!(target_arch = "x86_64") {
        assert!(matrix.contains_key("baseline"), "{:?}", matrix.keys());
    }
}

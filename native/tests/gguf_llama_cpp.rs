//! GGUF files llama.cpp wrote itself, read with `from_gguf`, against what llama.cpp computes
//! from the same files. `tests/fixtures/gen_gguf_llama_cpp.py` made them: transformers'
//! random Llama (untied, tied), Qwen2 (q/k/v biases), Qwen3 (q/k norms), Mixtral and
//! Qwen3-MoE with trained byte-level BPE tokenizers (Llama 3's, SmolLM's, Qwen2's and
//! GPT-2's splits), converted by llama.cpp's `convert_hf_to_gguf.py` to F32 and Q8_0 and
//! quantized by llama.cpp to Q4_0 and Q4_K_M; llama.cpp's logits of a prompt
//! (`llama-cpp-python`, `logits_all`, F32 KV cache), its eight greedy tokens after it, its
//! tokenization of a set of strings, and transformers' logits of the source models.

use std::path::{Path, PathBuf};

use rusting_brain::core::Sampler;
use rusting_brain::{Precision, TransformerLm};
use safetensors::SafeTensors;
use serde_json::Value;
use tokenizers::Tokenizer;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/gguf_llama_cpp")
}

struct Expected {
    bytes: Vec<u8>,
    meta: Value,
}

impl Expected {
    fn load() -> Expected {
        let bytes = std::fs::read(dir().join("expected.safetensors")).unwrap();
        let meta = serde_json::from_slice(&std::fs::read(dir().join("expected.json")).unwrap()).unwrap();
        Expected { bytes, meta }
    }
    fn logits(&self, name: &str) -> Vec<f32> {
        let st = SafeTensors::deserialize(&self.bytes).unwrap();
        let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        t.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
    }
    fn cases(&self) -> Vec<(String, Value)> {
        self.meta["cases"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// Our logits of `prompt`, every position, and the `n` greedy tokens after it.
fn run(model: &mut TransformerLm, prompt: &[u32], n: usize) -> (Vec<f32>, Vec<u32>) {
    let logits = rusting_brain_test_support::every_position_logits(model, prompt);
    let mut decoder = model.decoder();
    decoder.feed(prompt).unwrap();
    let mut sampler = Sampler::greedy();
    let greedy = (0..n).map(|_| decoder.next(&mut sampler).unwrap()).collect();
    (logits, greedy)
}

/// Worst |ours - theirs| over the largest |theirs|, per file.
fn distance(got: &[f32], want: &[f32]) -> f32 {
    rusting_brain_test_support::rel_to_scale("logits", got, want)
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

/// What counts as a near-tie between two sides' logits: twice their typical difference at
/// one position (the median over positions of the worst |ours - theirs|). The typical,
/// not the worst: a mixture of experts whose routing flips at one position differs there by
/// far more than anywhere else, and would excuse every step.
fn near_tie(ours: &[f32], theirs: &[f32], vocab: usize) -> f32 {
    let mut worst: Vec<f32> = ours
        .chunks_exact(vocab)
        .zip(theirs.chunks_exact(vocab))
        .map(|(a, b)| rusting_brain_test_support::worst_abs_diff(a, b))
        .collect();
    worst.sort_by(f32::total_cmp);
    2.0 * worst[worst.len() / 2]
}

/// llama.cpp's greedy tokens against ours, fed its own tokens one after another (so one
/// near-tie does not send the two down different texts): at each step its token must be
/// our top token, except where its own margin over the runner-up is under `tie`
/// ([`near_tie`]: where rounding may decide), and there our logit of its token must be
/// within `tie` of our best. Returns the steps decided by a near-tie.
fn agrees(
    model: &mut TransformerLm, prompt: &[u32], greedy: &[u32], margins: &[f32], tie: f32,
) -> Result<usize, String> {
    let fed: Vec<u32> = prompt.iter().chain(greedy).copied().collect();
    let (logits, _) = run(model, &fed, 0);
    let vocab = logits.len() / fed.len();
    let mut ties = 0;
    for (i, (&want, &margin)) in greedy.iter().zip(margins).enumerate() {
        let row = &logits[(prompt.len() - 1 + i) * vocab..][..vocab];
        let best = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let gap = best - row[want as usize];
        if margin < tie {
            ties += 1;
            if gap > tie {
                return Err(format!(
                    "step {i}: llama.cpp's token {want} is {gap} below our best (a near-tie of {margin})"
                ));
            }
        } else if gap > 0.0 {
            return Err(format!(
                "step {i}: llama.cpp's token {want} (margin {margin}) is {gap} below our best"
            ));
        }
    }
    Ok(ties)
}

/// Every file read with `from_gguf` (its weights decoded to f32) against llama.cpp:
///
/// - on the same weights multiplied in f32 (the F32 file itself; for a quantized file its
///   dequantized twin) the logits agree to the order of sums: measured at most 1.8e-6 of
///   their range, bound 1e-5. So each file is read to llama.cpp's very model: experts,
///   rotary interleave, biases, q/k norms and Q8_0, Q4_0, Q4_K, Q6_K blocks;
/// - on the quantized file itself llama.cpp also rounds the activations (to Q8_0 blocks;
///   Q8_K for K-quants), which `from_gguf` at f32 does not: measured mean KL up to 0.0012
///   nats for the dense models (bound 0.005) and 0.035 for the mixtures of experts, where
///   that rounding flips a routing choice now and then (Qwen3-MoE's Q4_0 file; bound
///   0.07); the Q8_0 files read at int8 (our blocks of 32) alike;
/// - greedy: the same eight tokens at F32; at Q8_0 llama.cpp's token is ours at every step
///   fed its tokens, except at near-ties ([`agrees`]).
#[test]
fn llama_cpp_s_files_give_llama_cpp_s_logits_and_greedy_tokens() {
    let expected = Expected::load();
    let (mut report, mut failures) = (Vec::new(), Vec::new());
    for (name, case) in expected.cases() {
        for (kind, file) in case["files"].as_object().unwrap() {
            let path = dir().join(format!("{name}.{kind}.gguf"));
            let prompt = ids(&file["prompt_ids"]);
            let (want_greedy, margins) = (ids(&file["greedy"]), floats(&file["margins"]));
            let theirs = expected.logits(&format!("{name}.{kind}.llama_cpp"));
            let exact = match kind.as_str() {
                "f32" => theirs.clone(),
                _ => expected.logits(&format!("{name}.{kind}.llama_cpp_f32")),
            };
            let at = if kind == "q8_0" { vec![Precision::F32, Precision::Q8] } else { vec![Precision::F32] };
            for precision in at {
                let label = format!("{name}.{kind} read at {precision:?}");
                let mut model =
                    TransformerLm::from_gguf_at(&path, precision).unwrap_or_else(|e| panic!("{label}: {e}"));
                let (got, greedy) = run(&mut model, &prompt, want_greedy.len());
                let vocab = got.len() / prompt.len();
                let mut line = format!("{label}:");
                if precision == Precision::F32 {
                    let d = distance(&got, &exact);
                    line += &format!(" same weights in f32 {d:.1e} of the range;");
                    if d > 1e-5 {
                        failures.push(format!("{label}: {d:e} of the range from llama.cpp's f32 logits"));
                    }
                }
                if kind != "f32" {
                    let (kl, same) = rusting_brain_test_support::kl_and_agreement(&got, &theirs, vocab);
                    line += &format!(" the file itself KL {kl:.5}, top token {:.0}%;", 100.0 * same);
                    let bound = if name.contains("moe") || name == "mixtral" { 0.07 } else { 0.005 };
                    if kl.is_nan() || kl > bound {
                        failures.push(format!("{label}: mean KL {kl} from llama.cpp's on the file"));
                    }
                }
                let tie = near_tie(&got, &theirs, vocab);
                match kind.as_str() {
                    "f32" if greedy != want_greedy => {
                        failures.push(format!("{label}: greedy {greedy:?}, llama.cpp's {want_greedy:?}"))
                    }
                    "f32" => line += " greedy tokens llama.cpp's",
                    "q8_0" => match agrees(&mut model, &prompt, &want_greedy, &margins, tie) {
                        Ok(ties) => {
                            line +=
                                &format!(" greedy tokens llama.cpp's ({ties} of 8 near-ties under {tie:.3})")
                        }
                        Err(e) => failures.push(format!("{label}: {e}")),
                    },
                    _ => {}
                }
                report.push(line);
            }
        }
    }
    eprintln!("against llama.cpp on its own files:\n  {}", report.join("\n  "));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A quantized file read at a quantized precision holds its own blocks: Q4_0, Q4_1 and Q4_K
/// at 4 bits and Q8_0, Q4_0 and Q5_0 in int8 exactly, and at 4 bits a Q4_K_M file's wider
/// blocks (Q6_K here) in int8, so the model differs from the file read in f32 by our rounding of
/// the activations (13 bits in blocks of 32) and, where a layout cannot hold a block, the
/// int8 rounding of it (Q6_K; the embedding and routed experts, which stay int8, from
/// Q4_K). Measured on "AMD EPYC" (Zen 4), mean KL to the f32 reading: 1.9e-7 to 8.9e-7
/// for the six models' Q4_0 files at 4 bits and in int8 and their Q8_0 files in int8
/// (bound 2e-5), 7.2e-5 to 4.5e-4 for their Q4_K_M files at 4 bits (bound 1e-3). Rounding
/// the decoded values again, as loads did before: 4.5e-3 to 0.14 at 4 bits, 1.4e-4 to
/// 9.8e-4 for Q4_0 in int8. A 4-bit checkpoint of the model (`save_bin`, each block's
/// scale and offset kept as they were) reads back to the same bits.
#[test]
fn quantized_files_load_as_their_own_blocks() {
    let expected = Expected::load();
    let (mut report, mut failures) = (Vec::new(), Vec::new());
    let tmp = rusting_brain_test_support::TempDir::new("gguf_blocks_as_they_are");
    for (name, case) in expected.cases() {
        for (kind, precision) in [
            ("q4_0", Precision::Q4),
            ("q4_k_m", Precision::Q4),
            ("q8_0", Precision::Q8),
            ("q4_0", Precision::Q8),
        ] {
            let path = dir().join(format!("{name}.{kind}.gguf"));
            let prompt = ids(&case["files"][kind]["prompt_ids"]);
            let mut f32_model = TransformerLm::from_gguf(&path).unwrap();
            let mut held = TransformerLm::from_gguf_at(&path, precision).unwrap();
            let want = rusting_brain_test_support::every_position_logits(&mut f32_model, &prompt);
            let got = rusting_brain_test_support::every_position_logits(&mut held, &prompt);
            let vocab = got.len() / prompt.len();
            let (kl, same) = rusting_brain_test_support::kl_and_agreement(&got, &want, vocab);
            report.push(format!(
                "{name}.{kind} at {precision:?}: KL {kl:.2e} to the f32 reading, top {:.0}%",
                100.0 * same
            ));
            let bound = if kind == "q4_k_m" { 1e-3 } else { 2e-5 };
            if kl.is_nan() || kl > bound {
                failures
                    .push(format!("{name}.{kind} at {precision:?}: mean KL {kl} from the file read in f32"));
            }
            if precision == Precision::Q4 {
                let saved = tmp.path().join(format!("{name}.{kind}.rbw"));
                held.save_bin(&saved, Precision::Q4).unwrap();
                let mut back = TransformerLm::load_bin(&saved).unwrap();
                let again = rusting_brain_test_support::every_position_logits(&mut back, &prompt);
                if again.iter().zip(&got).any(|(a, b)| a.to_bits() != b.to_bits()) {
                    failures.push(format!("{name}.{kind}: the 4-bit checkpoint reads back to other logits"));
                }
            }
        }
    }
    eprintln!("quantized files at their own blocks:\n  {}", report.join("\n  "));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `save_gguf_as(.., GgufType::Q4K)` on the six width-256 models (each Q4_K_M file read in
/// f32): every block matrix Q4_K (its rows are whole 256-value super-blocks), the embedding
/// and head Q8_0, norms and biases F32; read back, the model is the source rounded to 4
/// bits again. Measured on "AMD EPYC" (Zen 4): mean KL to the source 4.5e-3 to 7.7e-2 nats
/// (these small random models move far under a second rounding; bound 0.16, twice the
/// worst: the test's teeth are the types). That the blocks are `llama-quantize`'s bytes is
/// `write.rs`'s test and, on SmolLM2 (272 of 272 tensors), `docs/baseline.md`.
#[test]
fn q4_k_files_written_here_hold_q4_k_blocks() {
    use rusting_brain::gguf::GgufType;
    use rusting_brain_formats::gguf::{blocks::GgmlType, Gguf};
    let expected = Expected::load();
    let tmp = rusting_brain_test_support::TempDir::new("save_gguf_q4_k");
    let (mut report, mut failures) = (Vec::new(), Vec::new());
    for (name, case) in expected.cases() {
        let mut source = TransformerLm::from_gguf(dir().join(format!("{name}.q4_k_m.gguf"))).unwrap();
        let path = tmp.path().join(format!("{name}.gguf"));
        source.save_gguf_as(&path, GgufType::Q4K).unwrap();
        let file = Gguf::parse(std::fs::read(&path).unwrap()).unwrap();
        // Norms, biases and routers (`ffn_gate_inp`) stay F32.
        let matrices = file.tensors.iter().filter(|t| t.dims.len() >= 2 && !t.name.contains("_inp."));
        for t in matrices {
            let edge = t.name == "token_embd.weight" || t.name == "output.weight";
            let want = if edge { GgmlType::Q8_0 } else { GgmlType::Q4K };
            if t.kind != want {
                failures.push(format!("{name}: {} is {}, not {}", t.name, t.kind.name(), want.name()));
            }
        }
        if file
            .tensors
            .iter()
            .any(|t| t.kind == GgmlType::F32 && t.dims.len() >= 2 && !t.name.contains("_inp."))
        {
            failures.push(format!("{name}: a matrix left F32"));
        }
        let prompt = ids(&case["files"]["q4_k_m"]["prompt_ids"]);
        let want = rusting_brain_test_support::every_position_logits(&mut source, &prompt);
        let mut back = TransformerLm::from_gguf(&path).unwrap();
        let got = rusting_brain_test_support::every_position_logits(&mut back, &prompt);
        let (kl, same) = rusting_brain_test_support::kl_and_agreement(&got, &want, got.len() / prompt.len());
        report.push(format!("{name}: KL {kl:.2e} to the source, top {:.0}%", 100.0 * same));
        if kl.is_nan() || kl > 0.16 {
            failures.push(format!("{name}: mean KL {kl} from the source"));
        }
    }
    eprintln!("Q4_K files written here:\n  {}", report.join("\n  "));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The F32 files (llama.cpp's converter from transformers' models) give transformers'
/// logits of the source model at the f32 bound: the order of sums differs (measured at most
/// 7.7e-7 of the range; bound 1e-5).
#[test]
fn llama_cpp_s_f32_files_give_transformers_logits() {
    let expected = Expected::load();
    for (name, case) in expected.cases() {
        let path = dir().join(format!("{name}.f32.gguf"));
        let mut model = TransformerLm::from_gguf(&path).unwrap();
        let prompt = ids(&case["prompt_ids"]);
        let (got, _) = run(&mut model, &prompt, 0);
        let d = distance(&got, &expected.logits(&format!("{name}.transformers")));
        eprintln!("{name}: {d:.2e} of the range from transformers'");
        assert!(d <= 1e-5, "{name}: logits {d:e} of the range from transformers'");
    }
}

/// The tokenizer rebuilt from each file's `tokenizer.ggml.*` splits every string as
/// llama.cpp does on that file, and as the `tokenizers` tokenizer the file was made from.
#[test]
fn the_tokenizer_from_each_file_gives_llama_cpp_s_ids() {
    let expected = Expected::load();
    let strings: Vec<String> = expected.meta["strings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect();
    for (name, case) in expected.cases() {
        for (kind, file) in case["files"].as_object().unwrap() {
            let path = dir().join(format!("{name}.{kind}.gguf"));
            let tok: Tokenizer = rusting_brain::gguf::tokenizer_json(&path).unwrap().parse().unwrap();
            for s in &strings {
                let ours = tok.encode(s.as_str(), false).unwrap().get_ids().to_vec();
                assert_eq!(ours, ids(&file["llama_cpp_ids"][s]), "{name}.{kind} ({}): {s:?}", case["pre"]);
                assert_eq!(ours, ids(&case["hf_ids"][s]), "{name}.{kind}: {s:?} against tokenizers");
            }
        }
    }
}

/// llama.cpp reads what `save_gguf` writes: each F32 fixture read with `from_gguf` and
/// written back at F32, Q8_0 and Q4_0, then llama.cpp's greedy tokens on the written file
/// (`tests/fixtures/llama_cpp_greedy.py`) against ours on the same file (read at f32, and
/// the Q8_0 file at int8 too). Runs where `RB_LLAMA_CPP_PYTHON` names a Python with
/// `llama-cpp-python` 0.3.36 (CI has none: it skips, saying so; `docs/baseline.md` has
/// the run).
#[test]
fn llama_cpp_reads_save_gguf_s_files() {
    let Ok(python) = std::env::var("RB_LLAMA_CPP_PYTHON") else {
        eprintln!("SKIPPED: RB_LLAMA_CPP_PYTHON is not set (a Python with llama-cpp-python)");
        return;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/llama_cpp_greedy.py");
    let expected = Expected::load();
    let tmp = rusting_brain_test_support::TempDir::new("save_gguf_llama_cpp");
    let (mut report, mut failures) = (Vec::new(), Vec::new());
    for (name, case) in expected.cases() {
        let source = TransformerLm::from_gguf(dir().join(format!("{name}.f32.gguf"))).unwrap();
        let prompt = ids(&case["prompt_ids"]);
        for precision in [Precision::F32, Precision::Q8, Precision::Q4] {
            let path = tmp.path().join(format!("{name}.{precision:?}.gguf"));
            source.save_gguf(&path, precision).unwrap();
            let out = std::process::Command::new(&python)
                .arg(&script)
                .arg(&path)
                .arg("8")
                .args(prompt.iter().map(u32::to_string))
                .output()
                .unwrap();
            assert!(out.status.success(), "{name} {precision:?}: {}", String::from_utf8_lossy(&out.stderr));
            let theirs: Value = serde_json::from_slice(&out.stdout).unwrap();
            let want = ids(&theirs["greedy"]);
            let at = if precision == Precision::Q8 { Precision::Q8 } else { Precision::F32 };
            let mut ours = TransformerLm::from_gguf_at(&path, at).unwrap();
            let (logits, greedy) = run(&mut ours, &prompt, want.len());
            let vocab = logits.len() / prompt.len();
            let last: Vec<f32> = theirs["last_logits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect();
            let ours_last = &logits[(prompt.len() - 1) * vocab..];
            let d = distance(ours_last, &last);
            let tie = near_tie(ours_last, &last, vocab);
            let verdict = if precision == Precision::F32 {
                if greedy == want {
                    Ok(0)
                } else {
                    Err(format!("greedy {greedy:?}, llama.cpp's {want:?}"))
                }
            } else {
                agrees(&mut ours, &prompt, &want, &floats(&theirs["margins"]), tie)
            };
            report.push(format!("{name} {precision:?}: last logits {d:.2e} of the range, {verdict:?}"));
            if let Err(e) = verdict {
                failures.push(format!("{name} {precision:?}: {e}"));
            }
        }
    }
    eprintln!("llama.cpp on save_gguf's files:\n  {}", report.join("\n  "));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

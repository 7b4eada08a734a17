//! How far a quantized model is from its f32 self on real text, measured as the field
//! measures it (llama.cpp's `llama-perplexity --kl-divergence`): the text cut into windows
//! of `--window` tokens, each window's second half scored (so every scored token has at
//! least half a window of context), and per scored position the f32 model's and the
//! quantized model's next-token distributions compared.
//!
//! ```text
//! python3 bench/smollm2_folder.py /var/tmp/smollm2 --f32-gguf /var/tmp/smollm2-f32.gguf
//! bash bench/setup_llama_cpp.sh                          # llama.cpp beside, optional
//! RB_LLAMA_DIR=/var/tmp/rb-llama cargo run --release -p rusting_brain --example quant_quality -- \
//!     /var/tmp/smollm2 TEXT_FILE [--f32-gguf /var/tmp/smollm2-f32.gguf] [--window 512] [--max-tokens N] \
//!     [--precisions q8,q4]
//! ```
//!
//! Prints, per precision (`Precision::Q8` and `Precision::Q4` by default): weight bytes,
//! perplexity and its change from f32, mean KL divergence to f32 in
//! nats a token (and its 99th percentile), and how often the top token agrees with f32's.
//! With `--f32-gguf` (the same weights in llama.cpp's layout) and a built llama.cpp under
//! `$RB_LLAMA_DIR`, the same figures from `llama-perplexity --kl-divergence` for llama.cpp's
//! Q8_0, Q4_0 and Q4_K_M made by `llama-quantize` from that file, on the same text and
//! window: both sides start from the very same f32 values.

#[path = "common/bench.rs"]
mod common;

use std::path::PathBuf;
use std::time::Instant;

use rusting_brain::cpu::CpuBackend;
use rusting_brain::{Precision, TokenBatch, TransformerLm};
use tokenizers::Tokenizer;

type R<T> = Result<T, Box<dyn std::error::Error>>;

/// Natural-log softmax of one row of logits, in f64.
fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
    let lse = max + sum.ln();
    row.iter().map(|&v| v as f64 - lse).collect()
}

fn argmax(row: &[f64]) -> usize {
    row.iter().enumerate().fold((0, f64::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0
}

/// What one precision scores against f32 over the text.
#[derive(Default)]
struct Score {
    nll: f64,
    kl: Vec<f64>,
    same_top: usize,
    scored: usize,
}

fn main() -> R<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let positional: Vec<&String> = args
        .iter()
        .enumerate()
        .filter(|(i, a)| !a.starts_with("--") && (*i == 0 || !args[i - 1].starts_with("--")))
        .map(|(_, a)| a)
        .collect();
    let (Some(dir), Some(text)) = (positional.first(), positional.get(1)) else {
        return Err(
            "usage: quant_quality MODEL_DIR TEXT_FILE [--window 512] [--max-tokens N] [--precisions q8,q4]"
                .into(),
        );
    };
    let dir = PathBuf::from(dir);
    let window: usize = flag("--window").map_or(Ok(512), |v| v.parse())?;
    if window < 4 {
        return Err("--window must be at least 4 tokens".into());
    }
    let tokenizer =
        Tokenizer::from_file(dir.join("tokenizer.json")).map_err(|e| format!("tokenizer.json: {e}"))?;
    let text = std::fs::read_to_string(text).map_err(|e| format!("{text}: {e}"))?;
    let mut ids =
        tokenizer.encode(text.as_str(), false).map_err(|e| format!("tokenizing: {e}"))?.get_ids().to_vec();
    if let Some(n) = flag("--max-tokens") {
        ids.truncate(n.parse()?);
    }
    // As llama-perplexity: windows of `window` tokens; in each, the positions from the
    // middle to the second-to-last predict the next token and are scored.
    let windows: Vec<&[u32]> = ids.chunks_exact(window).collect();
    if windows.is_empty() {
        return Err(format!("{} tokens: shorter than one window of {window}", ids.len()).into());
    }

    println!(
        "quant_quality: {} on {} tokens, {} windows of {window}, the second half of each scored; {} ({}) at commit {}",
        dir.display(),
        ids.len(),
        windows.len(),
        common::cpu_model(),
        CpuBackend::new().isa(),
        common::commit()
    );
    // The precisions to score: `--precisions q8,q4` (both by default).
    let wanted = flag("--precisions").unwrap_or_else(|| "q8,q4".into());
    let mut precisions = Vec::new();
    for p in wanted.split(',') {
        precisions.push(match p.trim() {
            "q8" => ("q8", Precision::Q8),
            "q4" => ("q4", Precision::Q4),
            other => return Err(format!("--precisions: {other:?} is not q8 or q4").into()),
        });
    }
    let t = Instant::now();
    let mut f32_model = TransformerLm::from_pretrained(&dir)?;
    let mut models = Vec::new();
    for &(name, p) in &precisions {
        let model = TransformerLm::from_pretrained_at(&dir, p)?;
        println!("{name}: {:.1} MB of weights", model.weight_bytes() as f64 / 1e6);
        models.push(model);
    }
    println!("loaded f32 and {wanted} in {:.1} s", t.elapsed().as_secs_f64());

    let mut base = Score::default();
    let mut scores: Vec<Score> = precisions.iter().map(|_| Score::default()).collect();
    let t = Instant::now();
    for w in &windows {
        let batch = TokenBatch::new([w.to_vec()])?;
        let p = f32_model.forward_batch(&batch)?;
        let vocab = p.len() / (window - 1);
        let quantized: Vec<Vec<f32>> =
            models.iter_mut().map(|m| m.forward_batch(&batch)).collect::<Result<_, _>>()?;
        for pos in window / 2..window - 1 {
            let row = pos * vocab..(pos + 1) * vocab;
            let lp = log_softmax(&p[row.clone()]);
            let target = w[pos + 1] as usize;
            base.nll -= lp[target];
            base.scored += 1;
            for (q, score) in quantized.iter().zip(&mut scores) {
                let lq = log_softmax(&q[row.clone()]);
                score.nll -= lq[target];
                score.kl.push(lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum());
                score.same_top += usize::from(argmax(&lp) == argmax(&lq));
                score.scored += 1;
            }
        }
    }
    println!("scored {} positions in {:.1} s", base.scored, t.elapsed().as_secs_f64());

    let ppl = |s: &Score| (s.nll / s.scored as f64).exp();
    let p0 = ppl(&base);
    println!();
    println!("precision    perplexity   vs f32   mean KL (nats)   KL p99   same top token");
    println!("f32          {p0:>10.4}        -                -        -                -");
    for (&(name, _), score) in precisions.iter().zip(&scores) {
        let p1 = ppl(score);
        let mut kl = score.kl.clone();
        kl.sort_by(f64::total_cmp);
        let mean_kl = kl.iter().sum::<f64>() / kl.len() as f64;
        let p99 = kl[((kl.len() as f64 * 0.99) as usize).min(kl.len() - 1)];
        println!(
            "{name:<12} {p1:>10.4}  {:>+6.2}%   {mean_kl:>14.5}  {p99:>7.4}   {:>13.1}%",
            100.0 * (p1 / p0 - 1.0),
            100.0 * score.same_top as f64 / score.scored as f64
        );
    }
    match (flag("--f32-gguf"), std::env::var("RB_LLAMA_DIR")) {
        (Some(gguf), Ok(llama)) => llama_cpp(&PathBuf::from(llama), &gguf, positional[1], window)?,
        (None, _) => println!("llama.cpp: not run (pass --f32-gguf, from bench/smollm2_folder.py)"),
        (_, Err(_)) => println!("llama.cpp: not run (set RB_LLAMA_DIR; bench/setup_llama_cpp.sh builds it)"),
    }
    Ok(())
}

/// llama.cpp's figures on the same weights and text: `llama-quantize` from the F32 GGUF,
/// then `llama-perplexity` with the F32 file's logits as the base.
fn llama_cpp(dir: &std::path::Path, f32_gguf: &str, text: &str, window: usize) -> R<()> {
    use std::process::Command;
    let bin = dir.join("build/bin");
    for tool in ["llama-quantize", "llama-perplexity"] {
        if !bin.join(tool).exists() {
            println!(
                "llama.cpp: not run ({} is missing; run bench/setup_llama_cpp.sh)",
                bin.join(tool).display()
            );
            return Ok(());
        }
    }
    let run = |cmd: &mut Command| -> R<String> {
        let out = cmd.output()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            return Err(format!("{cmd:?} failed:\n{}", &text[text.len().saturating_sub(2000)..]).into());
        }
        Ok(text)
    };
    let ctx = window.to_string();
    let base = dir.join("smollm2-f32.kld");
    let perplexity = |model: &std::path::Path, kl_base: bool| -> R<String> {
        let mut cmd = Command::new(bin.join("llama-perplexity"));
        cmd.arg("-m").arg(model).args(["-f", text, "-c", &ctx, "-b", &ctx]);
        if kl_base {
            cmd.arg("--kl-divergence-base").arg(&base);
        } else {
            cmd.args(["--kl-divergence", "--kl-divergence-base"]).arg(&base);
        }
        run(&mut cmd)
    };
    let base_out = perplexity(std::path::Path::new(f32_gguf), true)?;
    let number = |text: &str, key: &str| -> Option<f64> {
        let at = text.find(key)? + key.len();
        text[at..]
            .trim_start_matches([' ', ':'])
            .split_whitespace()
            .next()?
            .trim_end_matches('%')
            .parse()
            .ok()
    };
    println!();
    println!(
        "llama.cpp (llama-perplexity -c {window}, {}): f32 perplexity {}",
        dir.display(),
        number(&base_out, "Final estimate: PPL =").map_or("?".into(), |p| format!("{p:.4}"))
    );
    println!("type         perplexity   vs f32   mean KL (nats)   KL p99   same top token");
    for kind in ["Q8_0", "Q4_K_M", "Q4_0"] {
        let q = dir.join(format!("smollm2-{}.gguf", kind.to_lowercase()));
        if !q.exists() {
            run(Command::new(bin.join("llama-quantize")).arg(f32_gguf).arg(&q).arg(kind))?;
        }
        let out = perplexity(&q, false)?;
        let (pq, pb) = (number(&out, "Mean PPL(Q)"), number(&out, "Mean PPL(base)"));
        let delta = match (pq, pb) {
            (Some(q), Some(b)) => format!("{:>+6.2}%", 100.0 * (q / b - 1.0)),
            _ => "?".into(),
        };
        println!(
            "{kind:<12} {:>10}  {delta}   {:>14}  {:>7}   {:>13}%",
            pq.map_or("?".into(), |v| format!("{v:.4}")),
            number(&out, "Mean    KLD:").map_or("?".into(), |v| format!("{v:.5}")),
            number(&out, "99.0%   KLD:").map_or("?".into(), |v| format!("{v:.4}")),
            number(&out, "Same top p:").map_or("?".into(), |v| format!("{v:.1}")),
        );
    }
    Ok(())
}

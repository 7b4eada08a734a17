//! Crash safety of every saver. A child process (this test binary again, told so by
//! `RB_CRASH_CHILD`) saves two versions of each file in turn, forever: `save_bin`,
//! `save_optimizer_state`, `save_json`, `save_onnx`, `save_lora`, `save_lora_peft`,
//! `save_pretrained` and `TokenFile::write`. The parent kills it with SIGKILL at a random
//! moment, again and again; after every kill each path must hold one of the two versions
//! byte for byte, and load. Prints the count of kills and, per file, how many times it
//! held each version (never neither).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use rusting_brain_test_support::TempDir;
use safetensors::SafeTensors;

use rusting_brain::{Activation, LoraConfig, Loss, Network, Optimizer, TokenFile, TransformerLm};

const CHILD: &str = "RB_CRASH_CHILD";
const KILLS: usize = 120;

fn lm(seed: u64) -> TransformerLm {
    // Big enough (about 0.6 MB of f32 weights) that a kill often lands inside a write.
    TransformerLm::builder()
        .shape(512, 64, 2, (4, 2, 16), 160, 16)
        .optimizer(Optimizer::adam(1e-3))
        .seed(seed)
        .build()
        .unwrap()
}

const SEQS: [[u32; 6]; 2] = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]];

/// Version `v` (0 or 1) of every object saved: models trained `v + 1` steps, networks of
/// other seeds, a token file of other ids.
struct Version {
    lm: TransformerLm,
    lora: TransformerLm,
    net: Network,
    ids: Vec<u32>,
}

fn version(v: usize) -> Version {
    let seqs: Vec<Vec<u32>> = SEQS.iter().map(|s| s.to_vec()).collect();
    let mut base = lm(3);
    let mut lora = lm(3);
    lora.add_lora(LoraConfig::new(4)).unwrap();
    for _ in 0..=v {
        base.train_step(&seqs).unwrap();
        lora.train_step(&seqs).unwrap();
    }
    let net = Network::builder()
        .input_size(32)
        .dense(64, Activation::Relu)
        .dense(8, Activation::Identity)
        .loss(Loss::MeanSquaredError)
        .seed(10 + v as u64)
        .build();
    let ids = (0..20_000u32).map(|i| (i * 7 + v as u32) % 512).collect();
    Version { lm: base, lora, net, ids }
}

/// The files one round of saves writes, relative to the folder.
const FILES: [&str; 11] = [
    "model.rbw",
    "state.opt",
    "net.json",
    "net.onnx",
    "adapters.rbl",
    "peft/adapter_config.json",
    "peft/adapter_model.safetensors",
    "hf/config.json",
    "hf/generation_config.json",
    "hf/model.safetensors",
    "corpus.tok",
];

fn save_all(v: &Version, dir: &Path) {
    v.lm.save_bin(dir.join("model.rbw"), rusting_brain::Precision::F32).unwrap();
    v.lm.save_optimizer_state(dir.join("state.opt")).unwrap();
    v.net.save_json(dir.join("net.json")).unwrap();
    v.net.save_onnx(dir.join("net.onnx")).unwrap();
    v.lora.save_lora(dir.join("adapters.rbl")).unwrap();
    v.lora.save_lora_peft(dir.join("peft")).unwrap();
    v.lm.save_pretrained(dir.join("hf")).unwrap();
    TokenFile::write(dir.join("corpus.tok"), &v.ids).unwrap();
}

/// The child: saves version 0, 1, 0, 1, ... into the folder until it is killed, saying
/// `ready` once the first round is whole.
fn child(dir: &Path) -> ! {
    let versions = [version(0), version(1)];
    let mut round = 0usize;
    loop {
        save_all(&versions[round % 2], dir);
        if round == 0 {
            println!("ready");
        }
        round += 1;
    }
}

/// Every path loads through its public loader.
fn loads(dir: &Path) -> Result<(), String> {
    fn e(what: &'static str) -> impl Fn(rusting_brain::NetworkError) -> String {
        move |err| format!("{what}: {err}")
    }
    TransformerLm::load_bin(dir.join("model.rbw")).map_err(e("load_bin"))?;
    lm(3).load_optimizer_state(dir.join("state.opt")).map_err(e("load_optimizer_state"))?;
    Network::load_json(dir.join("net.json")).map_err(e("load_json"))?;
    lm(3).load_lora(dir.join("adapters.rbl")).map_err(e("load_lora(.rbl)"))?;
    lm(3).load_lora(dir.join("peft")).map_err(e("load_lora(PEFT)"))?;
    TransformerLm::from_pretrained(dir.join("hf")).map_err(e("from_pretrained"))?;
    TokenFile::open(dir.join("corpus.tok"), 0).map_err(e("TokenFile::open"))?;
    Ok(())
}

/// Temporary files the killed saves left (`.name.tmpPID`); they are never read.
fn leftovers(dir: &Path) -> usize {
    let mut n = 0;
    for sub in [dir.to_path_buf(), dir.join("peft"), dir.join("hf")] {
        for entry in std::fs::read_dir(&sub).into_iter().flatten().flatten() {
            if entry.file_name().to_string_lossy().contains(".tmp") {
                n += 1;
            }
        }
    }
    n
}

/// Whether two saved files hold the same thing: the same bytes, or (safetensors files,
/// whose metadata map is written in a per-process hash order) the same tensors and the
/// same metadata, or the same JSON value.
fn same(a: &[u8], b: &[u8]) -> bool {
    if a == b {
        return true;
    }
    if let (Ok(x), Ok(y)) = (SafeTensors::deserialize(a), SafeTensors::deserialize(b)) {
        let meta = |s: &[u8]| SafeTensors::read_metadata(s).ok().map(|(_, m)| m.metadata().clone());
        let tensors = |t: &SafeTensors| {
            let mut v: Vec<_> = t
                .tensors()
                .into_iter()
                .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
                .collect();
            v.sort_by(|p, q| p.0.cmp(&q.0));
            v
        };
        return meta(a) == meta(b) && tensors(&x) == tensors(&y);
    }
    match (serde_json::from_slice::<serde_json::Value>(a), serde_json::from_slice::<serde_json::Value>(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

#[test]
fn every_save_survives_sigkill_with_the_old_or_the_new_file() {
    if let Ok(dir) = std::env::var(CHILD) {
        child(Path::new(&dir));
    }

    // The bytes of each version, saved here once.
    let want: Vec<BTreeMap<&str, Vec<u8>>> = (0..2)
        .map(|v| {
            let d = TempDir::new(&format!("crash_want{v}"));
            save_all(&version(v), d.path());
            FILES.iter().map(|f| (*f, std::fs::read(d.join(f)).unwrap())).collect()
        })
        .collect();

    let live = TempDir::new("crash_live");
    let dir = live.path().to_path_buf();
    // How long a round of saves takes, so the kills spread over whole rounds.
    let t = Instant::now();
    save_all(&version(0), &dir);
    let round = t.elapsed();

    let exe = std::env::current_exe().unwrap();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut held: BTreeMap<&str, [usize; 2]> = BTreeMap::new();
    let mut temporaries = 0;
    for kill in 0..KILLS {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "every_save_survives_sigkill_with_the_old_or_the_new_file",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, &dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        while out.read_line(&mut line).unwrap() > 0 && !line.contains("ready") {
            line.clear();
        }
        assert!(line.contains("ready"), "kill {kill}: the child ended before saving");
        // xorshift: a fixed sequence, so a failure replays.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let wait = round.mul_f64((rng % 10_000) as f64 / 10_000.0 * 2.0);
        std::thread::sleep(wait);
        child.kill().unwrap();
        child.wait().unwrap();

        for f in FILES {
            let got = std::fs::read(dir.join(f))
                .unwrap_or_else(|e| panic!("kill {kill}: {f} is gone after the kill: {e}"));
            let which = (0..2).find(|&v| same(&want[v][f], &got)).unwrap_or_else(|| {
                panic!(
                    "kill {kill} ({wait:?} into the saves): {f} holds neither version ({} bytes; the versions have {} and {})",
                    got.len(),
                    want[0][f].len(),
                    want[1][f].len()
                )
            });
            held.entry(f).or_default()[which] += 1;
        }
        loads(&dir).unwrap_or_else(|e| panic!("kill {kill}: {e}"));
        temporaries = leftovers(&dir);
    }

    eprintln!("{KILLS} kills (SIGKILL at random within 2 rounds of saves, a round is {round:?}):");
    eprintln!("{:<32} {:>9} {:>9} {:>8}", "file", "version 0", "version 1", "neither");
    for (f, [a, b]) in &held {
        eprintln!("{f:<32} {a:>9} {b:>9} {:>8}", 0);
        assert_eq!(a + b, KILLS);
    }
    eprintln!("temporary files left at the end (the last child's): {temporaries}");
    // Each save clears the temporaries of killed processes, so only the last child's stay.
    assert!(temporaries <= 3, "{temporaries} temporaries pile up");
    // A versioned file that only ever held one version means the kills never landed in
    // its rewrite window: the check above would then prove little.
    for f in ["model.rbw", "state.opt", "hf/model.safetensors", "adapters.rbl"] {
        assert!(held[f].iter().all(|&n| n > 0), "{f}: {:?}", held[f]);
    }
}

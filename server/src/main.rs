//! `rusting-brain-server --model DIR|FILE.rbw|FILE.gguf [--tokenizer FILE] [--q8 | --q4] [--name NAME]
//! [--lora NAME=DIR|FILE.rbl]... [--image DIR [--image-q8]] [--host 127.0.0.1] [--port 8080] [--api-key KEY]
//! [--max-batch N] [--max-queue N] [--context N] [--max-body BYTES]`
//!
//! Serves the Hugging Face folder `DIR` (weights, `config.json`, `tokenizer.json`, the chat
//! template in `tokenizer_config.json` or `chat_template.jinja`, `generation_config.json`),
//! a `.rbw` checkpoint with those files beside it, or a llama.cpp GGUF file with the
//! tokenizer, template and end ids it carries (at the precision that keeps its blocks as
//! they are unless `--q8` or `--q4` says otherwise), over OpenAI's API; each `--lora` is
//! an adapter (PEFT's folder or `.rbl`) that requests pick with `"model": NAME`; `--image`
//! a diffusers folder (FLUX, SD3, SD 1.x/2.x/XL) for `/v1/images/generations`. Prints
//! `listening on http://HOST:PORT` once it answers; on SIGTERM or Ctrl-C it stops taking
//! connections and exits after the requests in flight finish.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use rusting_brain::{ChatTemplate, GenerationConfig, ImagePipeline, Precision, TransformerLm};
use rusting_brain_server::engine::Engine;
use rusting_brain_server::http::{router, Served};
use rusting_brain_server::images::Painter;
use rusting_brain_server::ServerError;

struct Args {
    model: PathBuf,
    image: Option<PathBuf>,
    image_q8: bool,
    tokenizer: Option<PathBuf>,
    lora: Vec<(String, PathBuf)>,
    q8: bool,
    q4: bool,
    name: Option<String>,
    host: String,
    port: u16,
    api_key: Option<String>,
    max_batch: usize,
    max_queue: usize,
    context: Option<usize>,
    max_body: usize,
}

const USAGE: &str = "usage: rusting-brain-server --model DIR|FILE.rbw|FILE.gguf [--tokenizer FILE] [--q8 | --q4] [--name NAME] \
[--lora NAME=DIR|FILE.rbl]... [--image DIR [--image-q8]] [--host 127.0.0.1] [--port 8080] [--api-key KEY] [--max-batch 16] [--max-queue 64] \
[--context N] [--max-body 1048576]";

fn parse_args() -> Result<Args, ServerError> {
    let mut a = Args {
        model: PathBuf::new(),
        image: None,
        image_q8: false,
        tokenizer: None,
        lora: Vec::new(),
        q8: false,
        q4: false,
        name: None,
        host: "127.0.0.1".into(),
        port: 8080,
        api_key: std::env::var("RB_API_KEY").ok().filter(|k| !k.is_empty()),
        max_batch: 16,
        max_queue: 64,
        context: None,
        max_body: 1 << 20,
    };
    let mut it = std::env::args().skip(1);
    let mut model = None;
    while let Some(flag) = it.next() {
        let mut value =
            |what: &str| it.next().ok_or_else(|| ServerError::Usage(format!("{flag} needs {what}\n{USAGE}")));
        let count = |v: String, flag: &str| {
            v.parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(|| {
                ServerError::Usage(format!("{flag} takes a whole number of at least 1, got `{v}`"))
            })
        };
        match flag.as_str() {
            "--model" => model = Some(PathBuf::from(value("a folder, a .rbw or a .gguf file")?)),
            "--image" => a.image = Some(PathBuf::from(value("a diffusers folder")?)),
            "--image-q8" => a.image_q8 = true,
            "--tokenizer" => a.tokenizer = Some(PathBuf::from(value("a tokenizer.json")?)),
            "--lora" => {
                let v = value("NAME=PATH")?;
                match v.split_once('=') {
                    Some((name, path)) if !name.is_empty() && !path.is_empty() => {
                        a.lora.push((name.to_string(), PathBuf::from(path)))
                    }
                    _ => return Err(ServerError::Usage(format!("--lora takes NAME=PATH, got `{v}`"))),
                }
            }
            "--q8" => a.q8 = true,
            "--q4" => a.q4 = true,
            "--name" => a.name = Some(value("a name")?),
            "--host" => a.host = value("an address")?,
            "--port" => {
                let v = value("a port")?;
                a.port = v
                    .parse()
                    .map_err(|_| ServerError::Usage(format!("--port takes 0 to 65535, got `{v}`")))?;
            }
            "--api-key" => a.api_key = Some(value("a key")?),
            "--max-batch" => a.max_batch = count(value("a number")?, "--max-batch")?,
            "--max-queue" => a.max_queue = count(value("a number")?, "--max-queue")?,
            "--context" => a.context = Some(count(value("a number")?, "--context")?),
            "--max-body" => a.max_body = count(value("a number of bytes")?, "--max-body")?,
            "-h" | "--help" => return Err(ServerError::Usage(USAGE.into())),
            other => return Err(ServerError::Usage(format!("unknown argument `{other}`\n{USAGE}"))),
        }
    }
    a.model = model.ok_or_else(|| ServerError::Usage(format!("--model DIR is required\n{USAGE}")))?;
    if a.q8 && a.q4 {
        return Err(ServerError::Usage("--q8 and --q4: pick one precision".into()));
    }
    Ok(a)
}

fn main() {
    if let Err(e) = run() {
        eprintln!("rusting-brain-server: {e}");
        std::process::exit(2);
    }
}

fn run() -> Result<(), ServerError> {
    let a = parse_args()?;
    let model_err = |e: &dyn std::fmt::Display| ServerError::Model(format!("{}: {e}", a.model.display()));
    // The GGUF reader's errors name the file already.
    let gguf_err = |e: rusting_brain::NetworkError| ServerError::Model(e.to_string());
    let asked = match (a.q8, a.q4) {
        (true, _) => Some(Precision::Q8),
        (_, true) => Some(Precision::Q4),
        _ => None,
    };
    let gguf = a.model.is_file() && a.model.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    // A folder is read as Hugging Face wrote it; a GGUF file as llama.cpp wrote it, with
    // what it carries; a checkpoint of ours with its tokenizer, template and generation
    // settings beside it.
    let (mut model, dir) = if a.model.is_dir() {
        let precision = asked.unwrap_or(Precision::F32);
        (TransformerLm::from_pretrained_at(&a.model, precision).map_err(|e| model_err(&e))?, a.model.clone())
    } else if gguf {
        let precision = match asked {
            Some(p) => p,
            None => rusting_brain::gguf::held_precision(&a.model).map_err(gguf_err)?,
        };
        (TransformerLm::from_gguf_at(&a.model, precision).map_err(gguf_err)?, PathBuf::new())
    } else {
        let mut m = TransformerLm::load_bin(&a.model).map_err(|e| model_err(&e))?;
        if let Some(p) = asked.filter(|_| !m.is_quantized()) {
            m.quantize_to(p).map_err(|e| model_err(&e))?;
        }
        let dir = a.model.parent().map_or_else(|| PathBuf::from("."), PathBuf::from);
        (m, if dir.as_os_str().is_empty() { PathBuf::from(".") } else { dir })
    };
    if let Some(n) = a.context {
        model.set_max_seq_len(n).map_err(|e| model_err(&e))?;
    }
    let tokenizer = match &a.tokenizer {
        None if gguf => {
            let json = rusting_brain::gguf::tokenizer_json(&a.model).map_err(gguf_err)?;
            json.parse::<tokenizers::Tokenizer>().map_err(|e| model_err(&e))?
        }
        given => {
            let path = given.clone().unwrap_or_else(|| dir.join("tokenizer.json"));
            tokenizers::Tokenizer::from_file(&path)
                .map_err(|e| ServerError::Model(format!("{}: {e}", path.display())))?
        }
    };
    let vocab = model.config().vocab_size;
    if tokenizer.get_vocab_size(true) > vocab {
        return Err(ServerError::Model(format!(
            "{}: the tokenizer has {} tokens, over the model's vocabulary of {vocab}",
            a.tokenizer.as_ref().unwrap_or(&a.model).display(),
            tokenizer.get_vocab_size(true)
        )));
    }
    // A base model has no template: it is served on /v1/completions only.
    let template =
        if gguf { ChatTemplate::from_gguf(&a.model).ok() } else { ChatTemplate::from_pretrained(&dir).ok() };
    let generation = if gguf {
        GenerationConfig::from_gguf(&a.model).map_err(gguf_err)?
    } else if a.model.is_dir()
        || dir.join("generation_config.json").is_file()
        || dir.join("config.json").is_file()
    {
        GenerationConfig::from_pretrained(&dir).map_err(|e| model_err(&e))?
    } else {
        eprintln!(
            "rusting-brain-server: no generation_config.json or config.json beside {}: replies end at max_tokens, the context or a stop string",
            a.model.display()
        );
        GenerationConfig::default()
    };
    let name = a.name.clone().unwrap_or_else(|| {
        let stem = if a.model.is_dir() { a.model.file_name() } else { a.model.file_stem() };
        stem.map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned())
    });
    for (adapter, path) in &a.lora {
        if *adapter == name {
            return Err(ServerError::Usage(format!(
                "--lora {adapter}: the base model is called that; name the adapter otherwise"
            )));
        }
        model
            .load_named_lora(adapter, path)
            .map_err(|e| ServerError::Model(format!("--lora {adapter}={}: {e}", path.display())))?;
    }
    let painter = match &a.image {
        Some(dir) => {
            let precision = if a.image_q8 { Precision::Q8 } else { Precision::F32 };
            let pipeline = ImagePipeline::load_at(dir, precision)
                .map_err(|e| ServerError::Model(format!("--image {}: {e}", dir.display())))?;
            let name = dir.file_name().map_or_else(|| "image".into(), |n| n.to_string_lossy().into_owned());
            Some((Painter::start(pipeline, a.max_queue.min(8)), name))
        }
        None if a.image_q8 => return Err(ServerError::Usage("--image-q8 goes with --image DIR".into())),
        None => None,
    };
    let context = model.config().max_seq_len;
    let engine =
        Engine::start(model, tokenizer.clone(), generation.eos_token_ids.clone(), a.max_batch, a.max_queue);
    let served = Arc::new(Served {
        engine,
        tokenizer,
        template,
        model_id: name,
        adapters: a.lora.iter().map(|(n, _)| n.clone()).collect(),
        context,
        painter,
        api_key: a.api_key.clone(),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        served: AtomicU64::new(0),
    });
    let app = router(served, a.max_body);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((a.host.as_str(), a.port)).await?;
        let addr: SocketAddr = listener.local_addr()?;
        println!("listening on http://{addr}");
        axum::serve(listener, app).with_graceful_shutdown(shutdown()).await?;
        Ok(())
    })
}

/// SIGTERM or Ctrl-C.
async fn shutdown() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

//! `rusting-brain-server --model DIR [--q8] [--name NAME] [--host 127.0.0.1] [--port 8080]
//! [--api-key KEY] [--max-batch N] [--max-queue N] [--context N] [--max-body BYTES]`
//!
//! Serves the Hugging Face folder `DIR` (weights, `config.json`, `tokenizer.json`, the chat
//! template in `tokenizer_config.json` or `chat_template.jinja`, `generation_config.json`)
//! over OpenAI's API. Prints `listening on http://HOST:PORT` once it answers; on SIGTERM or
//! Ctrl-C it stops taking connections and exits after the requests in flight finish.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use rusting_brain::{ChatTemplate, GenerationConfig, Precision, TransformerLm};
use rusting_brain_server::engine::Engine;
use rusting_brain_server::http::{router, Served};
use rusting_brain_server::ServerError;

struct Args {
    model: PathBuf,
    q8: bool,
    name: Option<String>,
    host: String,
    port: u16,
    api_key: Option<String>,
    max_batch: usize,
    max_queue: usize,
    context: Option<usize>,
    max_body: usize,
}

const USAGE: &str =
    "usage: rusting-brain-server --model DIR [--q8] [--name NAME] [--host 127.0.0.1] [--port 8080] \
[--api-key KEY] [--max-batch 16] [--max-queue 64] [--context N] [--max-body 1048576]";

fn parse_args() -> Result<Args, ServerError> {
    let mut a = Args {
        model: PathBuf::new(),
        q8: false,
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
            "--model" => model = Some(PathBuf::from(value("a folder")?)),
            "--q8" => a.q8 = true,
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
    let precision = if a.q8 { Precision::Q8 } else { Precision::F32 };
    let mut model = TransformerLm::from_pretrained_at(&a.model, precision).map_err(|e| model_err(&e))?;
    if let Some(n) = a.context {
        model.set_max_seq_len(n).map_err(|e| model_err(&e))?;
    }
    let tokenizer =
        tokenizers::Tokenizer::from_file(a.model.join("tokenizer.json")).map_err(|e| model_err(&e))?;
    // A base model has no template: it is served on /v1/completions only.
    let template = ChatTemplate::from_pretrained(&a.model).ok();
    let generation = GenerationConfig::from_pretrained(&a.model).map_err(|e| model_err(&e))?;
    let name = a.name.clone().unwrap_or_else(|| {
        a.model.file_name().map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned())
    });
    let context = model.config().max_seq_len;
    let engine =
        Engine::start(model, tokenizer.clone(), generation.eos_token_ids.clone(), a.max_batch, a.max_queue);
    let served = Arc::new(Served {
        engine,
        tokenizer,
        template,
        model_id: name,
        context,
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

//! The server as a client meets it: the binary started on a free port over the chat
//! fixture folder (`tests/fixtures/hf_chat/chatml`, a small Qwen2 that transformers wrote
//! with its tokenizer and ChatML template), spoken to over plain HTTP/1.1.
//!
//! Greedy replies equal `TransformerLm::generate` on the same rendered prompt, streamed or
//! not; concurrent clients get their one-at-a-time replies; malformed requests get OpenAI's
//! 4xx errors and the server keeps serving; a client that leaves mid-stream frees its
//! slot; SIGTERM lets the requests in flight finish.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rusting_brain::vae::encode_png;
use rusting_brain::{
    ChatMessage, ChatTemplate, GenerationConfig, ImagePipeline, LoraConfig, Optimizer, Precision, Sampler,
    TransformerLm,
};
use rusting_brain_test_support::TempDir;
use serde_json::{json, Value};

fn folder() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/hf_chat/chatml"))
}

/// The server process; killed when dropped.
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(extra: &[&str]) -> Server {
    start_at(&folder(), extra)
}

/// The server over `model` (a folder or a `.rbw`).
fn start_at(model: &std::path::Path, extra: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rusting-brain-server"))
        .arg("--model")
        .arg(model)
        .args(["--port", "0"])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting the server");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let port = line
        .trim()
        .strip_prefix("listening on http://127.0.0.1:")
        .unwrap_or_else(|| panic!("the server said `{line}`"))
        .parse()
        .unwrap();
    Server { child, port }
}

/// One request; the status and the body.
fn request(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> (u16, String) {
    let (status, _, body) = request_full(port, method, path, headers, body);
    (status, body)
}

/// One request; the status, the response's head and the body.
fn request_full(
    port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8],
) -> (u16, String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    // Chunked bodies (the event streams): the chunks joined.
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        let (mut out, mut rest) = (String::new(), body);
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap();
            if n == 0 {
                break;
            }
            out.push_str(&tail[..n]);
            rest = &tail[n + 2..];
        }
        out
    } else {
        body.to_string()
    };
    (status, head.to_string(), body)
}

fn post(port: u16, path: &str, body: &Value) -> (u16, Value) {
    let (status, text) =
        request(port, "POST", path, &[("content-type", "application/json")], body.to_string().as_bytes());
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("`{text}` is not JSON: {e}")))
}

/// A streamed reply: the text joined from the chunks, the finish reason, the usage chunk.
fn stream(port: u16, path: &str, body: &Value) -> (String, String, Option<Value>) {
    let (status, text) = request(port, "POST", path, &[], body.to_string().as_bytes());
    assert_eq!(status, 200, "{text}");
    let (mut out, mut finish, mut usage, mut done) = (String::new(), String::new(), None, false);
    for line in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        assert!(!done, "data after [DONE]");
        if line == "[DONE]" {
            done = true;
            continue;
        }
        let v: Value = serde_json::from_str(line).unwrap();
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            usage = Some(u.clone());
        }
        let Some(c) = v["choices"].get(0) else { continue };
        out.push_str(c["delta"]["content"].as_str().or(c["text"].as_str()).unwrap_or(""));
        if let Some(f) = c["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    assert!(done, "no [DONE] in {text}");
    (out, finish, usage)
}

/// The reply `TransformerLm::generate` gives the rendered chat, stopping at the end id:
/// its text and the prompt's and reply's token counts.
fn expected_chat(messages: &[ChatMessage], max: usize) -> (String, usize, usize) {
    let mut model = TransformerLm::from_pretrained(folder()).unwrap();
    let text = ChatTemplate::from_pretrained(folder()).unwrap().render(messages, true).unwrap();
    greedy(&mut model, &text, max)
}

/// The greedy continuation `model` generates for `text` (the folder's tokenizer), up to
/// `max` tokens or the end id: its text and the prompt's and reply's token counts.
fn greedy(model: &mut TransformerLm, text: &str, max: usize) -> (String, usize, usize) {
    let d = folder();
    let tok = tokenizers::Tokenizer::from_file(d.join("tokenizer.json")).unwrap();
    greedy_with(model, &tok, &GenerationConfig::from_pretrained(&d).unwrap(), text, max)
}

/// [`greedy`] with a tokenizer and end ids from anywhere.
fn greedy_with(
    model: &mut TransformerLm, tok: &tokenizers::Tokenizer, gen: &GenerationConfig, text: &str, max: usize,
) -> (String, usize, usize) {
    let prompt = tok.encode(text, false).unwrap().get_ids().to_vec();
    let mut reply = Vec::new();
    model
        .generate_with(&prompt, max, &mut Sampler::greedy(), |id| {
            if gen.is_end(id) {
                return false;
            }
            reply.push(id);
            true
        })
        .unwrap();
    (tok.decode(&reply, false).unwrap(), prompt.len(), reply.len())
}

#[test]
fn greedy_chat_equals_generate_streamed_or_not() {
    let server = start(&[]);
    let (status, models) = {
        let (s, t) = request(server.port, "GET", "/v1/models", &[], b"");
        (s, serde_json::from_str::<Value>(&t).unwrap())
    };
    assert_eq!(status, 200);
    assert_eq!(models["data"][0]["id"], "chatml");
    assert_eq!(request(server.port, "GET", "/health", &[], b"").0, 200);
    for question in ["hi", "what is 2 + 2?", "name a colour"] {
        let (want, prompt_tokens, completion_tokens) = expected_chat(&[ChatMessage::user(question)], 6);
        let body = json!({"model": "chatml", "messages": [{"role": "user", "content": question}],
                          "max_tokens": 6, "temperature": 0});
        let (status, r) = post(server.port, "/v1/chat/completions", &body);
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["object"], "chat.completion");
        assert_eq!(r["choices"][0]["message"]["content"], want.as_str(), "{question}");
        assert_eq!(r["usage"]["prompt_tokens"], prompt_tokens);
        assert_eq!(r["usage"]["completion_tokens"], completion_tokens);
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        streamed["stream_options"] = json!({"include_usage": true});
        let (text, finish, usage) = stream(server.port, "/v1/chat/completions", &streamed);
        assert_eq!(text, want, "{question}: streamed");
        assert_eq!(finish, r["choices"][0]["finish_reason"].as_str().unwrap());
        assert_eq!(usage.unwrap(), r["usage"]);
    }
}

/// transformers' own greedy reply on the folder it wrote (`tests/fixtures/hf_chat/expected.json`,
/// `gen_hf_chat.py`): the same ids, whole and streamed.
#[test]
fn greedy_chat_is_transformers_reply() {
    let server = start(&[]);
    let e: Value =
        serde_json::from_slice(&std::fs::read(folder().join("../expected.json")).unwrap()).unwrap();
    let ids: Vec<u32> =
        e["greedy"]["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let tok = tokenizers::Tokenizer::from_file(folder().join("tokenizer.json")).unwrap();
    let want = tok.decode(&ids, false).unwrap();
    let body = json!({"model": "chatml", "temperature": 0, "max_tokens": ids.len(),
                      "messages": [{"role": "system", "content": "  be brief  "}, {"role": "user", "content": "a chat"}]});
    let (status, r) = post(server.port, "/v1/chat/completions", &body);
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["choices"][0]["message"]["content"], want.as_str());
    assert_eq!(r["usage"]["prompt_tokens"], e["greedy"]["prompt"].as_array().unwrap().len());
    assert_eq!(r["usage"]["completion_tokens"], ids.len());
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    assert_eq!(stream(server.port, "/v1/chat/completions", &streamed).0, want);
}

/// Two adapters trained on the fixture's model and saved as PEFT's folder and as `.rbl`,
/// served beside the int8 base (`--lora`): requests for each adapter and for the base,
/// sent together so they share steps, each get their one-at-a-time reply, which is what
/// the model with that adapter attached generates (and not the base's); `/v1/models`
/// lists the adapters and `/health` counts the steps they shared.
#[test]
fn adapter_and_base_requests_share_steps_and_keep_their_replies() {
    let dir = TempDir::new("server_lora");
    let mut rng = rusting_brain::core::Rng::new(3);
    for (i, rank) in [4usize, 2].into_iter().enumerate() {
        let mut m = TransformerLm::from_pretrained(folder()).unwrap();
        m.optimizer = Optimizer::adam(2e-2);
        let vocab = m.config().vocab_size as u64;
        m.add_lora(LoraConfig::new(rank).alpha(16.0)).unwrap();
        for _ in 0..8 {
            let seqs: Vec<Vec<u32>> =
                (0..2).map(|_| (0..24).map(|_| rng.below(vocab) as u32).collect()).collect();
            m.train_step(&seqs).unwrap();
        }
        if i == 0 {
            m.save_lora_peft(dir.join("tuned")).unwrap();
        } else {
            m.save_lora(dir.join("other.rbl")).unwrap();
        }
    }
    let tuned = format!("tuned={}", dir.join("tuned").display());
    let other = format!("other={}", dir.join("other.rbl").display());
    let server = start(&["--q8", "--lora", &tuned, "--lora", &other]);
    let (_, models) = request(server.port, "GET", "/v1/models", &[], b"");
    let models: Value = serde_json::from_str(&models).unwrap();
    let ids: Vec<&str> =
        models["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["chatml", "tuned", "other"]);
    let names = ["tuned", "chatml", "other"];
    let bodies: Vec<Value> = (0..12)
        .map(|i| json!({"model": names[i % 3], "prompt": format!("line {}:", i / 3), "max_tokens": 24, "temperature": 0}))
        .collect();
    let alone: Vec<Value> = bodies.iter().map(|b| post(server.port, "/v1/completions", b).1).collect();
    let port = server.port;
    let together: Vec<Value> = std::thread::scope(|s| {
        let handles: Vec<_> =
            bodies.iter().map(|b| s.spawn(move || post(port, "/v1/completions", b).1)).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a["model"], names[i % 3]);
        assert_eq!(a["choices"][0]["text"], t["choices"][0]["text"], "request {i} ({})", names[i % 3]);
        assert_eq!(a["usage"], t["usage"], "request {i}");
    }
    // What the model with each adapter attached generates, one prompt each.
    let mut base_text = String::new();
    for (name, path) in
        [("chatml", None), ("tuned", Some(dir.join("tuned"))), ("other", Some(dir.join("other.rbl")))]
    {
        let mut m = TransformerLm::from_pretrained_at(folder(), Precision::Q8).unwrap();
        if let Some(p) = path {
            m.load_lora(p).unwrap();
        }
        let want = greedy(&mut m, "line 0:", 24).0;
        let i = names.iter().position(|n| *n == name).unwrap();
        assert_eq!(alone[i]["choices"][0]["text"], want.as_str(), "{name}");
        if name == "chatml" {
            base_text = want;
        } else {
            assert_ne!(want, base_text, "`{name}` replies as the base does");
        }
    }
    let (_, health) = request(server.port, "GET", "/health", &[], b"");
    let health: Value = serde_json::from_str(&health).unwrap();
    assert!(health["mixed_adapter_steps"].as_u64().unwrap() > 0, "no step was shared: {health}");
    let (status, r) = post(server.port, "/v1/completions", &json!({"model": "nope", "prompt": "x"}));
    assert_eq!(status, 404);
    assert!(r["error"]["message"].as_str().unwrap().contains("`chatml`, `tuned`, `other`"), "{r}");
}

/// Adapters on a mixture-of-experts' routed experts (the Mixtral fixture, the chat
/// fixture's tokenizer) serve a whole step: requests for the adapter and for the base sent
/// together decode in a step each, and each gets its one-at-a-time reply.
#[test]
fn expert_adapters_and_base_requests_each_get_their_replies() {
    let dir = TempDir::new("server_moe_lora");
    let moe = folder().join("../../hf/mixtral");
    let mut m = TransformerLm::from_pretrained(&moe).unwrap();
    m.optimizer = Optimizer::adam(2e-2);
    m.add_lora(LoraConfig::new(2).alpha(8.0)).unwrap();
    let mut rng = rusting_brain::core::Rng::new(5);
    for _ in 0..6 {
        let seqs: Vec<Vec<u32>> = (0..2).map(|_| (0..20).map(|_| rng.below(64) as u32).collect()).collect();
        m.train_step(&seqs).unwrap();
    }
    m.save_lora(dir.join("experts.rbl")).unwrap();
    let tokenizer = folder().join("tokenizer.json");
    let lora = format!("experts={}", dir.join("experts.rbl").display());
    let server = start_at(&moe, &["--q8", "--tokenizer", tokenizer.to_str().unwrap(), "--lora", &lora]);
    let bodies: Vec<Value> = (0..8)
        .map(|i| {
            let model = if i % 2 == 0 { "mixtral" } else { "experts" };
            json!({"model": model, "prompt": format!("row {}:", i / 2), "max_tokens": 16})
        })
        .collect();
    let alone: Vec<Value> = bodies.iter().map(|b| post(server.port, "/v1/completions", b).1).collect();
    let port = server.port;
    let together: Vec<(u16, Value)> = std::thread::scope(|s| {
        let handles: Vec<_> =
            bodies.iter().map(|b| s.spawn(move || post(port, "/v1/completions", b))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (a, (status, t))) in alone.iter().zip(&together).enumerate() {
        assert_eq!(*status, 200, "request {i}: {t}");
        assert_eq!(a["choices"][0]["text"], t["choices"][0]["text"], "request {i}");
    }
    assert_ne!(alone[0]["choices"][0]["text"], alone[1]["choices"][0]["text"], "the adapter changes nothing");
}

/// A `.rbw` checkpoint with the folder's tokenizer, template and generation settings beside
/// it serves what the folder serves, under the file's name.
#[test]
fn a_checkpoint_file_serves_what_its_folder_serves() {
    let dir = TempDir::new("server_rbw");
    let m = TransformerLm::from_pretrained(folder()).unwrap();
    m.save_bin(dir.join("small.rbw"), Precision::F32).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"] {
        std::fs::copy(folder().join(f), dir.join(f)).unwrap();
    }
    let body = |model: &str| json!({"model": model, "messages": [{"role": "user", "content": "what is 2 + 2?"}], "max_tokens": 6, "temperature": 0});
    let want = post(start(&[]).port, "/v1/chat/completions", &body("chatml")).1;
    let server = start_at(&dir.join("small.rbw"), &[]);
    let (status, got) = post(server.port, "/v1/chat/completions", &body("small"));
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["choices"][0]["message"], want["choices"][0]["message"]);
    assert_eq!(got["usage"], want["usage"]);
}

/// A GGUF file served on its own (`--model FILE.gguf`, one llama.cpp's converter and
/// quantizer wrote: `tests/fixtures/gguf_llama_cpp`): the tokenizer, chat template and end
/// ids it carries. Each reply is the one `TransformerLm::from_gguf_at` generates with them
/// at the precision served: an F32 file at f32, a Q8_0 file at int8 (the precision that
/// keeps its blocks), and at 4 bits with `--q4`.
#[test]
fn a_gguf_file_serves_what_it_carries() {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/gguf_llama_cpp"));
    let messages = [ChatMessage::user("what is the capital of france?")];
    let body = json!({"model": "qwen2", "messages": [{"role": "user", "content": "what is the capital of france?"}],
                      "max_tokens": 8, "temperature": 0});
    let cases = [
        ("qwen2.f32.gguf", &[][..], Precision::F32),
        ("qwen2.q8_0.gguf", &[][..], Precision::Q8),
        ("qwen2.q8_0.gguf", &["--q4"][..], Precision::Q4),
    ];
    for (file, extra, precision) in cases {
        let path = dir.join(file);
        if extra.is_empty() {
            assert_eq!(rusting_brain::gguf::held_precision(&path).unwrap(), precision, "{file}");
        }
        let server = start_at(&path, &[&["--name", "qwen2"][..], extra].concat());
        let (status, got) = post(server.port, "/v1/chat/completions", &body);
        assert_eq!(status, 200, "{file}: {got}");
        let mut model = TransformerLm::from_gguf_at(&path, precision).unwrap();
        let tok: tokenizers::Tokenizer = rusting_brain::gguf::tokenizer_json(&path).unwrap().parse().unwrap();
        let text = ChatTemplate::from_gguf(&path).unwrap().render(&messages, true).unwrap();
        let gen = GenerationConfig::from_gguf(&path).unwrap();
        let (reply, prompt, n) = greedy_with(&mut model, &tok, &gen, &text, 8);
        assert_eq!(got["choices"][0]["message"]["content"], reply, "{file} at {precision:?}");
        assert_eq!(got["usage"]["prompt_tokens"], prompt, "{file}");
        assert_eq!(got["usage"]["completion_tokens"], n, "{file}");
        assert!(n > 0, "{file}: an empty reply tests nothing");
    }
}

/// A GGUF file the reader refuses stops the server with the reader's words, the file
/// named once.
#[test]
fn a_gguf_file_that_is_no_model_is_refused_by_name() {
    let path = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/gguf_blocks.gguf"));
    let out = Command::new(env!("CARGO_BIN_EXE_rusting-brain-server"))
        .arg("--model")
        .arg(&path)
        .args(["--port", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("general.architecture: fixture is not an architecture"), "{err}");
    assert_eq!(err.matches("gguf_blocks.gguf").count(), 1, "{err}");
}

/// Standard base64 back to bytes (the test's own decoder, not the server's encoder).
fn unbase64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("`{}` is not base64", c as char),
    };
    let mut out = Vec::new();
    for quad in text.as_bytes().chunks(4) {
        let pad = quad.iter().filter(|&&c| c == b'=').count();
        let n =
            quad.iter().filter(|&&c| c != b'=').fold(0u32, |n, &c| n << 6 | u32::from(value(c))) << (6 * pad);
        out.extend_from_slice(&n.to_be_bytes()[1..4 - pad]);
    }
    out
}

/// `--image` over the tiny SD fixture: a picture request returns, byte for byte, the PNG
/// of the picture `ImagePipeline::generate` paints for its prompt, size and seed; another
/// seed paints another; bad picture requests get their 4xx; a server without `--image`
/// says so.
#[test]
fn an_image_request_returns_the_pipelines_picture_for_the_seed() {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/pipelines/sd_tiny"));
    let server = start(&["--image", dir.to_str().unwrap()]);
    let paint = |seed: u64| {
        let body = json!({"model": "sd_tiny", "prompt": "a lighthouse in fog", "size": "16x16", "seed": seed,
                          "n": 1, "response_format": "b64_json"});
        let (status, r) = post(server.port, "/v1/images/generations", &body);
        assert_eq!(status, 200, "{r}");
        unbase64(r["data"][0]["b64_json"].as_str().unwrap())
    };
    let mut pipeline = ImagePipeline::load(&dir).unwrap();
    let want = |p: &mut ImagePipeline, seed| {
        encode_png(&p.generate("a lighthouse in fog", 16, 16, Some(seed), |_, _| true).unwrap()).unwrap()
    };
    let got = paint(3);
    assert_eq!(&got[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(got, want(&mut pipeline, 3), "not the pipeline's picture for seed 3");
    assert_ne!(paint(4), got, "another seed painted the same picture");
    for (body, status, param) in [
        (json!({"prompt": "x", "size": "15x16"}), 400, "size"),
        (json!({"prompt": "x", "n": 2}), 400, "n"),
        (json!({"prompt": "x", "response_format": "url"}), 400, "response_format"),
        (json!({"prompt": ""}), 400, "prompt"),
        (json!({"prompt": "x", "size": "5000x5000"}), 400, "size"),
    ] {
        let (s, r) = post(server.port, "/v1/images/generations", &body);
        assert_eq!((s, r["error"]["param"].as_str()), (status, Some(param)), "{body}: {r}");
    }
    let (s, r) = post(server.port, "/v1/images/generations", &json!({"model": "flux", "prompt": "x"}));
    assert_eq!((s, r["error"]["code"].as_str()), (404, Some("model_not_found")), "{r}");
    let (s, r) = post(start(&[]).port, "/v1/images/generations", &json!({"prompt": "x"}));
    assert_eq!(s, 404, "{r}");
    assert!(r["error"]["message"].as_str().unwrap().contains("--image"), "{r}");
}

#[test]
fn concurrent_clients_get_their_one_at_a_time_replies() {
    let server = start(&["--max-batch", "6"]);
    let bodies: Vec<Value> = (0..16)
        .map(|i| {
            let mut b = json!({"model": "chatml", "prompt": format!("item {i}:"), "max_tokens": 10 + i % 5});
            if i % 2 == 1 {
                // Sampled with a seed: the same draw whatever shares the steps.
                b["temperature"] = json!(0.9);
                b["seed"] = json!(i);
            }
            b
        })
        .collect();
    let alone: Vec<Value> = bodies.iter().map(|b| post(server.port, "/v1/completions", b).1).collect();
    let port = server.port;
    let together: Vec<Value> = std::thread::scope(|s| {
        let handles: Vec<_> =
            bodies.iter().map(|b| s.spawn(move || post(port, "/v1/completions", b).1)).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a["choices"][0]["text"], t["choices"][0]["text"], "request {i}");
        assert_eq!(a["usage"], t["usage"], "request {i}");
    }
}

/// A bounded load run on loopback: 24 clients send 96 requests (streamed and whole, chat
/// and text) at a server that decodes 4 at a time and queues 4 more. Every request gets
/// either its one-at-a-time reply or OpenAI's 503 (`overloaded`, with `retry-after`);
/// some of each happen; afterwards nothing is left active or queued and the server
/// answers as before.
#[test]
fn a_load_run_gets_replies_or_503s_and_leaves_the_server_idle() {
    // int8 here, f32 in the concurrent test: each row's sums run in the same order whatever
    // shares the step, so a reply under load is the reply alone bit for bit.
    let server = start(&["--q8", "--max-batch", "4", "--max-queue", "4"]);
    let port = server.port;
    let body =
        |i: usize| json!({"model": "chatml", "prompt": format!("row {}:", i % 6), "max_tokens": 20 + i % 6});
    let alone: Vec<Value> = (0..6).map(|i| post(port, "/v1/completions", &body(i)).1).collect();
    let alone = &alone;
    let outcomes: Vec<(u16, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..24)
            .map(|c| {
                s.spawn(move || {
                    (0..4)
                        .map(|k| {
                            let i = c * 4 + k;
                            let (status, head, text) = request_full(
                                port,
                                "POST",
                                "/v1/completions",
                                &[],
                                body(i).to_string().as_bytes(),
                            );
                            let v: Value =
                                serde_json::from_str(&text).unwrap_or_else(|e| panic!("`{text}`: {e}"));
                            match status {
                                200 => {
                                    assert_eq!(
                                        v["choices"][0]["text"],
                                        alone[i % 6]["choices"][0]["text"],
                                        "request {i}"
                                    );
                                    (status, String::new())
                                }
                                _ => {
                                    let retry = head.to_ascii_lowercase().contains("\r\nretry-after: 1");
                                    assert!(status != 503 || retry, "a 503 without retry-after: {head}");
                                    (status, v["error"]["code"].as_str().unwrap_or("").to_string())
                                }
                            }
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let served = outcomes.iter().filter(|o| o.0 == 200).count();
    let refused = outcomes.iter().filter(|o| o.0 == 503 && o.1 == "overloaded").count();
    assert_eq!(served + refused, 96, "{outcomes:?}");
    assert!(served >= 8, "only {served} of 96 served");
    assert!(refused > 0, "a queue of 4 behind 4 slots refused none of 24 clients' requests");
    let (_, health) = request(port, "GET", "/health", &[], b"");
    let health: Value = serde_json::from_str(&health).unwrap();
    assert_eq!((health["active"].as_u64(), health["queued"].as_u64()), (Some(0), Some(0)), "{health}");
    assert_eq!(
        post(port, "/v1/completions", &body(0)).1["choices"][0]["text"],
        alone[0]["choices"][0]["text"]
    );
}

/// An int8 server keeps the caches of its last requests: a chat that starts as an earlier
/// one did (the same system prompt) continues from that cache's keys and values, which
/// `/health` counts, and still gets the reply a fresh server gives it.
#[test]
fn a_shared_system_prompt_is_reused_and_changes_no_reply() {
    let chat = |q: &str| {
        json!({"model": "chatml", "max_tokens": 6, "temperature": 0, "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": q}]})
    };
    let server = start(&["--q8"]);
    let ask = |port: u16, q: &str| {
        let (status, r) = post(port, "/v1/chat/completions", &chat(q));
        assert_eq!(status, 200, "{r}");
        r
    };
    let first = ask(server.port, "hi");
    let second = ask(server.port, "a chat");
    let (_, health) = request(server.port, "GET", "/health", &[], b"");
    let health: Value = serde_json::from_str(&health).unwrap();
    assert!(health["reused_prompt_positions"].as_u64().unwrap() >= 8, "{health}");
    for (q, got) in [("hi", &first), ("a chat", &second)] {
        let fresh = ask(start(&["--q8"]).port, q);
        assert_eq!(got["choices"][0]["message"], fresh["choices"][0]["message"], "{q}");
        assert_eq!(got["usage"], fresh["usage"], "{q}");
    }
}

#[test]
fn malformed_requests_get_openai_errors_and_the_server_keeps_serving() {
    let server = start(&["--max-body", "4096"]);
    let p = server.port;
    let chat = "/v1/chat/completions";
    let m = |extra: Value| {
        let mut b = json!({"model": "chatml", "messages": [{"role": "user", "content": "hi"}]});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b.to_string()
    };
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("not JSON", "{".into(), 400, "not valid JSON"),
        ("an array", "[]".into(), 400, "JSON object"),
        ("no model", json!({"messages": []}).to_string(), 400, "`model` is required"),
        ("model a number", json!({"model": 3, "messages": []}).to_string(), 400, "`model` must be a string"),
        ("unknown model", json!({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}).to_string(), 404, "does not exist"),
        ("no messages", json!({"model": "chatml"}).to_string(), 400, "`messages` is required"),
        ("messages a string", json!({"model": "chatml", "messages": "hi"}).to_string(), 400, "must be an array"),
        ("no message", json!({"model": "chatml", "messages": []}).to_string(), 400, "at least one message"),
        ("bad role", json!({"model": "chatml", "messages": [{"role": "robot", "content": "x"}]}).to_string(), 400, "unknown role"),
        ("content a number", json!({"model": "chatml", "messages": [{"role": "user", "content": 5}]}).to_string(), 400, "content"),
        ("image part", json!({"model": "chatml", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}).to_string(), 400, "image_url"),
        ("max_tokens 0", m(json!({"max_tokens": 0})), 400, "at least 1"),
        ("max_tokens huge", m(json!({"max_tokens": 1_000_000_000u64})), 400, "over this model's context"),
        ("max_tokens negative", m(json!({"max_tokens": -4})), 400, "whole number"),
        ("max_tokens a string", m(json!({"max_tokens": "5"})), 400, "integer"),
        ("n 2", m(json!({"n": 2})), 400, "`n` must be 1"),
        ("temperature 3", m(json!({"temperature": 3})), 400, "between 0 and 2"),
        ("temperature a string", m(json!({"temperature": "hot"})), 400, "must be a number"),
        ("top_p 2", m(json!({"top_p": 2})), 400, "between 0 and 1"),
        ("stop a number", m(json!({"stop": 5})), 400, "`stop`"),
        ("five stops", m(json!({"stop": ["a", "b", "c", "d", "e"]})), 400, "at most 4"),
        ("stream a string", m(json!({"stream": "yes"})), 400, "true or false"),
        ("stream_options without stream", m(json!({"stream_options": {"include_usage": true}})), 400, "only allowed"),
        ("frequency_penalty", m(json!({"frequency_penalty": 1})), 400, "repetition_penalty"),
        ("seed a string", m(json!({"seed": "x"})), 400, "integer"),
        ("too long a prompt", m(json!({"messages": [{"role": "user", "content": "word ".repeat(200)}]})), 400, "context"),
        ("too large a body", json!({"model": "chatml", "messages": [{"role": "user", "content": "x".repeat(8000)}]}).to_string(), 413, ""),
    ];
    assert!(cases.len() >= 20);
    for (what, body, status, says) in &cases {
        let (got, text) = request(p, "POST", chat, &[], body.as_bytes());
        assert_eq!(got, *status, "{what}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{what}: `{text}` is not JSON"));
        let message =
            v["error"]["message"].as_str().unwrap_or_else(|| panic!("{what}: no error message in {v}"));
        assert!(message.contains(says), "{what}: `{message}` does not say `{says}`");
    }
    let (status, text) = request(p, "GET", "/v1/nothing", &[], b"");
    assert_eq!(status, 404, "{text}");
    let (status, r) = post(
        p,
        chat,
        &json!({"model": "chatml", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}),
    );
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["usage"]["completion_tokens"], 3);
}

#[test]
fn the_api_key_is_required_when_set() {
    let server = start(&["--api-key", "sesame"]);
    let body = json!({"model": "chatml", "prompt": "a", "max_tokens": 2}).to_string();
    let (status, text) = request(server.port, "POST", "/v1/completions", &[], body.as_bytes());
    assert_eq!(status, 401, "{text}");
    assert!(text.contains("missing API key"), "{text}");
    let wrong = [("authorization", "Bearer nope")];
    assert_eq!(request(server.port, "POST", "/v1/completions", &wrong, body.as_bytes()).0, 401);
    assert_eq!(request(server.port, "GET", "/v1/models", &wrong, b"").0, 401);
    let right = [("authorization", "Bearer sesame")];
    assert_eq!(request(server.port, "POST", "/v1/completions", &right, body.as_bytes()).0, 200);
}

#[test]
fn a_client_that_leaves_mid_stream_frees_its_slot() {
    // One slot, one place in the queue: the next request runs only once the first is gone.
    let server = start(&["--max-batch", "1", "--max-queue", "1", "--context", "4096"]);
    let body = json!({"model": "chatml", "prompt": "a", "max_tokens": 4000, "stream": true}).to_string();
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    write!(s, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}", body.len())
        .unwrap();
    // Decoding (a token's event is here), so out of the queue, when the client leaves.
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("\"text\":\"") || seen.len() < 600 {
        let mut buf = [0u8; 4096];
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended early");
        seen.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&seen).starts_with("HTTP/1.1 200"));
    drop(s);
    let started = std::time::Instant::now();
    let (status, r) =
        post(server.port, "/v1/completions", &json!({"model": "chatml", "prompt": "b", "max_tokens": 3}));
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["usage"]["completion_tokens"], 3);
    // Had the slot stayed busy, this request would have waited for 4,000 tokens.
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the slot was freed only after {:?}",
        started.elapsed()
    );
}

#[test]
fn sigterm_lets_the_requests_in_flight_finish() {
    let mut server = start(&["--context", "4096"]);
    let port = server.port;
    let body = json!({"model": "chatml", "prompt": "a", "max_tokens": 2000, "stream": true,
                      "stream_options": {"include_usage": true}})
    .to_string();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // The reply has begun (its first event is here) when the signal comes.
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("data: ") {
        let mut buf = [0u8; 4096];
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended before its first event");
        seen.extend_from_slice(&buf[..n]);
    }
    let pid = server.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    s.read_to_end(&mut seen).unwrap();
    let text = String::from_utf8_lossy(&seen);
    assert!(text.contains("data: [DONE]"), "the stream was cut: {}", &text[text.len().saturating_sub(300)..]);
    assert!(text.contains("\"completion_tokens\":2000"), "not the whole reply");
    let exit = server.child.wait().unwrap();
    assert!(exit.success(), "the server exited with {exit}");
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err(), "still taking connections");
}

/// OpenAI's Python client (`openai` from PyPI, on `RB_OPENAI_PYTHONPATH`; CI installs it and
/// sets `RB_REQUIRE_OPENAI=1`, elsewhere a missing package skips with the reason) reads the
/// server's replies, streamed and whole, and raises its own exceptions for the refusals.
#[test]
fn the_openai_python_client_reads_the_server() {
    let path = std::env::var("RB_OPENAI_PYTHONPATH").unwrap_or_default();
    let python = |args: &[&str]| Command::new("python3").args(args).env("PYTHONPATH", &path).output();
    if !python(&["-c", "import openai"]).is_ok_and(|o| o.status.success()) {
        assert!(
            std::env::var("RB_REQUIRE_OPENAI").as_deref() != Ok("1"),
            "RB_REQUIRE_OPENAI=1 but python3 cannot import openai (RB_OPENAI_PYTHONPATH={path})"
        );
        eprintln!("SKIPPED: python3 cannot import openai (pip install openai; set RB_OPENAI_PYTHONPATH)");
        return;
    }
    let server = start(&[]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openai_client.py");
    let run = python(&[script, &server.port.to_string()]).unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let got: Value = serde_json::from_slice(&run.stdout).unwrap();
    let (want, prompt_tokens, completion_tokens) = expected_chat(&[ChatMessage::user("hi")], 6);
    assert_eq!(got["models"], json!(["chatml"]));
    assert_eq!(got["chat"], want.as_str());
    assert_eq!(got["streamed"], want.as_str());
    assert_eq!(got["chat_finish"], got["streamed_finish"]);
    assert_eq!(got["chat_usage"]["prompt_tokens"], prompt_tokens);
    assert_eq!(got["chat_usage"]["completion_tokens"], completion_tokens);
    assert_eq!(got["streamed_usage"], got["chat_usage"]);
    let (_, direct) = post(
        server.port,
        "/v1/completions",
        &json!({"model": "chatml", "prompt": "item 3:", "max_tokens": 5}),
    );
    assert_eq!(got["completion"], direct["choices"][0]["text"]);
    let statuses: Vec<(String, u64)> = got["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["raised"].as_str().unwrap_or("nothing").to_string(), e["status"].as_u64().unwrap_or(0)))
        .collect();
    let want_errors = [("BadRequestError", 400), ("NotFoundError", 404), ("BadRequestError", 400)];
    assert_eq!(statuses, want_errors.map(|(c, s)| (c.to_string(), s)).to_vec(), "{}", got["errors"]);
    // And curl, as the README shows it.
    let body = r#"{"model": "chatml", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}"#;
    let url = format!("http://127.0.0.1:{}/v1/chat/completions", server.port);
    match Command::new("curl").args(["-s", "-d", body, &url]).output() {
        Ok(o) => {
            let v: Value = serde_json::from_slice(&o.stdout).unwrap();
            assert_eq!(v["choices"][0]["message"]["content"], want.as_str());
        }
        Err(e) => eprintln!("SKIPPED the curl request: {e}"),
    }
}

//! Chapter 13: a model written as a Hugging Face `transformers` directory, its safetensors
//! file read by hand, loaded back (f32 and int8) with identical logits and generation, and
//! the directory's chat template and generation settings.

// ANCHOR: imports
use std::error::Error;
use std::path::Path;

use rusting_brain::{
    ChatMessage, ChatTemplate, GenerationConfig, Optimizer, Precision, TokenBatch, TransformerLm,
};
// ANCHOR_END: imports

// ANCHOR: train
/// Ids 3 to 20 count up, then 2 ends the sequence and the count starts again. Id 2 plays
/// the end-of-text token a real vocabulary has.
const END: u32 = 2;

fn counting_model() -> Result<TransformerLm, Box<dyn Error>> {
    let mut model = TransformerLm::builder()
        .vocab_size(32)
        .d_model(32)
        .n_layers(2)
        .heads(4, 2, 8)
        .d_ff(64)
        .max_seq_len(64)
        .optimizer(Optimizer::adam(1e-2))
        .seed(3)
        .build()?;
    let cycle: Vec<u32> = (3..=20).chain([END]).collect();
    let stream: Vec<u32> = cycle.iter().copied().cycle().take(3 * cycle.len()).collect();
    // Every offset of the cycle once, so each id is followed by its successor somewhere.
    let rows: Vec<Vec<u32>> = (0..cycle.len()).map(|i| stream[i..i + 17].to_vec()).collect();
    let batch = TokenBatch::new(rows)?;
    for _ in 0..60 {
        model.train_step_batch(&batch)?;
    }
    Ok(model)
}
// ANCHOR_END: train

// ANCHOR: header
/// A safetensors file: 8 bytes of little-endian header length, a JSON header naming each
/// tensor with its dtype, shape and byte range, then the raw little-endian data.
fn read_header(path: &Path) -> Result<serde_json::Map<String, serde_json::Value>, Box<dyn Error>> {
    let bytes = std::fs::read(path)?;
    let len_bytes: [u8; 8] = bytes.get(..8).ok_or("shorter than a header")?.try_into()?;
    let len = u64::from_le_bytes(len_bytes) as usize;
    let json = bytes[8..].get(..len).ok_or("the header runs past the end")?;
    match serde_json::from_slice(json)? {
        serde_json::Value::Object(map) => Ok(map),
        _ => Err("the header is not a JSON object".into()),
    }
}

fn shape(
    header: &serde_json::Map<String, serde_json::Value>, name: &str,
) -> Result<Vec<usize>, Box<dyn Error>> {
    let entry = header.get(name).ok_or(format!("no tensor {name}"))?;
    Ok(serde_json::from_value(entry["shape"].clone())?)
}
// ANCHOR_END: header

// ANCHOR: authors
/// A ChatML template, the format of the Qwen instruct models, cut down: each message is
/// wrapped in <|im_start|>ROLE ... <|im_end|>, and the prompt ends where the assistant's
/// reply begins.
const TEMPLATE: &str = "\
{% if messages[0]['role'] == 'assistant' %}
{{ raise_exception('a conversation starts with the system or the user') }}
{% endif %}
{% for message in messages %}
<|im_start|>{{ message['role'] }}
{{ message['content'] }}{{ eos_token }}
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}";

/// What a model's authors put beside the weights: the end token and how to sample
/// (`generation_config.json`), the chat template and its special tokens
/// (`tokenizer_config.json`).
fn write_authors_files(dir: &Path) -> Result<(), Box<dyn Error>> {
    let generation = serde_json::json!({ "bos_token_id": 1, "eos_token_id": [END], "do_sample": false });
    std::fs::write(dir.join("generation_config.json"), generation.to_string())?;
    let tokenizer = serde_json::json!({ "chat_template": TEMPLATE, "eos_token": "<|im_end|>" });
    std::fs::write(dir.join("tokenizer_config.json"), tokenizer.to_string())?;
    Ok(())
}
// ANCHOR_END: authors

// ANCHOR: chat
fn chat_template(dir: &Path) -> Result<(), Box<dyn Error>> {
    let template = ChatTemplate::from_pretrained(dir)?;
    let conversation = [
        ChatMessage::system("You answer in one sentence."),
        ChatMessage::user("What does the borrow checker check?"),
    ];
    let prompt = template.render(&conversation, true)?;
    println!("the prompt the model would read:\n{prompt}");
    assert!(prompt.starts_with("<|im_start|>system\nYou answer in one sentence.<|im_end|>\n"));
    assert!(prompt.ends_with("<|im_start|>assistant\n"));

    // The same source given in the program, with the special token set by hand.
    let inline = ChatTemplate::new(TEMPLATE)?.special_token("eos_token", "<|im_end|>");
    assert_eq!(inline.render(&conversation, true)?, prompt);
    let refused = template.render(&[ChatMessage::assistant("Hello.")], true);
    println!("a conversation the template refuses: {}", refused.as_ref().err().ok_or("accepted")?);
    Ok(())
}
// ANCHOR_END: chat

// ANCHOR: save
/// Writes the model as a `transformers` directory and looks inside.
fn save(model: &TransformerLm, out: &Path) -> Result<(), Box<dyn Error>> {
    model.save_pretrained(out)?;
    write_authors_files(out)?;
    let mut files: Vec<String> = std::fs::read_dir(out)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    files.sort();
    println!("{}: {}", out.display(), files.join(", "));

    let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("config.json"))?)?;
    println!("config.json: {} {}", config["architectures"], config["model_type"]);
    let header = read_header(&out.join("model.safetensors"))?;
    for name in ["model.embed_tokens.weight", "model.layers.0.self_attn.k_proj.weight"] {
        println!("  {name} {:?} {}", shape(&header, name)?, header[name]["dtype"]);
    }
    let c = model.config();
    assert_eq!(
        shape(&header, "model.layers.0.self_attn.q_proj.weight")?,
        [c.q_heads * c.head_dim, c.d_model]
    );
    assert_eq!(
        shape(&header, "model.layers.0.self_attn.k_proj.weight")?,
        [c.kv_heads * c.head_dim, c.d_model]
    );
    assert!(!header.contains_key("lm_head.weight"), "a tied head is not stored twice");
    Ok(())
}
// ANCHOR_END: save

// ANCHOR: load
fn load(model: &mut TransformerLm, out: &Path, again: &Path) -> Result<(), Box<dyn Error>> {
    // Loaded back: the same function, bit for bit.
    let mut loaded = TransformerLm::from_pretrained(out)?;
    let probe = TokenBatch::new([vec![5, 6, 7, 8, 9, 10]])?;
    assert!(model.forward_batch(&probe)? == loaded.forward_batch(&probe)?, "the logits changed");

    // Generation as the directory describes it: its sampler, stopping at its end id.
    let generation = GenerationConfig::from_pretrained(out)?;
    let prompt = [5, 6, 7];
    let reply = |m: &mut TransformerLm| {
        m.generate_with(&prompt, 32, &mut generation.sampler(None), |id| !generation.is_end(id))
    };
    let ours = reply(model)?;
    println!("reply to {prompt:?}: {ours:?}");
    assert_eq!(ours, (8..=20).chain([END]).collect::<Vec<u32>>());
    assert_eq!(reply(&mut loaded)?, ours);

    // Saving what was loaded gives the same bytes, and keeps the authors' end ids.
    loaded.save_pretrained(again)?;
    let bytes = |dir: &Path| std::fs::read(dir.join("model.safetensors"));
    assert!(bytes(out)? == bytes(again)?, "the weights changed on the way");
    assert_eq!(GenerationConfig::from_pretrained(again)?.eos_token_ids, [END]);

    // Rounded to int8 as it is read: a quarter of the memory, the same greedy reply here.
    let mut small = TransformerLm::from_pretrained_at(out, Precision::Q8)?;
    assert!(small.is_quantized());
    assert_eq!(reply(&mut small)?, ours);
    println!("f32, reloaded and int8 models give the same reply");
    Ok(())
}
// ANCHOR_END: load

// ANCHOR: main
pub fn main() -> Result<(), Box<dyn Error>> {
    let mut model = counting_model()?;
    let dir = std::env::temp_dir().join("rusting_brain_tutorial_13");
    std::fs::create_dir_all(&dir)?;
    let (out, again) = (dir.join("counting"), dir.join("counting-again"));
    save(&model, &out)?;
    load(&mut model, &out, &again)?;
    chat_template(&out)
}
// ANCHOR_END: main

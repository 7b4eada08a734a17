//! Chat templates and generation settings of Hugging Face directories against what
//! transformers renders and generates from the same files (tests/fixtures/gen_hf_chat.py):
//! the template text to the byte, the tokenizer's ids, the template's own refusal, and a
//! greedy reply from the rendered prompt that stops where transformers stops.

use std::path::PathBuf;

use rusting_brain::{ChatMessage, ChatTemplate, GenerationConfig, NetworkError, Sampler, TransformerLm};
use rusting_brain_tests::fixture_path;
use serde_json::Value;

fn dir(name: &str) -> PathBuf {
    fixture_path("hf_chat").join(name)
}

fn expected() -> Value {
    serde_json::from_slice(&std::fs::read(dir("expected.json")).unwrap()).unwrap()
}

fn messages(v: &Value) -> Vec<ChatMessage> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn templates_render_as_transformers_renders_them() {
    let e = expected();
    let tokenizer = tokenizers::Tokenizer::from_file(dir("chatml").join("tokenizer.json")).unwrap();
    // transformers 5's chat_template.jinja and transformers 4's tokenizer_config.json entry.
    for layout in ["chatml", "config_template"] {
        let template = ChatTemplate::from_pretrained(dir(layout)).unwrap();
        for c in e["conversations"].as_array().unwrap() {
            let text = template
                .render(&messages(&c["messages"]), c["add_generation_prompt"].as_bool().unwrap())
                .unwrap();
            assert_eq!(text, c["text"].as_str().unwrap(), "{layout}: {}", c["messages"]);
            let got = tokenizer.encode(text.as_str(), false).unwrap().get_ids().to_vec();
            assert_eq!(got, ids(&c["ids"]), "{layout}: ids of {text:?}");
        }
        let err = template.render(&messages(&e["refused"]["messages"]), true).unwrap_err().to_string();
        let want = e["refused"]["message"].as_str().unwrap();
        assert!(err.contains(want), "`{err}` does not carry the template's message `{want}`");
        assert!(err.contains("chat_template") || err.contains("tokenizer_config.json"), "{err}");
    }
}

/// The constructs published templates lean on: macros, namespaces, `selectattr`, `is
/// defined` / `is not none`, filtered loops with `loop.length`, `.get`, `.split(..)[-1]`,
/// `.lstrip(..)`, `~`, `join`, a conditional expression; and a variable passed the way
/// `apply_chat_template(..., enable_thinking=False)` passes it.
#[test]
fn a_template_with_published_constructs_renders_as_transformers_renders_it() {
    let e = expected();
    let template = ChatTemplate::from_pretrained(dir("rich_template")).unwrap();
    let cases = e["rich"].as_array().unwrap();
    assert_eq!(cases.len(), 4);
    for c in cases {
        // The last case passes enable_thinking=False, as Qwen3's users do.
        let vars = c.get("extra").and_then(Value::as_object).cloned().unwrap_or_default();
        let text = template
            .render_with(&messages(&c["messages"]), c["add_generation_prompt"].as_bool().unwrap(), &vars)
            .unwrap();
        assert_eq!(text, c["text"].as_str().unwrap(), "{}", c["messages"]);
    }
}

#[test]
fn a_greedy_reply_to_the_rendered_prompt_is_transformers_reply() {
    let e = expected();
    let g = &e["greedy"];
    let d = dir("chatml");
    let gen = GenerationConfig::from_pretrained(&d).unwrap();
    assert_eq!(gen.eos_token_ids, vec![2]);
    assert_eq!(gen.bos_token_id, Some(1));
    assert!(!gen.do_sample);
    let mut model = TransformerLm::from_pretrained(&d).unwrap();
    let prompt = ids(&g["prompt"]);
    assert_eq!(prompt, ids(&e["conversations"][1]["ids"]));
    let mut reply = Vec::new();
    let max = g["max_new_tokens"].as_u64().unwrap() as usize;
    model
        .generate_with(&prompt, max, &mut gen.sampler(None), |id| {
            reply.push(id);
            !gen.is_end(id)
        })
        .unwrap();
    assert_eq!(reply, ids(&g["ids"]));
    // The greedy sampler the settings describe is the plain greedy one.
    let plain = model.generate(&prompt, max, &mut Sampler::greedy()).unwrap();
    assert_eq!(plain[..reply.len()], reply[..]);
}

fn scratch(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("rb-chat-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

#[test]
fn bad_templates_and_settings_are_refused_by_file() {
    // No template at all: a base model.
    let d = scratch("none");
    let err = ChatTemplate::from_pretrained(&d).unwrap_err().to_string();
    assert!(err.contains("no chat template"), "{err}");

    // A template that does not parse names its file and line.
    std::fs::write(d.join("chat_template.jinja"), "{% for m in messages %}\n{{ m.content }\n").unwrap();
    let err = ChatTemplate::from_pretrained(&d).unwrap_err().to_string();
    assert!(err.contains("chat_template.jinja:2"), "{err}");
    std::fs::remove_file(d.join("chat_template.jinja")).unwrap();

    // tokenizer_config.json: not JSON; a template of the wrong type; named ones without
    // a default.
    let cfg = d.join("tokenizer_config.json");
    std::fs::write(&cfg, "{\"chat_template\": ").unwrap();
    let err = ChatTemplate::from_pretrained(&d).unwrap_err().to_string();
    assert!(err.contains("tokenizer_config.json"), "{err}");
    std::fs::write(&cfg, r#"{"chat_template": 3}"#).unwrap();
    let err = ChatTemplate::from_pretrained(&d).unwrap_err().to_string();
    assert!(err.contains("tokenizer_config.json") && err.contains("chat_template"), "{err}");
    std::fs::write(&cfg, r#"{"chat_template": [{"name": "tool_use", "template": "x"}]}"#).unwrap();
    let err = ChatTemplate::from_pretrained(&d).unwrap_err().to_string();
    assert!(err.contains("default"), "{err}");
    // Named templates: `default` is the one taken, and special tokens come along as an
    // AddedToken object or a string.
    std::fs::write(
        &cfg,
        r#"{"bos_token": {"content": "<s>", "__type": "AddedToken"}, "eos_token": "</s>",
            "chat_template": [{"name": "tool_use", "template": "x"},
                              {"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"}]}"#,
    )
    .unwrap();
    let t = ChatTemplate::from_pretrained(&d).unwrap();
    assert_eq!(t.render(&[ChatMessage::user("hi")], false).unwrap(), "<s>hi</s>");

    // Generation settings: nothing there, an end id that is no id, a negative temperature.
    let err = GenerationConfig::from_pretrained(&d).unwrap_err().to_string();
    assert!(err.contains("generation_config.json"), "{err}");
    let gen = d.join("generation_config.json");
    std::fs::write(&gen, r#"{"eos_token_id": [2, "x"]}"#).unwrap();
    let err = GenerationConfig::from_pretrained(&d).unwrap_err().to_string();
    assert!(err.contains("generation_config.json") && err.contains("eos_token_id"), "{err}");
    std::fs::write(&gen, r#"{"eos_token_id": 2, "temperature": -1}"#).unwrap();
    let err = GenerationConfig::from_pretrained(&d).unwrap_err().to_string();
    assert!(err.contains("temperature"), "{err}");
    // Ids it lacks come from config.json; several end ids are all ends.
    std::fs::write(&gen, r#"{"do_sample": true, "temperature": 0.6, "top_p": 0.9}"#).unwrap();
    std::fs::write(d.join("config.json"), r#"{"eos_token_id": [7, 9], "bos_token_id": 1}"#).unwrap();
    let g = GenerationConfig::from_pretrained(&d).unwrap();
    assert_eq!(g.eos_token_ids, vec![7, 9]);
    assert!(g.is_end(9) && !g.is_end(2));
    assert_eq!((g.do_sample, g.temperature, g.top_p), (true, Some(0.6), Some(0.9)));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn templates_get_python_methods_tojson_and_the_clock() {
    let t = ChatTemplate::new(
        "{{ messages[0].content.upper() }}|{{ messages[0].content.split(' ') | tojson }}|\
         {{ {'b': 1, 'a': [true, none]} | tojson }}|{{ {'a': 1} | tojson(indent=2) }}|\
         {{ '<&>' | tojson }}|{% for m in messages %}{% if loop.index0 == 1 %}{% break %}{% endif %}{{ m.role }}{% endfor %}|\
         {{ strftime_now('%Y') | length }}",
    )
    .unwrap();
    let out = t.render(&[ChatMessage::user("two words"), ChatMessage::assistant("x")], false).unwrap();
    // Python: json.dumps(..., ensure_ascii=False) separators and no HTML escaping.
    assert_eq!(
        out,
        "TWO WORDS|[\"two\", \"words\"]|{\"b\": 1, \"a\": [true, null]}|{\n  \"a\": 1\n}|\"<&>\"|user|4"
    );
    let err = ChatTemplate::new("{{ strftime_now('%Q') }}").unwrap().render(&[], false).unwrap_err();
    // A template from a string has no file to name: the message says "chat template" once.
    assert!(
        matches!(err, NetworkError::InvalidInput(_))
            && err.to_string().starts_with("chat template: ")
            && !err.to_string().contains("chat template: chat template")
            && err.to_string().contains("%Q"),
        "{err}"
    );
    // A message's keys come in their order (role, then content), as a Python dict's do.
    let t = ChatTemplate::new("{% for k in messages[0] %}{{ k }} {% endfor %}").unwrap();
    assert_eq!(t.render(&[ChatMessage::user("x")], false).unwrap(), "role content ");
}

/// save_pretrained writes the loaded directory's generation settings back as they were:
/// an instruct model's second end id and its sampling defaults survive a fine-tune.
#[test]
fn generation_settings_survive_load_and_save() {
    let d = scratch("gen_src");
    for f in std::fs::read_dir(dir("chatml")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, d.join(f.file_name().unwrap())).unwrap();
    }
    std::fs::write(
        d.join("generation_config.json"),
        r#"{"eos_token_id": [2, 5], "bos_token_id": 1, "do_sample": true, "temperature": 0.7, "top_k": 0}"#,
    )
    .unwrap();
    let out = scratch("gen_out");
    std::fs::remove_dir_all(&out).unwrap();
    TransformerLm::from_pretrained(&d).unwrap().save_pretrained(&out).unwrap();
    let g = GenerationConfig::from_pretrained(&out).unwrap();
    assert_eq!(g.eos_token_ids, vec![2, 5]);
    assert_eq!((g.do_sample, g.temperature), (true, Some(0.7)));
    // top_k 0 is transformers' "no top-k filter".
    assert_eq!(g.top_k, None);
    std::fs::remove_dir_all(&d).unwrap();
    std::fs::remove_dir_all(&out).unwrap();
}

//! What a Hugging Face directory says about talking to its model: the chat template
//! (`chat_template.jinja`, or `tokenizer_config.json`'s `chat_template`) and the generation
//! settings (`generation_config.json`: end ids, sampling defaults).
//!
//! Templates render as transformers' `apply_chat_template` renders them: Jinja with
//! `trim_blocks` and `lstrip_blocks`, loop controls, the tokenizer's special tokens
//! (`bos_token`, `eos_token`, ...), `raise_exception`, `strftime_now`, Python's string
//! and dict methods, and a `tojson` that writes what Python's `json.dumps` writes.

use std::path::{Path, PathBuf};

use minijinja::{Environment, ErrorKind, Value as JValue};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::{NetworkError, Result, Sampler};

/// One turn of a conversation, as chat templates read it (`message.role`,
/// `message['content']`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    /// Who speaks: "system", "user" or "assistant" (or a template's own roles).
    pub role: String,
    /// What they say.
    pub content: String,
}

impl ChatMessage {
    /// A message with any role.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage { role: role.into(), content: content.into() }
    }
    /// The system prompt.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }
    /// What the user says.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }
    /// What the model said before (a reply kept in the history).
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

/// A model's chat template with the special tokens it refers to.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    source: String,
    /// `bos_token`, `eos_token`, `unk_token`, `pad_token` where the tokenizer has them.
    specials: Map<String, Value>,
    /// Where the template came from, for errors.
    origin: PathBuf,
    /// Its file name, which errors show as `(in NAME:LINE)`.
    name: String,
}

fn read_json(path: &Path) -> Result<Value> {
    let bytes = std::fs::read(path).map_err(|e| NetworkError::io(path, e))?;
    serde_json::from_slice(&bytes).map_err(|e| NetworkError::parse(path, "json", e.to_string()))
}

/// A special token as tokenizer_config.json spells it: a string, or an AddedToken object
/// with `content`.
fn token_text(v: &Value) -> Option<&str> {
    v.as_str().or_else(|| v.get("content").and_then(Value::as_str))
}

impl ChatTemplate {
    /// The template in `dir`: `chat_template.jinja` (transformers 5's file), else
    /// `chat_template.json`'s or `tokenizer_config.json`'s `chat_template` (a string, or a
    /// list of named templates, of which `default` is taken). Special tokens come from
    /// `tokenizer_config.json`.
    pub fn from_pretrained(dir: impl AsRef<Path>) -> Result<ChatTemplate> {
        let dir = dir.as_ref();
        let config_path = dir.join("tokenizer_config.json");
        let config = if config_path.is_file() { Some(read_json(&config_path)?) } else { None };
        let mut specials = Map::new();
        if let Some(c) = &config {
            for key in ["bos_token", "eos_token", "unk_token", "pad_token"] {
                if let Some(t) = c.get(key).and_then(token_text) {
                    specials.insert(key.into(), Value::String(t.into()));
                }
            }
        }
        let jinja = dir.join("chat_template.jinja");
        let (source, origin) = if jinja.is_file() {
            let s = std::fs::read_to_string(&jinja).map_err(|e| NetworkError::io(&jinja, e))?;
            (s, jinja)
        } else {
            let json_path = dir.join("chat_template.json");
            let (holder, path) = if json_path.is_file() {
                (Some(read_json(&json_path)?), json_path)
            } else {
                (config, config_path)
            };
            let found = holder.as_ref().and_then(|h| h.get("chat_template"));
            let source = match found {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(named)) => named
                    .iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                    .and_then(|t| t.get("template"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        NetworkError::parse(
                            &path,
                            "chat_template",
                            "a list of named templates without one named \"default\"",
                        )
                    })?
                    .to_string(),
                Some(other) => {
                    return Err(NetworkError::parse(
                        &path,
                        "chat_template",
                        format!("{other} is neither a template nor a list of named ones"),
                    ))
                }
                None => {
                    return Err(NetworkError::InvalidInput(format!(
                        "{}: no chat template (looked for chat_template.jinja, chat_template.json and tokenizer_config.json's chat_template); a base model continues text instead",
                        dir.display()
                    )))
                }
            };
            (source, path)
        };
        ChatTemplate::checked(source, specials, origin)
    }

    /// The chat template a GGUF file carries (`tokenizer.chat_template`), with its
    /// special tokens' texts; a file without one is an error naming the key.
    pub fn from_gguf(path: impl AsRef<Path>) -> Result<ChatTemplate> {
        let path = path.as_ref();
        let (source, specials) = crate::io::gguf::chat_template(path)?;
        let source = source.ok_or_else(|| {
            NetworkError::parse(path, "tokenizer.chat_template", "missing: the file carries no chat template")
        })?;
        let specials = specials.into_iter().map(|(k, v)| (k.to_string(), Value::String(v))).collect();
        Self::checked(source, specials, path.to_path_buf())
    }

    /// A template from its source; a syntax error is reported here, with its line.
    pub fn new(source: impl Into<String>) -> Result<ChatTemplate> {
        Self::checked(source.into(), Map::new(), PathBuf::from("chat template"))
    }

    fn checked(source: String, specials: Map<String, Value>, origin: PathBuf) -> Result<ChatTemplate> {
        let name =
            origin.file_name().map_or_else(|| "chat template".into(), |n| n.to_string_lossy().into_owned());
        let t = ChatTemplate { source, specials, origin, name };
        t.compile(&environment())?;
        Ok(t)
    }

    /// The parsed template, named after its file so errors say `(in FILE:LINE)`.
    fn compile<'e>(&'e self, env: &'e Environment<'e>) -> Result<minijinja::Template<'e, 'e>> {
        env.template_from_named_str(&self.name, &self.source).map_err(|e| self.error(e))
    }

    /// Sets a special token the template may name (`bos_token`, `eos_token`, ...).
    pub fn special_token(mut self, name: &str, text: &str) -> Self {
        self.specials.insert(name.into(), Value::String(text.into()));
        self
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    fn error(&self, e: minijinja::Error) -> NetworkError {
        let mut message = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            message.push_str(&format!(": {s}"));
            source = s.source();
        }
        // A template given as a string has no file to name, only the template itself.
        if self.origin.as_os_str() == "chat template" {
            return NetworkError::InvalidInput(format!("chat template: {message}"));
        }
        NetworkError::parse(&self.origin, "chat template", message)
    }

    /// The prompt for `messages`; with `add_generation_prompt` it ends where the
    /// assistant's reply begins. A template's own refusal (`raise_exception`) is an error
    /// with its message.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with(messages, add_generation_prompt, &Map::new())
    }

    /// [`ChatTemplate::render`] with more variables for the template, as transformers'
    /// `apply_chat_template(..., **kwargs)` passes them (`{"enable_thinking": false}` for
    /// Qwen3, `{"date_string": "..."}` for Llama 3). They are set after the special tokens,
    /// so they may override one.
    pub fn render_with(
        &self, messages: &[ChatMessage], add_generation_prompt: bool, vars: &Map<String, Value>,
    ) -> Result<String> {
        let env = environment();
        let template = self.compile(&env)?;
        // Serialized by minijinja itself, so each message keeps its keys in order (role,
        // then content), as transformers' dicts do for a template that walks them.
        #[derive(Serialize)]
        struct Context<'a> {
            #[serde(flatten)]
            specials: &'a Map<String, Value>,
            #[serde(flatten)]
            vars: &'a Map<String, Value>,
            messages: &'a [ChatMessage],
            add_generation_prompt: bool,
        }
        let ctx = Context { specials: &self.specials, vars, messages, add_generation_prompt };
        template.render(JValue::from(minijinja::value::Serde(&ctx))).map_err(|e| self.error(e))
    }
}

/// The environment transformers renders in (`ImmutableSandboxedEnvironment(trim_blocks=True,
/// lstrip_blocks=True)` with loop controls, `raise_exception` and `strftime_now`).
fn environment<'s>() -> Environment<'s> {
    let mut env = Environment::new();
    let mut syntax = minijinja::syntax::SyntaxConfig::builder();
    syntax.trim_blocks(true).lstrip_blocks(true);
    // The default delimiters always build.
    if let Ok(syntax) = syntax.build() {
        env.set_syntax(syntax);
    }
    // Prompts are plain text whatever the file's extension (minijinja would escape for
    // JSON when the template's name ends in .json).
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |message: String| -> std::result::Result<String, minijinja::Error> {
        Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
    });
    env.add_function("strftime_now", |format: String| {
        strftime(&format, now_utc()).map_err(|m| minijinja::Error::new(ErrorKind::InvalidOperation, m))
    });
    env.add_filter("tojson", tojson);
    env
}

/// `json.dumps(value, ensure_ascii=False, indent=indent)` as transformers' `tojson` filter
/// calls it: `", "` and `": "` between items without an indent, `","` and newlines with
/// one; no HTML escaping.
fn tojson(value: JValue, kwargs: minijinja::value::Kwargs) -> std::result::Result<JValue, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    // Serialized from minijinja's value itself, whose maps keep insertion order as
    // Python's dicts do (serde_json's own map would sort the keys).
    let v = &value;
    let mut out = Vec::new();
    let written = match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            let mut ser = serde_json::Serializer::with_formatter(
                &mut out,
                serde_json::ser::PrettyFormatter::with_indent(&pad),
            );
            v.serialize(&mut ser)
        }
        None => {
            let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonFormatter);
            v.serialize(&mut ser)
        }
    };
    written.map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let text = String::from_utf8(out)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    Ok(JValue::from_safe_string(text))
}

/// Python's default separators: `", "` between items, `": "` after keys.
struct PythonFormatter;

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self, w: &mut W, first: bool,
    ) -> std::io::Result<()> {
        item_separator(w, first)
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self, w: &mut W, first: bool,
    ) -> std::io::Result<()> {
        item_separator(w, first)
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

fn item_separator<W: ?Sized + std::io::Write>(w: &mut W, first: bool) -> std::io::Result<()> {
    if first {
        Ok(())
    } else {
        w.write_all(b", ")
    }
}

/// Seconds since the Unix epoch, UTC.
fn now_utc() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// `time.strftime(format)` for the specifiers chat templates use (`%d %b %Y`, `%B %d, %Y`,
/// ...), in UTC; any other specifier is an error naming it.
pub(crate) fn strftime(format: &str, unix: i64) -> std::result::Result<String, String> {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let before = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334][(month - 1) as usize];
    let yday = before + day + i64::from(leap && month > 2);
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let spec = chars.next().ok_or("strftime_now: the format ends in a lone %")?;
        let piece = match spec {
            'Y' => year.to_string(),
            'y' => format!("{:02}", year.rem_euclid(100)),
            'm' => format!("{month:02}"),
            'd' => format!("{day:02}"),
            'e' => format!("{day:2}"),
            'j' => format!("{yday:03}"),
            'B' => month_name.to_string(),
            'b' | 'h' => month_name[..3].to_string(),
            'A' => DAYS[weekday].to_string(),
            'a' => DAYS[weekday][..3].to_string(),
            'H' => format!("{h:02}"),
            'I' => format!("{:02}", if h % 12 == 0 { 12 } else { h % 12 }),
            'p' => (if h < 12 { "AM" } else { "PM" }).to_string(),
            'M' => format!("{m:02}"),
            'S' => format!("{s:02}"),
            'F' => format!("{year}-{month:02}-{day:02}"),
            '%' => "%".to_string(),
            other => return Err(format!("strftime_now: %{other} is not a specifier this build formats")),
        };
        out.push_str(&piece);
    }
    Ok(out)
}

/// `generation_config.json` (falling back to `config.json` for the token ids): what ends a
/// reply and how the model's authors sample it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationConfig {
    /// Ids that end a reply (`eos_token_id`, one or a list).
    pub eos_token_ids: Vec<u32>,
    /// The id a prompt starts with, where the model has one.
    pub bos_token_id: Option<u32>,
    /// The padding id, where the model has one.
    pub pad_token_id: Option<u32>,
    /// Whether the authors sample (`true`) or decode greedily.
    pub do_sample: bool,
    /// Their sampling temperature.
    pub temperature: Option<f32>,
    /// Their top-k.
    pub top_k: Option<usize>,
    /// Their top-p.
    pub top_p: Option<f32>,
    /// Their repetition penalty.
    pub repetition_penalty: Option<f32>,
    /// Their limit on new tokens.
    pub max_new_tokens: Option<usize>,
}

impl GenerationConfig {
    /// Reads `dir`'s `generation_config.json` where there is one; ids it lacks come from
    /// `config.json`. A directory with neither file is an error.
    pub fn from_pretrained(dir: impl AsRef<Path>) -> Result<GenerationConfig> {
        let dir = dir.as_ref();
        let gen_path = dir.join("generation_config.json");
        let cfg_path = dir.join("config.json");
        let gen = if gen_path.is_file() { Some(read_json(&gen_path)?) } else { None };
        let cfg = if cfg_path.is_file() { Some(read_json(&cfg_path)?) } else { None };
        if gen.is_none() && cfg.is_none() {
            return Err(NetworkError::InvalidInput(format!(
                "{}: neither generation_config.json nor config.json is there",
                dir.display()
            )));
        }
        // The first file that has the key, with the path for errors.
        let find = |key: &str| -> Option<(&Path, &Value)> {
            [(gen_path.as_path(), gen.as_ref()), (cfg_path.as_path(), cfg.as_ref())]
                .into_iter()
                .find_map(|(p, v)| v.and_then(|v| v.get(key)).filter(|v| !v.is_null()).map(|v| (p, v)))
        };
        let id = |path: &Path, key: &str, v: &Value| -> Result<u32> {
            v.as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .ok_or_else(|| NetworkError::parse(path, key, format!("{v} is not a token id")))
        };
        let one_id = |key: &str| -> Result<Option<u32>> { find(key).map(|(p, v)| id(p, key, v)).transpose() };
        let eos_token_ids = match find("eos_token_id") {
            None => Vec::new(),
            Some((p, Value::Array(ids))) => {
                ids.iter().map(|v| id(p, "eos_token_id", v)).collect::<Result<_>>()?
            }
            Some((p, v)) => vec![id(p, "eos_token_id", v)?],
        };
        let sampling =
            |key: &str| -> Result<Option<f64>> {
                match gen.as_ref().and_then(|g| g.get(key)) {
                    None | Some(Value::Null) => Ok(None),
                    Some(v) => v.as_f64().filter(|x| x.is_finite() && *x >= 0.0).map(Some).ok_or_else(|| {
                        NetworkError::parse(&gen_path, key, format!("{v} is not a number >= 0"))
                    }),
                }
            };
        let do_sample = match gen.as_ref().and_then(|g| g.get("do_sample")) {
            None | Some(Value::Null) => false,
            Some(v) => v.as_bool().ok_or_else(|| {
                NetworkError::parse(&gen_path, "do_sample", format!("{v} is not true or false"))
            })?,
        };
        Ok(GenerationConfig {
            eos_token_ids,
            bos_token_id: one_id("bos_token_id")?,
            pad_token_id: one_id("pad_token_id")?,
            do_sample,
            temperature: sampling("temperature")?.map(|x| x as f32),
            // transformers reads top_k 0 as no top-k filter.
            top_k: sampling("top_k")?.map(|x| x as usize).filter(|&k| k > 0),
            top_p: sampling("top_p")?.map(|x| x as f32),
            repetition_penalty: sampling("repetition_penalty")?.map(|x| x as f32),
            max_new_tokens: sampling("max_new_tokens")?.map(|x| x as usize),
        })
    }

    /// The ids a GGUF file names (end of text, of turn and of message; start; padding),
    /// with greedy decoding: GGUF files carry no sampling settings.
    pub fn from_gguf(path: impl AsRef<Path>) -> Result<GenerationConfig> {
        let (eos_token_ids, bos_token_id, pad_token_id) = crate::io::gguf::special_ids(path.as_ref())?;
        Ok(GenerationConfig { eos_token_ids, bos_token_id, pad_token_id, ..Default::default() })
    }

    /// Whether `id` ends a reply.
    pub fn is_end(&self, id: u32) -> bool {
        self.eos_token_ids.contains(&id)
    }

    /// The sampler the authors' settings describe: greedy unless `do_sample`, else
    /// temperature, top-k and top-p as given (transformers' defaults 1.0, 50 and 1.0 where
    /// absent); the repetition penalty either way.
    pub fn sampler(&self, seed: Option<u64>) -> Sampler {
        let penalty = self.repetition_penalty.unwrap_or(1.0);
        if !self.do_sample {
            return Sampler::greedy().repetition_penalty(penalty);
        }
        Sampler::temperature(self.temperature.unwrap_or(1.0), seed)
            .top_k(self.top_k.unwrap_or(50))
            .top_p(self.top_p.unwrap_or(1.0))
            .repetition_penalty(penalty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_formats_known_dates() {
        // 2024-02-29 13:05:09 UTC, a Thursday in a leap year.
        let t = 1_709_211_909;
        assert_eq!(strftime("%d %b %Y", t).unwrap(), "29 Feb 2024");
        assert_eq!(strftime("%B %d, %Y", t).unwrap(), "February 29, 2024");
        assert_eq!(
            strftime("%A %a %j %F %H:%M:%S %I%p %y %%", t).unwrap(),
            "Thursday Thu 060 2024-02-29 13:05:09 01PM 24 %"
        );
        assert_eq!(strftime("%F %A", 0).unwrap(), "1970-01-01 Thursday");
        assert_eq!(strftime("%F", -86_400).unwrap(), "1969-12-31");
        assert_eq!(strftime("%F %j", 951_782_400).unwrap(), "2000-02-29 060");
        assert!(strftime("%Q", t).unwrap_err().contains("%Q"));
        assert!(strftime("50%", t).is_err());
    }
}

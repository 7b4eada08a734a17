//! Chat templates: the Jinja a model's tokenizer files carry, rendered as transformers'
//! `apply_chat_template` renders it (the same environment, filters and functions), so a
//! prompt is the bytes the model was trained on. Natively from a folder or a GGUF file; in
//! the browser from the GGUF file dropped on the page.

use minijinja::{Environment, ErrorKind, Value as JValue};
use serde::Serialize;
use serde_json::{Map, Value};

/// A chat template with the special tokens it refers to. Its errors are messages: a
/// syntax error with its line, a template's own refusal (`raise_exception`) with its words.
#[derive(Debug, Clone)]
pub struct Template {
    source: String,
    /// `bos_token`, `eos_token`, `unk_token`, `pad_token` where the tokenizer has them.
    specials: Map<String, Value>,
    /// The name errors show as `(in NAME:LINE)`.
    name: String,
}

impl Template {
    /// The template `source` called `name` in errors, with the special tokens' texts;
    /// a syntax error is reported here.
    pub fn new(source: String, specials: Map<String, Value>, name: String) -> Result<Template, String> {
        let t = Template { source, specials, name };
        t.compile(&environment(0))?;
        Ok(t)
    }

    /// The parsed template, named so errors say `(in NAME:LINE)`.
    fn compile<'e>(&'e self, env: &'e Environment<'e>) -> Result<minijinja::Template<'e, 'e>, String> {
        env.template_from_named_str(&self.name, &self.source).map_err(message)
    }

    /// Sets a special token the template may name (`bos_token`, `eos_token`, ...).
    pub fn set_special(&mut self, name: &str, text: &str) {
        self.specials.insert(name.into(), Value::String(text.into()));
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The prompt for `messages` (each serialized as the template reads it: `role`, then
    /// `content`); with `add_generation_prompt` it ends where the assistant's reply
    /// begins. `vars` are set after the special tokens, as transformers'
    /// `apply_chat_template(..., **kwargs)` passes them; `now` (seconds since the Unix
    /// epoch, UTC) is the time `strftime_now` formats.
    pub fn render<M: Serialize>(
        &self, messages: &[M], add_generation_prompt: bool, vars: &Map<String, Value>, now: i64,
    ) -> Result<String, String> {
        let env = environment(now);
        let template = self.compile(&env)?;
        // Serialized by minijinja itself, so each message keeps its keys in order (role,
        // then content), as transformers' dicts do for a template that walks them.
        #[derive(Serialize)]
        struct Context<'a, M> {
            #[serde(flatten)]
            specials: &'a Map<String, Value>,
            #[serde(flatten)]
            vars: &'a Map<String, Value>,
            messages: &'a [M],
            add_generation_prompt: bool,
        }
        let ctx = Context { specials: &self.specials, vars, messages, add_generation_prompt };
        template.render(JValue::from(minijinja::value::Serde(&ctx))).map_err(message)
    }
}

/// A minijinja error with its causes, one after another.
fn message(e: minijinja::Error) -> String {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        message.push_str(&format!(": {s}"));
        source = s.source();
    }
    message
}

/// The environment transformers renders in (`ImmutableSandboxedEnvironment(trim_blocks=True,
/// lstrip_blocks=True)` with loop controls, `raise_exception` and `strftime_now`).
fn environment<'s>(now: i64) -> Environment<'s> {
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
    env.add_function("strftime_now", move |format: String| {
        strftime(&format, now).map_err(|m| minijinja::Error::new(ErrorKind::InvalidOperation, m))
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

/// `time.strftime(format)` for the specifiers chat templates use (`%d %b %Y`, `%B %d, %Y`,
/// ...), in UTC; any other specifier is an error naming it.
pub fn strftime(format: &str, unix: i64) -> std::result::Result<String, String> {
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

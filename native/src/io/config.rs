//! The one reader of `config.json` files (Hugging Face models, diffusers components,
//! schedulers, `model_index.json`): typed lookups whose errors name the file and the key.

use std::borrow::Cow;
use std::path::Path;

use serde_json::Value;

use crate::{NetworkError, Result};

/// A JSON object read from `path`, with typed lookups that name the file and key on failure.
pub(crate) struct Config<'a> {
    path: &'a Path,
    v: Cow<'a, Value>,
}

impl<'a> Config<'a> {
    /// The object in the file `path`.
    pub(crate) fn read(path: &'a Path) -> Result<Config<'a>> {
        let text = crate::io::files::read(path)?;
        Config::parse(path, text)
    }

    /// [`Config::read`] for files Python's `json` wrote with its non-standard values
    /// (`-Infinity`, `Infinity`, `NaN`, as diffusers saves `lambda_min_clipped`), which are
    /// read as null.
    pub(crate) fn read_python(path: &'a Path) -> Result<Config<'a>> {
        let text = String::from_utf8_lossy(&crate::io::files::read(path)?)
            .replace(": -Infinity", ": null")
            .replace(": Infinity", ": null")
            .replace(": NaN", ": null");
        Config::parse(path, text.into_bytes())
    }

    fn parse(path: &'a Path, text: Vec<u8>) -> Result<Config<'a>> {
        let v: Value =
            serde_json::from_slice(&text).map_err(|e| NetworkError::parse(path, "json", e.to_string()))?;
        Config::of(path, Cow::Owned(v))
    }

    /// An object already parsed from `path` (errors still name the file).
    pub(crate) fn view(path: &'a Path, v: &'a Value) -> Result<Config<'a>> {
        Config::of(path, Cow::Borrowed(v))
    }

    fn of(path: &'a Path, v: Cow<'a, Value>) -> Result<Config<'a>> {
        if !v.is_object() {
            return Err(NetworkError::parse(path, "json", "not an object"));
        }
        Ok(Config { path, v })
    }

    /// An error about `key` of this file.
    pub(crate) fn err(&self, key: &str, message: impl Into<String>) -> NetworkError {
        NetworkError::parse(self.path, key, message)
    }

    /// The raw value of `key`, if present and not null.
    pub(crate) fn get(&self, key: &str) -> Option<&Value> {
        self.v.get(key).filter(|v| !v.is_null())
    }

    /// A string key.
    pub(crate) fn str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    /// A non-negative integer, `None` when absent or null.
    pub(crate) fn opt_count(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(x) => x
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| self.err(key, format!("{x} is not a non-negative integer"))),
        }
    }

    /// A count of at most 2^24 (a width, a depth), `default` when absent; without a
    /// default, missing is an error.
    pub(crate) fn count(&self, key: &str, default: Option<usize>) -> Result<usize> {
        match self.opt_count(key)? {
            None => default.ok_or_else(|| self.err(key, "missing; the model's shape needs it")),
            Some(n) if n <= 1 << 24 => Ok(n),
            Some(n) => Err(self.err(key, format!("{n} is not a count"))),
        }
    }

    /// A number, `None` when absent or null.
    pub(crate) fn opt_number(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(x) => x.as_f64().map(Some).ok_or_else(|| self.err(key, format!("{x} is not a number"))),
        }
    }

    /// A number as f32, `default` when absent or null.
    pub(crate) fn float(&self, key: &str, default: f32) -> Result<f32> {
        Ok(self.opt_number(key)?.map_or(default, |f| f as f32))
    }

    /// A boolean, `default` when absent or null.
    pub(crate) fn flag(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(x) => x.as_bool().ok_or_else(|| self.err(key, format!("{x} is not true or false"))),
        }
    }

    /// A list of counts, `default` when absent or null.
    pub(crate) fn counts(&self, key: &str, default: &[usize]) -> Result<Vec<usize>> {
        match self.get(key) {
            None => Ok(default.to_vec()),
            Some(Value::Array(items)) if items.len() <= 1 << 12 => items
                .iter()
                .map(|x| {
                    x.as_u64()
                        .and_then(|n| usize::try_from(n).ok())
                        .filter(|&n| n <= 1 << 24)
                        .ok_or_else(|| self.err(key, format!("{x} is not a count")))
                })
                .collect(),
            Some(x) => Err(self.err(key, format!("{x} is not a list of counts"))),
        }
    }

    /// A count or a list of `n` counts (one a block), `default` when absent.
    pub(crate) fn per_block(&self, key: &str, default: usize, n: usize) -> Result<Vec<usize>> {
        match self.get(key) {
            None => Ok(vec![default; n]),
            Some(Value::Array(_)) => {
                let v = self.counts(key, &[])?;
                if v.len() != n {
                    return Err(self.err(key, format!("{} entries for {n} blocks", v.len())));
                }
                Ok(v)
            }
            Some(_) => Ok(vec![self.count(key, Some(default))?; n]),
        }
    }

    /// The first of `architectures`.
    pub(crate) fn architecture(&self) -> Option<&str> {
        self.get("architectures")?.as_array()?.first()?.as_str()
    }
}

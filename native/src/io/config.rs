//! The one reader of `config.json` files (Hugging Face models, diffusers components,
//! schedulers, `model_index.json`): the formats crate's typed lookups, their errors naming
//! the file as well as the key.

use std::path::Path;

use rusting_brain_formats::json::Object;
use rusting_brain_formats::FormatError;
use serde_json::Value;

use crate::{NetworkError, Result};

/// A JSON object read from `path`, with typed lookups that name the file and key on failure.
pub(crate) struct Config<'a> {
    path: &'a Path,
    object: Object<'a>,
}

/// A lookup's error with the file named.
pub(crate) fn lift(path: &Path) -> impl Fn(FormatError) -> NetworkError + '_ {
    move |e| NetworkError::parse(path, e.what, e.message)
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
        Ok(Config { path, object: Object::owned(v).map_err(lift(path))? })
    }

    /// An error about `key` of this file.
    pub(crate) fn err(&self, key: &str, message: impl Into<String>) -> NetworkError {
        NetworkError::parse(self.path, key, message)
    }

    /// The raw value of `key`, if present and not null.
    pub(crate) fn get(&self, key: &str) -> Option<&Value> {
        self.object.get(key)
    }

    /// A string key.
    pub(crate) fn str(&self, key: &str) -> Option<&str> {
        self.object.str(key)
    }

    /// A count of at most 2^24, `default` when absent; without a default, missing is an error.
    pub(crate) fn count(&self, key: &str, default: Option<usize>) -> Result<usize> {
        self.object.count(key, default).map_err(lift(self.path))
    }

    /// A number as f32, `default` when absent or null.
    pub(crate) fn float(&self, key: &str, default: f32) -> Result<f32> {
        self.object.float(key, default).map_err(lift(self.path))
    }

    /// A boolean, `default` when absent or null.
    pub(crate) fn flag(&self, key: &str, default: bool) -> Result<bool> {
        self.object.flag(key, default).map_err(lift(self.path))
    }

    /// A list of counts, `default` when absent or null.
    pub(crate) fn counts(&self, key: &str, default: &[usize]) -> Result<Vec<usize>> {
        self.object.counts(key, default).map_err(lift(self.path))
    }

    /// A count or a list of `n` counts (one a block), `default` when absent.
    pub(crate) fn per_block(&self, key: &str, default: usize, n: usize) -> Result<Vec<usize>> {
        self.object.per_block(key, default, n).map_err(lift(self.path))
    }

    /// The first of `architectures`.
    pub(crate) fn architecture(&self) -> Option<&str> {
        self.object.architecture()
    }
}

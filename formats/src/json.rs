//! Typed lookups in a JSON object (a `config.json`, a scheduler's settings, a
//! `model_index.json`) whose errors name the key: the one reader of such files.

use std::borrow::Cow;

use serde_json::Value;

use crate::{FormatError, Result};

/// A JSON object with typed lookups that name the key on failure.
#[derive(Debug, Clone)]
pub struct Object<'a> {
    v: Cow<'a, Value>,
}

impl<'a> Object<'a> {
    /// A view of `v`, which must be an object.
    pub fn view(v: &'a Value) -> Result<Object<'a>> {
        Object::of(Cow::Borrowed(v))
    }

    /// `v`, owned, which must be an object.
    pub fn owned(v: Value) -> Result<Object<'static>> {
        Object::of(Cow::Owned(v))
    }

    fn of<'b>(v: Cow<'b, Value>) -> Result<Object<'b>> {
        if !v.is_object() {
            return Err(FormatError::new("json", "not an object"));
        }
        Ok(Object { v })
    }

    /// An error about `key`.
    pub fn err(&self, key: &str, message: impl Into<String>) -> FormatError {
        FormatError::new(key, message)
    }

    /// The raw value of `key`, if present and not null.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.v.get(key).filter(|v| !v.is_null())
    }

    /// A string key.
    pub fn str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    /// A non-negative integer, `None` when absent or null.
    pub fn opt_count(&self, key: &str) -> Result<Option<usize>> {
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
    pub fn count(&self, key: &str, default: Option<usize>) -> Result<usize> {
        match self.opt_count(key)? {
            None => default.ok_or_else(|| self.err(key, "missing; the model's shape needs it")),
            Some(n) if n <= 1 << 24 => Ok(n),
            Some(n) => Err(self.err(key, format!("{n} is not a count"))),
        }
    }

    /// A number, `None` when absent or null.
    pub fn opt_number(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(x) => x.as_f64().map(Some).ok_or_else(|| self.err(key, format!("{x} is not a number"))),
        }
    }

    /// A number as f32, `default` when absent or null.
    pub fn float(&self, key: &str, default: f32) -> Result<f32> {
        Ok(self.opt_number(key)?.map_or(default, |f| f as f32))
    }

    /// A boolean, `default` when absent or null.
    pub fn flag(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(x) => x.as_bool().ok_or_else(|| self.err(key, format!("{x} is not true or false"))),
        }
    }

    /// A list of counts, `default` when absent or null.
    pub fn counts(&self, key: &str, default: &[usize]) -> Result<Vec<usize>> {
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
    pub fn per_block(&self, key: &str, default: usize, n: usize) -> Result<Vec<usize>> {
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
    pub fn architecture(&self) -> Option<&str> {
        self.get("architectures")?.as_array()?.first()?.as_str()
    }
}

//! JSON reading for tokenizer files: a parse that rejects duplicate keys, and typed field access whose errors
//! name the field, so a value of the wrong type is an error instead of a silent default.

use std::fmt;
use std::path::Path;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::error::{Result, TokenizerError};

/// Parses `bytes` as JSON, rejecting an object that repeats a key: serde_json's own `Value` keeps the last
/// occurrence, so a vocabulary listing one token twice would silently lose an id. serde_json's nesting limit
/// (128) still applies, so deep input cannot overflow the stack.
pub(crate) fn parse(bytes: &[u8], path: &Path) -> Result<Value> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = Strict::deserialize(&mut de)
        .and_then(|v| de.end().map(|()| v.0))
        .map_err(|e| TokenizerError::malformed(path, format!("invalid JSON: {e}")))?;
    Ok(value)
}

/// A JSON value read by [`StrictVisitor`].
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> std::result::Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> std::result::Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> std::result::Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> std::result::Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E>(self, v: &str) -> std::result::Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> std::result::Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> std::result::Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> std::result::Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            match out.entry(key) {
                serde_json::map::Entry::Vacant(slot) => {
                    slot.insert(map.next_value::<Strict>()?.0);
                }
                serde_json::map::Entry::Occupied(slot) => {
                    return Err(de::Error::custom(format_args!(
                        "duplicate key {:?}",
                        slot.key()
                    )));
                }
            }
        }
        Ok(Value::Object(out))
    }
}

/// The JSON type of `v` with its article ("a string", "an array", "null"), for error messages that say what a
/// field held instead of what was expected. Shared by every crate that reads JSON (configs, requests) so their
/// messages read alike.
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Typed access to the fields of one section of a file, with errors naming the file and `section.key`.
#[derive(Clone, Copy)]
pub(crate) struct Fields<'a> {
    pub path: &'a Path,
}

impl<'a> Fields<'a> {
    pub fn bad(&self, message: impl Into<String>) -> TokenizerError {
        TokenizerError::malformed(self.path, message)
    }

    fn wrong(&self, section: &str, key: &str, expected: &str, found: &Value) -> TokenizerError {
        self.bad(format!(
            "`{}` must be {expected}, found {}",
            join(section, key),
            type_name(found)
        ))
    }

    /// `v[key]`, with an absent key and `null` both `None` (HF writes `null` for unset options).
    pub fn get<'v>(&self, v: &'v Value, key: &str) -> Option<&'v Value> {
        v.get(key).filter(|x| !x.is_null())
    }

    pub fn opt_bool(&self, v: &Value, key: &str, section: &str) -> Result<Option<bool>> {
        match self.get(v, key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.wrong(section, key, "a boolean", other)),
        }
    }

    pub fn opt_str<'v>(&self, v: &'v Value, key: &str, section: &str) -> Result<Option<&'v str>> {
        match self.get(v, key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(self.wrong(section, key, "a string", other)),
        }
    }

    pub fn opt_f64(&self, v: &Value, key: &str, section: &str) -> Result<Option<f64>> {
        match self.get(v, key) {
            None => Ok(None),
            Some(n @ Value::Number(_)) => Ok(n.as_f64()),
            Some(other) => Err(self.wrong(section, key, "a number", other)),
        }
    }

    pub fn opt_u64(&self, v: &Value, key: &str, section: &str) -> Result<Option<u64>> {
        match self.get(v, key) {
            None => Ok(None),
            Some(n) => n
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.wrong(section, key, "a non-negative integer", n)),
        }
    }

    pub fn opt_array<'v>(
        &self,
        v: &'v Value,
        key: &str,
        section: &str,
    ) -> Result<Option<&'v [Value]>> {
        match self.get(v, key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(other) => Err(self.wrong(section, key, "an array", other)),
        }
    }

    pub fn str<'v>(&self, v: &'v Value, key: &str, section: &str) -> Result<&'v str> {
        self.opt_str(v, key, section)?
            .ok_or_else(|| self.bad(format!("`{}` (a string) is missing", join(section, key))))
    }

    pub fn array<'v>(&self, v: &'v Value, key: &str, section: &str) -> Result<&'v [Value]> {
        self.opt_array(v, key, section)?
            .ok_or_else(|| self.bad(format!("`{}` (an array) is missing", join(section, key))))
    }
}

/// `section.key`, or `key` at the top level.
pub(crate) fn join(section: &str, key: &str) -> String {
    if section.is_empty() {
        key.to_owned()
    } else {
        format!("{section}.{key}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_keys_are_rejected_at_any_depth() {
        let path = Path::new("t.json");
        assert!(parse(br#"{"a": {"x": 1, "y": 2}, "b": [1, {"z": null}]}"#, path).is_ok());
        let err = parse(br#"{"model": {"vocab": {"a": 0, "a": 1}}}"#, path)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("duplicate key \"a\"") && err.contains("t.json"),
            "{err}"
        );
        assert!(parse(br#"{"a": 1} trailing"#, path).is_err());
    }

    #[test]
    fn nesting_is_bounded_instead_of_overflowing_the_stack() {
        let deep = "[".repeat(100_000);
        assert!(parse(deep.as_bytes(), Path::new("deep.json")).is_err());
    }
}

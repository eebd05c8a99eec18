//! Checks of a safetensors header that the `safetensors` crate does not make.
//!
//! The crate parses the header's JSON into hash maps, so a header naming one tensor (or one `__metadata__` key)
//! twice silently keeps one of the two entries: the file loads, with one tensor's description dropped. Every
//! ember reader of safetensors files (model checkpoints, quantized checkpoints, training state) calls
//! [`check_safetensors_header`] first. It lives here because this is the lowest crate all those readers depend on.

use std::collections::HashSet;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};

/// The header length the `safetensors` crate accepts at most (100 MB); longer headers are its error to report.
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// A JSON object read in file order that remembers the first key it saw twice, instead of keeping one value as a
/// map would.
#[derive(Debug)]
pub struct UniqueKeyMap<V> {
    /// The entries in file order (with a duplicate key, both entries).
    pub entries: Vec<(String, V)>,
    /// The first key that appeared more than once.
    pub duplicate: Option<String>,
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for UniqueKeyMap<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MapVisitor<V>(PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for MapVisitor<V> {
            type Value = UniqueKeyMap<V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut seen = HashSet::new();
                let mut out = UniqueKeyMap {
                    entries: Vec::new(),
                    duplicate: None,
                };
                while let Some(key) = map.next_key::<String>()? {
                    if !seen.insert(key.clone()) && out.duplicate.is_none() {
                        out.duplicate = Some(key.clone());
                    }
                    out.entries.push((key, map.next_value()?));
                }
                Ok(out)
            }
        }
        deserializer.deserialize_map(MapVisitor(PhantomData))
    }
}

/// The header's top level, with `__metadata__` told apart from tensor entries.
struct Header {
    duplicate_tensor: Option<String>,
    duplicate_metadata: Option<String>,
}

impl<'de> Deserialize<'de> for Header {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct HeaderVisitor;
        impl<'de> Visitor<'de> for HeaderVisitor {
            type Value = Header;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Header, A::Error> {
                let mut seen = HashSet::new();
                let mut header = Header {
                    duplicate_tensor: None,
                    duplicate_metadata: None,
                };
                while let Some(key) = map.next_key::<String>()? {
                    // The `__metadata__` object's keys are checked too; a tensor's description is the crate's.
                    if key == "__metadata__" {
                        let meta: Option<UniqueKeyMap<IgnoredAny>> = map.next_value()?;
                        if header.duplicate_metadata.is_none() {
                            header.duplicate_metadata = meta.and_then(|m| m.duplicate);
                        }
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                    if !seen.insert(key.clone()) && header.duplicate_tensor.is_none() {
                        header.duplicate_tensor = Some(key);
                    }
                }
                Ok(header)
            }
        }
        deserializer.deserialize_map(HeaderVisitor)
    }
}

/// Checks that the safetensors file `bytes` names no tensor and no `__metadata__` key twice; the message says
/// which. A header this check cannot parse is left to the `safetensors` crate, which rejects it: the check
/// accepts every header the crate accepts, except those with a repeated name.
pub fn check_safetensors_header(bytes: &[u8]) -> Result<(), String> {
    let Some(len) = bytes.get(..8) else {
        return Ok(());
    };
    let len = u64::from_le_bytes(len.try_into().unwrap_or_default());
    // Bounded by the file and the crate's limit, so the slice below exists; anything else is the crate's error.
    if len > MAX_HEADER_BYTES || len > (bytes.len() - 8) as u64 {
        return Ok(());
    }
    let Ok(header) = serde_json::from_slice::<Header>(&bytes[8..8 + len as usize]) else {
        return Ok(());
    };
    if let Some(name) = header.duplicate_tensor {
        let what = if name == "__metadata__" {
            "the `__metadata__` entry".to_string()
        } else {
            format!("tensor `{name}`")
        };
        return Err(format!(
            "the header names {what} twice (only one entry could be used)"
        ));
    }
    if let Some(key) = header.duplicate_metadata {
        return Err(format!(
            "the header's `__metadata__` has key `{key}` twice (only one value could be used)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str) -> Vec<u8> {
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(&[0; 8]);
        out
    }

    const A: &str = r#"{"dtype":"F32","shape":[2],"data_offsets":[0,8]}"#;

    #[test]
    fn a_tensor_named_twice_is_rejected_and_named() {
        let bytes = file(&format!(r#"{{"a":{A},"a":{A}}}"#));
        // The crate itself accepts it: this is the gap the check closes.
        assert!(safetensors::SafeTensors::deserialize(&bytes).is_ok());
        let err = check_safetensors_header(&bytes).unwrap_err();
        assert!(err.contains("tensor `a` twice"), "{err}");
    }

    #[test]
    fn a_metadata_key_named_twice_is_rejected_and_named() {
        let bytes = file(&format!(
            r#"{{"__metadata__":{{"k":"1","k":"2"}},"a":{A}}}"#
        ));
        assert!(safetensors::SafeTensors::deserialize(&bytes).is_ok());
        let err = check_safetensors_header(&bytes).unwrap_err();
        assert!(err.contains("key `k` twice"), "{err}");
    }

    #[test]
    fn valid_and_unparseable_headers_pass_to_the_crate() {
        let bytes = file(&format!(r#"{{"__metadata__":{{"k":"1"}},"a":{A}}}"#));
        assert_eq!(check_safetensors_header(&bytes), Ok(()));
        for broken in [
            &b"\x05"[..],
            b"\xff\xff\xff\xff\xff\xff\xff\x7f{}",
            b"\x02\0\0\0\0\0\0\0[]",
        ] {
            assert_eq!(check_safetensors_header(broken), Ok(()));
            assert!(safetensors::SafeTensors::deserialize(broken).is_err());
        }
    }
}

//! Structured mutations of a safetensors file's JSON header: byte mutations mostly make the JSON unparseable,
//! which tests one error path; these keep it JSON and make it lie (shapes, offsets, dtypes, a tensor named twice,
//! a quantized checkpoint's scheme metadata).

use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{Map, Value as Json};

use super::{Value, any_value, resolve};

/// The dtypes the header may name (all of the crate's, so unsupported ones reach ember's checks).
const DTYPES: [&str; 12] = [
    "F32", "F16", "BF16", "F64", "U8", "I8", "I16", "I32", "I64", "BOOL", "U32", "F8_E4M3",
];

/// One lie told by a header.
#[derive(Debug, Clone)]
pub enum Edit {
    /// Set one dimension of a tensor's shape.
    Dim(Index, Index, Value),
    /// Append a dimension.
    AddDim(Index, Value),
    /// Drop the last dimension.
    DropDim(Index),
    /// Set a tensor's start (`false`) or end (`true`) offset.
    Offset(Index, bool, Value),
    /// Change a tensor's dtype.
    Dtype(Index, Index),
    /// Name a tensor a second time (with the same entry, or its offsets nudged).
    Duplicate(Index, Option<Value>),
    /// Remove a tensor.
    Remove(Index),
    /// In the `ember.quantization` metadata: set one dimension of an entry's shape.
    QuantDim(Index, bool, Value),
    /// In the `ember.quantization` metadata: change an entry's scheme.
    QuantScheme(Index, Index),
    /// Repeat a `__metadata__` key.
    DuplicateMetadata(Index),
    /// Give a tensor another element count, consistently: shape `[n]`, its bytes resized and every later
    /// tensor's offsets moved, so the file is valid and only its sizes disagree with what the reader expects.
    Resize(Index, u8),
    /// [`Edit::Resize`] of the tensor with this name (for targets that resize related tensors together).
    ResizeNamed(String, u8),
}

/// Schemes an `ember.quantization` entry may be changed to, valid and not.
const SCHEMES: [&str; 8] = [
    "int8",
    "int8-g32",
    "int4-g32",
    "int4-g32-asym",
    "int4-g8",
    "int4-g18446744073709551608",
    "int8-g0",
    "fp4",
];

/// One edit.
pub fn edit() -> impl Strategy<Value = Edit> {
    let i = any::<Index>;
    prop_oneof![
        3 => (i(), i(), any_value()).prop_map(|(t, d, v)| Edit::Dim(t, d, v)),
        1 => (i(), any_value()).prop_map(|(t, v)| Edit::AddDim(t, v)),
        1 => i().prop_map(Edit::DropDim),
        3 => (i(), any::<bool>(), any_value()).prop_map(|(t, e, v)| Edit::Offset(t, e, v)),
        2 => (i(), i()).prop_map(|(t, d)| Edit::Dtype(t, d)),
        2 => (i(), proptest::option::of(any_value())).prop_map(|(t, v)| Edit::Duplicate(t, v)),
        1 => i().prop_map(Edit::Remove),
        2 => (i(), any::<bool>(), any_value()).prop_map(|(t, c, v)| Edit::QuantDim(t, c, v)),
        1 => (i(), i()).prop_map(|(t, s)| Edit::QuantScheme(t, s)),
        1 => i().prop_map(Edit::DuplicateMetadata),
        3 => (i(), 0u8..24).prop_map(|(t, n)| Edit::Resize(t, n)),
    ]
}

/// Up to `max` edits (none: the header stays true and only the byte mutations of a case apply).
pub fn edits(max: usize) -> impl Strategy<Value = Vec<Edit>> {
    prop::collection::vec(edit(), 0..=max)
}

/// A safetensors file split into its header (as JSON) and its data section.
pub struct Parsed {
    /// The header object.
    pub header: Map<String, Json>,
    /// The bytes after the header.
    pub data: Vec<u8>,
}

/// Splits a valid safetensors file.
pub fn parse(bytes: &[u8]) -> Parsed {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    Parsed {
        header,
        data: bytes[8 + n..].to_vec(),
    }
}

fn tensor_names(header: &Map<String, Json>) -> Vec<String> {
    header
        .keys()
        .filter(|k| *k != "__metadata__")
        .cloned()
        .collect()
}

fn pick<'a>(names: &'a [String], i: &Index) -> Option<&'a String> {
    (!names.is_empty()).then(|| &names[i.index(names.len())])
}

fn set_number(slot: &mut Json, value: &Value) {
    let current = slot.as_u64().unwrap_or(0);
    *slot = Json::from(resolve(value, current));
}

/// Applies the `ember.quantization` edits to the metadata string, if the header has one.
fn edit_quantization(header: &mut Map<String, Json>, edit: &Edit) {
    let Some(Json::String(text)) = header
        .get_mut("__metadata__")
        .and_then(|m| m.get_mut("ember.quantization"))
    else {
        return;
    };
    let Ok(Json::Object(mut entries)) = serde_json::from_str::<Json>(text) else {
        return;
    };
    let names: Vec<String> = entries.keys().cloned().collect();
    let Some(name) = names.first().map(|_| match edit {
        Edit::QuantDim(t, ..) | Edit::QuantScheme(t, _) => names[t.index(names.len())].clone(),
        _ => names[0].clone(),
    }) else {
        return;
    };
    let entry = &mut entries[&name];
    match edit {
        Edit::QuantDim(_, cols, v) => {
            if let Some(dim) = entry
                .get_mut("shape")
                .and_then(|s| s.get_mut(usize::from(*cols)))
            {
                set_number(dim, v);
            }
        }
        Edit::QuantScheme(_, s) => entry["scheme"] = Json::from(SCHEMES[s.index(SCHEMES.len())]),
        _ => {}
    }
    *text = Json::Object(entries).to_string();
}

/// The `[start, end]` offsets of tensor `name`, when they are numbers.
fn offsets(header: &Map<String, Json>, name: &str) -> Option<(usize, usize)> {
    let o = header.get(name)?.get("data_offsets")?;
    Some((o.get(0)?.as_u64()? as usize, o.get(1)?.as_u64()? as usize))
}

/// [`Edit::Resize`]: tensor `name` gets `n` elements of its current width, later tensors move.
fn resize(header: &mut Map<String, Json>, data: &mut Vec<u8>, name: &str, n: usize) {
    let Some((start, end)) = offsets(header, name).filter(|&(s, e)| s <= e && e <= data.len())
    else {
        return;
    };
    // An earlier edit may have made the shape absurd; the width then cannot be known, so leave the tensor.
    let Some(numel) = header[name]["shape"].as_array().and_then(|s| {
        s.iter()
            .try_fold(1u64, |acc, d| acc.checked_mul(d.as_u64()?))
    }) else {
        return;
    };
    let width = if numel > 0 {
        (end - start) / numel as usize
    } else {
        4
    }
    .max(1);
    let old = data[start..end].to_vec();
    let new: Vec<u8> = (0..n * width)
        .map(|i| old.get(i % old.len().max(1)).copied().unwrap_or(0x3f))
        .collect();
    let delta = new.len() as isize - (end - start) as isize;
    data.splice(start..end, new);
    header[name]["shape"] = Json::from(vec![n]);
    header[name]["data_offsets"] = Json::from(vec![start, end.wrapping_add_signed(delta)]);
    for other in tensor_names(header) {
        if other == name {
            continue;
        }
        if let Some((s, e)) = offsets(header, &other).filter(|&(s, _)| s >= end) {
            // Wrapping: another edit may have set these offsets anywhere; the reader judges the result.
            let moved = |x: usize| x.wrapping_add_signed(delta);
            header[&other]["data_offsets"] = Json::from(vec![moved(s), moved(e)]);
        }
    }
}

/// The header text with `edits` applied (a duplicate name can only be made in text: a JSON map holds one).
pub fn apply(parsed: &Parsed, edits: &[Edit]) -> Vec<u8> {
    let mut header = parsed.header.clone();
    let mut data = parsed.data.clone();
    let mut duplicates = Vec::new();
    for edit in edits {
        let names = tensor_names(&header);
        let entry = |h: &mut Map<String, Json>, t: &Index| -> Option<String> {
            pick(&tensor_names(h), t).cloned()
        };
        match edit {
            Edit::Dim(t, d, v) => {
                if let Some(name) = entry(&mut header, t)
                    && let Some(Json::Array(shape)) = header[&name].get_mut("shape")
                    && !shape.is_empty()
                {
                    let k = d.index(shape.len());
                    set_number(&mut shape[k], v);
                }
            }
            Edit::AddDim(t, v) => {
                if let Some(name) = entry(&mut header, t)
                    && let Some(Json::Array(shape)) = header[&name].get_mut("shape")
                {
                    shape.push(Json::from(resolve(v, 1)));
                }
            }
            Edit::DropDim(t) => {
                if let Some(name) = entry(&mut header, t)
                    && let Some(Json::Array(shape)) = header[&name].get_mut("shape")
                {
                    shape.pop();
                }
            }
            Edit::Offset(t, end, v) => {
                if let Some(name) = entry(&mut header, t)
                    && let Some(Json::Array(offsets)) = header[&name].get_mut("data_offsets")
                    && offsets.len() == 2
                {
                    set_number(&mut offsets[usize::from(*end)], v);
                }
            }
            Edit::Dtype(t, d) => {
                if let Some(name) = entry(&mut header, t) {
                    header[&name]["dtype"] = Json::from(DTYPES[d.index(DTYPES.len())]);
                }
            }
            Edit::Duplicate(t, nudge) => {
                if let Some(name) = pick(&names, t) {
                    let mut copy = header[name].clone();
                    if let (Some(v), Some(Json::Array(offsets))) =
                        (nudge, copy.get_mut("data_offsets"))
                        && offsets.len() == 2
                    {
                        offsets.iter_mut().for_each(|o| set_number(o, v));
                    }
                    duplicates.push((name.clone(), copy));
                }
            }
            Edit::Remove(t) => {
                if let Some(name) = pick(&names, t) {
                    header.remove(&name.clone());
                }
            }
            Edit::QuantDim(..) | Edit::QuantScheme(..) => edit_quantization(&mut header, edit),
            Edit::Resize(t, n) => {
                if let Some(name) = pick(&names, t) {
                    resize(&mut header, &mut data, &name.clone(), usize::from(*n));
                }
            }
            Edit::ResizeNamed(name, n) => {
                if header.contains_key(name) {
                    resize(&mut header, &mut data, name, usize::from(*n));
                }
            }
            Edit::DuplicateMetadata(k) => {
                if let Some(Json::Object(meta)) = header.get("__metadata__") {
                    let keys: Vec<&String> = meta.keys().collect();
                    if !keys.is_empty() {
                        let key = keys[k.index(keys.len())].clone();
                        duplicates.push(("__metadata__.".to_string() + &key, Json::from("x")));
                    }
                }
            }
        }
    }
    let mut text = Json::Object(header).to_string();
    for (name, value) in duplicates {
        if let Some(key) = name.strip_prefix("__metadata__.") {
            if let Some(at) = text.find("\"__metadata__\":{") {
                let at = at + "\"__metadata__\":{".len();
                text.insert_str(at, &format!("{}:{value},", Json::from(key)));
            }
        } else {
            text.insert_str(1, &format!("{}:{value},", Json::from(name)));
        }
    }
    // `insert_str` after an empty object leaves a trailing comma; that is a syntax error the crate reports.
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(&data);
    out
}

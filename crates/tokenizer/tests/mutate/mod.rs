//! Mutations of a JSON document for the loaders' fuzz tests (this crate's `fuzz_files.rs` and, through a
//! `#[path]` include, ember-model's `fuzz_config.rs`): a mutation picks a node of the document and replaces its
//! value (numbers huge, negative, fractional or written as strings, types swapped, arrays and objects swapped),
//! drops it or duplicates it. Mutations are plain numbers so proptest generates and shrinks them.

#![allow(dead_code)]

use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// Case count: `EMBER_FUZZ_CASES` when set (e.g. 100000 for a long run), else `default` (CI).
pub fn cases(default: u32) -> u32 {
    std::env::var("EMBER_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The proptest configuration of a fuzz target: `cases` cases (or `EMBER_FUZZ_CASES`) from a fixed seed
/// (`EMBER_FUZZ_SEED`, default 0), so CI runs the same cases every time and a longer run can explore others.
pub fn config(default_cases: u32) -> ProptestConfig {
    let seed = std::env::var("EMBER_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    ProptestConfig {
        cases: cases(default_cases),
        rng_seed: proptest::test_runner::RngSeed::Fixed(seed),
        ..ProptestConfig::default()
    }
}

/// One mutation: which node (`node` modulo the number of candidate nodes), what to do (`kind`), and a
/// parameter some kinds use.
#[derive(Clone, Copy, Debug)]
pub struct Mutation {
    pub node: usize,
    pub kind: u8,
    pub param: u64,
}

/// One to `max` mutations.
pub fn mutations(max: usize) -> impl Strategy<Value = Vec<Mutation>> {
    prop::collection::vec(
        (any::<usize>(), 0u8..KINDS, any::<u64>()).prop_map(|(node, kind, param)| Mutation {
            node,
            kind,
            param,
        }),
        1..=max,
    )
}

const KINDS: u8 = 24;

/// The numbers the loaders must survive: ids and sizes at and around the 2^31, 2^32 and 2^64 edges, zero,
/// negatives, fractions and floats too large for any integer.
fn number(param: u64) -> Value {
    match param % 14 {
        0 => json!(0),
        1 => json!(1),
        2 => json!(-1),
        3 => json!(1u64 << 31),
        4 => json!((1u64 << 32) + 5),
        5 => json!(u64::MAX),
        6 => json!(i64::MIN),
        7 => json!(1e308),
        8 => json!(-1e308),
        9 => json!(0.5),
        10 => json!(-0.0),
        11 => json!(1e-300),
        12 => json!(1u64 << 40),
        _ => json!(param >> 40),
    }
}

/// A step into a document: an object key or an array index.
#[derive(Clone, Debug)]
enum Step {
    Key(String),
    Index(usize),
}

/// Paths of the nodes mutations pick from. Long containers (a vocabulary, a merge list) would swamp the choice,
/// so only their first and last `keep` children are candidates, besides the container itself.
fn paths(v: &Value, keep: usize) -> Vec<Vec<Step>> {
    let mut out = Vec::new();
    walk(v, &mut Vec::new(), keep, &mut out);
    out
}

fn walk(v: &Value, at: &mut Vec<Step>, keep: usize, out: &mut Vec<Vec<Step>>) {
    out.push(at.clone());
    let pick = |i: usize, n: usize| i < keep || i + keep >= n;
    match v {
        Value::Object(m) => {
            let n = m.len();
            for (i, (k, child)) in m.iter().enumerate() {
                if pick(i, n) {
                    at.push(Step::Key(k.clone()));
                    walk(child, at, keep, out);
                    at.pop();
                }
            }
        }
        Value::Array(a) => {
            let n = a.len();
            for (i, child) in a.iter().enumerate() {
                if pick(i, n) {
                    at.push(Step::Index(i));
                    walk(child, at, keep, out);
                    at.pop();
                }
            }
        }
        _ => {}
    }
}

fn node_mut<'v>(v: &'v mut Value, path: &[Step]) -> &'v mut Value {
    path.iter().fold(v, |v, step| match step {
        Step::Key(k) => &mut v[k.as_str()],
        Step::Index(i) => &mut v[*i],
    })
}

/// Applies `m` to `doc`.
pub fn apply(doc: &mut Value, m: Mutation) {
    apply_sparing(doc, m, &[]);
}

/// Applies `m` to `doc`, leaving the top-level keys `spared` alone (a config's `architectures`, without which
/// every mutant is the same "missing key" error). The document itself is never replaced whole: that case is
/// one test, not a quarter of the fuzzing.
pub fn apply_sparing(doc: &mut Value, m: Mutation, spared: &[&str]) {
    let candidates: Vec<Vec<Step>> = paths(doc, 6)
        .into_iter()
        .filter(|p| match p.first() {
            None => false,
            Some(Step::Key(k)) => !spared.contains(&k.as_str()),
            Some(Step::Index(_)) => true,
        })
        .collect();
    if candidates.is_empty() {
        return;
    }
    let path = &candidates[m.node % candidates.len()];
    if m.kind >= 20 && !path.is_empty() {
        // Structural: drop the node or duplicate it within its parent.
        let (last, parent) = path.split_last().expect("not the root");
        let parent = node_mut(doc, parent);
        match (parent, last) {
            (Value::Object(map), Step::Key(k)) => {
                if m.kind < 23 {
                    map.remove(k);
                } else {
                    let copy = map[k].clone();
                    map.insert(format!("{k}_copy"), copy);
                }
            }
            (Value::Array(a), Step::Index(i)) => {
                if m.kind < 22 {
                    a.remove(*i);
                } else {
                    let copy = a[*i].clone();
                    a.insert((m.param as usize) % (a.len() + 1), copy);
                }
            }
            _ => {}
        }
        return;
    }
    let node = node_mut(doc, path);
    *node = replacement(node, m);
}

fn replacement(old: &Value, m: Mutation) -> Value {
    match m.kind % 20 {
        0..=4 => number(m.param),
        5 => json!("NaN"),
        6 => json!("inf"),
        7 => match old {
            // A number written as a string.
            Value::Number(n) => json!(n.to_string()),
            other => json!(other.to_string()),
        },
        8 => Value::Bool(m.param.is_multiple_of(2)),
        9 => Value::Null,
        10 => json!(""),
        11 => json!([]),
        12 => json!({}),
        13 => swap_container(old),
        14 => match old {
            Value::String(s) => json!(format!(
                "{s}{}",
                char::from_u32((m.param % 0x3000) as u32).unwrap_or('x')
            )),
            _ => json!("x"),
        },
        15 => match old {
            // Off by one in either direction.
            Value::Number(n) => match n.as_i64() {
                Some(i) if m.param.is_multiple_of(2) => json!(i.saturating_add(1)),
                Some(i) => json!(i.saturating_sub(1)),
                None => json!(n.as_f64().map_or(0.0, |f| -f)),
            },
            other => other.clone(),
        },
        16 => json!("a".repeat((m.param % 5000) as usize)),
        17 => match old {
            // The first character of a string, or a string dropped to empty.
            Value::String(s) => json!(s.chars().next().map(String::from).unwrap_or_default()),
            other => other.clone(),
        },
        18 => json!([old.clone()]),
        _ => json!({ "type": "Unknown" }),
    }
}

/// An array becomes an object keyed by index, an object the array of its values, anything else an array of it.
fn swap_container(v: &Value) -> Value {
    match v {
        Value::Array(a) => Value::Object(
            a.iter()
                .enumerate()
                .map(|(i, x)| (i.to_string(), x.clone()))
                .collect::<Map<_, _>>(),
        ),
        Value::Object(m) => Value::Array(m.values().cloned().collect()),
        other => json!([other.clone()]),
    }
}

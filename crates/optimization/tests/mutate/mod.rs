//! Mutation fuzzing with proptest, shared by every crate's hostile-file tests (included with `#[path]`, since the
//! readers under test live in several crates).
//!
//! A test builds a small valid file, lists the integer fields of its header ([`Field`]: counts, lengths,
//! dimensions, offsets), and lets proptest apply a few [`Mutation`]s: byte writes and bit flips anywhere, a field
//! set to a boundary value or nudged by a small delta, truncation, and splices. The reader must then return `Ok` or
//! an error naming the file; a panic fails the case and proptest shrinks it to a minimal mutation list.
//!
//! `EMBER_FUZZ_CASES` sets the number of cases (default [`DEFAULT_CASES`], a few seconds); `EMBER_FUZZ_SEED` makes
//! a longer run explore other inputs. Failures are not persisted to files: each one found becomes an explicit
//! regression test next to the target.

#![allow(dead_code)]

pub mod safetensors;

use std::fmt::Display;

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, FileFailurePersistence, RngAlgorithm, TestRng, TestRunner};

/// Cases per target when `EMBER_FUZZ_CASES` is unset: enough to hit every mutation kind many times, fast enough
/// for CI.
pub const DEFAULT_CASES: u32 = 256;

/// The number of cases to run: `EMBER_FUZZ_CASES`, or `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("EMBER_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A test runner for `cases` cases (overridden by `EMBER_FUZZ_CASES`), seeded by `EMBER_FUZZ_SEED` (a `u64`,
/// default 0) so CI runs the same cases every time and a longer run can explore others.
pub fn runner(default_cases: u32) -> TestRunner {
    let config = Config {
        cases: cases(default_cases),
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        // Shrinking a hostile input down to one mutation takes many re-runs; bound it so a failure reports fast.
        max_shrink_iters: 2048,
        ..Config::default()
    };
    let seed: u64 = std::env::var("EMBER_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &key))
}

/// A little-endian integer field of a file: where it starts and how many bytes it has (1, 2, 4 or 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    /// Byte offset.
    pub at: usize,
    /// Width in bytes.
    pub width: usize,
}

/// What a field or word is set to.
#[derive(Debug, Clone)]
pub enum Value {
    /// A value chosen from [`BOUNDARIES`].
    Boundary(Index),
    /// The current value plus a small signed delta (a count one too high, an offset one past the end).
    Delta(i8),
    /// Any value.
    Any(u64),
}

/// Values that sit on the edges readers get wrong: zero, one, powers of two and their neighbours, and the
/// largest values of each width (overflowing products, lengths past any file).
pub const BOUNDARIES: [u64; 18] = [
    0,
    1,
    2,
    3,
    31,
    32,
    33,
    255,
    256,
    65_535,
    65_536,
    (1 << 31) - 1,
    u32::MAX as u64,
    1 << 32,
    1 << 40,
    i64::MAX as u64,
    u64::MAX - 1,
    u64::MAX,
];

/// One change to a file.
#[derive(Debug, Clone)]
pub enum Mutation {
    /// Overwrite one byte.
    Byte(Index, u8),
    /// Flip one bit.
    Flip(Index, u8),
    /// Set one of the file's listed fields.
    Field(Index, Value),
    /// Set a 4- or 8-byte word at any offset, aligned or not.
    Word(Index, bool, Value),
    /// Cut the file at a position.
    Truncate(Index),
    /// Remove up to 16 bytes at a position and insert others.
    Splice(Index, usize, Vec<u8>),
}

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => any::<Index>().prop_map(Value::Boundary),
        2 => (-3i8..=3).prop_map(Value::Delta),
        1 => any::<u64>().prop_map(Value::Any),
    ]
}

/// One mutation, weighted towards the listed fields (where a lying header does damage) when there are any.
pub fn mutation(has_fields: bool) -> impl Strategy<Value = Mutation> {
    let field_weight = if has_fields { 6 } else { 0 };
    prop_oneof![
        2 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Byte(i, b)),
        2 => (any::<Index>(), 0u8..8).prop_map(|(i, b)| Mutation::Flip(i, b)),
        field_weight => (any::<Index>(), value()).prop_map(|(i, v)| Mutation::Field(i, v)),
        2 => (any::<Index>(), any::<bool>(), value()).prop_map(|(i, w, v)| Mutation::Word(i, w, v)),
        1 => any::<Index>().prop_map(Mutation::Truncate),
        1 => (any::<Index>(), 0usize..16, prop::collection::vec(any::<u8>(), 0..16))
            .prop_map(|(i, r, ins)| Mutation::Splice(i, r, ins)),
    ]
}

/// One to `max` mutations.
pub fn mutations(has_fields: bool, max: usize) -> impl Strategy<Value = Vec<Mutation>> {
    prop::collection::vec(mutation(has_fields), 1..=max)
}

fn read_le(bytes: &[u8], at: usize, width: usize) -> u64 {
    let mut word = [0u8; 8];
    word[..width].copy_from_slice(&bytes[at..at + width]);
    u64::from_le_bytes(word)
}

/// What `value` makes of a field currently holding `current`.
pub fn resolve(value: &Value, current: u64) -> u64 {
    match value {
        Value::Boundary(i) => BOUNDARIES[i.index(BOUNDARIES.len())],
        Value::Delta(d) => current.wrapping_add(*d as i64 as u64),
        Value::Any(v) => *v,
    }
}

/// A strategy for [`Value`]s, for targets that mutate numbers inside text (JSON headers).
pub fn any_value() -> impl Strategy<Value = Value> {
    value()
}

fn write(bytes: &mut [u8], at: usize, width: usize, value: &Value) {
    if bytes.len() < width || at + width > bytes.len() {
        return;
    }
    let v = resolve(value, read_le(bytes, at, width));
    bytes[at..at + width].copy_from_slice(&v.to_le_bytes()[..width]);
}

/// `bytes` with `mutations` applied in order. `fields` are the original file's fields; a field that a previous
/// mutation moved or cut off is written where it was, or skipped.
pub fn apply(bytes: &[u8], fields: &[Field], mutations: &[Mutation]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    for m in mutations {
        let len = out.len();
        match m {
            Mutation::Byte(i, b) if len > 0 => out[i.index(len)] = *b,
            Mutation::Flip(i, bit) if len > 0 => out[i.index(len)] ^= 1 << bit,
            Mutation::Field(i, v) if !fields.is_empty() => {
                let f = fields[i.index(fields.len())];
                write(&mut out, f.at, f.width, v);
            }
            Mutation::Word(i, wide, v) if len > 0 => {
                write(&mut out, i.index(len), if *wide { 8 } else { 4 }, v);
            }
            Mutation::Truncate(i) => out.truncate(i.index(len + 1)),
            Mutation::Splice(i, remove, insert) => {
                let at = i.index(len + 1);
                let end = (at + remove).min(len);
                out.splice(at..end, insert.iter().copied());
            }
            _ => {}
        }
    }
    out
}

/// Fails unless `result` is `Ok` or an error whose message contains `file` (the reader named what it read).
pub fn ok_or_names<T, E: Display>(
    result: Result<T, E>,
    file: &str,
) -> Result<Option<T>, TestCaseError> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(e) => {
            let message = e.to_string();
            prop_assert!(
                message.contains(file),
                "the error does not name {file}: {message}"
            );
            Ok(None)
        }
    }
}

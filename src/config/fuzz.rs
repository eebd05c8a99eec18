//! Mutation fuzzing of the run configuration: the shipped `configs/*.yaml`, with values replaced (huge,
//! negative, zero, NaN, infinite, of the wrong type), keys dropped or invented, and the text itself cut or
//! corrupted. Whatever comes out, [`RunConfig::parse`] must return `Ok` or an error naming the file, never panic,
//! and a config it accepts must be one a run can use: the model spec it builds validates, the optimiser and
//! schedule validate, the time limit is a `Duration`, and the memory it needs is within the bound.
//!
//! CI runs `EMBER_FUZZ_CASES` cases per property (default 2048: both properties in 0.35 s on the 2-core
//! reference machine); on demand, for longer (200,000 cases per property took 52 s; the test profile already runs
//! serde_yaml optimised, so `--release` would only add a long build):
//!
//! ```text
//! EMBER_FUZZ_CASES=200000 cargo test --bin ember config::fuzz
//! ```
//!
//! A failure is shrunk by proptest to a minimal mutation and its seed written to
//! `proptest-regressions/config/fuzz.txt`; commit that file, so the case is replayed first on every later run,
//! and add the shrunk input to `known_hostile_values_are_refused_by_key` below.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ember_training::{AdamWConfig, CosineSchedule, DecayPolicy};
use proptest::prelude::*;
use serde_yaml::{Mapping, Value};

use super::limits::{self, MAX_TRAINING_BYTES};
use super::{ConfigError, RunConfig};

/// Cases per property: `EMBER_FUZZ_CASES`, else 2048.
fn cases() -> u32 {
    std::env::var("EMBER_FUZZ_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2048)
}

/// The shipped configs, each as (file name, text): read from `configs/` so that a new one is fuzzed too.
fn shipped() -> Vec<(String, String)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("configs");
    let mut configs: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .map(|p| {
            let text = std::fs::read_to_string(&p)
                .unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
            let name = p
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            (name, text)
        })
        .collect();
    configs.sort();
    assert!(configs.len() >= 2, "configs/ holds the shipped configs");
    configs
}

/// A step into a YAML document: a mapping key or a sequence index.
#[derive(Clone, Debug)]
enum Step {
    Key(String),
    Index(usize),
}

/// The path of every node below the root (mappings and sequences included, so whole sections are mutated too).
fn paths(value: &Value, prefix: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    match value {
        Value::Mapping(map) => {
            for (key, child) in map {
                if let Some(key) = key.as_str() {
                    prefix.push(Step::Key(key.to_string()));
                    out.push(prefix.clone());
                    paths(child, prefix, out);
                    prefix.pop();
                }
            }
        }
        Value::Sequence(items) => {
            for (i, child) in items.iter().enumerate() {
                prefix.push(Step::Index(i));
                out.push(prefix.clone());
                paths(child, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

/// What to do to one node.
#[derive(Clone, Debug)]
enum Mutation {
    /// Replace it with this value.
    Set(Value),
    /// Multiply a number by 2^k (k may be negative), or negate it.
    Scale(i32, bool),
    /// Remove it from its mapping or sequence.
    Drop,
    /// Add an unknown key next to it.
    Unknown,
}

/// Values that have broken or nearly broken parsers elsewhere: extremes of every numeric type, the float
/// specials, and every other YAML type.
fn hostile_value() -> impl Strategy<Value = Value> {
    let numbers: Vec<Value> = vec![
        0u64.into(),
        1u64.into(),
        2u64.into(),
        3u64.into(),
        255u64.into(),
        u64::from(u16::MAX).into(),
        (u64::from(u16::MAX) + 1).into(),
        u64::from(u32::MAX).into(),
        (1u64 << 32).into(),
        (1u64 << 53).into(),
        i64::MAX.into(),
        u64::MAX.into(),
        (-1i64).into(),
        i64::MIN.into(),
        0.0f64.into(),
        (-0.0f64).into(),
        0.5f64.into(),
        1.0f64.into(),
        (-1.0f64).into(),
        1e-300f64.into(),
        f64::MIN_POSITIVE.into(),
        1e30f64.into(),
        1e300f64.into(),
        f64::MAX.into(),
        f64::NAN.into(),
        f64::INFINITY.into(),
        f64::NEG_INFINITY.into(),
    ];
    let others: Vec<Value> = vec![
        Value::Null,
        Value::Bool(true),
        Value::String(String::new()),
        Value::String("auto".into()),
        Value::String("x".repeat(300)),
        Value::String("1e9".into()),
        Value::Sequence(vec![]),
        Value::Sequence(vec![0u64.into(), 0u64.into()]),
        Value::Sequence(vec![u64::MAX.into()]),
        Value::Mapping(Mapping::new()),
    ];
    prop_oneof![
        3 => proptest::sample::select(numbers),
        1 => proptest::sample::select(others),
        1 => any::<u64>().prop_map(Value::from),
        1 => any::<f64>().prop_map(Value::from),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        6 => hostile_value().prop_map(Mutation::Set),
        3 => (-70i32..70, any::<bool>()).prop_map(|(k, negate)| Mutation::Scale(k, negate)),
        2 => Just(Mutation::Drop),
        1 => Just(Mutation::Unknown),
    ]
}

/// Applies `mutation` at `path` in `root`; a path that an earlier mutation removed is skipped.
fn apply(root: &mut Value, path: &[Step], mutation: &Mutation) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut node = &mut *root;
    for step in parents {
        let next = match (step, node) {
            (Step::Key(k), Value::Mapping(map)) => map.get_mut(k.as_str()),
            (Step::Index(i), Value::Sequence(items)) => items.get_mut(*i),
            _ => None,
        };
        let Some(next) = next else {
            return;
        };
        node = next;
    }
    match (last, node, mutation) {
        (Step::Key(k), Value::Mapping(map), Mutation::Drop) => {
            map.remove(k.as_str());
        }
        (Step::Index(i), Value::Sequence(items), Mutation::Drop) if *i < items.len() => {
            items.remove(*i);
        }
        (_, Value::Mapping(map), Mutation::Unknown) => {
            map.insert("fuzz_unknown_key".into(), 1u64.into());
        }
        (Step::Key(k), Value::Mapping(map), _) => {
            if let Some(target) = map.get_mut(k.as_str()) {
                mutate(target, mutation);
            }
        }
        (Step::Index(i), Value::Sequence(items), _) => {
            if let Some(target) = items.get_mut(*i) {
                mutate(target, mutation);
            }
        }
        _ => {}
    }
}

fn mutate(target: &mut Value, mutation: &Mutation) {
    match mutation {
        Mutation::Set(value) => *target = value.clone(),
        Mutation::Scale(k, negate) => {
            if let Some(x) = target.as_f64() {
                let sign = if *negate { -1.0 } else { 1.0 };
                let scaled = sign * x * 2f64.powi(*k);
                // Integers stay integers where they still fit, so the mutation reaches integer keys.
                *target = if target.is_u64() || target.is_i64() {
                    if scaled.fract() == 0.0 && scaled.abs() < 9.0e18 {
                        Value::from(scaled as i64)
                    } else {
                        Value::from(scaled)
                    }
                } else {
                    Value::from(scaled)
                };
            }
        }
        Mutation::Drop | Mutation::Unknown => {}
    }
}

/// The property: `text` parses to a usable config or to an error naming `name`.
fn check(name: &str, text: &str) -> Result<(), TestCaseError> {
    let path = Path::new(name);
    match RunConfig::parse(text, path) {
        Ok(config) => check_usable(&config),
        Err(err) => {
            let message = err.to_string();
            prop_assert!(
                message.starts_with(name),
                "the error must name the file: {message}"
            );
            if let ConfigError::Invalid { key, .. } | ConfigError::Parse { key, .. } = &err {
                prop_assert!(!key.is_empty(), "an error names its key: {message}");
            }
            Ok(())
        }
    }
}

/// What a run does with an accepted config must not fail on it: each of these is what `ember train` builds.
fn check_usable(config: &RunConfig) -> Result<(), TestCaseError> {
    let m = &config.model;
    let vocab = config.tokenizer.vocab_size.max(1);
    let spec = m
        .spec(vocab)
        .map_err(|e| TestCaseError::fail(format!("accepted a model the spec refuses: {e}")))?;
    prop_assert!(
        spec.validate().is_ok(),
        "accepted a model the spec refuses: {:?}",
        spec.validate()
    );
    let t = &config.training;
    let schedule = CosineSchedule {
        peak: t.learning_rate,
        floor: t.min_learning_rate,
        warmup_steps: t.warmup_steps,
        total_steps: t.max_steps,
    };
    prop_assert!(schedule.validate().is_ok());
    let lr = schedule.lr(t.max_steps / 2);
    prop_assert!(lr.is_finite() && lr >= 0.0, "lr {lr}");
    let optimizer = AdamWConfig {
        beta1: t.beta1,
        beta2: t.beta2,
        eps: t.eps,
        weight_decay: t.weight_decay,
        decay_policy: DecayPolicy::MatricesExceptEmbeddings,
    };
    prop_assert!(optimizer.validate().is_ok());
    prop_assert!(t.grad_clip.is_finite() && t.grad_clip >= 0.0);
    if let Some(minutes) = t.time_limit_min {
        prop_assert!(Duration::try_from_secs_f64(minutes * 60.0).is_ok());
    }
    let replicas = t.devices.indices(t.batch_size, Some(2)).len();
    prop_assert!(replicas >= 1 && t.batch_size.is_multiple_of(replicas));
    let estimate = limits::estimate(config, vocab, replicas);
    prop_assert!(
        estimate.total() <= MAX_TRAINING_BYTES * 2,
        "accepted a config needing {}",
        estimate.describe()
    );
    Ok(())
}

/// A shipped config with 1 to 4 mutations at random paths.
fn mutated_config() -> impl Strategy<Value = (String, String)> {
    let configs = shipped();
    (
        0..configs.len(),
        prop::collection::vec((any::<prop::sample::Index>(), mutation()), 1..5),
    )
        .prop_map(move |(which, mutations)| {
            let (name, text) = &configs[which];
            let mut root: Value = serde_yaml::from_str(text).expect("a shipped config is YAML");
            for (at, mutation) in &mutations {
                let mut all = Vec::new();
                paths(&root, &mut Vec::new(), &mut all);
                if all.is_empty() {
                    break;
                }
                apply(&mut root, &all[at.index(all.len())], mutation);
            }
            let text = serde_yaml::to_string(&root).expect("a YAML value serialises");
            (name.clone(), text)
        })
}

/// A shipped config's text with a byte range replaced by arbitrary bytes (lossily made UTF-8), or cut short.
fn corrupted_text() -> impl Strategy<Value = (String, String)> {
    let configs = shipped();
    (
        0..configs.len(),
        any::<prop::sample::Index>(),
        0usize..16,
        prop::collection::vec(any::<u8>(), 0..16),
        any::<bool>(),
    )
        .prop_map(move |(which, at, len, bytes, truncate)| {
            let (name, text) = &configs[which];
            let mut raw = text.as_bytes().to_vec();
            let start = at.index(raw.len());
            if truncate {
                raw.truncate(start);
            } else {
                let end = (start + len).min(raw.len());
                raw.splice(start..end, bytes);
            }
            (name.clone(), String::from_utf8_lossy(&raw).into_owned())
        })
}

proptest! {
    // A fixed seed (`EMBER_FUZZ_SEED`, default 0): CI runs the same cases every time, a longer run explores
    // others. Nothing is written to the source tree; a failure found becomes a regression test below.
    #![proptest_config(ProptestConfig {
        cases: cases(),
        rng_seed: proptest::test_runner::RngSeed::Fixed(
            std::env::var("EMBER_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0),
        ),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn mutated_values_parse_or_name_the_file((name, text) in mutated_config()) {
        check(&name, &text)?;
    }

    #[test]
    fn corrupted_text_parses_or_names_the_file((name, text) in corrupted_text()) {
        check(&name, &text)?;
    }
}

/// Mutations the fuzzer found or that broke a reader before: each once, so that they cannot regress even if the
/// random search stops drawing them.
#[test]
fn known_hostile_values_are_refused_by_key() {
    for (yaml, key) in [
        (
            "training:\n  devices: 18446744073709551615\n",
            "training.devices",
        ),
        (
            "training:\n  time_limit_min: 1.0e300\n",
            "training.time_limit_min",
        ),
        (
            "training:\n  time_limit_min: .nan\n",
            "training.time_limit_min",
        ),
        ("training:\n  weight_decay: .nan\n", "training.weight_decay"),
        // Found by the fuzzer: a base this small overflowed the RoPE frequencies, which only the spec refused.
        (
            "model:\n  rope_theta: 4.571006614009676e-102\n",
            "model.rope_theta",
        ),
        ("training:\n  grad_clip: .nan\n", "training.grad_clip"),
        ("training:\n  grad_clip: -1\n", "training.grad_clip"),
        (
            "training:\n  learning_rate: 1.0e30\n",
            "training.learning_rate",
        ),
        (
            "training:\n  learning_rate: .inf\n",
            "training.learning_rate",
        ),
        (
            "training:\n  min_learning_rate: .nan\n",
            "training.min_learning_rate",
        ),
        ("training:\n  beta1: .nan\n", "training.beta1"),
        ("training:\n  eps: 1.0e30\n", "training.eps"),
        (
            "training:\n  batch_size: 18446744073709551615\n",
            "training.batch_size",
        ),
        (
            "training:\n  grad_accum_steps: 4294967296\n",
            "training.grad_accum_steps",
        ),
        (
            "training:\n  batch_size: 65536\n  grad_accum_steps: 65536\n",
            "training.batch_size",
        ),
        ("training:\n  patience: 0\n", "training.patience"),
        (
            "model:\n  hidden_size: 1099511627776\n",
            "model.hidden_size",
        ),
        ("model:\n  num_layers: 4294967296\n", "model.num_layers"),
        ("model:\n  block_size: 4294967296\n", "model.block_size"),
        (
            "model:\n  intermediate_size: 1099511627776\n",
            "model.intermediate_size",
        ),
        (
            "model:\n  hidden_size: 65536\n  num_layers: 1024\n",
            "model",
        ),
        (
            "model:\n  hidden_size: 264\n  num_heads: 8\n",
            "model.num_heads",
        ),
        ("model:\n  norm_eps: 0\n", "model.norm_eps"),
        ("model:\n  norm_eps: -1.0e-5\n", "model.norm_eps"),
        ("model:\n  norm_eps: .nan\n", "model.norm_eps"),
        ("model:\n  rope_theta: .inf\n", "model.rope_theta"),
        ("model:\n  rope_theta: 0\n", "model.rope_theta"),
        (
            "tokenizer:\n  vocab_size: 4294967296\n",
            "tokenizer.vocab_size",
        ),
        (
            "tokenizer:\n  special_tokens: [\"<|a|>\", \"\"]\n",
            "tokenizer.special_tokens[1]",
        ),
        (
            "tokenizer:\n  special_tokens: [\"<|a|>\", \"<|a|>\"]\n",
            "tokenizer.special_tokens[1]",
        ),
        ("name: \"\"\n", "name"),
    ] {
        match RunConfig::parse(yaml, Path::new("hostile.yaml")) {
            Err(ConfigError::Invalid {
                key: k, message, ..
            }) => {
                assert_eq!(k, key, "{yaml}: {message}");
                assert!(
                    message.contains("expected")
                        || message.contains("limit")
                        || message.contains("must"),
                    "{yaml}: {message}"
                );
            }
            other => panic!("{yaml}: expected an error on {key}, got {other:?}"),
        }
    }
}

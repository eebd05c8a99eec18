//! Mutation fuzzing of `config.json` parsing: each family's parity-fixture config and the published configs
//! under `fixtures/configs` are mutated (numbers huge, negative, fractional or written as strings, types and
//! arrays/objects swapped, keys dropped or duplicated) and parsed. A parse must return an error naming the
//! file, or a spec that passes `validate` and whose memory needs are within the bound; a spec small enough is
//! then built and run on a few tokens, which must neither panic nor give non-finite logits.
//!
//! CI runs 1000 cases (about a second). A long run:
//!
//! ```text
//! EMBER_FUZZ_CASES=100000 cargo test --release -p ember-model --test fuzz_config
//! ```
//!
//! A failing case is shrunk and its seed saved by proptest; every crash found becomes a test in
//! `bad_config.rs`.

mod common;
// The JSON mutator is shared with ember-tokenizer's loader fuzzing.
#[path = "../../tokenizer/tests/mutate/mod.rs"]
mod mutate;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::{B, FIXTURES, fixture};
use ember_model::spec::MAX_MODEL_BYTES;
use ember_model::{Transformer, arch};
use mutate::{apply_sparing, mutations};
use proptest::prelude::*;
use serde_json::Value;

/// Every config the fuzzer starts from, with its path.
fn configs() -> &'static [(PathBuf, Value)] {
    static CONFIGS: OnceLock<Vec<(PathBuf, Value)>> = OnceLock::new();
    CONFIGS.get_or_init(|| {
        let published = std::fs::read_dir(fixture("configs"))
            .unwrap()
            .map(|e| e.unwrap().path());
        let mut paths: Vec<PathBuf> = FIXTURES
            .iter()
            .map(|name| fixture(name).join("config.json"))
            .chain(published)
            .collect();
        paths.sort();
        paths
            .into_iter()
            .map(|p| {
                let v = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
                (p, v)
            })
            .collect()
    })
}

/// Models up to this size are built and run (a few MiB keeps a case in milliseconds).
const RUN_BYTES: u128 = 8 << 20;

proptest! {
    #![proptest_config(mutate::config(1000))]

    #[test]
    fn mutated_configs_parse_to_a_valid_spec_or_name_the_file(
        which in any::<usize>(),
        muts in mutations(3),
    ) {
        let (path, original) = &configs()[which % configs().len()];
        let mut config = original.clone();
        for m in muts {
            apply_sparing(&mut config, m, &["architectures"]);
        }
        let name = format!("fuzz/{}", path.strip_prefix(fixture("")).unwrap().display());
        match arch::parse_config_value(&config, Path::new(&name)) {
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(msg.contains(&name), "error does not name {name}: {msg}");
            }
            Ok((family, spec)) => {
                prop_assert!(spec.validate().is_ok());
                let needs = spec.memory_needs().expect("a valid spec has bounded sizes");
                prop_assert!(needs.total() <= MAX_MODEL_BYTES);
                prop_assert_eq!(needs.parameters, u128::from(spec.parameter_count()));
                let _ = family.to_config(&spec);
                if needs.total() <= RUN_BYTES {
                    let model = Transformer::<B>::init(&spec, 0, &Default::default());
                    prop_assert!(model.is_ok(), "a valid spec must build: {:?}", model.err());
                    let model = model.unwrap();
                    let len = spec.context_length.min(4);
                    let ids: Vec<u32> = (0..len as u32).map(|i| i % spec.vocab_size as u32).collect();
                    let logits = model.forward(common::tokens(&ids));
                    prop_assert!(logits.is_ok(), "{:?}", logits.err());
                    // Accepted values must also make sense: a bad eps or RoPE scaling shows as NaN or inf.
                    let values: Vec<f32> = logits.unwrap().into_data().into_vec().unwrap();
                    prop_assert!(values.iter().all(|v| v.is_finite()), "non-finite logits for {config}");
                }
            }
        }
    }
}

#[test]
fn every_unmutated_config_parses() {
    for (path, config) in configs() {
        arch::parse_config_value(config, path).unwrap();
    }
    assert_eq!(configs().len(), FIXTURES.len() + 5);
}

//! Mutation fuzzing of the safetensors model-loading path (`config.json` + `model.safetensors`, and a quantized
//! `model.quantized.safetensors`), and the regression tests of what it found.
//!
//! Each case rewrites the weights file of a small model directory, with header edits that keep the JSON valid but
//! make it lie (`../../optimization/tests/mutate/safetensors.rs`: shapes, offsets, dtypes, a name given twice,
//! the quantization metadata) and byte mutations anywhere, then loads the directory: the load must succeed or
//! fail with an error naming the model directory's file.
//!
//! CI runs 256 cases per target (a few seconds). A longer run:
//!
//! ```text
//! EMBER_FUZZ_CASES=20000 EMBER_FUZZ_SEED=7 cargo test --release -p ember-model --test fuzz_safetensors
//! ```

mod common;
#[path = "../../optimization/tests/mutate/mod.rs"]
mod mutate;

use std::path::Path;

use common::{B, fixture};
use ember_model::{ModelError, load};
use mutate::safetensors::{Edit, Parsed};
use mutate::{DEFAULT_CASES, Field, Mutation};
use proptest::prelude::*;

/// Runs `cases` mutated copies of `dir/file` (the rest of `dir` copied unchanged) through `load`.
fn fuzz(source: &Path, file: &str, cases: u32) {
    let tmp = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(source).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), tmp.path().join(entry.file_name())).unwrap();
    }
    let target = tmp.path().join(file);
    let base = std::fs::read(&target).unwrap();
    if let Err(e) = load::<B>(tmp.path(), &Default::default(), None) {
        panic!("the unmutated model must load: {e}");
    }
    let parsed = mutate::safetensors::parse(&base);
    let header_len = [Field { at: 0, width: 8 }];
    let dir = tmp.path().display().to_string();
    let mut runner = mutate::runner(cases);
    let strategy = (
        mutate::safetensors::edits(3),
        prop::collection::vec(mutate::mutation(true), 0..=2),
    );
    let (loaded, refused) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
    let result = runner.run(
        &strategy,
        |(edits, mutations): (Vec<Edit>, Vec<Mutation>)| {
            let edited = mutate::safetensors::apply(&parsed, &edits);
            std::fs::write(&target, mutate::apply(&edited, &header_len, &mutations)).unwrap();
            let result = load::<B>(tmp.path(), &Default::default(), None);
            let counter = match mutate::ok_or_names(result.map(|_| ()), &dir)? {
                Some(()) => &loaded,
                None => &refused,
            };
            counter.set(counter.get() + 1);
            Ok(())
        },
    );
    if let Err(e) = result {
        panic!("{e}");
    }
    // Shown with `--nocapture`: a target whose every case is refused at the first check would test little.
    eprintln!("{file}: {} loaded, {} refused", loaded.get(), refused.get());
}

#[test]
fn fuzz_llama_checkpoint() {
    fuzz(&fixture("llama3"), "model.safetensors", DEFAULT_CASES);
}

#[test]
fn fuzz_gpt2_checkpoint() {
    // GPT-2 stores its matrices transposed (Conv1D) and splits the stacked QKV: other code paths than LLaMA's.
    fuzz(&fixture("gpt2"), "model.safetensors", DEFAULT_CASES / 2);
}

/// A small LLaMA quantized with `scheme` (embeddings and head too), saved to a temporary directory.
fn saved_quantized(scheme: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let quantized = common::small_llama(3, false, false)
        .quantize(&ember_model::Quantization {
            scheme: scheme.parse().unwrap(),
            lm_head: true,
            embeddings: true,
        })
        .unwrap();
    ember_model::save_quantized(&quantized, tmp.path()).unwrap();
    tmp
}

#[test]
fn fuzz_quantized_checkpoint() {
    let tmp = saved_quantized("int4-g32-asym");
    fuzz(tmp.path(), ember_model::QUANTIZED_FILE, DEFAULT_CASES);
}

// Regression tests.

/// `fixture`'s files in a temporary directory with the weights header rewritten by `edit` (on the header text).
fn with_header(fixture_name: &str, edit: impl Fn(&mut String)) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture(fixture_name).join(file), tmp.path().join(file)).unwrap();
    }
    let path = tmp.path().join("model.safetensors");
    let Parsed { header, data } = mutate::safetensors::parse(&std::fs::read(&path).unwrap());
    let mut text = serde_json::Value::Object(header).to_string();
    edit(&mut text);
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(text.as_bytes());
    bytes.extend_from_slice(&data);
    std::fs::write(&path, bytes).unwrap();
    tmp
}

#[test]
fn a_tensor_named_twice_is_refused() {
    // The second entry repeats the first one exactly, so the crate's own checks all pass and it keeps one.
    let tmp = with_header("llama3", |text| {
        let header: serde_json::Value = serde_json::from_str(text).unwrap();
        let entry = &header["model.norm.weight"];
        text.insert_str(1, &format!("\"model.norm.weight\":{entry},"));
    });
    let err = load::<B>(tmp.path(), &Default::default(), None)
        .err()
        .unwrap();
    let msg = err.to_string();
    assert!(matches!(err, ModelError::Safetensors { .. }), "{msg}");
    assert!(
        msg.contains("model.safetensors") && msg.contains("`model.norm.weight` twice"),
        "{msg}"
    );
}

#[test]
fn a_shard_index_pointing_outside_the_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture("llama3").join(file), tmp.path().join(file)).unwrap();
    }
    std::fs::write(
        tmp.path().join(ember_model::weights::INDEX_FILE),
        r#"{"weight_map": {"model.norm.weight": "../model.safetensors"}}"#,
    )
    .unwrap();
    let msg = load::<B>(tmp.path(), &Default::default(), None)
        .err()
        .unwrap()
        .to_string();
    assert!(
        msg.contains("model.safetensors.index.json") && msg.contains("../model.safetensors"),
        "{msg}"
    );
}

#[test]
fn a_tensor_in_two_shards_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture("llama3").join("config.json"),
        tmp.path().join("config.json"),
    )
    .unwrap();
    for shard in ["a.safetensors", "b.safetensors"] {
        std::fs::copy(
            fixture("llama3").join("model.safetensors"),
            tmp.path().join(shard),
        )
        .unwrap();
    }
    std::fs::write(
        tmp.path().join(ember_model::weights::INDEX_FILE),
        r#"{"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}}"#,
    )
    .unwrap();
    let msg = load::<B>(tmp.path(), &Default::default(), None)
        .err()
        .unwrap()
        .to_string();
    assert!(
        msg.contains("b.safetensors") && msg.contains("also in shard"),
        "{msg}"
    );
}

#[test]
fn a_quantized_entry_whose_shape_overflows_is_refused() {
    let tmp = saved_quantized("int8");
    let path = tmp.path().join(ember_model::QUANTIZED_FILE);
    let Parsed { mut header, data } = mutate::safetensors::parse(&std::fs::read(&path).unwrap());
    let meta = &mut header["__metadata__"]["ember.quantization"];
    let mut entries: serde_json::Value = serde_json::from_str(meta.as_str().unwrap()).unwrap();
    // rows x row_bytes overflows usize: `from_parts` multiplied it unchecked (a panic in debug builds).
    entries["layers.0.mlp.up.weight"]["shape"][0] = serde_json::json!(1u64 << 62);
    *meta = serde_json::Value::from(entries.to_string());
    let text = serde_json::Value::Object(header).to_string();
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(text.as_bytes());
    bytes.extend_from_slice(&data);
    std::fs::write(&path, bytes).unwrap();
    let msg = load::<B>(tmp.path(), &Default::default(), None)
        .err()
        .unwrap()
        .to_string();
    assert!(
        msg.contains(ember_model::QUANTIZED_FILE) && msg.contains("layers.0.mlp.up.weight"),
        "{msg}"
    );
}

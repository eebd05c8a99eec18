//! Mutation fuzzing of ember's quantized checkpoint reader ([`QuantizedCheckpoint::load`]) and of the GGUF block
//! import, and the regression tests of what it found.
//!
//! CI runs 256 cases per target (about a second). A longer run:
//!
//! ```text
//! EMBER_FUZZ_CASES=100000 EMBER_FUZZ_SEED=7 cargo test --release -p ember-optimization --test fuzz_checkpoint
//! ```

mod mutate;

use std::collections::BTreeMap;

use ember_optimization::{DenseTensor, QuantScheme, QuantizedCheckpoint, QuantizedWeight};
use mutate::safetensors::Edit;
use mutate::{DEFAULT_CASES, Field, Mutation};
use proptest::prelude::*;

const NAME: &str = "weights.safetensors";

/// A checkpoint with a weight of each scheme kind and a dense tensor.
fn checkpoint() -> QuantizedCheckpoint {
    let weights = |n: usize| (0..n).map(|i| (i as f32 * 0.37).sin()).collect::<Vec<_>>();
    let mut quantized = BTreeMap::new();
    for (name, scheme, shape) in [
        ("a", "int8", [4, 24]),
        ("b", "int4-g32-asym", [3, 40]),
        ("c", "int8-g16", [2, 48]),
    ] {
        let scheme: QuantScheme = scheme.parse().unwrap();
        let w = QuantizedWeight::quantize(&weights(shape[0] * shape[1]), shape, scheme).unwrap();
        quantized.insert(name.to_string(), w);
    }
    let dense = BTreeMap::from([(
        "norm".to_string(),
        DenseTensor {
            shape: vec![8],
            values: weights(8),
        },
    )]);
    QuantizedCheckpoint { quantized, dense }
}

#[test]
fn fuzz_quantized_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(NAME);
    let original = checkpoint();
    original.save(&path).unwrap();
    assert_eq!(QuantizedCheckpoint::load(&path).unwrap(), original);
    let parsed = mutate::safetensors::parse(&std::fs::read(&path).unwrap());
    let header_len = [Field { at: 0, width: 8 }];
    let mut runner = mutate::runner(DEFAULT_CASES);
    let strategy = (
        mutate::safetensors::edits(3),
        prop::collection::vec(mutate::mutation(true), 0..=2),
    );
    let result = runner.run(
        &strategy,
        |(edits, mutations): (Vec<Edit>, Vec<Mutation>)| {
            let edited = mutate::safetensors::apply(&parsed, &edits);
            std::fs::write(&path, mutate::apply(&edited, &header_len, &mutations)).unwrap();
            if let Some(loaded) = mutate::ok_or_names(QuantizedCheckpoint::load(&path), NAME)? {
                // What loads must be internally consistent: dequantizing reads every code and scale.
                for weight in loaded.quantized.values() {
                    let [rows, cols] = weight.shape();
                    prop_assert_eq!(weight.dequantize().len(), rows * cols);
                }
            }
            Ok(())
        },
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn fuzz_gguf_blocks() {
    // Shapes come from a GGUF header and bytes from its data section: any pair must be a weight or an error.
    let mut runner = mutate::runner(DEFAULT_CASES);
    let dim = prop_oneof![
        0usize..130,
        Just(usize::MAX),
        Just(usize::MAX / 32 * 32),
        Just(1 << 40),
        Just(1 << 59),
    ];
    let strategy = (dim.clone(), dim, 0usize..600, 0u8..3);
    let result = runner.run(&strategy, |(rows, cols, len, kind)| {
        let bytes = vec![0x3c; len];
        let made = match kind {
            0 => QuantizedWeight::from_gguf_q8_0(&bytes, [rows, cols]),
            1 => QuantizedWeight::from_gguf_q4_0(&bytes, [rows, cols]),
            _ => QuantizedWeight::from_gguf_q4_1(&bytes, [rows, cols]),
        };
        if let Ok(w) = made {
            prop_assert_eq!(w.dequantize().len(), rows * cols);
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

// Regression tests.

#[test]
fn gguf_block_shapes_whose_size_overflows_are_errors() {
    // rows * cols / 32 * 34 overflowed usize (a panic in debug builds, a wrapped length in release).
    let err = QuantizedWeight::from_gguf_q8_0(&[0; 34], [1 << 59, 32]).unwrap_err();
    assert!(err.to_string().contains("overflow"), "{err}");
}

/// Saves [`checkpoint`], rewrites its `ember.quantization` metadata through `edit`, and loads it.
fn load_with_entries(edit: impl FnOnce(&mut serde_json::Value)) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(NAME);
    checkpoint().save(&path).unwrap();
    let mut parsed = mutate::safetensors::parse(&std::fs::read(&path).unwrap());
    let meta = &mut parsed.header["__metadata__"]["ember.quantization"];
    let mut entries: serde_json::Value = serde_json::from_str(meta.as_str().unwrap()).unwrap();
    edit(&mut entries);
    *meta = serde_json::Value::from(entries.to_string());
    std::fs::write(&path, mutate::safetensors::apply(&parsed, &[])).unwrap();
    let err = QuantizedCheckpoint::load(&path).unwrap_err().to_string();
    assert!(err.contains(NAME), "{err}");
    err
}

#[test]
fn a_quantized_shape_whose_size_overflows_is_an_error() {
    let err = load_with_entries(|e| e["a"]["shape"] = serde_json::json!([1u64 << 62, 24]));
    assert!(
        err.contains("`a`") && err.contains("fit in memory"),
        "{err}"
    );
}

#[test]
fn a_group_larger_than_any_file_is_an_error() {
    let err = load_with_entries(|e| e["c"]["scheme"] = "int8-g18446744073709551608".into());
    assert!(err.contains("`c`"), "{err}");
}

#[test]
fn a_shape_that_reinterprets_the_stored_tensors_is_an_error() {
    // `c` is int8-g16 [2, 48]: 96 codes and 6 scales. As [6, 16] it needs 96 codes and 6 scales too, so the
    // lengths matched and the file loaded as another matrix; the stored tensors' shapes ([2, 48], [2, 3]) do not.
    let err = load_with_entries(|e| e["c"]["shape"] = serde_json::json!([6, 16]));
    assert!(err.contains("c.qcodes") && err.contains("[6, 16]"), "{err}");
}

#[test]
fn a_tensor_described_twice_in_the_metadata_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(NAME);
    checkpoint().save(&path).unwrap();
    let mut parsed = mutate::safetensors::parse(&std::fs::read(&path).unwrap());
    let meta = &mut parsed.header["__metadata__"]["ember.quantization"];
    let text = meta.as_str().unwrap().to_string();
    // `{"a":{...},...}` becomes `{"a":{...},"a":{...},...}` with the second description lying about the shape.
    let first_end = text.find("},").unwrap() + 1;
    let lying = text[1..first_end].replace("[4,24]", "[2,48]");
    *meta = serde_json::Value::from(format!("{{{lying},{}", &text[1..]));
    std::fs::write(&path, mutate::safetensors::apply(&parsed, &[])).unwrap();
    let err = QuantizedCheckpoint::load(&path).unwrap_err().to_string();
    assert!(err.contains(NAME) && err.contains("`a` twice"), "{err}");
}

//! Bad checkpoints and inputs are errors naming what is wrong, never panics.

mod common;

use std::path::Path;

use common::{B, fixture};
use ember_model::{ModelError, load};

/// Copies fixture `name` into a temporary directory the test may damage.
fn copy_fixture(name: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture(name).join(file), tmp.path().join(file)).unwrap();
    }
    tmp
}

fn load_err(dir: &Path) -> ModelError {
    load::<B>(dir, &Default::default(), None)
        .err()
        .expect("loading should fail")
}

#[test]
fn truncated_safetensors_is_a_corrupt_file_error() {
    let tmp = copy_fixture("llama3");
    let path = tmp.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let err = load_err(tmp.path());
    assert!(matches!(err, ModelError::Safetensors { .. }), "{err}");
    assert!(err.to_string().contains("model.safetensors"), "{err}");
}

#[test]
fn garbage_header_is_a_corrupt_file_error() {
    let tmp = copy_fixture("gpt2");
    std::fs::write(
        tmp.path().join("model.safetensors"),
        b"\xff\xff\xff\xff\xff\xff\xff\x7fnot a header",
    )
    .unwrap();
    assert!(matches!(
        load_err(tmp.path()),
        ModelError::Safetensors { .. }
    ));
}

#[test]
fn missing_weights_file_names_the_path() {
    let tmp = copy_fixture("gpt2");
    std::fs::remove_file(tmp.path().join("model.safetensors")).unwrap();
    let err = load_err(tmp.path());
    assert!(
        matches!(err, ModelError::Io { .. }) && err.to_string().contains("model.safetensors"),
        "{err}"
    );
}

/// Rewrites the checkpoint of `dir` through `edit` (which receives every tensor as name, dtype, shape, bytes).
fn rewrite(dir: &Path, edit: impl Fn(&mut Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>)) {
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            (
                name,
                view.dtype(),
                view.shape().to_vec(),
                view.data().to_vec(),
            )
        })
        .collect();
    edit(&mut tensors);
    let views: Vec<_> = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            (
                name.clone(),
                safetensors::tensor::TensorView::new(*dtype, shape.clone(), data).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, &None, &path).unwrap();
}

#[test]
fn missing_tensor_names_the_checkpoint_tensor() {
    let tmp = copy_fixture("mistral");
    rewrite(tmp.path(), |t| {
        t.retain(|(name, ..)| name != "model.layers.1.self_attn.k_proj.weight")
    });
    let err = load_err(tmp.path());
    let msg = err.to_string();
    assert!(matches!(err, ModelError::MissingTensor { .. }), "{msg}");
    assert!(
        msg.contains("model.layers.1.self_attn.k_proj.weight")
            && msg.contains("layers.1.attn.k.weight"),
        "{msg}"
    );
}

#[test]
fn wrong_shape_names_tensor_expected_and_found() {
    let tmp = copy_fixture("llama3");
    rewrite(tmp.path(), |t| {
        let entry = t
            .iter_mut()
            .find(|(name, ..)| name == "model.layers.0.mlp.up_proj.weight")
            .unwrap();
        // [64, 32] stored as [32, 64]: same byte count, wrong shape.
        entry.2 = vec![32, 64];
    });
    let err = load_err(tmp.path());
    match &err {
        ModelError::ShapeMismatch {
            file,
            name,
            expected,
            found,
        } => {
            assert_eq!(file, &tmp.path().join("model.safetensors"));
            assert_eq!(name, "model.layers.0.mlp.up_proj.weight");
            assert_eq!(
                (expected.as_slice(), found.as_slice()),
                (&[64, 32][..], &[32, 64][..])
            );
        }
        other => panic!("expected a shape mismatch, got {other}"),
    }
}

#[test]
fn extra_tensors_are_reported_as_unused() {
    let tmp = copy_fixture("gpt2");
    rewrite(tmp.path(), |t| {
        t.push((
            "transformer.h.0.attn.masked_bias".into(),
            safetensors::Dtype::F32,
            vec![1],
            vec![0; 4],
        ))
    });
    let loaded = load::<B>(tmp.path(), &Default::default(), None).unwrap();
    assert_eq!(
        loaded.unused,
        vec!["transformer.h.0.attn.masked_bias".to_string()]
    );
}

#[test]
fn integer_tensor_where_a_float_is_expected_is_an_error() {
    let tmp = copy_fixture("gpt2");
    rewrite(tmp.path(), |t| {
        let entry = t
            .iter_mut()
            .find(|(name, ..)| name == "transformer.ln_f.bias")
            .unwrap();
        entry.1 = safetensors::Dtype::I32;
    });
    let msg = load_err(tmp.path()).to_string();
    assert!(
        msg.contains("transformer.ln_f.bias") && msg.contains("I32"),
        "{msg}"
    );
}

#[test]
fn out_of_range_token_id_is_an_error() {
    let model = load::<B>(&fixture("gpt2"), &Default::default(), None)
        .unwrap()
        .model;
    assert!(model.check_tokens(&[1, 2, 127]).is_ok());
    let err = model.check_tokens(&[1, 128, 3]).unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::TokenOutOfRange {
                id: 128,
                position: 1,
                vocab_size: 128
            }
        ),
        "{err}"
    );
}

#[test]
fn sequence_longer_than_learned_positions_is_an_error() {
    let model = load::<B>(&fixture("gpt2"), &Default::default(), None)
        .unwrap()
        .model;
    let ids: Vec<u32> = (0..65).map(|i| i % 100).collect();
    let err = model.forward(common::tokens(&ids)).err().unwrap();
    assert!(
        matches!(
            err,
            ModelError::ContextOverflow {
                len: 65,
                context_length: 64
            }
        ),
        "{err}"
    );
}

//! Mutation fuzzing of the training checkpoint readers: parameters (`load_parameters`), optimizer state
//! (`AdamW::load` + `check_fits`, then an update) and `trainer_state.json`, and the regression tests of what it
//! found.
//!
//! CI runs 256 cases per target (a few seconds). A longer run:
//!
//! ```text
//! EMBER_FUZZ_CASES=50000 EMBER_FUZZ_SEED=7 cargo test --release -p ember-training --test fuzz_state
//! ```

#[path = "../../optimization/tests/mutate/mod.rs"]
mod mutate;

use std::path::Path;

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use ember_training::{
    AdamW, AdamWConfig, Gradients, TrainerState, load_parameters, parameters, save_parameters,
};
use mutate::safetensors::Edit;
use mutate::{DEFAULT_CASES, Field, Mutation};
use proptest::prelude::*;
use serde_json::Value as Json;

type B = Autodiff<Flex>;

#[derive(Module, Debug)]
struct Affine<B: Backend> {
    w: Param<Tensor<B, 2>>,
    b: Param<Tensor<B, 1>>,
}

fn affine() -> Affine<B> {
    let device = Default::default();
    let w: Vec<f32> = (0..12).map(|i| i as f32 * 0.1 - 0.5).collect();
    Affine {
        w: Param::from_tensor(Tensor::from_data(TensorData::new(w, [4, 3]), &device)),
        b: Param::from_tensor(Tensor::from_data(
            TensorData::new(vec![0.1f32; 3], [3]),
            &device,
        )),
    }
}

/// The gradients of a squared-output loss, so an update touches every parameter.
fn gradients(model: &Affine<B>) -> Gradients<Flex> {
    let x = Tensor::<B, 2>::ones([2, 4], &Default::default());
    let y = x.matmul(model.w.val()) + model.b.val().unsqueeze::<2>();
    Gradients::from_backward(model, y.square().mean().backward())
}

/// Saves the parameters and the state after two updates into `dir`.
fn saved_state(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let mut model = affine();
    let mut optimizer = AdamW::<Flex>::new(AdamWConfig::default());
    for _ in 0..2 {
        let grads = gradients(&model);
        model = optimizer.step(1e-2, model, &grads);
    }
    let params = dir.join("parameters.safetensors");
    let state = dir.join("optimizer.safetensors");
    save_parameters(&model, &params).unwrap();
    optimizer.save(&state).unwrap();
    (params, state)
}

/// Runs `cases` mutated copies of `path` through `check`. Besides the shared edits, a case may resize both
/// moments of one parameter together (a file whose state is consistent in itself but not with the model: random
/// edits rarely resize the two tensors alike).
fn fuzz(path: &Path, check: impl Fn(&Path) -> Result<(), TestCaseError>) {
    let parsed = mutate::safetensors::parse(&std::fs::read(path).unwrap());
    let header_len = [Field { at: 0, width: 8 }];
    let mut runner = mutate::runner(DEFAULT_CASES);
    let strategy = (
        mutate::safetensors::edits(3),
        prop::collection::vec(mutate::mutation(true), 0..=2),
        proptest::option::of((prop::sample::select(vec!["w", "b"]), 0u8..16)),
    );
    let result = runner.run(
        &strategy,
        |(mut edits, mutations, paired): (Vec<Edit>, Vec<Mutation>, _)| {
            if let Some((param, n)) = paired {
                for suffix in ["exp_avg", "exp_avg_sq"] {
                    edits.insert(0, Edit::ResizeNamed(format!("{param}.{suffix}"), n));
                }
            }
            let edited = mutate::safetensors::apply(&parsed, &edits);
            std::fs::write(path, mutate::apply(&edited, &header_len, &mutations)).unwrap();
            check(path)
        },
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn fuzz_parameters() {
    let dir = tempfile::tempdir().unwrap();
    let (params, _) = saved_state(dir.path());
    fuzz(&params, |path| {
        if let Some(model) =
            mutate::ok_or_names(load_parameters(affine(), path), "parameters.safetensors")?
        {
            // What loads has the module's shapes: a forward pass and its backward run.
            gradients(&model);
        }
        Ok(())
    });
}

#[test]
fn fuzz_optimizer_state() {
    let dir = tempfile::tempdir().unwrap();
    let (_, state) = saved_state(dir.path());
    fuzz(&state, |path| {
        let mut optimizer = AdamW::<Flex>::new(AdamWConfig::default());
        let name = "optimizer.safetensors";
        if mutate::ok_or_names(optimizer.load(path, &Default::default()), name)?.is_none() {
            return Ok(());
        }
        let model = affine();
        if mutate::ok_or_names(optimizer.check_fits(&parameters(&model), path), name)?.is_some() {
            // State that fits must survive an update (mismatched moments panicked inside it).
            let grads = gradients(&model);
            optimizer.step(1e-2, model, &grads);
        }
        Ok(())
    });
}

/// Field edits of `trainer_state.json`: each sets one number to a boundary value, a negative or a float.
#[test]
fn fuzz_trainer_state() {
    let dir = tempfile::tempdir().unwrap();
    let state = TrainerState {
        step: 10,
        tokens_seen: 640,
        best_val_loss: Some(2.5),
        evals_since_best: 1,
        elapsed_s: 12.5,
        data: serde_json::json!({"next_batch": 10}),
        config: serde_json::json!({}),
    };
    state.save(dir.path()).unwrap();
    let path = dir.path().join(ember_training::TRAINER_STATE_FILE);
    let base: Json = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    const FIELDS: [&str; 5] = [
        "step",
        "tokens_seen",
        "best_val_loss",
        "evals_since_best",
        "elapsed_s",
    ];
    let number = prop_oneof![
        mutate::any_value().prop_map(|v| Json::from(mutate::resolve(&v, 10))),
        any::<i64>().prop_map(Json::from),
        any::<f64>().prop_map(Json::from),
        Just(Json::from(1e300)),
        Just(Json::Null),
    ];
    let mut runner = mutate::runner(DEFAULT_CASES);
    let strategy = prop::collection::vec((0..FIELDS.len(), number), 1..=3);
    let result = runner.run(&strategy, |edits: Vec<(usize, Json)>| {
        let mut state = base.clone();
        for (field, value) in edits {
            state[FIELDS[field]] = value;
        }
        std::fs::write(&path, state.to_string()).unwrap();
        if let Some(loaded) = mutate::ok_or_names(
            TrainerState::load(dir.path()),
            ember_training::TRAINER_STATE_FILE,
        )? {
            // What loads leaves room to keep counting and converts to a duration.
            prop_assert!(loaded.step.checked_add(1 << 20).is_some());
            prop_assert!(loaded.tokens_seen.checked_add(1 << 40).is_some());
            prop_assert!(std::time::Duration::try_from_secs_f64(loaded.elapsed_s).is_ok());
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

// Regression tests.

#[test]
fn optimizer_state_of_another_shape_is_refused_before_an_update() {
    // Moments of 5 elements for a parameter of 3: the update's element-wise add panicked inside burn.
    let dir = tempfile::tempdir().unwrap();
    let (_, path) = saved_state(dir.path());
    let mut parsed = mutate::safetensors::parse(&std::fs::read(&path).unwrap());
    let mut tensors = std::collections::BTreeMap::new();
    for (name, values) in ember_training::read_f32_tensors(&path).unwrap() {
        let values = if name.starts_with("b.") {
            vec![0.5; 5]
        } else {
            values
        };
        tensors.insert(name, values);
    }
    let views: Vec<_> = tensors
        .iter()
        .map(|(name, v)| {
            (
                name.clone(),
                v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(),
            )
        })
        .collect();
    let metadata = parsed.header.remove("__metadata__").unwrap();
    let metadata: std::collections::HashMap<String, String> =
        serde_json::from_value(metadata).unwrap();
    let views: Vec<_> = views
        .iter()
        .map(|(n, bytes)| {
            let view = safetensors::tensor::TensorView::new(
                safetensors::Dtype::F32,
                vec![bytes.len() / 4],
                bytes,
            )
            .unwrap();
            (n.clone(), view)
        })
        .collect();
    safetensors::serialize_to_file(views, &Some(metadata), &path).unwrap();

    let mut optimizer = AdamW::<Flex>::new(AdamWConfig::default());
    optimizer.load(&path, &Default::default()).unwrap();
    let err = optimizer
        .check_fits(&parameters(&affine()), &path)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("optimizer.safetensors")
            && err.contains("b.exp_avg")
            && err.contains("5 elements"),
        "{err}"
    );
}

#[test]
fn optimizer_state_with_a_zero_or_huge_step_count_is_refused() {
    for steps in [r#"{"b":0,"w":2}"#, r#"{"b":18446744073709551615,"w":2}"#] {
        let dir = tempfile::tempdir().unwrap();
        let (_, path) = saved_state(dir.path());
        let mut parsed = mutate::safetensors::parse(&std::fs::read(&path).unwrap());
        parsed.header["__metadata__"]["steps"] = Json::from(steps);
        std::fs::write(&path, mutate::safetensors::apply(&parsed, &[])).unwrap();
        let mut optimizer = AdamW::<Flex>::new(AdamWConfig::default());
        let err = optimizer
            .load(&path, &Default::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("optimizer.safetensors") && err.contains("step count"),
            "{err}"
        );
    }
}

#[test]
fn a_parameter_named_twice_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = saved_state(dir.path());
    let parsed = mutate::safetensors::parse(&std::fs::read(&path).unwrap());
    let entry = parsed.header["b"].clone();
    // Serialise with the entry twice: a JSON map holds one, so insert it as text.
    let text = Json::Object(parsed.header.clone()).to_string();
    let text = format!("{{\"b\":{entry},{}", &text[1..]);
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(text.as_bytes());
    bytes.extend_from_slice(&parsed.data);
    std::fs::write(&path, bytes).unwrap();
    let err = load_parameters(affine(), &path).unwrap_err().to_string();
    assert!(
        err.contains("parameters.safetensors") && err.contains("`b` twice"),
        "{err}"
    );
}

#[test]
fn trainer_state_counts_that_would_overflow_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (field, value) in [
        ("step", Json::from(u64::MAX)),
        ("tokens_seen", Json::from(u64::MAX)),
        ("elapsed_s", Json::from(1e300)),
        ("elapsed_s", Json::from(-1.0)),
    ] {
        let mut state = serde_json::json!({
            "step": 1, "tokens_seen": 1, "best_val_loss": null, "evals_since_best": 0,
            "elapsed_s": 0.0, "data": null, "config": null
        });
        state[field] = value;
        std::fs::write(
            dir.path().join(ember_training::TRAINER_STATE_FILE),
            state.to_string(),
        )
        .unwrap();
        let err = TrainerState::load(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("trainer_state.json") && err.contains(field),
            "{field}: {err}"
        );
    }
}

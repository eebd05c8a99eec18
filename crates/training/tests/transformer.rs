//! Training ember-model's transformer through the Hugging Face checkpoint store: exact resume from `last/`.

use std::sync::atomic::AtomicBool;

use ember_model::Transformer;
use ember_training::{
    AdamWConfig, CosineSchedule, HfModelStore, InMemoryData, Precision, TrainSettings, train,
};

mod common;

use common::{B, BLOCK};

fn model() -> Transformer<B> {
    common::transformer(16, 1, 2, 1, 32)
}

fn data() -> InMemoryData {
    common::cyclic_data(2)
}

fn settings(run_dir: &std::path::Path, max_steps: usize, resume: bool) -> TrainSettings {
    TrainSettings {
        batch_size: 2,
        block_size: BLOCK,
        grad_accum_steps: 1,
        max_steps,
        time_limit: None,
        schedule: CosineSchedule {
            peak: 1e-2,
            floor: 1e-3,
            warmup_steps: 2,
            total_steps: 8,
        },
        optimizer: AdamWConfig::default(),
        grad_clip: 1.0,
        log_interval: 1,
        eval_interval: 4,
        checkpoint_interval: 4,
        patience: None,
        precision: Precision::F32,
        checkpoint_activations: false,
        data_parallel: Default::default(),
        run_dir: run_dir.to_path_buf(),
        resume,
        config: serde_json::Value::Null,
    }
}

#[test]
fn transformer_resumes_exactly_from_its_hugging_face_checkpoint() {
    let store = HfModelStore::default();
    let straight_dir = tempfile::tempdir().unwrap();
    let straight = train(
        model(),
        &mut data(),
        &store,
        &settings(straight_dir.path(), 8, false),
        &mut (),
        &AtomicBool::new(false),
    )
    .unwrap();
    for file in [
        "config.json",
        "model.safetensors",
        "optimizer.safetensors",
        "trainer_state.json",
    ] {
        assert!(
            straight_dir.path().join("best").join(file).is_file(),
            "best/{file}"
        );
    }
    let split_dir = tempfile::tempdir().unwrap();
    let first = train(
        model(),
        &mut data(),
        &store,
        &settings(split_dir.path(), 4, false),
        &mut (),
        &AtomicBool::new(false),
    )
    .unwrap();
    let second = train(
        model(),
        &mut data(),
        &store,
        &settings(split_dir.path(), 8, true),
        &mut (),
        &AtomicBool::new(false),
    )
    .unwrap();
    let joined: Vec<f64> = first.losses.iter().chain(&second.losses).copied().collect();
    // Bitwise: model.safetensors stores the f32 weights exactly, the optimizer state likewise.
    assert_eq!(joined, straight.losses);
    assert!(
        straight.losses[7] < straight.losses[0],
        "loss did not fall: {:?}",
        straight.losses
    );
}

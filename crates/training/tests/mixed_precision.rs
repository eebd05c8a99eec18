//! bf16 mixed precision: bf16 activations and matmuls, f32 master weights, on burn-flex (which computes bf16
//! through f32 conversions, so the numerics are those of bf16 storage: what a GPU's bf16 tensor cores see).

use std::sync::atomic::AtomicBool;

use ember_model::Transformer;
use ember_training::{
    AdamWConfig, CosineSchedule, HfModelStore, InMemoryData, Precision, TrainSettings, train,
};

mod common;

use common::{B, BLOCK};

fn model() -> Transformer<B> {
    common::transformer(32, 2, 2, 1, 64)
}

fn data() -> InMemoryData {
    common::cyclic_data(4)
}

fn run(precision: Precision, dir: &std::path::Path) -> Vec<f64> {
    let settings = TrainSettings {
        batch_size: 4,
        block_size: BLOCK,
        grad_accum_steps: 1,
        max_steps: 12,
        time_limit: None,
        schedule: CosineSchedule {
            peak: 1e-2,
            floor: 1e-3,
            warmup_steps: 2,
            total_steps: 12,
        },
        optimizer: AdamWConfig::default(),
        grad_clip: 1.0,
        log_interval: 1,
        eval_interval: 100,
        checkpoint_interval: 100,
        patience: None,
        precision,
        checkpoint_activations: false,
        data_parallel: Default::default(),
        run_dir: dir.to_path_buf(),
        resume: false,
        config: serde_json::Value::Null,
    };
    train(
        model(),
        &mut data(),
        &HfModelStore::default(),
        &settings,
        &mut (),
        &AtomicBool::new(false),
    )
    .unwrap()
    .losses
}

#[test]
fn bf16_training_follows_f32_and_keeps_f32_master_weights() {
    let (f32_dir, bf16_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let full = run(Precision::F32, f32_dir.path());
    let mixed = run(Precision::Bf16, bf16_dir.path());
    // bf16 keeps 8 significant bits (relative step 2^-8 = 0.4%): on a loss of ~3.5 nats over 32-wide layers the
    // rounding of activations moves the loss by a few hundredths at most; a wrong cast (weights truncated in place,
    // gradients lost through the cast) would stall or derail training by far more than 0.1.
    let worst = full
        .iter()
        .zip(&mixed)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert!(worst < 0.1, "bf16 losses {mixed:?} vs f32 {full:?}");
    // ... and the forward pass did run in bf16: the losses are not f32's to the last bit.
    assert!(worst > 1e-6, "bf16 losses equal f32's: {mixed:?}");
    assert!(
        mixed[11] < mixed[0] - 0.3,
        "bf16 training did not learn: {mixed:?}"
    );
    // The checkpoint holds the f32 master weights.
    let bytes = std::fs::read(bf16_dir.path().join("last").join("model.safetensors")).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    for (name, view) in file.tensors() {
        assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name}");
    }
}

//! Data-parallel training on burn-collective: replicas on the CPU device (threads of one process) all-reduce their
//! gradients, and the run follows the single-device run of the same global batch.

use std::sync::atomic::AtomicBool;

use burn::tensor::backend::Device as _;
use ember_model::Transformer;
use ember_training::{
    AdamWConfig, CosineSchedule, DataParallelSettings, InMemoryData, PARAMETERS_FILE,
    ParameterFileStore, Precision, TrainError, TrainSettings, read_f32_tensors, save_parameters,
    train,
};

mod common;

use common::{B, BLOCK};

const BATCH: usize = 4;

fn model() -> Transformer<B> {
    common::transformer(16, 2, 2, 1, 32)
}

fn data() -> InMemoryData {
    common::cyclic_data(BATCH)
}

fn settings(run_dir: &std::path::Path, replicas: usize) -> TrainSettings {
    let cpu = burn::tensor::Device::<B>::default().to_id();
    TrainSettings {
        batch_size: BATCH,
        block_size: BLOCK,
        grad_accum_steps: 2,
        max_steps: 6,
        time_limit: None,
        schedule: CosineSchedule {
            peak: 1e-2,
            floor: 1e-3,
            warmup_steps: 2,
            total_steps: 6,
        },
        optimizer: AdamWConfig::default(),
        grad_clip: 1.0,
        log_interval: 1,
        eval_interval: 100,
        checkpoint_interval: 100,
        patience: None,
        precision: Precision::F32,
        checkpoint_activations: false,
        data_parallel: DataParallelSettings {
            devices: vec![cpu; replicas],
            nodes: None,
        },
        run_dir: run_dir.to_path_buf(),
        resume: false,
        config: serde_json::Value::Null,
    }
}

/// Parameter values by name, sorted by name.
type Parameters = Vec<(String, Vec<f32>)>;

/// Every tensor of a parameters file, in name order.
fn read_parameters(path: &std::path::Path) -> Parameters {
    read_f32_tensors(path).unwrap().into_iter().collect()
}

/// Trains 6 steps and returns the losses, the initial parameters and the final ones.
fn run(replicas: usize) -> (Vec<f64>, Parameters, Parameters) {
    let dir = tempfile::tempdir().unwrap();
    let initial = dir.path().join("initial.safetensors");
    save_parameters(&model(), &initial).unwrap();
    let summary = train(
        model(),
        &mut data(),
        &ParameterFileStore::<B>::new(),
        &settings(dir.path(), replicas),
        &mut (),
        &AtomicBool::new(false),
    )
    .unwrap();
    (
        summary.losses,
        read_parameters(&initial),
        read_parameters(&dir.path().join("last").join(PARAMETERS_FILE)),
    )
}

fn max_difference(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

#[test]
fn replicas_follow_the_single_device_run_of_the_same_global_batch() {
    let (single_losses, initial, single) = run(1);
    assert_eq!(single_losses.len(), 6);
    // The run moved the model, so equal parameters below are not the trivial case of no update.
    let moved = initial
        .iter()
        .zip(&single)
        .map(|((_, a), (_, b))| max_difference(a, b))
        .fold(0f32, f32::max);
    assert!(
        moved > 1e-3,
        "training did not move the parameters ({moved})"
    );
    for replicas in [2, 4] {
        let (losses, _, params) = run(replicas);
        // Each replica's loss is the mean over its shard and the all-reduce averages them: the same mean over the
        // batch, summed in another order. f32 rounding of ~1e-7 relative per step, compounded by AdamW over 6 steps
        // on O(1) values, stays far below 1e-4; a wrong reduction (a sum instead of the mean, a dropped shard)
        // changes the first update by the order of the learning rate (1e-3 and more).
        assert_eq!(losses.len(), single_losses.len());
        for (step, (a, b)) in single_losses.iter().zip(&losses).enumerate() {
            assert!(
                (a - b).abs() < 1e-4,
                "{replicas} replicas, step {step}: loss {b} vs single-device {a}"
            );
        }
        assert_eq!(params.len(), single.len());
        for ((name, a), (other, b)) in single.iter().zip(&params) {
            assert_eq!(name, other);
            let max = max_difference(a, b);
            assert!(max < 1e-4, "{replicas} replicas: `{name}` differs by {max}");
        }
    }
}

#[test]
fn a_batch_that_does_not_split_evenly_names_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let err = train(
        model(),
        &mut data(),
        &ParameterFileStore::<B>::new(),
        &settings(dir.path(), 3),
        &mut (),
        &AtomicBool::new(false),
    )
    .unwrap_err();
    assert!(matches!(err, TrainError::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("training.batch_size"), "{err}");
    assert!(
        err.to_string().contains("3 data-parallel replicas"),
        "{err}"
    );
}

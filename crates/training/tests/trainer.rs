//! The training loop on a tiny bigram model: exact resume, accumulation, clipping, early stopping, outputs.

use std::sync::atomic::{AtomicBool, Ordering};

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, Param};
use burn::tensor::backend::Backend;
use burn::tensor::module::embedding;
use burn::tensor::{Int, Tensor, TensorData};
use ember_training::{
    AdamWConfig, BoxError, CosineSchedule, DataParallelSettings, Gradients, InMemoryData, Observer,
    ParameterFileStore, Precision, StepReport, StopReason, TrainData, TrainSettings,
    TrainableModel, TrainerState, cross_entropy, inputs_and_targets, read_metrics, train,
};

type B = Autodiff<Flex>;

const VOCAB: usize = 16;
const BATCH: usize = 4;
const BLOCK: usize = 8;

const WIDTH: usize = 12;

/// Embedding, then a biased projection back to the vocabulary.
#[derive(Module, Debug)]
struct Bigram<B: Backend> {
    embed: Param<Tensor<B, 2>>,
    proj_weight: Param<Tensor<B, 2>>,
    proj_bias: Param<Tensor<B, 1>>,
}

impl<B: Backend> TrainableModel<B> for Bigram<B> {
    fn logits(&self, tokens: Tensor<B, 2, Int>) -> Result<Tensor<B, 3>, BoxError> {
        let hidden = embedding(self.embed.val(), tokens);
        Ok(hidden.matmul(self.proj_weight.val().unsqueeze())
            + self.proj_bias.val().unsqueeze::<3>())
    }
}

/// Deterministic weights (burn's initialisers draw from a process-wide generator that parallel tests share).
fn weights<const D: usize>(shape: [usize; D], salt: u64) -> Param<Tensor<B, D>> {
    let n: usize = shape.iter().product();
    let values: Vec<f32> = (0..n as u64)
        .map(|i| ((i * 7919 + salt * 104729) % 1000) as f32 / 1000.0 * 0.4 - 0.2)
        .collect();
    Param::from_tensor(Tensor::from_data(
        TensorData::new(values, shape),
        &Default::default(),
    ))
}

fn model() -> Bigram<B> {
    Bigram {
        embed: weights([VOCAB, WIDTH], 1),
        proj_weight: weights([WIDTH, VOCAB], 2),
        proj_bias: weights([VOCAB], 3),
    }
}

/// A noisy cyclic sequence: token i is followed by i+1 most of the time, so a bigram model can learn it.
fn corpus(len: usize, salt: u64) -> Vec<u32> {
    (0..len as u64)
        .map(|i| {
            let noise = (i.wrapping_mul(2654435761).wrapping_add(salt) >> 7) % 5 == 0;
            ((i + u64::from(noise) * 3) % VOCAB as u64) as u32
        })
        .collect()
}

fn data(seed: u64) -> InMemoryData {
    InMemoryData::new(corpus(4000, 1), corpus(600, 2), BATCH, BLOCK, 4, 1.0, seed).unwrap()
}

fn settings(run_dir: &std::path::Path, max_steps: usize) -> TrainSettings {
    TrainSettings {
        batch_size: BATCH,
        block_size: BLOCK,
        grad_accum_steps: 2,
        max_steps,
        time_limit: None,
        schedule: CosineSchedule {
            peak: 3e-2,
            floor: 3e-3,
            warmup_steps: 4,
            total_steps: 40,
        },
        optimizer: AdamWConfig::default(),
        grad_clip: 1.0,
        log_interval: 5,
        eval_interval: 10,
        checkpoint_interval: 10,
        patience: None,
        precision: Precision::F32,
        checkpoint_activations: false,
        data_parallel: Default::default(),
        run_dir: run_dir.to_path_buf(),
        resume: false,
        config: serde_json::json!({"test": true}),
    }
}

#[test]
fn resume_continues_exactly_like_an_uninterrupted_run() {
    let straight_dir = tempfile::tempdir().unwrap();
    let straight = train(
        model(),
        &mut data(5),
        &ParameterFileStore::new(),
        &settings(straight_dir.path(), 40),
        &mut (),
        &AtomicBool::new(false),
    )
    .unwrap();
    assert_eq!(straight.losses.len(), 40);

    let split_dir = tempfile::tempdir().unwrap();
    let first = train(
        model(),
        &mut data(5),
        &ParameterFileStore::new(),
        &settings(split_dir.path(), 20),
        &mut (),
        &AtomicBool::new(false),
    )
    .unwrap();
    let mut resumed_settings = settings(split_dir.path(), 40);
    resumed_settings.resume = true;
    // A fresh model and a data source with another seed: everything must come from the checkpoint.
    let second = train(
        model(),
        &mut data(999),
        &ParameterFileStore::new(),
        &resumed_settings,
        &mut (),
        &AtomicBool::new(false),
    )
    .unwrap();
    let joined: Vec<f64> = first.losses.iter().chain(&second.losses).copied().collect();
    // Bitwise: the same kernels run on the same bits (weights and moments are saved as f32, the data position and
    // schedule step exactly), so any difference means some state was not restored.
    assert_eq!(joined, straight.losses);
    assert_eq!(second.steps, 40);
    assert_eq!(second.best_val_loss, straight.best_val_loss);
    let steps: Vec<usize> = read_metrics(&split_dir.path().join("metrics.jsonl"))
        .unwrap()
        .iter()
        .map(|r| r.step)
        .collect();
    let straight_steps: Vec<usize> = read_metrics(&straight_dir.path().join("metrics.jsonl"))
        .unwrap()
        .iter()
        .map(|r| r.step)
        .collect();
    assert_eq!(
        steps, straight_steps,
        "the resumed metrics log continues the first one without duplicates"
    );
}

#[test]
fn training_lowers_validation_loss_and_writes_run_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let mut data = data(11);
    let initial = model();
    let before = ember_training::validation_loss::<B, _>(&initial, &mut data, BLOCK).unwrap();
    let summary = train(
        initial,
        &mut data,
        &ParameterFileStore::new(),
        &settings(dir.path(), 40),
        &mut (),
        &AtomicBool::new(false),
    )
    .unwrap();
    assert_eq!(summary.stop_reason, StopReason::MaxSteps);
    let best = summary.best_val_loss.unwrap();
    // Uniform guessing over 16 tokens is ln 16 = 2.77 nats and the sequence's entropy is about 0.5 nats (the next
    // token is i+1 80% of the time); 40 steps reach ~1.47. Requiring 40% less than the start leaves margin while an
    // optimizer that does not learn (wrong sign, zero lr) stays near 2.77.
    assert!(best < before * 0.6, "validation loss {before} -> {best}");
    // bytes_per_token = 1, so bits per byte is the loss in bits.
    assert!((summary.best_val_bpb.unwrap() - best / std::f64::consts::LN_2).abs() < 1e-12);
    let records = read_metrics(&dir.path().join("metrics.jsonl")).unwrap();
    let val_steps: Vec<usize> = records
        .iter()
        .filter(|r| r.val_loss.is_some())
        .map(|r| r.step)
        .collect();
    assert_eq!(val_steps, [10, 20, 30, 40]);
    assert_eq!(records.iter().filter(|r| r.loss.is_some()).count(), 8);
    for r in records.iter().filter(|r| r.val_loss.is_some()) {
        assert!((r.val_ppl.unwrap() - r.val_loss.unwrap().exp()).abs() < 1e-9);
    }
    for sub in ["best", "last"] {
        let state = TrainerState::load(&dir.path().join(sub)).unwrap();
        assert!(
            dir.path()
                .join(sub)
                .join(ember_training::PARAMETERS_FILE)
                .exists()
        );
        assert!(
            dir.path()
                .join(sub)
                .join(ember_training::OPTIMIZER_FILE)
                .exists()
        );
        assert_eq!(state.config, serde_json::json!({"test": true}));
    }
    assert_eq!(
        TrainerState::load(&dir.path().join("last")).unwrap().step,
        40
    );
    let png = std::fs::read(dir.path().join("loss.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn accumulated_micro_batches_equal_one_large_batch() {
    let device = Default::default();
    let m = model();
    let mut source = data(21);
    let rows: Vec<u32> = (0..2).flat_map(|_| source.next_batch().unwrap()).collect();
    let half = rows.len() / 2;
    let grads_of = |rows: &[u32], scale: f64| {
        let (inputs, targets) = inputs_and_targets::<B>(rows, BLOCK, &device);
        let loss = cross_entropy(m.logits(inputs).unwrap(), targets).div_scalar(scale);
        Gradients::from_backward(&m, loss.backward())
    };
    let mut accumulated = grads_of(&rows[..half], 2.0);
    accumulated.accumulate(grads_of(&rows[half..], 2.0));
    let big = grads_of(&rows, 1.0);
    assert_eq!(
        accumulated.names().collect::<Vec<_>>(),
        big.names().collect::<Vec<_>>()
    );
    for name in big.names() {
        let a = accumulated
            .get(name)
            .unwrap()
            .clone()
            .into_data()
            .to_vec::<f32>()
            .unwrap();
        let b = big
            .get(name)
            .unwrap()
            .clone()
            .into_data()
            .to_vec::<f32>()
            .unwrap();
        let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let diff = a
            .iter()
            .zip(&b)
            .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
        // Same sums in a different grouping (two means of 32 vs one mean of 64): f32 rounding, ~1e-7 of the scale.
        assert!(
            diff <= 1e-5 * scale.max(1e-3),
            "{name}: max diff {diff} (scale {scale})"
        );
    }
}

#[test]
fn clipping_rescales_to_the_max_norm_and_reports_the_norm_before() {
    let device = Default::default();
    let m = model();
    let (inputs, targets) = inputs_and_targets::<B>(&data(3).next_batch().unwrap(), BLOCK, &device);
    let mut grads = Gradients::from_backward(
        &m,
        cross_entropy(m.logits(inputs).unwrap(), targets)
            .mul_scalar(100.0)
            .backward(),
    );
    let reference: f64 = grads
        .names()
        .map(|n| {
            grads
                .get(n)
                .unwrap()
                .clone()
                .into_data()
                .to_vec::<f32>()
                .unwrap()
        })
        .flat_map(|v| v.into_iter().map(|x| (x as f64) * (x as f64)))
        .sum::<f64>()
        .sqrt();
    let norm = grads.clip_global_norm(0.5);
    // f32 sum of squares of a few hundred values vs the f64 reference: ~1e-6 relative.
    assert!(
        (norm - reference).abs() < 1e-5 * reference,
        "{norm} vs {reference}"
    );
    assert!(
        norm > 0.5,
        "the loss was scaled by 100 so that clipping happens"
    );
    assert!(
        (grads.global_norm() - 0.5).abs() < 1e-5,
        "norm after clipping {}",
        grads.global_norm()
    );
}

#[test]
fn early_stopping_ends_the_run_when_validation_stops_improving() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path(), 40);
    // With a zero learning rate the validation loss never improves after the first pass.
    s.schedule = CosineSchedule {
        peak: 0.0,
        floor: 0.0,
        warmup_steps: 0,
        total_steps: 40,
    };
    s.eval_interval = 2;
    s.patience = Some(3);
    let summary = train(
        model(),
        &mut data(1),
        &ParameterFileStore::new(),
        &s,
        &mut (),
        &AtomicBool::new(false),
    )
    .unwrap();
    assert_eq!(summary.stop_reason, StopReason::EarlyStopping);
    // Evaluations at 2 (best), 4, 6, 8: the third without improvement stops the run.
    assert_eq!(summary.steps, 8);
}

struct InterruptAt<'a>(usize, &'a AtomicBool);

impl Observer for InterruptAt<'_> {
    fn on_step(&mut self, report: &StepReport) {
        if report.step == self.0 {
            self.1.store(true, Ordering::SeqCst);
        }
    }
}

#[test]
fn an_interrupt_writes_a_checkpoint_at_the_current_step() {
    let dir = tempfile::tempdir().unwrap();
    let stop = AtomicBool::new(false);
    let summary = train(
        model(),
        &mut data(1),
        &ParameterFileStore::new(),
        &settings(dir.path(), 40),
        &mut InterruptAt(7, &stop),
        &stop,
    )
    .unwrap();
    assert_eq!(summary.stop_reason, StopReason::Interrupted);
    assert_eq!(summary.steps, 7);
    assert_eq!(
        TrainerState::load(&dir.path().join("last")).unwrap().step,
        7
    );
}

#[test]
fn bf16_is_refused_with_the_config_key() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path(), 4);
    s.precision = Precision::Bf16;
    let err = train(
        model(),
        &mut data(1),
        &ParameterFileStore::new(),
        &s,
        &mut (),
        &AtomicBool::new(false),
    )
    .unwrap_err();
    assert!(err.to_string().contains("training.precision"), "{err}");
}

/// `checkpoint_activations` reaches every micro-batch, on one device and on every data-parallel replica: a model
/// that cannot recompute its blocks (this test's, which keeps `checkpointed_gradients`' default) fails the step
/// with that method's error. (The transformer's checkpointed gradients equal the stored graph's bit for bit, so
/// its runs cannot show whether the flag was used; this one can.)
#[test]
fn checkpoint_activations_routes_every_micro_batch_through_the_model() {
    for replicas in [1, 2] {
        let dir = tempfile::tempdir().unwrap();
        let mut s = settings(dir.path(), 4);
        s.checkpoint_activations = true;
        if replicas > 1 {
            s.data_parallel = DataParallelSettings {
                devices: vec![
                    burn::tensor::backend::Device::to_id(
                        &burn::tensor::Device::<B>::default()
                    );
                    replicas
                ],
                nodes: None,
            };
        }
        let err = train(
            model(),
            &mut data(2),
            &ParameterFileStore::new(),
            &s,
            &mut (),
            &AtomicBool::new(false),
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("cannot recompute its activations"),
            "{replicas} replicas: {err}"
        );
    }
}

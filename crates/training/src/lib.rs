//! ember training: our own AdamW on burn's autodiff gradients, a warm-up + cosine schedule, gradient clipping and
//! accumulation, atomic checkpoints with exact resume, a JSONL metrics log and loss plots, and the training loop.
//!
//! The loop ([`train`]) is generic over the model ([`TrainableModel`] + [`ModelStore`]) and the token stream
//! ([`TrainData`]), so it runs the same on ember-model's transformer and on a two-layer test model.

mod adamw;
mod backprop;
mod chat_data;
mod checkpoint;
mod checkpointing;
mod data_parallel;
mod error;
mod hf_model;
mod interrupt;
mod loss;
mod memory_data;
mod metrics;
mod model_io;
mod params;
mod plot;
mod resident;
mod run_progress;
mod schedule;
mod shard_data;
mod tensor_file;
mod trainer;

pub use adamw::{AdamW, AdamWConfig, DecayPolicy};
pub use backprop::Backprop;
pub use chat_data::ChatData;
pub use checkpoint::{
    OPTIMIZER_FILE, TRAINER_STATE_FILE, TrainerState, resolve_checkpoint, write_atomically,
};
pub use data_parallel::{DataParallel, DataParallelSettings, NodeSettings, ParallelStep};
pub use error::TrainError;
pub use hf_model::{ADAPTER_DIR, HfModelStore};
pub use interrupt::interrupt_flag;
pub use loss::{counted_targets, cross_entropy, inputs_and_targets};
pub use memory_data::InMemoryData;
pub use metrics::{MetricsLog, MetricsRecord, read_metrics};
pub use model_io::{
    BoxError, ModelStore, PARAMETERS_FILE, ParameterFileStore, TrainData, TrainableModel,
};
pub use params::{Gradients, ParamInfo, load_parameters, parameters, save_parameters};
pub use plot::{draw as draw_loss_plot, plot_run};
pub use resident::{parse_status_bytes, peak_rss_bytes};
pub use schedule::CosineSchedule;
pub use shard_data::ShardData;
pub use tensor_file::read_f32_tensors;
pub use trainer::{
    Observer, Precision, StepReport, StopReason, TrainSettings, TrainSummary, train,
    validation_loss,
};

//! What the trainer needs from a model and from its data: small traits, so the loop is testable on tiny models and
//! in-memory corpora, and so ember-model's transformer and ember-dataset's reader plug in without the trainer
//! knowing their types.

use std::marker::PhantomData;
use std::path::Path;

use burn::module::{AutodiffModule, Module};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{FloatDType, Int, Tensor};

use crate::params::{Gradients, load_parameters, save_parameters};

/// A boxed error from a model or data source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A causal language model: next-token logits for every position.
pub trait TrainableModel<B: Backend>: Module<B> {
    /// Logits `[batch, seq, vocab]` for token ids `[batch, seq]`.
    fn logits(&self, tokens: Tensor<B, 2, Int>) -> Result<Tensor<B, 3>, BoxError>;

    /// Mean next-token cross-entropy (nats per token) `[1]` of the logits for `tokens` against `targets`, both
    /// `[batch, seq]`. The default is [`logits`](Self::logits) then [`crate::cross_entropy`]; a model on a
    /// backend with a loss kernel of its own overrides it.
    fn loss(
        &self,
        tokens: Tensor<B, 2, Int>,
        targets: Tensor<B, 2, Int>,
    ) -> Result<Tensor<B, 1>, BoxError> {
        Ok(crate::cross_entropy(self.logits(tokens)?, targets))
    }

    /// The loss of one micro-batch times `weight` (as [`loss`](Self::loss) gives it) and its gradients, with each
    /// block's activations recomputed during the backward pass instead of kept from the forward pass
    /// (`training.checkpoint_activations`). Models that cannot be cut into blocks return an error (the default).
    fn checkpointed_gradients(
        &self,
        tokens: Tensor<B, 2, Int>,
        targets: Tensor<B, 2, Int>,
        weight: f64,
    ) -> Result<(f64, Gradients<B::InnerBackend>), BoxError>
    where
        B: AutodiffBackend,
        Self: AutodiffModule<B> + Sized,
    {
        let _ = (tokens, targets, weight);
        Err(
            "this model cannot recompute its activations block by block \
             (training.checkpoint_activations)"
                .into(),
        )
    }

    /// The same model computing its activations in `dtype` while its parameters stay in f32 (mixed precision),
    /// with f32 logits. Models that cannot return an error (the default).
    fn with_compute_dtype(self, dtype: FloatDType) -> Result<Self, BoxError>
    where
        Self: Sized,
    {
        Err(format!("this model computes in its parameters' precision only, not {dtype:?}").into())
    }
}

/// Saves a model into a checkpoint directory and loads it back (bit-exactly, for `--resume`).
pub trait ModelStore<M> {
    /// Writes the model's files into the existing directory `dir`.
    fn save(&self, model: &M, dir: &Path) -> Result<(), BoxError>;
    /// Loads the weights saved in `dir` into `model` (which has the right architecture).
    fn load(&self, model: M, dir: &Path) -> Result<M, BoxError>;
}

/// File name of [`ParameterFileStore`]'s weights inside a checkpoint directory.
pub const PARAMETERS_FILE: &str = "parameters.safetensors";

/// A model-agnostic store for modules on backend `B`: every float parameter in [`PARAMETERS_FILE`], keyed by
/// module path.
#[derive(Debug, Clone, Copy, Default)]
pub struct ParameterFileStore<B>(PhantomData<B>);

impl<B> ParameterFileStore<B> {
    /// The store.
    pub fn new() -> Self {
        ParameterFileStore(PhantomData)
    }
}

impl<B: Backend, M: Module<B>> ModelStore<M> for ParameterFileStore<B> {
    fn save(&self, model: &M, dir: &Path) -> Result<(), BoxError> {
        Ok(save_parameters(model, &dir.join(PARAMETERS_FILE))?)
    }

    fn load(&self, model: M, dir: &Path) -> Result<M, BoxError> {
        Ok(load_parameters(model, &dir.join(PARAMETERS_FILE))?)
    }
}

/// The token stream the trainer consumes: random training windows and a fixed set of validation windows.
pub trait TrainData {
    /// The next training micro-batch: `batch_size` rows of `block_size + 1` token ids, row-major.
    fn next_batch(&mut self) -> Result<Vec<u32>, BoxError>;
    /// The validation batches, the same on every call, each shaped like a training batch.
    fn validation_batches(&mut self) -> Result<Vec<Vec<u32>>, BoxError>;
    /// Mean UTF-8 bytes of text per token on the validation split (to turn nats/token into bits/byte).
    fn bytes_per_token(&self) -> f64;
    /// The reader's position and random-generator state, serialisable into a checkpoint.
    fn state(&self) -> serde_json::Value;
    /// Restores a position returned by [`TrainData::state`].
    fn restore(&mut self, state: &serde_json::Value) -> Result<(), BoxError>;
}

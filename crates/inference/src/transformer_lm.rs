//! [`LanguageModel`] for ember's [`Transformer`]: a contiguous KV cache, per-row positions and a key padding mask
//! for left-padded batches.

use burn::tensor::{Bool, Int, Tensor, TensorData};
use ember_attention::{ContiguousKvCache, KvCache};
use ember_model::{AttentionBackend, Step, Transformer};

use crate::error::InferenceError;
use crate::model::LanguageModel;

/// A [`Transformer`] on a device, run step by step.
#[derive(Debug)]
pub struct TransformerLm<B: AttentionBackend> {
    model: Transformer<B>,
    device: B::Device,
}

/// The cache of a batch: keys and values of every layer, which positions are padding, and each row's next
/// position (its count of real tokens, so padding does not shift a row's positions).
#[derive(Debug)]
pub struct TransformerState<B: AttentionBackend> {
    cache: ContiguousKvCache<B>,
    /// `[batch][positions]`, `true` = padding.
    padding: Vec<Vec<bool>>,
    next_position: Vec<i64>,
}

impl<B: AttentionBackend> TransformerLm<B> {
    /// Wraps `model`, whose parameters live on `device`.
    pub fn new(model: Transformer<B>, device: B::Device) -> Self {
        Self { model, device }
    }

    /// The wrapped model.
    pub fn model(&self) -> &Transformer<B> {
        &self.model
    }
}

fn model_error(e: impl std::fmt::Display) -> InferenceError {
    InferenceError::Model(e.to_string())
}

impl<B: AttentionBackend> LanguageModel for TransformerLm<B> {
    type State = TransformerState<B>;

    fn context_length(&self) -> usize {
        self.model.spec().context_length
    }

    fn new_state(&self, batch: usize) -> Result<Self::State, InferenceError> {
        Ok(TransformerState {
            cache: ContiguousKvCache::new(self.model.spec().num_layers),
            padding: vec![Vec::new(); batch],
            next_position: vec![0; batch],
        })
    }

    fn state_len(&self, state: &Self::State) -> usize {
        state.cache.len()
    }

    fn step(
        &self,
        state: &mut Self::State,
        tokens: &[Vec<u32>],
        padding: &[Vec<bool>],
    ) -> Result<Vec<Vec<f32>>, InferenceError> {
        let batch = tokens.len();
        let seq = tokens.first().map_or(0, Vec::len);
        let flat: Vec<u32> = tokens.iter().flatten().copied().collect();
        self.model.check_tokens(&flat).map_err(model_error)?;
        let mut positions = Vec::with_capacity(batch * seq);
        for (b, row_pad) in padding.iter().enumerate() {
            for &pad in row_pad {
                // A padding position is never attended to; position 0 keeps it inside every rotary table.
                positions.push(if pad { 0 } else { state.next_position[b] });
                if !pad {
                    state.next_position[b] += 1;
                }
            }
            state.padding[b].extend_from_slice(row_pad);
        }
        let any_padding = state.padding.iter().flatten().any(|&p| p);
        let ids = TensorData::new(
            flat.iter().map(|&t| i64::from(t)).collect::<Vec<_>>(),
            [batch, seq],
        );
        let tokens = Tensor::<B, 2, Int>::from_data(ids, &self.device);
        let step = if any_padding {
            let total = state.padding[0].len();
            let mask: Vec<bool> = state.padding.iter().flatten().copied().collect();
            Step {
                cache: Some(&mut state.cache as &mut dyn KvCache<B>),
                positions: Some(Tensor::from_data(
                    TensorData::new(positions, [batch, seq]),
                    &self.device,
                )),
                key_padding: Some(Tensor::<B, 2, Bool>::from_data(
                    TensorData::new(mask, [batch, total]),
                    &self.device,
                )),
            }
        } else {
            // Without padding every row's positions continue from the cache length, the model's default.
            Step {
                cache: Some(&mut state.cache as &mut dyn KvCache<B>),
                positions: None,
                key_padding: None,
            }
        };
        let logits = self.model.forward_last(tokens, step).map_err(model_error)?;
        let [_, vocab] = logits.dims();
        let last: Vec<f32> = logits
            .into_data()
            .convert::<f32>()
            .into_vec()
            .map_err(|e| model_error(format!("{e:?}")))?;
        Ok(last.chunks(vocab).map(<[f32]>::to_vec).collect())
    }
}

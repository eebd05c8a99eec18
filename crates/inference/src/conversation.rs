//! A multi-turn conversation that keeps its KV cache between turns, so each turn only runs its new tokens.

use ember_tokenizer::Tokenizer;

use crate::error::InferenceError;
use crate::generate::{Generation, GenerationConfig, run};
use crate::model::Decoder;
use crate::sampling::{Sampler, SamplingConfig};

/// One sequence (batch of one) whose cache grows turn by turn.
pub struct Conversation<M: Decoder> {
    state: M::State,
    /// Every token of the conversation so far, for penalties.
    history: Vec<u32>,
    /// The last generated token, which was sampled but not yet run through the model.
    pending: Option<u32>,
    sampler: Sampler,
}

impl<M: Decoder> Conversation<M> {
    /// An empty conversation sampling with `sampling` (one random stream across all turns); a setting out of
    /// range is [`InferenceError::InvalidSampling`].
    pub fn new(model: &M, sampling: &SamplingConfig) -> Result<Self, InferenceError> {
        let sampler = Sampler::try_new(sampling)?;
        Ok(Self {
            state: model.new_state(1)?,
            history: Vec::new(),
            pending: None,
            sampler,
        })
    }

    /// Tokens of the conversation so far (prompts and replies).
    pub fn history(&self) -> &[u32] {
        &self.history
    }

    /// Appends `tokens` (the next user turn, already templated) and generates the reply. Only the new tokens are
    /// run through the model. Truncation is not possible mid-conversation: a turn that does not fit is an error.
    pub fn turn(
        &mut self,
        model: &M,
        tokens: &[u32],
        tokenizer: Option<&Tokenizer>,
        config: &GenerationConfig,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation, InferenceError> {
        if tokens.is_empty() {
            return Err(InferenceError::EmptyPrompt { row: 0 });
        }
        let feed: Vec<u32> = self
            .pending
            .iter()
            .copied()
            .chain(tokens.iter().copied())
            .collect();
        let cached = model.state_len(&self.state);
        if cached + feed.len() >= model.context_length() {
            return Err(InferenceError::PromptTooLong {
                row: 0,
                prompt_len: cached + feed.len(),
                context_length: model.context_length(),
            });
        }
        self.history.extend_from_slice(tokens);
        let samplers = std::slice::from_mut(&mut self.sampler);
        let history = vec![self.history.clone()];
        let mut out = run(
            model,
            &mut self.state,
            vec![feed],
            history,
            samplers,
            tokenizer,
            config,
            &mut |_, p| on_text(p),
        )?;
        let mut generation = out.pop().ok_or(InferenceError::NoOutput)?;
        self.history.extend_from_slice(&generation.ids);
        self.pending = generation.ids.last().copied();
        generation.prompt_ids = tokens.to_vec();
        Ok(generation)
    }
}

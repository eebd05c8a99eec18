//! Errors of generation.

use std::sync::Arc;

use ember_model::ModelError;

/// Why text could not be generated.
#[derive(Debug, thiserror::Error)]
pub enum InferenceError {
    /// A prompt does not fit in the model's context window (and truncation was not asked for).
    #[error(
        "prompt {row} has {prompt_len} tokens but the context window holds {context_length} (including at least one \
         generated token); shorten it or truncate from the left (--truncate)"
    )]
    PromptTooLong {
        /// Index of the prompt in the batch.
        row: usize,
        /// Tokens in the prompt (plus earlier conversation turns).
        prompt_len: usize,
        /// The model's context window.
        context_length: usize,
    },
    /// A prompt has no tokens.
    #[error("prompt {row} is empty; generation needs at least one token to condition on")]
    EmptyPrompt {
        /// Index of the prompt in the batch.
        row: usize,
    },
    /// The model refused the input or failed: a token id outside the vocabulary, a sequence past the context
    /// window, a shape or backend error. Match the inner [`ModelError`] for the kind.
    #[error("model: {0}")]
    Model(#[from] ModelError),
    /// The KV cache could not hold the batch (a paged pool out of budget); the source is the pool's
    /// [`ember_optimization::PoolError`], or the attention layer's error when the pool filled up mid-forward.
    #[error("{0}")]
    KvCache(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A sampling setting outside its range (a NaN temperature, a top-p of 0, ...): refused before any token is
    /// generated, since it would otherwise turn the logits into NaN.
    #[error("{0}")]
    InvalidSampling(#[from] crate::sampling::SamplingError),
    /// A perplexity window outside what the model can score.
    #[error(
        "perplexity window of {window} tokens: expected 2 to the model's context length {context_length}"
    )]
    InvalidWindow {
        /// The window asked for.
        window: usize,
        /// The model's context window.
        context_length: usize,
    },
    /// A batch handed to the model breaks the calling convention (a row to keep that does not exist, padding
    /// after a row's tokens in a paged cache).
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    /// The backend could not hand results back.
    #[error("backend: {0}")]
    Backend(String),
    /// A batched model step failed, and with it every request of the batch. Each one gets this same error,
    /// shared, so its kind (an input the model refused, a full KV pool, a backend failure) reaches every client
    /// intact: match [`root`](Self::root) for it. Displays as the step's error.
    #[error(transparent)]
    Step(Arc<InferenceError>),
    /// Generation returned no row for a prompt it was given (a bug, reported instead of a panic).
    #[error("generation returned no output for the conversation")]
    NoOutput,
    /// The tokenizer could not decode a generated id.
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] ember_tokenizer::TokenizerError),
    /// A model path could not be opened or its weights loaded.
    #[error("{}: {message}", path.display())]
    Load {
        /// The model path.
        path: std::path::PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A request needs more KV cache than the whole pool holds, so it could never run.
    #[error(
        "the request needs {needed} positions of KV cache (its prompt plus max tokens) but the pool holds {capacity}; \
         lower the token limit or give the pool a larger budget"
    )]
    KvBudget {
        /// Positions the request may hold.
        needed: usize,
        /// Positions the pool holds.
        capacity: usize,
    },
    /// A chat template failed to parse or render.
    #[error("chat template: {0}")]
    Template(String),
}

impl InferenceError {
    /// The error to match for the kind: the one a failed batch step shared out ([`InferenceError::Step`]), or
    /// this one.
    pub fn root(&self) -> &InferenceError {
        match self {
            Self::Step(step) => step.root(),
            other => other,
        }
    }
}

//! Errors of generation.

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
    /// The model failed (shape or backend error), with its message.
    #[error("model: {0}")]
    Model(String),
    /// The KV cache could not hold the batch (a paged pool out of budget), with its message.
    #[error("{0}")]
    KvCache(String),
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
    /// A chat template failed to parse or render.
    #[error("chat template: {0}")]
    Template(String),
}

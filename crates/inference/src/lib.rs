//! ember inference: turning a causal language model and a tokenizer into text.
//!
//! - [`sampling`]: logits processors (temperature, top-k, top-p, min-p, penalties, bias) and a seeded sampler.
//! - [`generate()`]: batched generation over a KV cache with left padding, EOS and stop strings, streaming text on
//!   UTF-8 boundaries; [`Conversation`] keeps the cache between chat turns.
//! - [`ModelAssets`]: a GGUF file or model directory opened with its tokenizer, template and EOS ids.
//! - [`Scheduler`]: continuous batching over a paged KV pool, with prefix caching and preemption (what
//!   `ember serve` runs).
//! - [`ChatTemplate`]: chat prompts from a model's Jinja template.
//! - [`perplexity()`]: windowed loss, perplexity and bits per byte of held-out text.
//! - [`Decoder`]: what generation needs from a model; [`TransformerLm`] implements it for ember's
//!   transformer.

mod assets;
mod chat;
mod conversation;
mod error;
mod generate;
mod model;
mod perplexity;
mod row;
pub mod sampling;
mod scheduler;
mod stop;
mod transformer_lm;

pub use assets::{ModelAssets, WeightFormat, WeightsFile};
pub use chat::{ChatTemplate, Message};
pub use conversation::Conversation;
pub use error::InferenceError;
pub use generate::{FinishReason, Generation, GenerationConfig, generate};
pub use model::{Decoder, PooledDecoder};
pub use perplexity::{Perplexity, perplexity};
pub use scheduler::{
    Completion, Request, RequestSink, Scheduler, SchedulerConfig, SchedulerStats, TokenLogprob,
};
pub use stop::{StopMatcher, StopStep};
pub use transformer_lm::{KvCacheKind, TransformerLm, TransformerState};

//! What a client hands the [`super::Scheduler`] and what it gets back.

use std::time::Duration;

use crate::error::InferenceError;
use crate::generate::{FinishReason, GenerationConfig};

/// One generation request: a prompt already tokenized (and templated, for a chat) and how to continue it.
#[derive(Clone, Debug)]
pub struct Request {
    /// Prompt ids; at least one, and fewer than the model's context.
    pub prompt: Vec<u32>,
    /// Token limit, sampling, stop strings and EOS ids. `truncate` is ignored: a request that does not fit is
    /// refused, since a server cannot ask the client which end to drop.
    pub config: GenerationConfig,
    /// With `Some(k)`, every generated token's log-probability under the model (before sampling processors) and
    /// the `k` most likely alternatives are reported in the [`Completion`].
    pub top_logprobs: Option<usize>,
}

/// A generated token's log-probability and the most likely alternatives, each `(id, logprob)`.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The generated id.
    pub id: u32,
    /// Its natural-log probability under the model's distribution.
    pub logprob: f32,
    /// The most likely ids at that position, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// A finished request.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    /// Prompt tokens (after the chat template).
    pub prompt_tokens: usize,
    /// Prompt tokens whose K/V came from the prefix cache instead of being run.
    pub cached_tokens: usize,
    /// Generated ids (including a final EOS, or the token that completed a stop string).
    pub ids: Vec<u32>,
    /// Generated text, cut before a stop string.
    pub text: String,
    /// Why generation ended.
    pub finish_reason: FinishReason,
    /// Per generated token, when [`Request::top_logprobs`] asked for them.
    pub logprobs: Option<Vec<TokenLogprob>>,
    /// From submission to the first generated token (queueing and prefill).
    pub time_to_first_token: Duration,
    /// Times the request was preempted (its cache dropped and recomputed later) to make room for others.
    pub preemptions: usize,
}

/// Where the scheduler sends a request's output. Called from the scheduler's thread, between steps.
pub trait RequestSink: Send {
    /// Generated token `id`, with the text that became final with it (often empty: a partial UTF-8 character or
    /// a possible start of a stop string is held back until it is decided), and its log-probability when
    /// [`Request::top_logprobs`] asked for them (`None` for text released at the end without a new token).
    fn token(&mut self, id: u32, text: &str, logprob: Option<&TokenLogprob>);

    /// The request ended: its completion, or why it failed. Called once; no call follows.
    fn finish(&mut self, result: Result<Completion, InferenceError>);

    /// Whether the client has gone: a cancelled request leaves the batch at the next step and its blocks are
    /// freed. [`finish`](Self::finish) is not called for it.
    fn cancelled(&self) -> bool;
}

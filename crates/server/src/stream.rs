//! Streamed responses: server-sent events in OpenAI's chunk format, ending with `data: [DONE]`.
//!
//! The stream owns the request's event channel, so a client that disconnects drops it and the scheduler cancels
//! the request at its next step.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::Stream;
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

use ember_inference::TokenLogprob;
use ember_tokenizer::Tokenizer;

use crate::engine::Event;
use crate::error::ApiError;
use crate::response::{self, Endpoint, ResponseMeta, finish_reason, logprobs_json, usage};

struct State {
    meta: ResponseMeta,
    events: UnboundedReceiver<Event>,
    pending: Option<Event>,
    out: VecDeque<SseEvent>,
    done: bool,
    tokenizer: Arc<Tokenizer>,
    /// Log-probabilities of tokens whose text has not been sent yet (held back partial characters or possible
    /// stop strings): they go with the next chunk that has text, or the last.
    held: Vec<TokenLogprob>,
    /// Bytes of text sent so far (a completion's `text_offset`s continue from it).
    sent: usize,
}

impl State {
    fn chunk(&mut self, delta_text: Option<&str>, role: bool, finish: Option<&str>) -> SseEvent {
        let logprobs = if self.held.is_empty() {
            Value::Null
        } else {
            let held = std::mem::take(&mut self.held);
            logprobs_json(self.meta.endpoint, &held, &self.tokenizer, self.sent)
        };
        self.sent += delta_text.map_or(0, str::len);
        let choice = response::chunk_choice(self.meta.endpoint, delta_text, role, logprobs, finish);
        self.data(json!([choice]), None)
    }

    fn data(&self, choices: Value, usage: Option<Value>) -> SseEvent {
        SseEvent::default().data(response::chunk(&self.meta, choices, usage).to_string())
    }

    /// Turns the next event of the request into chunks.
    fn push(&mut self, event: Option<Event>) {
        match event {
            Some(Event::Token { text, logprob, .. }) => {
                self.held.extend(logprob);
                if !text.is_empty() {
                    let chunk = self.chunk(Some(&text), false, None);
                    self.out.push_back(chunk);
                }
            }
            Some(Event::Done(Ok(c))) => {
                let last = self.chunk(None, false, Some(finish_reason(c.finish_reason)));
                self.out.push_back(last);
                if self.meta.include_usage {
                    let usage = self.data(json!([]), Some(usage(&c, c.prompt_tokens)));
                    self.out.push_back(usage);
                }
                self.end();
            }
            Some(Event::Done(Err(e))) => {
                let error = ApiError::from_inference(&e, self.meta.endpoint.prompt_param());
                self.out
                    .push_back(SseEvent::default().data(error.body().to_string()));
                self.end();
            }
            None => {
                let error = ApiError::worker_failed();
                self.out
                    .push_back(SseEvent::default().data(error.body().to_string()));
                self.end();
            }
        }
    }

    fn end(&mut self) {
        self.out.push_back(SseEvent::default().data("[DONE]"));
        self.done = true;
    }
}

/// The event stream of one request whose first event is `first`.
pub(crate) fn events(
    meta: ResponseMeta,
    first: Event,
    events: UnboundedReceiver<Event>,
    tokenizer: Arc<Tokenizer>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let mut state = State {
        meta,
        events,
        pending: Some(first),
        out: VecDeque::new(),
        done: false,
        tokenizer,
        held: Vec::new(),
        sent: 0,
    };
    // The first chunk names the role, as OpenAI's do.
    let opening = match state.meta.endpoint {
        Endpoint::Chat => state.chunk(Some(""), true, None),
        Endpoint::Completion => state.chunk(Some(""), false, None),
    };
    state.out.push_back(opening);
    let stream = futures_util::stream::unfold(state, |mut state| async move {
        loop {
            if let Some(event) = state.out.pop_front() {
                return Some((Ok(event), state));
            }
            if state.done {
                return None;
            }
            let next = match state.pending.take() {
                Some(event) => Some(event),
                None => state.events.recv().await,
            };
            state.push(next);
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

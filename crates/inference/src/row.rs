//! One sequence's output as it is generated: ids, text released on UTF-8 and stop-string boundaries, and why it
//! stopped. Shared by batch generation ([`crate::generate()`]) and the continuous-batching [`crate::Scheduler`],
//! so both end rows by the same rules.

use std::time::Instant;

use ember_tokenizer::{StreamDecoder, Tokenizer};

use crate::error::InferenceError;
use crate::generate::{FinishReason, GenerationConfig};
use crate::stop::StopMatcher;

/// The output of one sequence so far.
pub(crate) struct Row<'t> {
    /// What penalties look at: the prompt (and earlier turns) and every generated id.
    pub history: Vec<u32>,
    /// The prompt as run.
    pub prompt_ids: Vec<u32>,
    /// Generated ids (including a final EOS, or the token that completed a stop string).
    pub ids: Vec<u32>,
    /// Text released so far, cut before a stop string.
    pub text: String,
    decoder: Option<StreamDecoder<'t>>,
    stops: StopMatcher,
    /// Why the row stopped, once it has.
    pub finish: Option<FinishReason>,
    pub first_token_at: Option<Instant>,
    pub last_token_at: Option<Instant>,
}

impl<'t> Row<'t> {
    /// A row about to generate after `prompt_ids`; `history` is what penalties see (it includes the prompt).
    pub fn new(
        prompt_ids: Vec<u32>,
        history: Vec<u32>,
        tokenizer: Option<&'t Tokenizer>,
        config: &GenerationConfig,
    ) -> Self {
        Self {
            history,
            prompt_ids,
            ids: Vec::new(),
            text: String::new(),
            decoder: tokenizer.map(StreamDecoder::new),
            stops: StopMatcher::new(config.stop.iter().cloned()),
            finish: (config.max_new_tokens == 0).then_some(FinishReason::Length),
            first_token_at: None,
            last_token_at: None,
        }
    }

    /// Records generated token `id` and decides whether the row is done; text that became final goes to
    /// `on_text`.
    pub fn accept(
        &mut self,
        id: u32,
        config: &GenerationConfig,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<(), InferenceError> {
        let now = Instant::now();
        self.first_token_at.get_or_insert(now);
        self.last_token_at = Some(now);
        self.ids.push(id);
        self.history.push(id);
        if config.eos.contains(&id) {
            self.finish = Some(FinishReason::Eos);
            self.flush(on_text);
            return Ok(());
        }
        if let Some(decoder) = &mut self.decoder {
            let piece = decoder.push(id)?;
            let step = self.stops.push(&piece);
            self.emit(&step.emit, on_text);
            if step.stopped {
                self.finish = Some(FinishReason::Stop);
                return Ok(());
            }
        }
        if self.ids.len() >= config.max_new_tokens {
            self.finish(FinishReason::Length, on_text);
        }
        Ok(())
    }

    /// Ends the row for `reason` (the context is full, say), releasing the text held back.
    pub fn finish(&mut self, reason: FinishReason, on_text: &mut dyn FnMut(&str)) {
        self.finish = Some(reason);
        self.flush(on_text);
    }

    fn emit(&mut self, piece: &str, on_text: &mut dyn FnMut(&str)) {
        if !piece.is_empty() {
            self.text.push_str(piece);
            on_text(piece);
        }
    }

    /// Releases text held back by the UTF-8 decoder and the stop matcher once the row is finished.
    fn flush(&mut self, on_text: &mut dyn FnMut(&str)) {
        if let Some(decoder) = self.decoder.take() {
            let tail = decoder.finish();
            let mut rest = self.stops.push(&tail).emit;
            rest.push_str(&self.stops.finish());
            self.emit(&rest, on_text);
        }
    }
}

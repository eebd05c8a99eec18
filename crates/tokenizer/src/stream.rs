//! Incremental decoding for generation: bytes are held back until they form complete UTF-8 characters.

use crate::error::Result;
use crate::tokenizer::Tokenizer;

/// Decodes one token at a time, emitting text only at UTF-8 character boundaries, so a character split across
/// tokens (common for emoji and CJK in byte-level vocabularies) is printed once, whole.
#[derive(Debug)]
pub struct StreamDecoder<'t> {
    tokenizer: &'t Tokenizer,
    pending: Vec<u8>,
    at_start: bool,
}

impl<'t> StreamDecoder<'t> {
    /// A decoder at the start of a text.
    pub fn new(tokenizer: &'t Tokenizer) -> Self {
        Self {
            tokenizer,
            pending: Vec::new(),
            at_start: true,
        }
    }

    /// Adds one token; returns the text that became complete (possibly empty). Bytes that can never be valid
    /// UTF-8 are emitted as U+FFFD, as [`Tokenizer::decode`] does.
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.pending
            .extend_from_slice(self.tokenizer.token_bytes(id)?);
        if self.at_start && !self.pending.is_empty() {
            self.at_start = false;
            if self.tokenizer.strips_leading_space() && self.pending[0] == b' ' {
                self.pending.remove(0);
            }
        }
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(
                        std::str::from_utf8(&self.pending[..valid]).expect("checked valid prefix"),
                    );
                    match e.error_len() {
                        // An incomplete character at the end: wait for the next token.
                        None => {
                            self.pending.drain(..valid);
                            break;
                        }
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Ends the text: whatever incomplete character is left becomes U+FFFD.
    pub fn finish(self) -> String {
        String::from_utf8_lossy(&self.pending).into_owned()
    }
}

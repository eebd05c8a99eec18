//! Pre-tokenization: splitting normalized text into the "words" BPE runs on. The patterns of GPT-2, cl100k /
//! LLaMA-3 and Qwen2 run as hand-written state machines (`machines.rs`); any other pattern a `tokenizer.json`
//! declares runs through `fancy-regex`.

mod class;
mod machines;

pub use class::{CharClass, classify};

use crate::error::{Result, TokenizerError};

/// GPT-2's pattern (also GPT-NeoX, SmolLM, and HF's `ByteLevel` pre-tokenizer with `use_regex`).
pub const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// GPT-2's pattern as tiktoken writes it for `gpt2` / `r50k_base` (same matches as [`GPT2_PATTERN`]).
pub const R50K_PATTERN: &str =
    r"'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s";
/// LLaMA-3's pattern (cl100k's, as written in LLaMA-3's `tokenizer.json`).
pub const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// cl100k's pattern as tiktoken writes it (possessive quantifiers; same matches as [`LLAMA3_PATTERN`]).
pub const CL100K_PATTERN: &str = r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";
/// Qwen2's pattern: cl100k's with single digits.
pub const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// One splitting step.
#[derive(Debug, Clone)]
pub enum Splitter {
    /// GPT-2's pattern, hand-written.
    Gpt2,
    /// The cl100k family, hand-written; `max_digits` is 3 for cl100k / LLaMA-3 and 1 for Qwen2.
    Cl100k {
        /// Longest run of digits in one piece.
        max_digits: usize,
    },
    /// Any other pattern; both the matches and the text between them become pieces (HF's `Isolated`).
    Regex(Box<fancy_regex::Regex>),
    /// Every occurrence of the character starts a new piece (HF `Metaspace` with `split`, which splits on `▁`
    /// with the `MergedWithNext` behaviour).
    BeforeChar(char),
}

impl Splitter {
    /// The splitter for `pattern`: a hand-written machine when the pattern is one of the known ones, else a regex.
    pub fn from_pattern(pattern: &str) -> Result<Self> {
        Ok(match pattern {
            GPT2_PATTERN | R50K_PATTERN => Self::Gpt2,
            LLAMA3_PATTERN | CL100K_PATTERN => Self::Cl100k { max_digits: 3 },
            QWEN2_PATTERN => Self::Cl100k { max_digits: 1 },
            _ => Self::regex(pattern)?,
        })
    }

    /// A regex splitter for `pattern`, even when a hand-written machine exists (the reference in tests).
    pub fn regex(pattern: &str) -> Result<Self> {
        let re = fancy_regex::Regex::new(pattern).map_err(|e| TokenizerError::Pattern {
            pattern: pattern.to_owned(),
            message: e.to_string(),
        })?;
        Ok(Self::Regex(Box::new(re)))
    }

    /// Calls `f` on each piece of `text`, in order; the pieces concatenate to `text`.
    pub fn split<'a>(&self, text: &'a str, f: &mut impl FnMut(&'a str)) {
        match self {
            Self::Gpt2 => split_with(text, f, machines::gpt2_match),
            Self::Cl100k { max_digits } => {
                let max_digits = *max_digits;
                split_with(text, f, |t, i| machines::cl100k_match(t, i, max_digits));
            }
            Self::BeforeChar(c) => {
                let mut last = 0;
                for (i, _) in text.match_indices(*c) {
                    if i > last {
                        f(&text[last..i]);
                        last = i;
                    }
                }
                if last < text.len() {
                    f(&text[last..]);
                }
            }
            Self::Regex(re) => {
                let mut last = 0;
                for m in re.find_iter(text) {
                    // A regex error here is fancy-regex's backtrack limit; the rest of the text stays one piece.
                    let Ok(m) = m else { break };
                    if m.start() > last {
                        f(&text[last..m.start()]);
                    }
                    if m.end() > m.start() {
                        f(m.as_str());
                    }
                    last = m.end();
                }
                if last < text.len() {
                    f(&text[last..]);
                }
            }
        }
    }

    /// The pieces of `text` as a vector (convenience for tests and tools).
    pub fn pieces<'a>(&self, text: &'a str) -> Vec<&'a str> {
        let mut out = Vec::new();
        self.split(text, &mut |p| out.push(p));
        out
    }
}

fn split_with<'a>(
    text: &'a str,
    f: &mut impl FnMut(&'a str),
    next_end: impl Fn(&str, usize) -> usize,
) {
    let mut i = 0;
    while i < text.len() {
        let end = next_end(text, i);
        debug_assert!(end > i, "a pre-tokenizer match is never empty");
        f(&text[i..end]);
        i = end;
    }
}

impl Splitter {
    /// Whether `self` and `other` split every text alike because they are the same step (the same machine, or
    /// regexes of the same pattern text).
    pub(crate) fn same_as(&self, other: &Splitter) -> bool {
        match (self, other) {
            (Self::Gpt2, Self::Gpt2) => true,
            (Self::Cl100k { max_digits: a }, Self::Cl100k { max_digits: b }) => a == b,
            (Self::Regex(a), Self::Regex(b)) => a.as_str() == b.as_str(),
            (Self::BeforeChar(a), Self::BeforeChar(b)) => a == b,
            _ => false,
        }
    }
}

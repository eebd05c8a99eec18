//! Normalizers and the Metaspace transform, applied to each piece of text between added tokens.

use std::borrow::Cow;

use unicode_normalization::UnicodeNormalization;

/// One normalization step (HF `normalizer` types, plus the text side of the `Metaspace` pre-tokenizer).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Normalize {
    /// Unicode NFC.
    Nfc,
    /// Unicode NFKC.
    Nfkc,
    /// Prepends the string to every non-empty piece (HF `Prepend`, LLaMA-2's legacy `▁`).
    Prepend(String),
    /// Replaces every occurrence of a literal string (HF `Replace` with a `String` pattern).
    Replace(String, String),
    /// HF `Metaspace`: spaces become `replacement`, which is also prepended (per `prepend`) unless the piece
    /// already starts with it.
    Metaspace {
        /// The space marker, `▁`.
        replacement: char,
        /// When to prepend it.
        prepend: Prepend,
    },
}

/// When Metaspace prepends its marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Prepend {
    /// Every piece.
    Always,
    /// Only the piece at the very start of the input.
    First,
    /// Never.
    Never,
}

impl Normalize {
    /// Applies the step to `text`, a piece starting at byte `offset` of the original input.
    pub fn apply<'a>(&self, text: Cow<'a, str>, offset: usize) -> Cow<'a, str> {
        match self {
            Self::Nfc => Cow::Owned(text.nfc().collect()),
            Self::Nfkc => Cow::Owned(text.nfkc().collect()),
            Self::Prepend(p) if !text.is_empty() => Cow::Owned(format!("{p}{text}")),
            Self::Prepend(_) => text,
            Self::Replace(from, to) if text.contains(from.as_str()) => {
                Cow::Owned(text.replace(from.as_str(), to))
            }
            Self::Replace(..) => text,
            Self::Metaspace {
                replacement,
                prepend,
            } => {
                let mut out = String::with_capacity(text.len() + 3);
                let wants = match prepend {
                    Prepend::Always => true,
                    Prepend::First => offset == 0,
                    Prepend::Never => false,
                };
                if wants && !text.starts_with([' ', *replacement]) {
                    out.push(*replacement);
                }
                for c in text.chars() {
                    out.push(if c == ' ' { *replacement } else { c });
                }
                Cow::Owned(out)
            }
        }
    }
}

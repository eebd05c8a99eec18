//! Added tokens (special and control tokens such as `<|endoftext|>` or `<s>`), matched in the raw text before
//! normalization and BPE: leftmost match first, the longest token on ties.

/// A piece of input: text for the BPE pipeline, or an added token's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Segment {
    /// Bytes `start..end` of the input.
    Text(usize, usize),
    /// An added token.
    Token(u32),
}

/// One added token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddedToken {
    /// Its text.
    pub content: String,
    /// Its id.
    pub id: u32,
    /// Whether it is a special (control) token rather than an ordinary added word.
    pub special: bool,
}

/// The set of added tokens with an index by first byte.
#[derive(Debug, Clone, Default)]
pub(crate) struct AddedVocab {
    pub tokens: Vec<AddedToken>,
    /// Indices into `tokens` by first byte, longest first.
    by_first_byte: Vec<Vec<usize>>,
}

impl AddedVocab {
    pub fn new(mut tokens: Vec<AddedToken>) -> Self {
        tokens.retain(|t| !t.content.is_empty());
        let mut by_first_byte = vec![Vec::new(); 256];
        for (i, t) in tokens.iter().enumerate() {
            by_first_byte[usize::from(t.content.as_bytes()[0])].push(i);
        }
        for list in &mut by_first_byte {
            list.sort_by_key(|&i| std::cmp::Reverse(tokens[i].content.len()));
        }
        Self {
            tokens,
            by_first_byte,
        }
    }

    /// Splits `text` into text pieces and added tokens; special tokens only when `special` is set (ordinary
    /// added words are always matched, as Hugging Face's `split_special_tokens` and llama.cpp's
    /// `parse_special = false` do).
    pub fn split(&self, text: &str, special: bool, out: &mut Vec<Segment>) {
        let bytes = text.as_bytes();
        let mut last = 0;
        let mut i = 0;
        if !self.tokens.is_empty() {
            while i < bytes.len() {
                let found = self.by_first_byte[usize::from(bytes[i])]
                    .iter()
                    .map(|&k| &self.tokens[k])
                    .filter(|t| special || !t.special)
                    .find(|t| bytes[i..].starts_with(t.content.as_bytes()));
                match found {
                    Some(t) => {
                        if i > last {
                            out.push(Segment::Text(last, i));
                        }
                        out.push(Segment::Token(t.id));
                        i += t.content.len();
                        last = i;
                    }
                    None => i += 1,
                }
            }
        }
        if bytes.len() > last {
            out.push(Segment::Text(last, bytes.len()));
        }
    }
}

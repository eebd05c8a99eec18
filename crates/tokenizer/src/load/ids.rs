//! Checks on token ids read from a file, made before anything is sized by them: an id is an index into tables
//! of one entry per id, so an id far beyond what the file defines (2^31 in a 10-token vocabulary) would size a
//! table of billions of entries and abort, and an id that does not fit `u32` would wrap onto another token.

use std::path::Path;

use rustc_hash::FxHashMap;

use crate::added::AddedToken;
use crate::error::{Result, TokenizerError};

/// An added token as read from a file, before its id is known to fit.
pub(crate) struct RawAdded {
    /// Where it was read, e.g. `added_tokens[3]`.
    pub source: String,
    pub content: String,
    pub id: u64,
    pub special: bool,
}

/// The exclusive upper bound of ids in a file defining `defined` tokens (vocabulary entries plus added tokens,
/// which may fill holes the vocabulary leaves): every id is distinct, so a larger one is a hole nothing fills,
/// and refusing it keeps every id table no longer than the file's own list of tokens. Capped at `u32::MAX`,
/// the largest id type the tokenizer has.
pub(crate) fn id_limit(defined: usize) -> u64 {
    (defined as u64).min(u64::from(u32::MAX))
}

/// Vocabulary strings by id from `token -> id` pairs (ids below `limit`, each used once); ids the vocabulary
/// skips are empty strings, which never match.
pub(crate) fn dense_tokens(
    vocab: impl IntoIterator<Item = (String, u64)>,
    limit: u64,
    path: &Path,
    key: &str,
) -> Result<Vec<String>> {
    let pairs: Vec<(String, u64)> = vocab.into_iter().collect();
    for (token, id) in &pairs {
        if *id >= limit {
            return Err(out_of_range(path, &format!("{key}[{token:?}]"), *id, limit));
        }
    }
    // Every id is below `limit`, which is at most the number of tokens the file lists: this is bounded.
    let len = pairs
        .iter()
        .map(|(_, id)| *id as usize + 1)
        .max()
        .unwrap_or(0);
    let mut tokens: Vec<Option<String>> = vec![None; len];
    for (token, id) in pairs {
        let slot = &mut tokens[id as usize];
        if let Some(prev) = slot {
            return Err(TokenizerError::malformed(
                path,
                format!("{key}: id {id} is used by both {prev:?} and {token:?}"),
            ));
        }
        *slot = Some(token);
    }
    Ok(tokens.into_iter().map(Option::unwrap_or_default).collect())
}

fn out_of_range(path: &Path, what: &str, id: u64, limit: u64) -> TokenizerError {
    TokenizerError::malformed(
        path,
        format!(
            "{what} has id {id}, out of range: the file defines {limit} tokens, so ids must be below {limit}"
        ),
    )
}

/// Whether an added token may spell a vocabulary entry that has another id.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum SameText {
    /// No (`tokenizer.json`: HF warns and gives the token the vocabulary's id instead of the file's).
    Refuse,
    /// Yes (tiktoken: special tokens live apart from the ranks, and win when both match).
    Allow,
}

/// Checks added tokens against each other and the vocabulary `tokens` (strings by id) and converts their ids:
/// each id below `limit`, content non-empty, no id or content given twice, and an id the vocabulary already
/// uses only for the same string (an added token that re-lists a vocabulary entry is common; one that
/// replaces a different entry would make encode and decode disagree about that id).
pub(crate) fn check_added(
    added: Vec<RawAdded>,
    tokens: &[String],
    limit: u64,
    same_text: SameText,
    path: &Path,
) -> Result<Vec<AddedToken>> {
    let bad = |m: String| TokenizerError::malformed(path, m);
    let vocab_ids: FxHashMap<&str, usize> = match same_text {
        SameText::Refuse => tokens
            .iter()
            .enumerate()
            .filter(|(_, t)| !t.is_empty())
            .map(|(i, t)| (t.as_str(), i))
            .collect(),
        SameText::Allow => FxHashMap::default(),
    };
    let mut by_id: FxHashMap<u64, &str> = FxHashMap::default();
    let mut by_content: FxHashMap<&str, &str> = FxHashMap::default();
    for t in &added {
        if t.id >= limit {
            return Err(out_of_range(path, &t.source, t.id, limit));
        }
        if t.content.is_empty() {
            return Err(bad(format!("{}.content is empty", t.source)));
        }
        if let Some(prev) = by_id.insert(t.id, &t.source) {
            return Err(bad(format!(
                "{} and {prev} both have id {}",
                t.source, t.id
            )));
        }
        if let Some(prev) = by_content.insert(&t.content, &t.source) {
            return Err(bad(format!(
                "{} and {prev} both are {:?}",
                t.source, t.content
            )));
        }
        if let Some(existing) = tokens.get(t.id as usize).filter(|s| !s.is_empty())
            && *existing != t.content
        {
            return Err(bad(format!(
                "{} ({:?}) has id {}, which the vocabulary gives to {existing:?}",
                t.source, t.content, t.id
            )));
        }
        if same_text == SameText::Refuse
            && let Some(&other) = vocab_ids.get(t.content.as_str())
            && other as u64 != t.id
        {
            return Err(bad(format!(
                "{} ({:?}) has id {}, but the vocabulary gives it id {other}",
                t.source, t.content, t.id
            )));
        }
    }
    Ok(added
        .into_iter()
        .map(|t| AddedToken {
            content: t.content,
            // Below `limit`, which is at most u32::MAX.
            id: t.id as u32,
            special: t.special,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(content: &str, id: u64) -> RawAdded {
        RawAdded {
            source: format!("added[{content}]"),
            content: content.into(),
            id,
            special: true,
        }
    }

    #[test]
    fn dense_tokens_refuses_ids_beyond_the_file_and_reused_ids() {
        let p = Path::new("v.json");
        let ok = dense_tokens([("a".into(), 0), ("c".into(), 2)], 3, p, "vocab").unwrap();
        assert_eq!(ok, ["a", "", "c"]);
        let err = dense_tokens([("a".into(), 1 << 31)], 1, p, "vocab").unwrap_err();
        assert!(err.to_string().contains("2147483648"), "{err}");
        let err = dense_tokens([("a".into(), 0), ("b".into(), 0)], 2, p, "vocab").unwrap_err();
        assert!(err.to_string().contains("id 0 is used by both"), "{err}");
    }

    #[test]
    fn added_tokens_must_agree_with_the_vocabulary_and_each_other() {
        let p = Path::new("t.json");
        let vocab = ["a".to_string(), "b".to_string()];
        let check = |added, same| check_added(added, &vocab, 4, same, p);
        assert!(check(vec![raw("a", 0), raw("<s>", 2)], SameText::Refuse).is_ok());
        // tiktoken's specials may spell a rank's bytes; nothing else relaxes.
        assert!(check(vec![raw("a", 2)], SameText::Allow).is_ok());
        assert!(check(vec![raw("<s>", 1)], SameText::Allow).is_err());
        for (case, added) in [
            ("wrapped id", vec![raw("<s>", (1 << 32) + 1)]),
            ("beyond the file", vec![raw("<s>", 1 << 31)]),
            ("replaces b", vec![raw("<s>", 1)]),
            ("a elsewhere", vec![raw("a", 2)]),
            ("empty", vec![raw("", 2)]),
            ("same id", vec![raw("<s>", 2), raw("</s>", 2)]),
            ("same content", vec![raw("<s>", 2), raw("<s>", 3)]),
        ] {
            assert!(check(added, SameText::Refuse).is_err(), "{case}");
        }
    }
}

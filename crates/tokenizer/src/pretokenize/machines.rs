//! Hand-written matchers for the known pre-tokenization patterns. Each function returns the end of the match the
//! regex would find at byte offset `i` (leftmost-first alternation, greedy quantifiers, with backtracking where
//! the pattern needs it); the patterns cover every character, so a match always exists and the text splits into
//! consecutive matches.

use super::class::{CharClass, classify};

#[inline]
fn char_at(text: &str, i: usize) -> Option<char> {
    text.get(i..).and_then(|s| s.chars().next())
}

/// End of the maximal run of characters of class `class` starting at `i` (the char at `i` is assumed to match).
#[inline]
fn run_of(text: &str, i: usize, class: CharClass) -> usize {
    let bytes = text.as_bytes();
    let mut j = i;
    while j < bytes.len() {
        let b = bytes[j];
        if b < 128 {
            if classify(char::from(b)) != class {
                break;
            }
            j += 1;
        } else {
            let c = char_at(text, j).expect("j is on a char boundary");
            if classify(c) != class {
                break;
            }
            j += c.len_utf8();
        }
    }
    j
}

/// End of `[\r\n]*` starting at `i`.
fn newlines_from(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() && matches!(bytes[i], b'\r' | b'\n') {
        i += 1;
    }
    i
}

/// `\s+(?!\S)|\s+` at `i`, where the char at `i` is whitespace: the whole run if it reaches the end of the text,
/// otherwise the run minus its last character (so that character can prefix the next word), but at least one char.
fn whitespace_tail(text: &str, i: usize, run_end: usize) -> usize {
    if run_end == text.len() {
        return run_end;
    }
    let last_start = text[..run_end]
        .char_indices()
        .next_back()
        .map_or(i, |(p, _)| p);
    if last_start > i { last_start } else { run_end }
}

/// Length of the contraction after an apostrophe at `i` (`'s|'t|'re|'ve|'m|'ll|'d`), if any. With
/// `ignore_case`, letters match case-insensitively under Unicode simple case folding, where `s` also matches
/// U+017F LATIN SMALL LETTER LONG S.
fn contraction(text: &str, i: usize, ignore_case: bool) -> Option<usize> {
    let rest = &text.as_bytes()[i + 1..];
    let fold = |b: u8| {
        if ignore_case {
            b.to_ascii_lowercase()
        } else {
            b
        }
    };
    let first = *rest.first()?;
    if ignore_case && rest.starts_with("ſ".as_bytes()) {
        return Some(1 + 2);
    }
    match fold(first) {
        b's' | b't' | b'm' | b'd' => Some(2),
        b'r' | b'v' if rest.get(1).map(|&b| fold(b)) == Some(b'e') => Some(3),
        b'l' if rest.get(1).map(|&b| fold(b)) == Some(b'l') => Some(3),
        _ => None,
    }
}

/// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
pub fn gpt2_match(text: &str, i: usize) -> usize {
    let c = char_at(text, i).expect("i < text.len()");
    if c == '\''
        && let Some(n) = contraction(text, i, false)
    {
        return i + n;
    }
    let class = classify(c);
    if c == ' ' {
        if let Some(next) = char_at(text, i + 1) {
            let next_class = classify(next);
            if next_class != CharClass::Space {
                return run_of(text, i + 1, next_class);
            }
        }
    } else if class != CharClass::Space {
        return run_of(text, i, class);
    }
    whitespace_tail(text, i, run_of(text, i, CharClass::Space))
}

/// The cl100k / LLaMA-3 family (`max_digits` = 3) and Qwen2 (`max_digits` = 1):
/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}| ?[^\s\p{L}\p{N}]+[\r\n]*|
/// \s*[\r\n]+|\s+(?!\S)|\s+`.
pub fn cl100k_match(text: &str, i: usize, max_digits: usize) -> usize {
    let bytes = text.as_bytes();
    let c = char_at(text, i).expect("i < text.len()");
    if c == '\''
        && let Some(n) = contraction(text, i, true)
    {
        return i + n;
    }
    let class = classify(c);
    if class == CharClass::Letter {
        return run_of(text, i, CharClass::Letter);
    }
    let after = i + c.len_utf8();
    if class != CharClass::Number
        && c != '\r'
        && c != '\n'
        && let Some(next) = char_at(text, after)
        && classify(next) == CharClass::Letter
    {
        return run_of(text, after, CharClass::Letter);
    }
    if class == CharClass::Number {
        let mut j = i;
        for _ in 0..max_digits {
            match char_at(text, j) {
                Some(d) if classify(d) == CharClass::Number => j += d.len_utf8(),
                _ => break,
            }
        }
        return j;
    }
    if c == ' '
        && let Some(next) = char_at(text, after)
        && classify(next) == CharClass::Other
    {
        return newlines_from(bytes, run_of(text, after, CharClass::Other));
    }
    if class == CharClass::Other {
        return newlines_from(bytes, run_of(text, i, CharClass::Other));
    }
    let run_end = run_of(text, i, CharClass::Space);
    if let Some(last_newline) = bytes[i..run_end]
        .iter()
        .rposition(|&b| matches!(b, b'\r' | b'\n'))
    {
        return i + last_newline + 1;
    }
    whitespace_tail(text, i, run_end)
}

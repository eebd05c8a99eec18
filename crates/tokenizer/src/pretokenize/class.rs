//! Character classes used by the known pre-tokenization patterns: `\p{L}`, `\p{N}` and `\s`.
//!
//! The tables come from `regex-syntax`, the same Unicode data the `regex`/`fancy-regex` engines (and therefore
//! tiktoken) use, so the hand-written state machines classify every code point exactly as the regex does.

use std::sync::OnceLock;

use regex_syntax::hir::{Class, HirKind};

/// The class of one character as the pre-tokenization patterns see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CharClass {
    /// `\p{L}`.
    Letter,
    /// `\p{N}`.
    Number,
    /// `\s` (Unicode `White_Space`).
    Space,
    /// Anything else: `[^\s\p{L}\p{N}]`.
    Other,
}

struct Table {
    ascii: [CharClass; 128],
    /// Sorted, disjoint ranges of non-ASCII code points that are not `Other`.
    ranges: Vec<(u32, u32, CharClass)>,
}

fn ranges_of(pattern: &str) -> Vec<(u32, u32)> {
    let hir = regex_syntax::Parser::new()
        .parse(pattern)
        .expect("built-in class pattern parses");
    match hir.kind() {
        HirKind::Class(Class::Unicode(cls)) => cls
            .ranges()
            .iter()
            .map(|r| (u32::from(r.start()), u32::from(r.end())))
            .collect(),
        other => unreachable!("{pattern} parsed to {other:?}, not a Unicode class"),
    }
}

fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut ranges = Vec::new();
        for (pattern, class) in [
            (r"\p{L}", CharClass::Letter),
            (r"\p{N}", CharClass::Number),
            (r"\s", CharClass::Space),
        ] {
            ranges.extend(ranges_of(pattern).into_iter().map(|(a, b)| (a, b, class)));
        }
        ranges.sort_unstable_by_key(|r| r.0);
        let mut ascii = [CharClass::Other; 128];
        for (cp, slot) in ascii.iter_mut().enumerate() {
            *slot = lookup(&ranges, cp as u32);
        }
        ranges.retain(|r| r.1 >= 128);
        Table { ascii, ranges }
    })
}

fn lookup(ranges: &[(u32, u32, CharClass)], cp: u32) -> CharClass {
    let i = ranges.partition_point(|r| r.1 < cp);
    match ranges.get(i) {
        Some(&(start, _, class)) if start <= cp => class,
        _ => CharClass::Other,
    }
}

/// The class of `c`.
#[inline]
pub fn classify(c: char) -> CharClass {
    let t = table();
    let cp = c as u32;
    if cp < 128 {
        t.ascii[cp as usize]
    } else {
        lookup(&t.ranges, cp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_agree_with_regex_crate_on_every_code_point() {
        let letter = fancy_regex::Regex::new(r"^\p{L}$").unwrap();
        let number = fancy_regex::Regex::new(r"^\p{N}$").unwrap();
        let space = fancy_regex::Regex::new(r"^\s$").unwrap();
        // Every 7th code point keeps the test quick while touching every block.
        for c in (0..0x11_0000u32).step_by(7).filter_map(char::from_u32) {
            let s = c.to_string();
            let expected = if letter.is_match(&s).unwrap() {
                CharClass::Letter
            } else if number.is_match(&s).unwrap() {
                CharClass::Number
            } else if space.is_match(&s).unwrap() {
                CharClass::Space
            } else {
                CharClass::Other
            };
            assert_eq!(classify(c), expected, "U+{:04X}", c as u32);
        }
    }
}

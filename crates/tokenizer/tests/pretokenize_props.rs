//! The hand-written pre-tokenizers against `fancy-regex` running the original patterns.

use ember_tokenizer::pretokenize::{
    CL100K_PATTERN, GPT2_PATTERN, LLAMA3_PATTERN, QWEN2_PATTERN, R50K_PATTERN, Splitter,
};
use proptest::prelude::*;

fn assert_same(pattern: &str, text: &str) {
    let machine = Splitter::from_pattern(pattern).unwrap();
    assert!(
        !matches!(machine, Splitter::Regex(_)),
        "{pattern} should have a hand-written machine"
    );
    let reference = Splitter::regex(pattern).unwrap();
    assert_eq!(
        machine.pieces(text),
        reference.pieces(text),
        "pattern {pattern} on {text:?}"
    );
}

const PATTERNS: [&str; 5] = [
    GPT2_PATTERN,
    R50K_PATTERN,
    LLAMA3_PATTERN,
    CL100K_PATTERN,
    QWEN2_PATTERN,
];

/// Strings that exercise every alternative and the lookahead: contractions in both cases (and U+017F, which
/// case-folds to `s`), runs of spaces before words, numbers and punctuation, newlines mixed with spaces and tabs,
/// CJK, combining marks, emoji, non-ASCII digits and whitespace.
const HARD: &[&str] = &[
    "",
    "Hello world",
    "I'm you'll we've they're she'd it's don't I'M YOU'LL WE'VE THEY'RE SHE'D IT'S DON'T 'ſ 'Ll 'rE",
    "   leading and trailing   ",
    "a  b   c    d\t\te\n\nf \n g\r\n\r\nh",
    "x\n\n\n   ",
    "  \n  \n",
    "1234567 12 3 4444 ١٢٣٤٥ ⅣⅤ ½",
    "hello!!! ...what?? (yes) [no] {maybe}\n\n--\n",
    "naïve café e\u{301}\u{302} ñ",
    "日本語のテキスト 中文 한국어",
    "emoji 🦀🦀 👨‍👩‍👧 🏳️‍🌈!",
    "tab\tsep\u{a0}nbsp\u{3000}ideographic\u{2028}line",
    "'''' ' s 's'",
    "!@#$%^&*()_+-=`~",
    "a'sb 'sup 'lll 'ree",
    " ?! \n?!\n\n .\r\n",
];

#[test]
fn hand_written_machines_match_regex_on_hard_strings() {
    for pattern in PATTERNS {
        for text in HARD {
            assert_same(pattern, text);
        }
    }
}

fn text_strategy() -> impl Strategy<Value = String> {
    // Mostly characters from the classes that matter, so that interesting boundaries are frequent.
    let pieces = prop_oneof![
        Just(" ".to_owned()),
        Just("  ".to_owned()),
        Just("\n".to_owned()),
        Just("\r\n".to_owned()),
        Just("\t".to_owned()),
        Just("'".to_owned()),
        Just("'s".to_owned()),
        Just("'LL".to_owned()),
        "[a-zA-Z]{1,4}",
        "[0-9]{1,5}",
        "[!-/:-@]{1,3}",
        "\\PC{1,3}",
        any::<char>().prop_map(String::from),
    ];
    proptest::collection::vec(pieces, 0..24).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn hand_written_machines_match_regex_on_random_text(text in text_strategy()) {
        for pattern in PATTERNS {
            assert_same(pattern, &text);
        }
    }
}

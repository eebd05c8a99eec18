//! The pre-tokenizer of a GGUF byte-level (`gpt2`) vocabulary, chosen by `tokenizer.ggml.pre`. GGUF files carry
//! the pre-tokenizer only as a name (llama.cpp's converter hashes the Hugging Face tokenizer's output to pick
//! it), so each name maps to the splitting steps of that model's `tokenizer.json`: one pattern, or HF's
//! `Sequence` of `Split(..., Isolated)` steps, each applied to the pieces of the one before. An unknown name is an
//! error naming it: falling back to GPT-2's pattern would tokenize silently differently from the model's training.

use crate::error::Result;
use crate::pretokenize::Splitter;

/// How the text of a `gpt2` GGUF vocabulary is split before BPE.
pub(crate) struct Pretokenizer {
    /// The splitting steps, in order.
    pub splitters: Vec<Splitter>,
    /// Whether a piece that is itself a token skips the merges (HF's `ignore_merges`, the LLaMA-3 family).
    pub ignore_merges: bool,
    /// Whether a sequence starts with BOS when the file has no `tokenizer.ggml.add_bos_token` (llama.cpp's
    /// default: the LLaMA-3 family and Tekken do, other byte-level vocabularies do not).
    pub add_bos: bool,
}

/// The `tokenizer.ggml.pre` names this crate reads, for the error naming an unknown one.
pub(crate) const SUPPORTED: &[&str] = &[
    "default",
    "gpt-2",
    "mpt",
    "olmo",
    "phi-2",
    "llama-bpe",
    "llama3",
    "llama-v3",
    "dbrx",
    "smaug-bpe",
    "qwen2",
    "deepseek-r1-qwen",
    "stablelm2",
    "qwen35",
    "smollm",
    "starcoder",
    "refact",
    "command-r",
    "codeshell",
    "exaone",
    "deepseek-llm",
    "deepseek-coder",
    "falcon",
    "tekken",
    "bloom",
    "gpt3-finnish",
    "poro-chat",
    "viking",
];

/// DeepSeek LLM's letters: Latin, Greek, Cyrillic, Armenian, Georgian and other cased scripts (its
/// `tokenizer.json` lists the ranges rather than using `\p{L}`, so CJK letters fall to the next step).
const DEEPSEEK_LLM_LETTERS: &str = "A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃";
/// ASCII and full-width punctuation, quotation marks and CJK punctuation, with an optional leading space.
const DEEPSEEK_LLM_PUNCTUATION: &str = "\\s?[!-/:-~！-／：-～‘-‟\u{3000}-。]+";
/// CJK ideographs, other CJK blocks up to U+4E00, and Hangul syllables: one piece per run.
const CJK: &str = "一-龥ࠀ-一가-\u{D7FF}";
/// Tekken (Mistral NeMo and later): cased words split before an upper-case letter that follows lower-case ones.
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen 3.5: Qwen2's pattern with combining marks kept in words.
const QWEN35: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// BLOOM and its descendants: a word is anything up to whitespace or sentence punctuation.
const BLOOM: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";

/// The pre-tokenizer named `pre` (`None`: the file names none, read as GPT-2's, which llama.cpp's converter
/// writes as `gpt-2` for models with the original byte-level pattern), or `None` for an unknown name.
pub(crate) fn pretokenizer(pre: Option<&str>) -> Result<Option<Pretokenizer>> {
    let regex = Splitter::regex;
    let (splitters, ignore_merges) = match pre.unwrap_or("default") {
        "default" | "gpt-2" | "gpt2" | "mpt" | "olmo" | "phi-2" => (vec![Splitter::Gpt2], false),
        "llama-bpe" | "llama3" | "llama-v3" | "dbrx" | "smaug-bpe" => {
            (vec![Splitter::Cl100k { max_digits: 3 }], true)
        }
        "qwen2" | "deepseek-r1-qwen" | "stablelm2" => {
            (vec![Splitter::Cl100k { max_digits: 1 }], false)
        }
        "qwen35" => (vec![regex(QWEN35)?], false),
        // Digits isolated one by one, then GPT-2's pattern (HF: `Digits(individual)` + `ByteLevel`).
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" => {
            (vec![regex(r"\p{N}")?, Splitter::Gpt2], false)
        }
        "deepseek-llm" => (
            vec![
                regex(r"[\r\n]")?,
                regex(&format!(r"\s?[{DEEPSEEK_LLM_LETTERS}]+"))?,
                regex(DEEPSEEK_LLM_PUNCTUATION)?,
                regex(r"\s+$")?,
                regex(&format!("[{CJK}]+"))?,
                regex(r"\p{N}+")?,
            ],
            false,
        ),
        "deepseek-coder" => (
            vec![
                regex(r"[\r\n]")?,
                regex(r"\s?\p{L}+")?,
                regex(r"\s?\p{P}+")?,
                regex(&format!("[{CJK}]+"))?,
                regex(r"\p{N}")?,
            ],
            false,
        ),
        // HF: `Punctuation(contiguous)`, `ByteLevel` (GPT-2's pattern), `Digits`, then runs of three digits.
        "falcon" => (
            vec![
                regex(r"[\p{P}\$\+<=>\^~\|`]+")?,
                Splitter::Gpt2,
                regex("[0-9][0-9][0-9]")?,
            ],
            false,
        ),
        "tekken" => (vec![regex(TEKKEN)?], true),
        "bloom" | "gpt3-finnish" | "poro-chat" => (vec![regex(BLOOM)?], false),
        "viking" => (vec![regex(BLOOM)?, regex(r"\p{N}")?], false),
        _ => return Ok(None),
    };
    Ok(Some(Pretokenizer {
        splitters,
        // The two families whose merges are skipped for whole-token pieces are also the two that add BOS.
        add_bos: ignore_merges,
        ignore_merges,
    }))
}

/// One `tokenizer.ggml.pre` name for each distinct pre-tokenizer [`pretokenizer`] builds, the name llama.cpp's
/// converter writes for its best-known model.
const CANONICAL: &[&str] = &[
    "gpt-2",
    "llama-bpe",
    "qwen2",
    "qwen35",
    "smollm",
    "deepseek-llm",
    "deepseek-coder",
    "falcon",
    "tekken",
    "bloom",
    "viking",
];

/// The `tokenizer.ggml.pre` name whose pre-tokenizer is exactly `splitters` with `ignore_merges`, if llama.cpp
/// has one: the inverse of [`pretokenizer`], for writing a byte-level vocabulary to GGUF.
pub(crate) fn name_of(splitters: &[Splitter], ignore_merges: bool) -> Option<&'static str> {
    CANONICAL.iter().copied().find(|&name| {
        pretokenizer(Some(name)).ok().flatten().is_some_and(|pre| {
            pre.ignore_merges == ignore_merges
                && pre.splitters.len() == splitters.len()
                && pre
                    .splitters
                    .iter()
                    .zip(splitters)
                    .all(|(a, b)| a.same_as(b))
        })
    })
}

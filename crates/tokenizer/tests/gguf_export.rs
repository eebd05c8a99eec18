//! Byte-level tokenizers written as GGUF vocabularies (`Tokenizer::to_gguf_vocab`, what `ember export` puts in a
//! GGUF file) and read back (`Tokenizer::from_gguf_vocab`, the path llama.cpp-converted files take): the rebuilt
//! tokenizer gives HF `tokenizers`' ids on every fixture text and on all of Tiny Shakespeare. Layouts GGUF cannot
//! hold are refused, saying what.

mod common;

use common::{corpus, fixture, fixture_json, id_lists, strings};
use ember_tokenizer::Tokenizer;
use unicode_normalization::UnicodeNormalization;

/// Each byte-level fixture with the `tokenizer.ggml.pre` name its pre-tokenizer has in llama.cpp, and whether
/// its `tokenizer.json` normalizes to NFC.
const BYTE_LEVEL: [(&str, &str, bool); 3] = [
    ("ours_trained", "gpt-2", false),
    ("qwen2_style", "qwen2", true),
    ("llama3_style", "llama-bpe", false),
];

#[test]
fn byte_level_tokenizers_survive_the_gguf_vocabulary() {
    for (name, pre, nfc) in BYTE_LEVEL {
        let original = Tokenizer::from_path(fixture(&format!("{name}.tokenizer.json"))).unwrap();
        let vocab = original.to_gguf_vocab().unwrap();
        assert_eq!(vocab.model, "gpt2", "{name}");
        assert_eq!(vocab.pre.as_deref(), Some(pre), "{name}");
        assert_eq!(vocab.tokens.len(), original.vocab_size(), "{name}");
        assert_eq!(vocab.token_types.len(), vocab.tokens.len(), "{name}");
        for added in original.added_tokens() {
            let ty = vocab.token_types[added.id as usize];
            assert_eq!(ty, if added.special { 3 } else { 4 }, "{name}: {added:?}");
        }
        let rebuilt = Tokenizer::from_gguf_vocab(vocab).unwrap();
        let fx = fixture_json(&format!("{name}.ids.json"));
        for (text, expected) in strings(&fx["strings"]).iter().zip(id_lists(&fx["ids"])) {
            // GGUF cannot carry Qwen 2's NFC normalizer (llama.cpp's converter drops it too): the file's
            // tokenizer gives the original's ids on text already in NFC, which is what a caller must pass.
            let text: String = if nfc {
                text.nfc().collect()
            } else {
                text.clone()
            };
            assert_eq!(rebuilt.encode(&text).unwrap(), expected, "{name}: {text:?}");
        }
        let text = corpus();
        assert_eq!(
            rebuilt.encode(&text).unwrap(),
            original.encode(&text).unwrap(),
            "{name}: Tiny Shakespeare"
        );
        assert_eq!(rebuilt.bos_id(), original.bos_id(), "{name}");
        assert_eq!(rebuilt.eos_id(), original.eos_id(), "{name}");
        assert_eq!(rebuilt.adds_special(), original.adds_special(), "{name}");
    }
}

/// SentencePiece-style vocabularies go in as llama.cpp's `llama` model, whose merges follow from token scores
/// (crates/model/tests/gguf_tokenizers.rs writes converted ones). These two were trained by Hugging Face
/// `tokenizers`, one merge per token rather than every split, which scores cannot express: refused, naming a
/// merge, rather than written to tokenize differently.
#[test]
fn sentencepiece_merges_scores_cannot_express_are_refused() {
    for name in ["llama2_style", "mistral_style"] {
        let tok = Tokenizer::from_path(fixture(&format!("{name}.tokenizer.json"))).unwrap();
        let err = tok.to_gguf_vocab().unwrap_err().to_string();
        assert!(
            err.contains("merges scores cannot express") && err.contains("the merge `"),
            "{name}: {err}"
        );
    }
}

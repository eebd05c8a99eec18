//! Tokenizers built from GGUF-style vocabulary arrays, checked against the HF ids of the same vocabularies.

mod common;

use common::{fixture_json, id_lists, strings};
use ember_tokenizer::{GgufVocab, Tokenizer};

/// The arrays a GGUF converter writes for a HF `tokenizer.json`: tokens by id, token types (3 = control for added
/// special tokens, 6 = byte for `<0xNN>`, else 1), merges as `"left right"`, and SentencePiece scores that rank a
/// token formed by merge `r` at `-r` (llama.cpp merges the pair whose concatenation scores highest).
fn gguf_arrays(name: &str, model: &str, pre: Option<&str>) -> GgufVocab {
    let json = fixture_json(&format!("{name}.tokenizer.json"));
    let vocab = json["model"]["vocab"].as_object().unwrap();
    let mut tokens = vec![String::new(); vocab.len()];
    for (t, id) in vocab {
        tokens[id.as_u64().unwrap() as usize] = t.clone();
    }
    let merges: Vec<String> = json["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            serde_json::Value::String(s) => s.clone(),
            pair => format!(
                "{} {}",
                pair[0].as_str().unwrap(),
                pair[1].as_str().unwrap()
            ),
        })
        .collect();
    let mut scores = vec![0.0f32; tokens.len()];
    for (rank, m) in merges.iter().enumerate() {
        let joined = m.replacen(' ', "", 1);
        if let Some(id) = tokens.iter().position(|t| *t == joined) {
            scores[id] = scores[id].min(-(rank as f32) - 1.0);
        }
    }
    let specials: Vec<u64> = json["added_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_u64().unwrap())
        .collect();
    let token_types = (0..tokens.len())
        .map(|i| {
            if specials.contains(&(i as u64)) {
                3
            } else if tokens[i].starts_with("<0x") && tokens[i].len() == 6 {
                6
            } else {
                1
            }
        })
        .collect();
    let id_of = |t: &str| tokens.iter().position(|x| x == t).map(|i| i as u32);
    GgufVocab {
        model: model.into(),
        pre: pre.map(Into::into),
        bos: id_of("<s>"),
        eos: id_of("</s>").or(id_of("<|endoftext|>")),
        unk: id_of("<unk>"),
        tokens,
        scores,
        token_types,
        merges,
        ..GgufVocab::default()
    }
}

fn assert_matches_hf(tok: &Tokenizer, name: &str) {
    let fx = fixture_json(&format!("{name}.ids.json"));
    for (text, expected) in strings(&fx["strings"]).iter().zip(id_lists(&fx["ids"])) {
        assert_eq!(tok.encode(text).unwrap(), expected, "{name}: {text:?}");
    }
}

#[test]
fn gguf_gpt2_model_with_qwen2_pre_matches_hf() {
    let tok =
        Tokenizer::from_gguf_vocab(gguf_arrays("qwen2_style", "gpt2", Some("qwen2"))).unwrap();
    // Qwen2's tokenizer.json also NFC-normalizes; GGUF carries no normalizer, so compare on NFC-stable strings.
    let fx = fixture_json("qwen2_style.ids.json");
    for (text, expected) in strings(&fx["strings"]).iter().zip(id_lists(&fx["ids"])) {
        if text.is_ascii() {
            assert_eq!(tok.encode(text).unwrap(), expected, "{text:?}");
        }
    }
    assert_eq!(tok.eos_id(), tok.token_to_id("<|endoftext|>"));
}

#[test]
fn gguf_llama_model_scores_and_byte_tokens_match_hf_sentencepiece_layout() {
    let tok = Tokenizer::from_gguf_vocab(gguf_arrays("llama2_style", "llama", None)).unwrap();
    assert_matches_hf(&tok, "llama2_style");
    assert_eq!(
        tok.decode(&tok.encode("Hello 🦀 world").unwrap()).unwrap(),
        "Hello 🦀 world"
    );
}

#[test]
fn gguf_vocab_errors_name_the_key() {
    let mut v = gguf_arrays("qwen2_style", "gpt2", Some("qwen2"));
    v.token_types.pop();
    let err = Tokenizer::from_gguf_vocab(v).unwrap_err().to_string();
    assert!(err.contains("tokenizer.ggml.token_type"), "{err}");
    let v = gguf_arrays("qwen2_style", "gpt2", Some("some-new-pre"));
    let err = Tokenizer::from_gguf_vocab(v).unwrap_err().to_string();
    assert!(
        err.contains("tokenizer.ggml.pre") && err.contains("some-new-pre"),
        "{err}"
    );
}

/// `token_ends` must cut the decoded bytes into each token's own bytes, including SentencePiece's first token,
/// whose added prefix space the decoder strips (it covers one byte less).
#[test]
fn token_ends_cut_the_decoded_text_into_each_tokens_bytes() {
    let byte_level =
        Tokenizer::from_gguf_vocab(gguf_arrays("qwen2_style", "gpt2", Some("qwen2"))).unwrap();
    let spm = Tokenizer::from_gguf_vocab(gguf_arrays("llama2_style", "llama", None)).unwrap();
    for tok in [&byte_level, &spm] {
        for text in ["Hello world", "  two spaces\n\nand 12345", "a"] {
            let ids = tok.encode(text).unwrap();
            let ends = tok.token_ends(&ids).unwrap();
            let decoded = tok.decode_bytes(&ids).unwrap();
            assert_eq!(ends.len(), ids.len());
            assert_eq!(*ends.last().unwrap(), decoded.len(), "{text:?}");
            let mut start = 0;
            for (i, &end) in ends.iter().enumerate() {
                assert!(start <= end, "{text:?}: ends go backwards at {i}");
                // The first i + 1 tokens decode to the text up to token i's end.
                let prefix = tok.decode_bytes(&ids[..=i]).unwrap();
                assert_eq!(&decoded[..end], &prefix[..], "{text:?}: token {i}");
                start = end;
            }
        }
    }
}

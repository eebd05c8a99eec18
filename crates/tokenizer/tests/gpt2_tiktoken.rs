//! GPT-2 from `gpt2.tiktoken` against tiktoken's ids (fixture made by scripts/fixtures/tokenizer_fixtures.py).
//! Skips with a message when the rank file has not been fetched.

mod common;

use common::{corpus, fixture_json, fnv1a64, gpt2_ranks, id_lists, strings};
use ember_tokenizer::Tokenizer;

fn gpt2() -> Option<Tokenizer> {
    gpt2_ranks().map(|p| Tokenizer::from_path(p).unwrap())
}

#[test]
fn gpt2_ids_equal_tiktoken_on_hard_strings() {
    let Some(tok) = gpt2() else { return };
    let fx = fixture_json("gpt2_tiktoken.json");
    let texts = strings(&fx["strings"]);
    for ((text, with_special), ordinary) in texts
        .iter()
        .zip(id_lists(&fx["ids"]))
        .zip(id_lists(&fx["ordinary_ids"]))
    {
        assert_eq!(tok.encode(text).unwrap(), with_special, "encode {text:?}");
        assert_eq!(
            tok.encode_ordinary(text).unwrap(),
            ordinary,
            "encode_ordinary {text:?}"
        );
        assert_eq!(
            tok.decode(&with_special).unwrap(),
            *text,
            "round trip {text:?}"
        );
    }
}

#[test]
fn gpt2_ids_equal_tiktoken_on_all_of_tiny_shakespeare() {
    let Some(tok) = gpt2() else { return };
    let fx = &fixture_json("gpt2_tiktoken.json")["shakespeare"];
    let text = corpus();
    let ids = tok.encode_ordinary(&text).unwrap();
    let first: Vec<u32> = fx["first"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(ids[..first.len()], first[..]);
    assert_eq!(ids.len() as u64, fx["count"].as_u64().unwrap());
    assert_eq!(fnv1a64(&ids), fx["fnv1a64"].as_str().unwrap());
    assert_eq!(tok.decode(&ids).unwrap(), text);
}

#[test]
fn gpt2_special_tokens_and_vocab_lookups() {
    let Some(tok) = gpt2() else { return };
    assert_eq!(tok.vocab_size(), 50257);
    assert_eq!(tok.eos_id(), Some(50256));
    assert_eq!(tok.token_to_id("<|endoftext|>"), Some(50256));
    // "Ġthe" (space + "the") is rank 262 in GPT-2's vocabulary.
    assert_eq!(tok.token_to_id("Ġthe"), Some(262));
    assert_eq!(tok.id_to_token(262), Some("Ġthe"));
    assert!(tok.decode(&[50257]).is_err());
}

#[test]
fn gpt2_encode_batch_matches_sequential_encode() {
    let Some(tok) = gpt2() else { return };
    let text = corpus();
    let docs: Vec<&str> = text.split("\n\n").take(400).collect();
    let batch = tok.encode_batch(&docs).unwrap();
    for (doc, ids) in docs.iter().zip(&batch) {
        assert_eq!(&tok.encode(doc).unwrap(), ids);
    }
}

#[test]
fn gpt2_stream_decoder_emits_whole_characters_only() {
    let Some(tok) = gpt2() else { return };
    let text = "emoji 🦀 日本語 e\u{301} done";
    let ids = tok.encode(text).unwrap();
    let mut dec = tok.stream_decoder();
    let mut out = String::new();
    for &id in &ids {
        // Every chunk is valid UTF-8 by type, and must never contain U+FFFD from a split character.
        let chunk = dec.push(id).unwrap();
        assert!(
            !chunk.contains(char::REPLACEMENT_CHARACTER),
            "chunk {chunk:?}"
        );
        out.push_str(&chunk);
    }
    out.push_str(&dec.finish());
    assert_eq!(out, text);
}

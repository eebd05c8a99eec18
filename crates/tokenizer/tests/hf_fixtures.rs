//! Small trained HF tokenizers (SentencePiece/LLaMA-2, Mistral Metaspace, Qwen2, LLaMA-3 layouts, and the one our
//! own trainer writes) against the ids HF `tokenizers` produced for them (scripts/fixtures/tokenizer_fixtures.py).

mod common;

use common::{corpus, fixture, fixture_json, fnv1a64, id_lists, strings};
use ember_tokenizer::Tokenizer;

fn check(name: &str) {
    let tok = Tokenizer::from_path(fixture(&format!("{name}.tokenizer.json"))).unwrap();
    let fx = fixture_json(&format!("{name}.ids.json"));
    let texts = strings(&fx["strings"]);
    let decoded = strings(&fx["decoded"]);
    for ((text, expected), expected_text) in texts.iter().zip(id_lists(&fx["ids"])).zip(&decoded) {
        let ids = tok.encode(text).unwrap();
        assert_eq!(ids, expected, "{name}: encode {text:?}");
        assert_eq!(
            &tok.decode(&ids).unwrap(),
            expected_text,
            "{name}: decode {text:?}"
        );
    }
    let full = tok.encode(&corpus()).unwrap();
    let sh = &fx["shakespeare"];
    let first: Vec<u32> = sh["first"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(
        full[..first.len()],
        first[..],
        "{name}: first ids of Tiny Shakespeare"
    );
    assert_eq!(
        full.len() as u64,
        sh["count"].as_u64().unwrap(),
        "{name}: Tiny Shakespeare token count"
    );
    assert_eq!(
        fnv1a64(&full),
        sh["fnv1a64"].as_str().unwrap(),
        "{name}: Tiny Shakespeare ids hash"
    );
}

#[test]
fn sentencepiece_llama2_layout_matches_hf() {
    check("llama2_style");
}

#[test]
fn sentencepiece_metaspace_mistral_layout_matches_hf() {
    check("mistral_style");
}

#[test]
fn byte_level_qwen2_layout_matches_hf() {
    check("qwen2_style");
}

#[test]
fn byte_level_llama3_layout_with_ignore_merges_matches_hf() {
    check("llama3_style");
}

#[test]
fn tokenizer_trained_by_us_gives_the_ids_hf_gives_for_it() {
    check("ours_trained");
}

#[test]
fn llama2_layout_uses_byte_fallback_for_unseen_characters() {
    let tok = Tokenizer::from_path(fixture("llama2_style.tokenizer.json")).unwrap();
    let ids = tok.encode("🦀").unwrap();
    // "▁" is a learned token; the crab is not, so it becomes its four UTF-8 bytes as <0xNN> tokens.
    let pieces: Vec<&str> = ids.iter().map(|&i| tok.id_to_token(i).unwrap()).collect();
    assert_eq!(pieces, ["▁", "<0xF0>", "<0x9F>", "<0xA6>", "<0x80>"]);
    assert_eq!(tok.bos_id(), tok.token_to_id("<s>"));
    assert_eq!(tok.eos_id(), tok.token_to_id("</s>"));
}

#[test]
fn special_tokens_can_be_treated_as_plain_text() {
    let tok = Tokenizer::from_path(fixture("qwen2_style.tokenizer.json")).unwrap();
    let marker = tok.token_to_id("<|im_start|>").unwrap();
    assert_eq!(tok.encode("<|im_start|>").unwrap(), [marker]);
    let plain = tok.encode_ordinary("<|im_start|>").unwrap();
    assert!(!plain.contains(&marker) && plain.len() > 1, "{plain:?}");
    assert_eq!(tok.decode(&plain).unwrap(), "<|im_start|>");
}

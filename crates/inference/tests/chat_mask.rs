//! Chat fine-tuning's loss mask against transformers' `return_assistant_tokens_mask` on SmolLM2-135M-Instruct's
//! tokenizer and chat template (fixture written by scripts/fixtures/chat_mask_fixtures.py). Skipped, with a
//! message, when scripts/fetch_smollm2.sh has not been run.

use std::path::PathBuf;

use ember_inference::{Message, ModelAssets};
use serde_json::Value;

fn manifest_dir() -> PathBuf {
    PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
}

fn gguf_path() -> Option<PathBuf> {
    let path = manifest_dir().join("../../.cache/assets/SmolLM2-135M-Instruct.Q4_1.gguf");
    if path.is_file() {
        Some(path)
    } else {
        eprintln!(
            "SKIP: {} is absent; run scripts/fetch_smollm2.sh",
            path.display()
        );
        None
    }
}

/// Every conversation of the fixture (multi-turn, a system prompt, non-ASCII text, a reply that starts with a
/// newline, an empty reply): ember's rendering, ids and mask equal transformers' exactly (integers: no
/// tolerance).
#[test]
fn assistant_mask_matches_transformers() {
    let Some(path) = gguf_path() else { return };
    let fixture: Value = serde_json::from_str(
        &std::fs::read_to_string(manifest_dir().join("tests/fixtures/chat_mask.json")).unwrap(),
    )
    .unwrap();
    let assets = ModelAssets::open(&path).unwrap();
    let tokenizer = assets.tokenizer.as_ref().expect("GGUF vocabulary");
    let template = assets.chat_template.as_ref().expect("GGUF chat template");
    let conversations = fixture["conversations"].as_array().unwrap();
    assert!(conversations.len() >= 4);
    for (i, record) in conversations.iter().enumerate() {
        let messages: Vec<Message> = record["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        let (text, _) = template.render_assistant_spans(&messages).unwrap();
        assert_eq!(
            text,
            record["text"].as_str().unwrap(),
            "conversation {i}: text"
        );
        let (ids, trained) = template.encode_for_training(tokenizer, &messages).unwrap();
        let want_ids: Vec<u32> = record["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let want_mask: Vec<bool> = record["mask"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() == 1)
            .collect();
        assert_eq!(ids, want_ids, "conversation {i}: ids");
        assert_eq!(trained, want_mask, "conversation {i}: assistant mask");
        assert!(
            trained.iter().any(|&t| t),
            "conversation {i}: no reply token"
        );
    }
}

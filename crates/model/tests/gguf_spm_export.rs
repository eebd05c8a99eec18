//! SentencePiece-style `tokenizer.json` files (LLaMA 2's, Mistral's, Gemma's layout) written as GGUF `llama`
//! vocabularies (`Tokenizer::to_gguf_vocab`, what `ember export` puts into a file made from a Hugging Face
//! directory) and read back as llama.cpp reads them, by token scores.
//!
//! The `tokenizer.json` is made here the way Hugging Face's converter makes one from a SentencePiece model (the
//! vocabulary, and as merges every split of each piece into two pieces, pieces in score order), from the 32k
//! LLaMA vocabulary llama.cpp ships for its tokenizer tests (`scripts/fetch_llama_vocabs.sh`). Its ids are
//! checked against Hugging Face's own first: llama.cpp's `.out` file (LLaMA's pipeline) and
//! `fixtures/gemma_spm.json` (Gemma's, no space prefix). Then the GGUF vocabulary written from it must give the
//! same ids on those texts and on all of Tiny Shakespeare. Exact equality: tokenization has no tolerance.

use std::path::{Path, PathBuf};

use ember_model::gguf::{GgufFile, tokenizer_vocab};
use ember_tokenizer::{GgufVocab, Tokenizer};
use serde_json::{Value, json};

const VOCAB_SEPARATOR: &str = "\n__ggml_vocab_test__\n";

fn llama_spm() -> Option<PathBuf> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../.cache/assets/llama-vocab/ggml-vocab-llama-spm.gguf");
    if path.is_file() {
        Some(path)
    } else {
        eprintln!(
            "skipping: {} is absent; run scripts/fetch_llama_vocabs.sh (scripts/test.sh does)",
            path.display()
        );
        None
    }
}

/// llama.cpp's test texts for `gguf` with the ids Hugging Face gives each.
fn llama_cases(gguf: &Path) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(gguf.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(gguf.with_extension("gguf.out")).unwrap();
    let texts: Vec<&str> = inp.split(VOCAB_SEPARATOR).collect();
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    texts
        .into_iter()
        .map(str::to_string)
        .zip(ids)
        .collect::<Vec<_>>()
}

/// `fixtures/gemma_spm.json`: Gemma's Hugging Face pipeline on the same vocabulary.
fn gemma_cases() -> Vec<(String, Vec<u32>)> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gemma_spm.json");
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    fixture["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|case| {
            let ids = case["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            (case["text"].as_str().unwrap().to_string(), ids)
        })
        .collect()
}

/// A `tokenizer.json` as Hugging Face's SentencePiece converter writes it for `vocab` (token types 3 and 6,
/// control and byte, are added tokens and byte fallback; `<unk>` is the unknown token), with `normalizer`.
fn hf_sentencepiece_json(vocab: &GgufVocab, normalizer: Value, strip: usize) -> Vec<u8> {
    let n = vocab.tokens.len();
    let text_piece = |i: usize| !matches!(vocab.token_types[i], 2 | 3 | 6);
    let ids: std::collections::HashMap<&str, usize> = (0..n)
        .filter(|&i| text_piece(i))
        .map(|i| (vocab.tokens[i].as_str(), i))
        .collect();
    let mut order: Vec<usize> = (0..n).filter(|&i| text_piece(i)).collect();
    order.sort_by(|&a, &b| vocab.scores[b].total_cmp(&vocab.scores[a]).then(a.cmp(&b)));
    let mut merges = Vec::new();
    for &id in &order {
        let piece = &vocab.tokens[id];
        for (k, _) in piece.char_indices().skip(1) {
            let (left, right) = piece.split_at(k);
            if ids.contains_key(left) && ids.contains_key(right) {
                merges.push(json!([left, right]));
            }
        }
    }
    let added: Vec<Value> = (0..n)
        .filter(|&i| matches!(vocab.token_types[i], 2 | 3))
        .map(|i| {
            json!({"id": i, "content": vocab.tokens[i], "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let vocab_map: serde_json::Map<String, Value> = vocab
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), json!(i)))
        .collect();
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": strip, "stop": 0}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>",
                  "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": true,
                  "byte_fallback": true, "ignore_merges": false, "vocab": vocab_map, "merges": merges}
    });
    serde_json::to_vec(&tokenizer).unwrap()
}

fn assert_encodes(tokenizer: &Tokenizer, cases: &[(String, Vec<u32>)], what: &str) {
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|(text, expected)| {
            let got = tokenizer.encode_ordinary(text).unwrap();
            (&got != expected)
                .then(|| format!("{text:?}\n  got      {got:?}\n  expected {expected:?}"))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{what}: {} of {} texts differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

fn corpus() -> String {
    std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/tinyshakespeare.txt"),
    )
    .unwrap()
}

#[test]
fn sentencepiece_tokenizer_json_survives_the_gguf_vocabulary() {
    let Some(path) = llama_spm() else { return };
    let file = GgufFile::open(&path).unwrap();
    let source = tokenizer_vocab(&file).unwrap();
    let text = corpus();
    let llama_normalizer = json!({"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u{2581}"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}]});
    let mistral_normalizer = Value::Null;
    let gemma_normalizer =
        json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"});
    let llama = llama_cases(&path);
    assert!(llama.len() >= 30, "only {} cases", llama.len());
    let gemma = gemma_cases();
    for (name, normalizer, prefix, cases) in [
        ("llama", llama_normalizer, true, &llama),
        ("mistral", mistral_normalizer, true, &llama),
        ("gemma", gemma_normalizer, false, &gemma),
    ] {
        let mut json = hf_sentencepiece_json(&source, normalizer, usize::from(prefix));
        if name == "mistral" {
            // Mistral's layout: no normalizer, a Metaspace pre-tokenizer that prepends to the first piece.
            let mut value: Value = serde_json::from_slice(&json).unwrap();
            value["pre_tokenizer"] = json!({"type": "Metaspace", "replacement": "\u{2581}",
                                           "prepend_scheme": "first", "split": false});
            json = serde_json::to_vec(&value).unwrap();
        }
        let hf = Tokenizer::from_hf_json_bytes(&json, Path::new("tokenizer.json")).unwrap();
        // Metaspace does not prepend its marker to text that starts with a space, where LLaMA's `Prepend` (and
        // llama.cpp's space prefix) does: on those texts Mistral's pipeline gives other ids than the `.out`
        // file's, and its GGUF file, as llama.cpp's converter writes it too, gives llama.cpp's.
        let hf_cases: Vec<(String, Vec<u32>)> = cases
            .iter()
            .filter(|(text, _)| name != "mistral" || !text.starts_with(' '))
            .cloned()
            .collect();
        assert_encodes(&hf, &hf_cases, &format!("{name}: the tokenizer.json"));

        let vocab = hf.to_gguf_vocab().unwrap();
        assert_eq!(vocab.model, "llama", "{name}");
        assert_eq!(vocab.add_space_prefix, Some(prefix), "{name}");
        assert_eq!(vocab.unk, Some(0), "{name}");
        assert_eq!(vocab.token_types, source.token_types, "{name}: token types");
        let rebuilt = Tokenizer::from_gguf_vocab(vocab).unwrap();
        assert_encodes(&rebuilt, cases, &format!("{name}: its GGUF vocabulary"));
        assert_eq!(
            rebuilt.encode_ordinary(&text).unwrap(),
            hf.encode_ordinary(&text).unwrap(),
            "{name}: Tiny Shakespeare"
        );
        // Control tokens in text stay whole, as llama.cpp parses them. (Mistral's `first` scheme prepends the
        // space to the text's first piece only; llama.cpp prepends it after every control token too, so text
        // with control tokens inside differs there, as it does for any Mistral GGUF llama.cpp's converter wrote.)
        if name != "mistral" {
            let special = "<s>Hello</s> world<unk>";
            assert_eq!(
                rebuilt.encode(special).unwrap(),
                hf.encode(special).unwrap(),
                "{name}: {special:?}"
            );
        }
    }
}

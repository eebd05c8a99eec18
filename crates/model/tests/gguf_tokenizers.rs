//! Tokenizers read from GGUF files against llama.cpp's tokenizer tests: for each vocabulary llama.cpp ships
//! (`models/ggml-vocab-*.gguf`, fetched by `scripts/fetch_llama_vocabs.sh` from the llama-cpp-python sdist), its
//! `.inp` texts (hard cases: whitespace runs, digits, CJK, emoji, code, apostrophes) must encode to exactly the
//! ids of its `.out` file, which llama.cpp's converter wrote with the model's Hugging Face tokenizer
//! (`encode(text, add_special_tokens=False)`). Exact equality: tokenization has no tolerance.

use std::path::{Path, PathBuf};

use ember_model::gguf::{GgufFile, load_tokenizer, tokenizer_vocab};
use ember_tokenizer::{GgufVocab, Tokenizer};
use serde_json::{Value, json};

fn vocab_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache/assets/llama-vocab")
}

/// The vocabulary file `ggml-vocab-{name}.gguf`, or `None` (with a message saying how to get it) when the
/// assets were not fetched.
fn vocab(name: &str) -> Option<PathBuf> {
    let path = vocab_dir().join(format!("ggml-vocab-{name}.gguf"));
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

/// llama.cpp's test cases of `gguf`: texts separated by `\n__ggml_vocab_test__\n` (each one ends with the
/// separator) and one line of space-separated ids per text.
fn cases(gguf: &std::path::Path) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(gguf.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(gguf.with_extension("gguf.out")).unwrap();
    let texts: Vec<&str> = inp
        .split("\n__ggml_vocab_test__\n")
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .skip_while(|t| t.is_empty())
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(
        texts.len(),
        ids.len(),
        "{}: .inp and .out disagree",
        gguf.display()
    );
    texts.into_iter().map(str::to_string).zip(ids).collect()
}

fn assert_matches_llama_cpp(name: &str) {
    let Some(path) = vocab(name) else { return };
    let tokenizer = load_tokenizer(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
    let cases = cases(&path);
    assert!(cases.len() >= 30, "{name}: only {} cases", cases.len());
    assert_encodes(&tokenizer, &cases, name);
}

macro_rules! llama_cpp_vocab_tests {
    ($($test:ident => $name:literal,)*) => {
        $(
            #[test]
            fn $test() {
                assert_matches_llama_cpp($name);
            }
        )*
    };
}

llama_cpp_vocab_tests! {
    gpt_2 => "gpt-2",
    llama_bpe => "llama-bpe",
    llama_spm => "llama-spm",
    phi_3 => "phi-3",
    qwen2 => "qwen2",
    qwen35 => "qwen35",
    mpt => "mpt",
    starcoder => "starcoder",
    refact => "refact",
    command_r => "command-r",
    deepseek_llm => "deepseek-llm",
    deepseek_coder => "deepseek-coder",
    falcon => "falcon",
}

/// A vocabulary kind ember does not read is an error naming the file and the value, not a silent GPT-2 fallback.
#[test]
fn an_unsupported_vocabulary_kind_is_an_error_naming_it() {
    for (name, value) in [("bert-bge", "\"bert\""), ("gemma-4", "\"gemma4\"")] {
        let Some(path) = vocab(name) else { return };
        let err = load_tokenizer(&path).unwrap_err().to_string();
        assert!(
            err.contains("tokenizer.ggml.model")
                && err.contains(value)
                && err.contains(&*path.to_string_lossy()),
            "{err}"
        );
    }
}

/// BOS/EOS from `tokenizer.ggml.add_bos_token` / `add_eos_token`, with llama.cpp's defaults when absent.
#[test]
fn special_tokens_are_added_as_the_file_declares() {
    for (name, bos) in [
        ("llama-spm", Some(1)),
        ("llama-bpe", Some(128000)),
        ("gpt-2", None),
    ] {
        let Some(path) = vocab(name) else { return };
        let tokenizer = load_tokenizer(&path).unwrap();
        let plain = tokenizer.encode("Hello world").unwrap();
        let with = tokenizer.encode_with_special("Hello world").unwrap();
        let expected: Vec<u32> = bos.into_iter().chain(plain.iter().copied()).collect();
        assert_eq!(with, expected, "{name}");
    }
}

/// Gemma's SentencePiece tokenization, as llama.cpp's converter writes it for Gemma 2 / 3 (`tokenizer.ggml.model`
/// `llama`, `add_space_prefix` false), on llama.cpp's 32k SentencePiece vocabulary (Gemma's own is gated):
/// `fixtures/gemma_spm.json` holds the ids of Gemma's Hugging Face pipeline (normalizer `" " -> "▁"`, no prefix,
/// BPE with byte fallback) for 29 hard texts, from scripts/fixtures/gemma_spm_fixtures.py.
#[test]
fn gemma_sentencepiece_without_a_space_prefix_matches_hugging_face() {
    let Some(path) = vocab("llama-spm") else {
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let mut vocab = tokenizer_vocab(&file).unwrap();
    assert_eq!(
        vocab.add_space_prefix, None,
        "LLaMA's file uses llama.cpp's default"
    );
    vocab.add_space_prefix = Some(false);
    let tokenizer = Tokenizer::from_gguf_vocab(vocab).unwrap();
    assert_matches_fixture(&tokenizer, "gemma_spm.json");
}

/// Mistral's Tekken tokenizer as llama.cpp's converter writes it into a GGUF (`tokenizer.ggml.model` `gpt2`,
/// `pre` `tekken`): the vocabulary, merges and token types built from the Hugging Face `tokenizer.json` that
/// transformers converts Tekken into (scripts/fetch_tekken.sh), as the converter's `get_vocab_base` does (added
/// special tokens are control tokens). `fixtures/tekken.json` holds mistral-common's own ids for 29 hard texts
/// (scripts/fixtures/tekken_fixtures.py, where Hugging Face `tokenizers` agrees on each).
#[test]
fn tekken_from_gguf_metadata_matches_mistral_common() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache/assets/tekken");
    let json_path = dir.join("tokenizer.json");
    if !json_path.is_file() {
        eprintln!(
            "skipping: {} is absent; run scripts/fetch_tekken.sh (scripts/test.sh does)",
            json_path.display()
        );
        return;
    }
    let hf: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    let mut tokens: Vec<Option<(String, i32)>> = Vec::new();
    let mut put = |id: usize, token: &str, kind: i32| {
        if tokens.len() <= id {
            tokens.resize(id + 1, None);
        }
        tokens[id] = Some((token.to_string(), kind));
    };
    for (token, id) in hf["model"]["vocab"].as_object().unwrap() {
        put(id.as_u64().unwrap() as usize, token, 1);
    }
    for added in hf["added_tokens"].as_array().unwrap() {
        let kind = if added["special"].as_bool().unwrap() {
            3
        } else {
            4
        };
        put(
            added["id"].as_u64().unwrap() as usize,
            added["content"].as_str().unwrap(),
            kind,
        );
    }
    let (tokens, token_types): (Vec<String>, Vec<i32>) = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.unwrap_or_else(|| (format!("[PAD{i}]"), 4)))
        .unzip();
    let merges = hf["model"]["merges"]
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
    let vocab = ember_tokenizer::GgufVocab {
        path: json_path.clone(),
        model: "gpt2".into(),
        pre: Some("tekken".into()),
        tokens,
        token_types,
        merges,
        bos: Some(1),
        eos: Some(2),
        unk: Some(0),
        ..Default::default()
    };
    let tokenizer = Tokenizer::from_gguf_vocab(vocab).unwrap();
    assert_matches_fixture(&tokenizer, "tekken.json");
}

/// The cases of `tests/fixtures/{name}`: 29 hard texts from scripts/fixtures/hard_texts.py with their ids.
fn fixture_cases(name: &str) -> Vec<(String, Vec<u32>)> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let fixture: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let cases: Vec<(String, Vec<u32>)> = fixture["cases"]
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
        .collect();
    assert_eq!(cases.len(), 29, "{name}");
    cases
}

/// `tokenizer` encodes every text of `tests/fixtures/{name}` to exactly its ids.
fn assert_matches_fixture(tokenizer: &Tokenizer, name: &str) {
    assert_encodes(tokenizer, &fixture_cases(name), name);
}

/// `tokenizer` encodes each text of `cases` to exactly its ids (`encode_ordinary`, as HF's
/// `encode(text, add_special_tokens=False)`), and decodes them back byte for byte.
fn assert_encodes(tokenizer: &Tokenizer, cases: &[(String, Vec<u32>)], what: &str) {
    let mut failures = Vec::new();
    for (text, expected) in cases {
        let got = tokenizer.encode_ordinary(text).unwrap();
        if &got != expected {
            failures.push(format!(
                "{text:?}\n  got      {got:?}\n  expected {expected:?}"
            ));
        }
        assert_eq!(tokenizer.decode(&got).unwrap(), *text, "{what}: decode");
    }
    assert!(
        failures.is_empty(),
        "{what}: {} of {} texts differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
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

fn corpus() -> String {
    std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/tinyshakespeare.txt"),
    )
    .unwrap()
}

/// SentencePiece-style `tokenizer.json` files (LLaMA 2's, Mistral's, Gemma's layout) written as GGUF `llama`
/// vocabularies (`Tokenizer::to_gguf_vocab`, what `ember export` puts into a file made from a Hugging Face
/// directory) and read back by token scores, as llama.cpp reads them. The `tokenizer.json` is made from llama-spm's
/// 32k pieces as Hugging Face's converter makes one from a SentencePiece model, and checked against HF's ids first
/// (`.out`, `gemma_spm.json`); the GGUF vocabulary must then give the same ids on those texts and on all of Tiny
/// Shakespeare.
#[test]
fn sentencepiece_tokenizer_json_survives_the_gguf_vocabulary() {
    let Some(path) = vocab("llama-spm") else {
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let source = tokenizer_vocab(&file).unwrap();
    let text = corpus();
    let llama_normalizer = json!({"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u{2581}"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}]});
    let mistral_normalizer = Value::Null;
    let gemma_normalizer =
        json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"});
    let llama = cases(&path);
    assert!(llama.len() >= 30, "only {} cases", llama.len());
    let gemma = fixture_cases("gemma_spm.json");
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

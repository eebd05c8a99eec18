//! Mutation fuzzing of the tokenizer loaders: valid small files (the HF fixtures, a GPT-2 `vocab.json` +
//! `merges.txt` and a tiktoken rank file made from one of them) are mutated and loaded; each load must return
//! `Ok` or an error naming the file, never panic or abort, and a tokenizer that loads must encode and decode
//! without panicking.
//!
//! CI runs 512 cases per target (about two seconds). A long run:
//!
//! ```text
//! EMBER_FUZZ_CASES=100000 cargo test --release -p ember-tokenizer --test fuzz_files
//! ```
//!
//! A failing case is shrunk and its seed saved by proptest; every crash found becomes a test in `bad_files.rs`.

mod common;
mod mutate;

use std::path::Path;
use std::sync::OnceLock;

use base64::Engine;
use ember_tokenizer::{Tokenizer, byte_level, pretokenize::R50K_PATTERN};
use mutate::{apply, mutations};
use proptest::prelude::*;
use serde_json::Value;

const HF_FIXTURES: [&str; 6] = [
    "llama2_style",
    "mistral_style",
    "qwen2_style",
    "llama3_style",
    "ours_trained",
    "hf_trained",
];

fn hf_documents() -> &'static [Value] {
    static DOCS: OnceLock<Vec<Value>> = OnceLock::new();
    DOCS.get_or_init(|| {
        HF_FIXTURES
            .iter()
            .map(|name| common::fixture_json(&format!("{name}.tokenizer.json")))
            .collect()
    })
}

/// Uses a tokenizer that loaded: encode (with and without special tokens), decode, decode every id and a few
/// past the end, stream-decode. Errors are fine; panics are not.
fn exercise(tok: &Tokenizer) {
    for text in [
        "Hello world, 12345!",
        " <s>ünï\u{2581}code 🦀 </s><|endoftext|>",
        "",
    ] {
        if let Ok(ids) = tok.encode(text) {
            let _ = tok.decode(&ids);
            let mut stream = tok.stream_decoder();
            for id in ids {
                let _ = stream.push(id);
            }
            let _ = stream.finish();
        }
        let _ = tok.encode_ordinary(text);
    }
    let n = tok.vocab_size() as u32;
    for id in 0..n.saturating_add(2) {
        let _ = tok.decode(&[id]);
        let _ = tok.id_to_token(id);
    }
    let _ = tok.decode(&[u32::MAX]);
}

/// The outcome of one load: a tokenizer to exercise, or an error that must name `name`.
fn check(result: ember_tokenizer::Result<Tokenizer>, name: &str) -> Result<(), TestCaseError> {
    match result {
        Ok(tok) => exercise(&tok),
        Err(e) => {
            let msg = e.to_string();
            prop_assert!(msg.contains(name), "error does not name {name}: {msg}");
        }
    }
    Ok(())
}

/// GPT-2's two files made from a byte-level fixture.
fn gpt2_files() -> &'static (Value, Vec<String>) {
    static FILES: OnceLock<(Value, Vec<String>)> = OnceLock::new();
    FILES.get_or_init(|| {
        let doc = common::fixture_json("qwen2_style.tokenizer.json");
        let merges = doc["model"]["merges"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| match m {
                Value::String(s) => s.clone(),
                pair => format!(
                    "{} {}",
                    pair[0].as_str().unwrap(),
                    pair[1].as_str().unwrap()
                ),
            })
            .collect();
        (doc["model"]["vocab"].clone(), merges)
    })
}

/// A tiktoken rank file's lines, made from a byte-level fixture's vocabulary in id order.
fn rank_lines() -> &'static [String] {
    static LINES: OnceLock<Vec<String>> = OnceLock::new();
    LINES.get_or_init(|| {
        let doc = common::fixture_json("qwen2_style.tokenizer.json");
        let mut vocab: Vec<(&String, u64)> = doc["model"]["vocab"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(t, id)| (t, id.as_u64().unwrap()))
            .collect();
        vocab.sort_by_key(|&(_, id)| id);
        vocab
            .iter()
            .enumerate()
            .map(|(rank, (token, _))| {
                let bytes = byte_level::string_to_bytes(token).unwrap();
                let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
                format!("{b64} {rank}")
            })
            .collect()
    })
}

/// A line-level mutation of a text file.
fn mutate_lines(lines: &mut Vec<String>, at: usize, kind: u8, param: u64) {
    if lines.is_empty() {
        lines.push(String::new());
    }
    let i = at % lines.len();
    let number = [
        "0".to_string(),
        "-1".to_string(),
        (1u64 << 31).to_string(),
        ((1u64 << 32) + 5).to_string(),
        u64::MAX.to_string(),
        "99999999999999999999999".to_string(),
        "1.5".to_string(),
        "NaN".to_string(),
    ][(param % 8) as usize]
        .clone();
    match kind % 10 {
        0 => {
            lines.remove(i);
        }
        1 => {
            let copy = lines[i].clone();
            lines.insert((param as usize) % (lines.len() + 1), copy);
        }
        2 => {
            let head = lines[i].split(' ').next().unwrap_or_default().to_string();
            lines[i] = format!("{head} {number}");
        }
        3 => {
            let tail = lines[i].split(' ').nth(1).unwrap_or_default().to_string();
            lines[i] = format!("!!notbase64 {tail}");
        }
        4 => {
            let j = (param as usize) % lines.len();
            lines.swap(i, j);
        }
        5 => lines[i] = lines[i].replace(' ', ""),
        6 => {
            let tail = lines[i].split(' ').nth(1).unwrap_or_default().to_string();
            lines[i] = format!(" {tail}");
        }
        7 => {
            let line = &mut lines[i];
            let cut = (param as usize) % (line.len() + 1);
            let cut = (0..=cut)
                .rev()
                .find(|&c| line.is_char_boundary(c))
                .unwrap_or(0);
            line.truncate(cut);
        }
        8 => lines.insert(i, "garbage".into()),
        _ => lines[i].push_str(" extra"),
    }
}

proptest! {
    #![proptest_config(mutate::config(512))]

    #[test]
    fn mutated_tokenizer_json_loads_or_names_the_file(
        which in 0..HF_FIXTURES.len(),
        muts in mutations(3),
    ) {
        let mut doc = hf_documents()[which].clone();
        for m in muts {
            apply(&mut doc, m);
        }
        let bytes = serde_json::to_vec(&doc).unwrap();
        let name = format!("fuzz/{}.tokenizer.json", HF_FIXTURES[which]);
        check(Tokenizer::from_hf_json_bytes(&bytes, Path::new(&name)), &name)?;
    }

    #[test]
    fn mutated_gpt2_vocab_and_merges_load_or_name_a_file(
        muts in mutations(3),
        merge_edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<u64>()), 0..3),
    ) {
        let (vocab, merges) = gpt2_files();
        let mut vocab = vocab.clone();
        for m in muts {
            apply(&mut vocab, m);
        }
        let mut merges = merges.clone();
        for (at, kind, param) in merge_edits {
            mutate_lines(&mut merges, at, kind, param);
        }
        let tmp = tempfile::tempdir().unwrap();
        let (v, m) = (tmp.path().join("vocab.json"), tmp.path().join("merges.txt"));
        std::fs::write(&v, serde_json::to_vec(&vocab).unwrap()).unwrap();
        std::fs::write(&m, format!("#version: 0.2\n{}\n", merges.join("\n"))).unwrap();
        match Tokenizer::from_gpt2_files(&v, &m) {
            Ok(tok) => exercise(&tok),
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(msg.contains("vocab.json") || msg.contains("merges.txt"), "{msg}");
            }
        }
    }

    #[test]
    fn mutated_tiktoken_ranks_load_or_name_the_file(
        edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<u64>()), 1..4),
        special in 0u64..8,
        invalid_utf8 in any::<bool>(),
    ) {
        let mut lines = rank_lines().to_vec();
        for (at, kind, param) in edits {
            mutate_lines(&mut lines, at, kind, param);
        }
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("fuzz.tiktoken");
        let mut bytes = lines.join("\n").into_bytes();
        if invalid_utf8 {
            bytes.insert(bytes.len() / 2, 0xff);
        }
        std::fs::write(&path, &bytes).unwrap();
        let n = lines.len() as u32;
        // Special ids at, near, inside and far beyond the ranks.
        let id = [n, n + 1, n + 65_000, 5, 1 << 31, u32::MAX, 0, n.saturating_sub(1)][special as usize];
        let specials = [("<|endoftext|>", id), ("<|fim|>", n.wrapping_add(3))];
        check(Tokenizer::from_tiktoken(&path, R50K_PATTERN, &specials), "fuzz.tiktoken")?;
        check(Tokenizer::from_path(&path), "fuzz.tiktoken")?;
    }
}

#[test]
fn the_unmutated_inputs_load() {
    for (name, doc) in HF_FIXTURES.iter().zip(hf_documents()) {
        let bytes = serde_json::to_vec(doc).unwrap();
        Tokenizer::from_hf_json_bytes(&bytes, Path::new(name)).unwrap();
    }
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("ranks.tiktoken");
    std::fs::write(&path, rank_lines().join("\n")).unwrap();
    let n = rank_lines().len() as u32;
    let tok = Tokenizer::from_tiktoken(&path, R50K_PATTERN, &[("<|endoftext|>", n)]).unwrap();
    assert_eq!(tok.vocab_size(), n as usize + 1);
    let (vocab, merges) = gpt2_files();
    let (v, m) = (tmp.path().join("vocab.json"), tmp.path().join("merges.txt"));
    std::fs::write(&v, serde_json::to_vec(vocab).unwrap()).unwrap();
    std::fs::write(&m, merges.join("\n")).unwrap();
    Tokenizer::from_gpt2_files(&v, &m).unwrap();
}

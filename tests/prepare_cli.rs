//! `ember prepare` end to end: a real trained tokenizer, the binary, and the shards read back.

mod common;

use std::path::Path;

use ember_dataset::{Manifest, Split, SplitMethod, TokenDataset, TokenDtype};
use ember_tokenizer::{BpeTrainer, NoProgress, Tokenizer};

use common::ember;

/// Trains a 300-token byte-level BPE on `text` and saves it in `dir`.
fn train_tokenizer(text: &str, dir: &Path) -> std::path::PathBuf {
    let trained = BpeTrainer::new(300)
        .special_tokens(["<|endoftext|>"])
        .train_texts(&[text], &mut NoProgress)
        .unwrap();
    trained.save(dir).unwrap()
}

fn read_all(dir: &Path, split: Split) -> Vec<u32> {
    let data = TokenDataset::open(dir, split).unwrap();
    let mut ids = vec![0; data.len() as usize];
    data.read(0, &mut ids).unwrap();
    ids
}

#[test]
fn prepare_writes_shards_that_decode_back_to_the_corpus() {
    let dir = tempfile::tempdir().unwrap();
    let text: String = (0..400)
        .map(|i| format!("ROMEO: line {i} of the play, wherefore art thou.\n"))
        .collect();
    let corpus = dir.path().join("play.txt");
    std::fs::write(&corpus, &text).unwrap();
    let tok_path = train_tokenizer(&text, &dir.path().join("tok"));
    let out = dir.path().join("prepared");
    let result = ember()
        .args(["prepare", "--quiet", "--tokenizer"])
        .arg(&tok_path)
        .arg("--input")
        .arg(&corpus)
        .arg("--output")
        .arg(&out)
        .args(["--val-fraction", "0.2", "--shard-tokens", "1000"])
        .output()
        .unwrap();
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    assert!(
        result.stderr.is_empty(),
        "--quiet prints nothing: {}",
        String::from_utf8_lossy(&result.stderr)
    );

    let manifest = Manifest::load(&out).unwrap();
    assert_eq!(manifest.split_method, SplitMethod::ContiguousTail);
    assert_eq!(manifest.dtype, TokenDtype::U16);
    assert!(manifest.shards.iter().all(|s| s.tokens <= 1000) && manifest.shards.len() > 2);
    // Oracle: the tokenizer's own encoding of the whole text, cut 20% from the end.
    let tokenizer = Tokenizer::from_path(&tok_path).unwrap();
    let expected = tokenizer.encode_ordinary(&text).unwrap();
    let (train, val) = (read_all(&out, Split::Train), read_all(&out, Split::Val));
    assert_eq!(val.len(), (expected.len() as f64 * 0.2).round() as usize);
    assert_eq!([train, val].concat(), expected);
    assert_eq!(
        manifest.tokenizer.fingerprint,
        ember_dataset::fingerprint_path(&tok_path).unwrap()
    );
}

#[test]
fn prepare_reports_a_jsonl_line_without_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let tok_path = train_tokenizer("hello world", &dir.path().join("tok"));
    let input = dir.path().join("chat.jsonl");
    std::fs::write(&input, "{\"message\": \"hi\"}\n{\"body\": \"x\"}\n").unwrap();
    let result = ember()
        .args(["prepare", "--text-field", "message", "--tokenizer"])
        .arg(&tok_path)
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(dir.path().join("out"))
        .output()
        .unwrap();
    assert!(!result.status.success());
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(
        stderr.contains("chat.jsonl:2") && stderr.contains("no field `message`"),
        "{stderr}"
    );
}

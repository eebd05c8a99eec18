//! `ember tokenize` and `ember train-tokenizer` end to end.

mod common;

use std::io::Write;
use std::process::Stdio;

use common::{ember, fixture, tokenizer_fixture};

/// Runs `ember args` with `stdin` written to its standard input.
fn run_with_stdin(args: &[&str], stdin: &[u8]) -> std::process::Output {
    let mut child = ember()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // ember may exit before reading stdin (a tokenizer it refuses): the pipe is then closed, which is no failure
    // of the test; the exit status and stderr say what happened.
    if let Err(e) = child.stdin.take().unwrap().write_all(stdin) {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
    }
    child.wait_with_output().unwrap()
}

#[test]
fn tokenize_prints_hf_reference_ids_and_decodes_them_back_byte_for_byte() {
    let tok = tokenizer_fixture("qwen2_style.tokenizer.json");
    let fx: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(tokenizer_fixture("qwen2_style.ids.json")).unwrap(),
    )
    .unwrap();
    // The third hard string has a trailing "\n\n": stdin must not be trimmed.
    let text = fx["strings"][2].as_str().unwrap();
    let out = run_with_stdin(
        &["tokenize", "--tokenizer", tok.to_str().unwrap()],
        text.as_bytes(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(ids, fx["ids"][2]);

    let out = run_with_stdin(
        &[
            "tokenize",
            "--tokenizer",
            tok.to_str().unwrap(),
            "--format",
            "ids",
        ],
        text.as_bytes(),
    );
    let spaced = String::from_utf8(out.stdout).unwrap();
    let back = run_with_stdin(
        &["tokenize", "--tokenizer", tok.to_str().unwrap(), "--decode"],
        spaced.as_bytes(),
    );
    assert!(back.status.success());
    assert_eq!(back.stdout, text.as_bytes());
}

#[test]
fn tokenize_reports_a_malformed_tokenizer_file_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("tokenizer.json");
    std::fs::write(
        &bad,
        r#"{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}}"#,
    )
    .unwrap();
    let out = run_with_stdin(&["tokenize", "--tokenizer", bad.to_str().unwrap()], b"a");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("tokenizer.json") && err.contains("\"b\" is not in the vocabulary"),
        "{err}"
    );
}

#[test]
fn train_tokenizer_writes_a_tokenizer_that_tokenize_loads() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("corpus.txt");
    std::fs::write(
        &input,
        "to be or not to be, that is the question\n".repeat(20),
    )
    .unwrap();
    let out_dir = dir.path().join("tok");
    let out = run_with_stdin(
        &[
            "train-tokenizer",
            "--input",
            input.to_str().unwrap(),
            "--output",
            out_dir.to_str().unwrap(),
            "--vocab-size",
            "280",
            "--special-tokens",
            "<|endoftext|>",
            "--quiet",
        ],
        b"",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let enc = run_with_stdin(
        &["tokenize", "--tokenizer", out_dir.to_str().unwrap()],
        b"to be<|endoftext|>",
    );
    let ids: Vec<u32> = serde_json::from_slice(&enc.stdout).unwrap();
    // "to be" is frequent enough to be merged into few tokens; the special token is id 0.
    assert_eq!(ids.last(), Some(&0));
    assert!(ids.len() <= 3, "{ids:?}");
}

/// `--tokenizer` takes a GGUF file: the ids of llama.cpp's own test case (which its converter took from the HF
/// tokenizer), and with `--add-special` the BOS the file declares (`tokenizer.ggml.add_bos_token`) in front.
#[test]
fn tokenize_reads_a_gguf_vocabulary_and_adds_its_bos_on_request() {
    let dir = fixture(".cache/assets/llama-vocab");
    let gguf = dir.join("ggml-vocab-llama-spm.gguf");
    if !gguf.is_file() {
        eprintln!(
            "skipping: {} is absent; run scripts/fetch_llama_vocabs.sh (scripts/test.sh does)",
            gguf.display()
        );
        return;
    }
    let inp = std::fs::read_to_string(dir.join("ggml-vocab-llama-spm.gguf.inp")).unwrap();
    let out = std::fs::read_to_string(dir.join("ggml-vocab-llama-spm.gguf.out")).unwrap();
    let index = inp
        .split("\n__ggml_vocab_test__\n")
        .position(|t| t == " Hello world")
        .expect("llama.cpp's cases include \" Hello world\"");
    let expected = out.lines().nth(index).unwrap().trim().to_string();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "tokenize",
            "--format",
            "ids",
            "--tokenizer",
            gguf.to_str().unwrap(),
        ];
        args.extend(extra);
        let out = run_with_stdin(&args, b" Hello world");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    assert_eq!(run(&[]), expected);
    assert_eq!(run(&["--add-special"]), format!("1 {expected}"));
}

//! Broken and hostile tokenizer files are errors naming the file and the field or line, never panics, aborts or
//! silently defaulted values. Each case edits one valid fixture; several were found by `fuzz_files.rs`.

mod common;

use std::path::Path;

use base64::Engine;
use ember_tokenizer::{Tokenizer, TokenizerError, pretokenize::R50K_PATTERN};
use serde_json::{Value, json};

const NAME: &str = "edited/tokenizer.json";

/// The byte-level Qwen2-style fixture (500 tokens; ids 0..=2 are also added tokens), edited by `edit`.
fn edited(edit: impl FnOnce(&mut Value)) -> Value {
    let mut doc = common::fixture_json("qwen2_style.tokenizer.json");
    edit(&mut doc);
    doc
}

fn load(doc: &Value) -> ember_tokenizer::Result<Tokenizer> {
    Tokenizer::from_hf_json_bytes(&serde_json::to_vec(doc).unwrap(), Path::new(NAME))
}

/// Loading fails with a message naming the file and containing every one of `needles`.
fn assert_rejected(doc: &Value, needles: &[&str]) {
    let err = load(doc).expect_err("the edited file must be rejected");
    let msg = err.to_string();
    assert!(msg.contains(NAME), "{msg}");
    for needle in needles {
        assert!(msg.contains(needle), "{msg} should mention {needle}");
    }
}

#[test]
fn the_unedited_fixture_loads() {
    let tok = load(&edited(|_| {})).unwrap();
    assert_eq!(tok.vocab_size(), 500);
}

#[test]
fn a_document_that_is_not_an_object_is_an_error() {
    for doc in [json!([1, 2]), json!("tokenizer"), json!(null)] {
        assert_rejected(&doc, &["expected a JSON object"]);
    }
    assert_rejected(&json!({"model": []}), &["`model` must be an object"]);
}

#[test]
fn a_vocab_id_of_two_to_the_31_is_out_of_range_not_an_abort() {
    // It used to size the id table to 2^31 + 1 entries (48 GB) and abort.
    let doc = edited(|d| d["model"]["vocab"]["We"] = json!(1u64 << 31));
    assert_rejected(&doc, &["model.vocab[\"We\"]", "2147483648", "out of range"]);
}

#[test]
fn an_added_token_id_of_two_to_the_31_is_out_of_range_not_an_abort() {
    let doc = edited(|d| {
        d["added_tokens"]
            .as_array_mut()
            .unwrap()
            .push(json!({"id": 1u64 << 31, "content": "<|new|>", "special": true}))
    });
    assert_rejected(&doc, &["added_tokens[3]", "2147483648", "out of range"]);
}

#[test]
fn an_added_token_id_past_u32_does_not_wrap_onto_a_vocab_entry() {
    // 2^32 + 5 used to become id 5 and overwrite the vocabulary's token 5.
    let doc = edited(|d| {
        d["added_tokens"]
            .as_array_mut()
            .unwrap()
            .push(json!({"id": (1u64 << 32) + 5, "content": "<|new|>"}))
    });
    assert_rejected(&doc, &["added_tokens[3]", "4294967301"]);
}

#[test]
fn an_added_token_may_not_take_the_id_of_another_vocab_entry() {
    let doc = edited(|d| d["added_tokens"][2]["id"] = json!(5));
    assert_rejected(&doc, &["added_tokens[2]", "id 5"]);
}

#[test]
fn added_tokens_as_an_object_is_an_error_not_ignored() {
    let doc = edited(|d| {
        d["added_tokens"] = json!({"0": {"id": 0, "content": "<|endoftext|>"}});
    });
    assert_rejected(&doc, &["added_tokens", "must be an array", "an object"]);
}

#[test]
fn added_tokens_given_twice_are_errors() {
    let doc = edited(|d| {
        let first = d["added_tokens"][0].clone();
        d["added_tokens"].as_array_mut().unwrap().push(first);
    });
    assert_rejected(&doc, &["added_tokens[3]", "added_tokens[0]"]);
}

#[test]
fn fields_of_the_wrong_type_are_errors_naming_the_field() {
    type Edit = fn(&mut Value);
    let cases: [(&str, Edit); 8] = [
        ("added_tokens[1].id", |d| {
            d["added_tokens"][1]["id"] = json!("1")
        }),
        ("added_tokens[0].special", |d| {
            d["added_tokens"][0]["special"] = json!("yes")
        }),
        ("added_tokens[0].content", |d| {
            d["added_tokens"][0]["content"] = json!(7)
        }),
        ("model.byte_fallback", |d| {
            d["model"]["byte_fallback"] = json!("true")
        }),
        ("model.ignore_merges", |d| {
            d["model"]["ignore_merges"] = json!(1)
        }),
        ("pre_tokenizer.pretokenizers[1].add_prefix_space", |d| {
            d["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = json!("false")
        }),
        ("pre_tokenizer.pretokenizers", |d| {
            d["pre_tokenizer"]["pretokenizers"] = json!({})
        }),
        ("model.vocab[\"We\"]", |d| {
            d["model"]["vocab"]["We"] = json!(-498)
        }),
    ];
    for (field, edit) in cases {
        assert_rejected(&edited(edit), &[field]);
    }
}

#[test]
fn a_sequence_without_its_list_is_an_error_not_empty() {
    let doc = edited(|d| {
        d["pre_tokenizer"]
            .as_object_mut()
            .unwrap()
            .remove("pretokenizers");
    });
    assert_rejected(&doc, &["pre_tokenizer.pretokenizers", "missing"]);
}

#[test]
fn a_token_listed_twice_in_the_vocab_is_an_error() {
    // serde_json keeps the last of two equal keys, which silently left id 3 without a token.
    let text = std::fs::read_to_string(common::fixture("qwen2_style.tokenizer.json")).unwrap();
    let text = text.replacen("\"!\": 3", "\"!\": 3, \"!\": 498", 1);
    assert!(text.contains("\"!\": 498"));
    let err = Tokenizer::from_hf_json_bytes(text.as_bytes(), Path::new(NAME)).unwrap_err();
    assert!(
        err.to_string().contains("duplicate key \"!\"") && err.to_string().contains(NAME),
        "{err}"
    );
}

#[test]
fn two_tokens_with_one_id_are_an_error() {
    let doc = edited(|d| d["model"]["vocab"]["We"] = json!(3));
    assert_rejected(&doc, &["id 3 is used by both"]);
}

#[test]
fn a_merge_of_unknown_tokens_is_an_error() {
    let doc = edited(|d| d["model"]["merges"][0] = json!(["Ġ", "zzz"]));
    assert_rejected(
        &doc,
        &["model.merges[0]", "\"zzz\" is not in the vocabulary"],
    );
    // In merges.txt the error gives the line.
    let tmp = tempfile::tempdir().unwrap();
    let (v, m) = (tmp.path().join("vocab.json"), tmp.path().join("merges.txt"));
    std::fs::write(&v, r#"{"a": 0, "b": 1, "ab": 2}"#).unwrap();
    std::fs::write(&m, "#version: 0.2\na b\n\na c\n").unwrap();
    let err = Tokenizer::from_gpt2_files(&v, &m).unwrap_err().to_string();
    assert!(
        err.contains("merges.txt") && err.contains("line 4"),
        "{err}"
    );
}

#[test]
fn an_invalid_split_regex_names_the_file_and_section() {
    // Found by fuzz_files: the pattern error named the pattern but not the file.
    let doc = edited(|d| {
        d["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = json!("(");
    });
    assert_rejected(&doc, &["pre_tokenizer.pretokenizers[0].pattern.Regex"]);
}

fn ranks(tokens: &[&[u8]]) -> String {
    tokens
        .iter()
        .enumerate()
        .map(|(rank, t)| {
            format!(
                "{} {rank}\n",
                base64::engine::general_purpose::STANDARD.encode(t)
            )
        })
        .collect()
}

fn tiktoken_err(text: &str, specials: &[(&str, u32)]) -> TokenizerError {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("bad.tiktoken");
    std::fs::write(&path, text).unwrap();
    let err = Tokenizer::from_tiktoken(&path, R50K_PATTERN, specials).unwrap_err();
    assert!(err.to_string().contains("bad.tiktoken"), "{err}");
    err
}

#[test]
fn tiktoken_files_refuse_repeated_and_empty_tokens() {
    let err = tiktoken_err(&ranks(&[b"a", b"b", b"a"]), &[]);
    assert!(
        err.to_string().contains("line 3") && err.to_string().contains("line 1"),
        "{err}"
    );
    // An empty base64 field is an empty token.
    let err = tiktoken_err("YQ== 0\n 1\n", &[]);
    assert!(
        err.to_string().contains("line 2") && err.to_string().contains("empty token"),
        "{err}"
    );
}

#[test]
fn tiktoken_special_ids_must_sit_just_above_the_ranks() {
    let text = ranks(&[b"a", b"b", b"ab"]);
    // 2^31 used to size the id table to 2^31 + 1 entries.
    let err = tiktoken_err(&text, &[("<|endoftext|>", 1 << 31)]);
    assert!(err.to_string().contains("2147483648"), "{err}");
    // An id that is a rank would make that id decode to the special token.
    let err = tiktoken_err(&text, &[("<|endoftext|>", 1)]);
    assert!(err.to_string().contains("\"b\""), "{err}");
    let err = tiktoken_err(&text, &[("<|a|>", 3), ("<|b|>", 3)]);
    assert!(err.to_string().contains("both have id 3"), "{err}");
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("ok.tiktoken");
    std::fs::write(&path, &text).unwrap();
    let tok = Tokenizer::from_tiktoken(&path, R50K_PATTERN, &[("<|endoftext|>", 10)]).unwrap();
    assert_eq!(tok.vocab_size(), 11);
}

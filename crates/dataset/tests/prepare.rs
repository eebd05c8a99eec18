//! `prepare`: inputs, splits, separators, dtypes, shards and bad input.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::{BYTE_EOS, ByteEncoder, WideEncoder, documents_of, read_split};
use ember_dataset::clean::{CleanOptions, Cleaner};
use ember_dataset::{
    DatasetError, Manifest, PrepareOptions, Split, SplitMethod, TokenDtype, prepare,
};

fn no_progress(_: ember_dataset::Progress) {}

/// Writes `docs` as a JSONL file with field `text`.
fn write_jsonl(path: &Path, docs: &[String]) {
    let lines: Vec<String> = docs
        .iter()
        .map(|d| serde_json::json!({ "id": 1, "text": d }).to_string())
        .collect();
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

fn many_docs(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("document number {i}: {}", "lorem ipsum ".repeat(i % 7 + 1)))
        .collect()
}

fn options(inputs: Vec<PathBuf>, output: &Path) -> PrepareOptions {
    PrepareOptions::new(inputs, output.to_path_buf())
}

#[test]
fn hash_split_is_independent_of_input_order() {
    let dir = tempfile::tempdir().unwrap();
    let docs = many_docs(300);
    let mut reversed = docs.clone();
    reversed.reverse();
    write_jsonl(&dir.path().join("a.jsonl"), &docs);
    write_jsonl(&dir.path().join("b.jsonl"), &reversed);
    let (out_a, out_b) = (dir.path().join("out-a"), dir.path().join("out-b"));
    prepare(
        &ByteEncoder,
        &options(vec![dir.path().join("a.jsonl")], &out_a),
        &no_progress,
    )
    .unwrap();
    let report = prepare(
        &ByteEncoder,
        &options(vec![dir.path().join("b.jsonl")], &out_b),
        &no_progress,
    )
    .unwrap();
    assert_eq!(report.manifest.split_method, SplitMethod::DocumentHash);
    for split in [Split::Train, Split::Val] {
        let a: BTreeSet<String> = documents_of(&read_split(&out_a, split))
            .into_iter()
            .collect();
        let b: BTreeSet<String> = documents_of(&read_split(&out_b, split))
            .into_iter()
            .collect();
        assert_eq!(
            a, b,
            "split {split} holds the same documents in either order"
        );
    }
    // Every document is in exactly one split, once.
    let train = documents_of(&read_split(&out_a, Split::Train));
    let val = documents_of(&read_split(&out_a, Split::Val));
    let mut all: Vec<String> = train.iter().chain(&val).cloned().collect();
    all.sort();
    let mut expected = docs.clone();
    expected.sort();
    assert_eq!(all, expected);
    // 300 documents at 10%: the count is Binomial(300, 0.1), mean 30, sd 5.2; 10..=50 is a ~4 sigma band.
    assert!(
        (10..=50).contains(&val.len()),
        "{} validation documents",
        val.len()
    );
    assert_eq!(report.manifest.val.documents as usize, val.len());
}

#[test]
fn shards_hold_documents_in_input_order_separated_by_eos() {
    let dir = tempfile::tempdir().unwrap();
    let docs = many_docs(200);
    write_jsonl(&dir.path().join("d.jsonl"), &docs);
    let out = dir.path().join("out");
    let report = prepare(
        &ByteEncoder,
        &options(vec![dir.path().join("d.jsonl")], &out),
        &no_progress,
    )
    .unwrap();
    let train = read_split(&out, Split::Train);
    let train_docs = documents_of(&train);
    // Oracle: the input documents filtered by the split found, in input order, joined by exactly one EOS.
    let in_train: Vec<&String> = docs.iter().filter(|d| train_docs.contains(d)).collect();
    assert_eq!(train_docs.iter().collect::<Vec<_>>(), in_train);
    assert_eq!(
        train.iter().filter(|&&t| t == BYTE_EOS).count(),
        train_docs.len() - 1
    );
    assert_eq!(report.manifest.train.tokens, train.len() as u64);
    assert_eq!(report.manifest.dtype, TokenDtype::U16);
    assert_eq!(report.manifest.inputs[0].documents, 200);
}

#[test]
fn single_document_gets_a_contiguous_tail_split() {
    let dir = tempfile::tempdir().unwrap();
    let text: String = (0..1000).map(|i| format!("line {i}\n")).collect();
    let file = dir.path().join("one.txt");
    std::fs::write(&file, &text).unwrap();
    let out = dir.path().join("out");
    let mut opts = options(vec![file], &out);
    opts.val_fraction = 0.25;
    let report = prepare(&ByteEncoder, &opts, &no_progress).unwrap();
    let manifest = Manifest::load(&out).unwrap();
    assert_eq!(manifest.split_method, SplitMethod::ContiguousTail);
    let (train, val) = (read_split(&out, Split::Train), read_split(&out, Split::Val));
    let n = text.len();
    // The cut is round(n * 0.25) tokens from the end, exactly.
    assert_eq!(val.len(), (n as f64 * 0.25).round() as usize);
    let joined: Vec<u32> = train.iter().chain(&val).copied().collect();
    assert_eq!(joined, text.bytes().map(u32::from).collect::<Vec<_>>());
    assert_eq!(
        (
            report.manifest.train.documents,
            report.manifest.val.documents
        ),
        (1, 1)
    );
}

#[test]
fn directories_are_walked_recursively_in_sorted_order_skipping_hidden_files() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("corpus");
    std::fs::create_dir_all(root.join("b/nested")).unwrap();
    std::fs::write(root.join("c.txt"), "third").unwrap();
    std::fs::write(root.join("a.txt"), "first").unwrap();
    std::fs::write(root.join("b/nested/x.md"), "second").unwrap();
    std::fs::write(root.join(".hidden"), "never").unwrap();
    let out = dir.path().join("out");
    let report = prepare(
        &ByteEncoder,
        &options(vec![root.clone()], &out),
        &no_progress,
    )
    .unwrap();
    let files: Vec<PathBuf> = report
        .manifest
        .inputs
        .iter()
        .map(|i| i.path.clone())
        .collect();
    assert_eq!(
        files,
        [
            root.join("a.txt"),
            root.join("b/nested/x.md"),
            root.join("c.txt")
        ]
    );
    // Three documents: few enough that hashing may leave a split empty, in which case the tail split is used;
    // either way the stream, train then val, is the documents in order.
    let stream: Vec<u32> = [Split::Train, Split::Val]
        .iter()
        .flat_map(|&s| read_split(&out, s))
        .collect();
    if report.manifest.split_method == SplitMethod::ContiguousTail {
        assert_eq!(documents_of(&stream), ["first", "second", "third"]);
    }
}

#[test]
fn jsonl_line_without_the_field_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("chat.jsonl");
    std::fs::write(
        &file,
        "{\"text\": \"hello\"}\n\n{\"body\": \"no text here\"}\n",
    )
    .unwrap();
    let err = prepare(
        &ByteEncoder,
        &options(vec![file], &dir.path().join("out")),
        &no_progress,
    )
    .unwrap_err();
    assert!(matches!(err, DatasetError::Jsonl { line: 3, .. }), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("chat.jsonl:3")
            && message.contains("no field `text`")
            && message.contains("body")
    );
}

#[test]
fn jsonl_field_can_be_chosen_and_bad_json_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("chat.jsonl");
    std::fs::write(&file, "{\"body\": \"hello\"}\n{\"body\": 5}\n").unwrap();
    let mut opts = options(vec![file.clone()], &dir.path().join("out"));
    opts.text_field = "body".into();
    let err = prepare(&ByteEncoder, &opts, &no_progress).unwrap_err();
    assert!(
        err.to_string().contains("chat.jsonl:2") && err.to_string().contains("not a string"),
        "{err}"
    );
    std::fs::write(&file, "{\"body\": \"hello\"}\n{\"body\": \n").unwrap();
    let err = prepare(&ByteEncoder, &opts, &no_progress).unwrap_err();
    assert!(
        err.to_string().contains("chat.jsonl:2") && err.to_string().contains("invalid JSON"),
        "{err}"
    );
}

#[test]
fn empty_corpus_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("empty.txt"), "").unwrap();
    std::fs::write(dir.path().join("blank.jsonl"), "\n\n{\"text\": \"\"}\n").unwrap();
    let inputs = vec![dir.path().join("empty.txt"), dir.path().join("blank.jsonl")];
    let out = dir.path().join("out");
    let err = prepare(&ByteEncoder, &options(inputs, &out), &no_progress).unwrap_err();
    assert!(matches!(err, DatasetError::EmptyCorpus { .. }), "{err}");
    assert!(err.to_string().contains("empty.txt"), "{err}");
    assert!(!out.join("manifest.json").exists());
}

#[test]
fn invalid_utf8_is_replaced_counted_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("latin1.txt");
    let raw = b"caf\xe9 au lait \xff\xfe ok".to_vec();
    std::fs::write(&file, &raw).unwrap();
    let out = dir.path().join("out");
    let report = prepare(&ByteEncoder, &options(vec![file], &out), &no_progress).unwrap();
    // Oracle: std's lossy decoding, which replaces each maximal invalid subsequence with one U+FFFD.
    let expected = String::from_utf8_lossy(&raw);
    let replaced = expected.matches('\u{FFFD}').count() as u64;
    assert_eq!(replaced, 3);
    assert_eq!(report.manifest.inputs[0].replaced_invalid_utf8, replaced);
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.contains("latin1.txt") && w.contains("replaced 3")),
        "{:?}",
        report.warnings
    );
    let stream: Vec<u32> = [Split::Train, Split::Val]
        .iter()
        .flat_map(|&s| read_split(&out, s))
        .collect();
    assert_eq!(stream, expected.bytes().map(u32::from).collect::<Vec<_>>());
}

#[test]
fn invalid_utf8_in_jsonl_reports_the_first_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("d.jsonl");
    std::fs::write(
        &file,
        b"{\"text\": \"fine\"}\n{\"text\": \"bad \xff\"}\n{\"text\": \"also \xff\"}\n",
    )
    .unwrap();
    let report = prepare(
        &ByteEncoder,
        &options(vec![file], &dir.path().join("out")),
        &no_progress,
    )
    .unwrap();
    assert_eq!(report.manifest.inputs[0].replaced_invalid_utf8, 2);
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.contains("d.jsonl") && w.contains("first at line 2")),
        "{:?}",
        report.warnings
    );
}

#[test]
fn large_vocabulary_gets_u32_shards() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.txt");
    std::fs::write(&file, "abc").unwrap();
    let out = dir.path().join("out");
    let report = prepare(&WideEncoder, &options(vec![file], &out), &no_progress).unwrap();
    assert_eq!(report.manifest.dtype, TokenDtype::U32);
    let stream: Vec<u32> = [Split::Train, Split::Val]
        .iter()
        .flat_map(|&s| read_split(&out, s))
        .collect();
    assert_eq!(stream, [70_097, 70_098, 70_099]);
}

#[test]
fn shards_roll_over_at_the_token_limit_and_rerun_replaces_old_shards() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.txt");
    std::fs::write(&file, "x".repeat(1000)).unwrap();
    let out = dir.path().join("out");
    let mut opts = options(vec![file.clone()], &out);
    opts.shard_tokens = 128;
    let report = prepare(&ByteEncoder, &opts, &no_progress).unwrap();
    // 900 train tokens in shards of 128: 7 full shards and one of 4; 100 val tokens in one shard.
    let sizes: Vec<u64> = report.manifest.shards.iter().map(|s| s.tokens).collect();
    assert_eq!(sizes, [128, 128, 128, 128, 128, 128, 128, 4, 100]);

    std::fs::write(&file, "y".repeat(100)).unwrap();
    opts.shard_tokens = 1000;
    prepare(&ByteEncoder, &opts, &no_progress).unwrap();
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["manifest.json", "train-00000.bin", "val-00000.bin"]);
}

#[test]
fn output_does_not_depend_on_the_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    write_jsonl(&dir.path().join("d.jsonl"), &many_docs(500));
    let run = |threads: usize, name: &str| {
        let out = dir.path().join(name);
        let opts = options(vec![dir.path().join("d.jsonl")], &out);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| prepare(&ByteEncoder, &opts, &no_progress))
            .unwrap();
        ["train-00000.bin", "val-00000.bin"].map(|f| std::fs::read(out.join(f)).unwrap())
    };
    assert_eq!(run(1, "one"), run(3, "three"));
}

#[test]
fn progress_reaches_the_total_input_size() {
    let dir = tempfile::tempdir().unwrap();
    write_jsonl(&dir.path().join("d.jsonl"), &many_docs(50));
    let total = std::fs::metadata(dir.path().join("d.jsonl")).unwrap().len();
    let last = std::sync::Mutex::new(Vec::new());
    let record = |p: ember_dataset::Progress| last.lock().unwrap().push(p);
    prepare(
        &ByteEncoder,
        &options(vec![dir.path().join("d.jsonl")], &dir.path().join("out")),
        &record,
    )
    .unwrap();
    let seen = last.into_inner().unwrap();
    assert_eq!(seen.len(), 50);
    assert!(seen.iter().all(|p| p.bytes_total == total));
    assert_eq!(seen.iter().map(|p| p.bytes_done).max(), Some(total));
    assert_eq!(seen.iter().map(|p| p.documents).max(), Some(50));
}

#[test]
fn clean_option_tokenizes_the_cleaned_text() {
    let dir = tempfile::tempdir().unwrap();
    let mail = "Hi Bob,\r\n\r\nThe report is at https://example.com/r.pdf.\r\n\r\nBest regards,\r\nAnn\r\n\r\n> old quoted text\r\n";
    let file = dir.path().join("mail.txt");
    std::fs::write(&file, mail).unwrap();
    let out = dir.path().join("out");
    let mut opts = options(vec![file], &out);
    opts.clean = Some(CleanOptions::all());
    let report = prepare(&ByteEncoder, &opts, &no_progress).unwrap();
    assert!(report.manifest.cleaned);
    let stream: Vec<u32> = [Split::Train, Split::Val]
        .iter()
        .flat_map(|&s| read_split(&out, s))
        .collect();
    let text = String::from_utf8(stream.iter().map(|&b| b as u8).collect()).unwrap();
    assert_eq!(text, "Hi Bob,\n\nThe report is at <|url|>.");
    assert_eq!(text, Cleaner::new(CleanOptions::all()).clean(mail));
}

#[test]
fn token_outside_the_vocabulary_is_reported_with_its_document() {
    struct Liar;
    impl ember_dataset::DocumentEncoder for Liar {
        fn encode(&self, _: &str) -> Result<Vec<u32>, String> {
            Ok(vec![1, 300])
        }
        fn vocab_size(&self) -> usize {
            257
        }
        fn eos_id(&self) -> Option<u32> {
            None
        }
        fn fingerprint(&self) -> String {
            "liar".into()
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.txt");
    std::fs::write(&file, "abc").unwrap();
    let err = prepare(
        &Liar,
        &options(vec![file], &dir.path().join("out")),
        &no_progress,
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("300") && err.to_string().contains("t.txt"),
        "{err}"
    );
}

#[test]
fn invalid_options_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(vec![dir.path().to_path_buf()], &dir.path().join("out"));
    opts.val_fraction = 1.0;
    assert!(
        prepare(&ByteEncoder, &opts, &no_progress)
            .unwrap_err()
            .to_string()
            .contains("val_fraction")
    );
    let missing = options(vec![dir.path().join("nope.txt")], &dir.path().join("out"));
    assert!(
        prepare(&ByteEncoder, &missing, &no_progress)
            .unwrap_err()
            .to_string()
            .contains("nope.txt")
    );
}

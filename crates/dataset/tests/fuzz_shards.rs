//! Mutation fuzzing of a prepared corpus (`manifest.json` and its shards), and the regression tests of what it
//! found.
//!
//! Each case damages one shard's bytes (its header fields first) or makes the manifest lie (counts, totals,
//! vocabulary, file names), then opens both splits and reads every token and a few batches: the reader must
//! succeed or fail with an error naming the corpus's file.
//!
//! CI runs 256 cases (about a second). A longer run:
//!
//! ```text
//! EMBER_FUZZ_CASES=100000 EMBER_FUZZ_SEED=7 cargo test --release -p ember-dataset --test fuzz_shards
//! ```

#[path = "../../optimization/tests/mutate/mod.rs"]
mod mutate;

use std::path::Path;
use std::sync::Arc;

use ember_dataset::{
    CorpusWriter, EvalBatches, MANIFEST_VERSION, Manifest, RandomBatches, ReaderState, Split,
    SplitMethod, SplitStats, TokenDataset, TokenDtype, TokenizerInfo,
};
use mutate::{DEFAULT_CASES, Field, Mutation, Value};
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::Value as Json;

/// The integer fields of a shard header: version, bytes per token, token count, tokenizer digest.
const SHARD_FIELDS: [Field; 4] = [
    Field { at: 8, width: 4 },
    Field { at: 12, width: 4 },
    Field { at: 16, width: 8 },
    Field { at: 24, width: 8 },
];

/// A corpus of byte ids (vocabulary 257, EOS 256): train in shards of 40 tokens, val in one; returns every file
/// and its bytes.
fn corpus(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut writer = CorpusWriter::new(dir, TokenDtype::U16, "bytes-v1", 40);
    let train: Vec<u32> = (0..100u32).map(|i| (i * 7) % 257).collect();
    writer.push(Split::Train, &train).unwrap();
    writer
        .push(Split::Val, &[1, 2, 3, 256, 4, 5, 6, 7, 8, 9])
        .unwrap();
    let shards = writer.finish().unwrap();
    let manifest = Manifest {
        format_version: MANIFEST_VERSION,
        tokenizer: TokenizerInfo {
            fingerprint: "bytes-v1".into(),
            vocab_size: 257,
            eos_id: Some(256),
        },
        dtype: TokenDtype::U16,
        split_method: SplitMethod::ContiguousTail,
        val_fraction: 0.1,
        cleaned: false,
        train: SplitStats {
            documents: 1,
            tokens: 100,
        },
        val: SplitStats {
            documents: 2,
            tokens: 10,
        },
        skipped_empty_documents: 0,
        inputs: Vec::new(),
        shards,
    };
    manifest.save(dir).unwrap();
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            (name, std::fs::read(e.path()).unwrap())
        })
        .collect();
    files.sort();
    files
}

/// A lie in the manifest.
#[derive(Debug, Clone)]
enum ManifestEdit {
    /// `shards[i].tokens`.
    ShardTokens(Index, Value),
    /// `train.tokens` (`false`) or `val.tokens`.
    SplitTokens(bool, Value),
    /// `tokenizer.vocab_size`.
    Vocab(Value),
    /// `tokenizer.eos_id`.
    Eos(Value),
    /// `shards[i].file`, to another shard's name or one of [`FILE_NAMES`].
    File(Index, Index),
    /// A shard listed twice.
    Repeat(Index),
    /// A shard dropped.
    Drop(Index),
    /// A shard moved to the other split.
    Split(Index),
}

const FILE_NAMES: [&str; 6] = [
    "train-00000.bin",
    "val-00000.bin",
    "missing.bin",
    "../train-00000.bin",
    "/dev/zero",
    "",
];

fn manifest_edit() -> impl Strategy<Value = ManifestEdit> {
    let i = any::<Index>;
    let v = mutate::any_value;
    prop_oneof![
        (i(), v()).prop_map(|(s, v)| ManifestEdit::ShardTokens(s, v)),
        (any::<bool>(), v()).prop_map(|(val, v)| ManifestEdit::SplitTokens(val, v)),
        v().prop_map(ManifestEdit::Vocab),
        v().prop_map(ManifestEdit::Eos),
        (i(), i()).prop_map(|(s, n)| ManifestEdit::File(s, n)),
        i().prop_map(ManifestEdit::Repeat),
        i().prop_map(ManifestEdit::Drop),
        i().prop_map(ManifestEdit::Split),
    ]
}

fn edit_manifest(text: &str, edits: &[ManifestEdit]) -> String {
    let mut m: Json = serde_json::from_str(text).unwrap();
    let set = |slot: &mut Json, v: &Value| {
        *slot = Json::from(mutate::resolve(v, slot.as_u64().unwrap_or(0)))
    };
    for edit in edits {
        let n = m["shards"].as_array().map_or(0, Vec::len);
        let shard = |i: &Index| (n > 0).then(|| i.index(n));
        match edit {
            ManifestEdit::ShardTokens(i, v) => {
                if let Some(s) = shard(i) {
                    set(&mut m["shards"][s]["tokens"], v);
                }
            }
            ManifestEdit::SplitTokens(val, v) => {
                set(&mut m[if *val { "val" } else { "train" }]["tokens"], v);
            }
            ManifestEdit::Vocab(v) => set(&mut m["tokenizer"]["vocab_size"], v),
            ManifestEdit::Eos(v) => set(&mut m["tokenizer"]["eos_id"], v),
            ManifestEdit::File(i, name) => {
                if let Some(s) = shard(i) {
                    m["shards"][s]["file"] = Json::from(FILE_NAMES[name.index(FILE_NAMES.len())]);
                }
            }
            ManifestEdit::Repeat(i) => {
                if let Some(s) = shard(i) {
                    let copy = m["shards"][s].clone();
                    m["shards"].as_array_mut().unwrap().push(copy);
                }
            }
            ManifestEdit::Drop(i) => {
                if let Some(s) = shard(i) {
                    m["shards"].as_array_mut().unwrap().remove(s);
                }
            }
            ManifestEdit::Split(i) => {
                if let Some(s) = shard(i) {
                    let other = if m["shards"][s]["split"] == "train" {
                        "val"
                    } else {
                        "train"
                    };
                    m["shards"][s]["split"] = Json::from(other);
                }
            }
        }
    }
    m.to_string()
}

/// Opens both splits of `dir` and reads every token and some batches; each error must name `dir`'s files.
fn read_corpus(dir: &Path) -> Result<(), TestCaseError> {
    let names = dir.display().to_string();
    for split in [Split::Train, Split::Val] {
        let Some(dataset) = mutate::ok_or_names(TokenDataset::open(dir, split), &names)? else {
            continue;
        };
        let mut all = vec![0u32; dataset.len() as usize];
        mutate::ok_or_names(dataset.read(0, &mut all), &names)?;
        let dataset = Arc::new(dataset);
        if let Some(mut batches) = mutate::ok_or_names(
            RandomBatches::new(dataset.clone(), ReaderState::new(1, 2, 4)),
            &names,
        )? {
            for _ in 0..3 {
                mutate::ok_or_names(batches.next_batch(), &names)?;
            }
        }
        if let Some(batches) = mutate::ok_or_names(EvalBatches::new(dataset, 2, 4, 0, 1), &names)? {
            for batch in batches {
                mutate::ok_or_names(batch, &names)?;
            }
        }
    }
    Ok(())
}

#[test]
fn fuzz_corpus() {
    let dir = tempfile::tempdir().unwrap();
    let files = corpus(dir.path());
    read_corpus(dir.path()).unwrap();
    let shards: Vec<usize> = (0..files.len())
        .filter(|&i| files[i].0.ends_with(".bin"))
        .collect();
    let manifest = files
        .iter()
        .position(|(name, _)| name == "manifest.json")
        .unwrap();
    let mut runner = mutate::runner(DEFAULT_CASES);
    let strategy = (
        any::<Index>(),
        prop::collection::vec(mutate::mutation(true), 0..=3),
        prop::collection::vec(manifest_edit(), 0..=2),
    );
    let result = runner.run(
        &strategy,
        |(shard, mutations, edits): (Index, Vec<Mutation>, Vec<ManifestEdit>)| {
            let shard = shards[shard.index(shards.len())];
            for (i, (name, bytes)) in files.iter().enumerate() {
                let bytes = if i == shard {
                    mutate::apply(bytes, &SHARD_FIELDS, &mutations)
                } else if i == manifest {
                    edit_manifest(std::str::from_utf8(bytes).unwrap(), &edits).into_bytes()
                } else {
                    bytes.clone()
                };
                std::fs::write(dir.path().join(name), bytes).unwrap();
            }
            read_corpus(dir.path())
        },
    );
    if let Err(e) = result {
        panic!("{e}");
    }
}

// Regression tests.

/// A corpus in a temporary directory with its manifest edited.
fn corpus_with(edits: &[ManifestEdit]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    corpus(dir.path());
    let path = dir.path().join("manifest.json");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, edit_manifest(&text, edits)).unwrap();
    dir
}

fn open_err(dir: &Path, split: Split) -> String {
    let err = TokenDataset::open(dir, split).unwrap_err().to_string();
    assert!(err.contains(&dir.display().to_string()), "{err}");
    err
}

#[test]
fn a_token_count_that_overflows_the_byte_count_is_refused() {
    // 2^63 tokens of 2 bytes are 2^64 bytes, which wrapped to 0: a header-only shard claimed 2^63 tokens.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.bin");
    let mut writer = ember_dataset::ShardWriter::create(&path, TokenDtype::U16, 0).unwrap();
    writer.push(&[]).unwrap();
    writer.finish().unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[16..24].copy_from_slice(&(1u64 << 63).to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
    let err = ember_dataset::MappedShard::open(&path)
        .unwrap_err()
        .to_string();
    assert!(err.contains("s.bin") && err.contains("2^64"), "{err}");
}

#[test]
fn split_totals_that_disagree_with_the_shards_are_refused() {
    let dir = corpus_with(&[ManifestEdit::SplitTokens(false, Value::Delta(1))]);
    assert!(
        open_err(dir.path(), Split::Train).contains("declares 101 tokens, but its shards hold 100")
    );
}

/// A corpus in a temporary directory whose manifest JSON is rewritten by `edit`.
fn corpus_with_json(edit: impl FnOnce(&mut Json)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    corpus(dir.path());
    let path = dir.path().join("manifest.json");
    let mut manifest: Json =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut manifest);
    std::fs::write(&path, manifest.to_string()).unwrap();
    dir
}

#[test]
fn a_shard_listed_twice_or_outside_the_directory_is_refused() {
    // Listed twice, the shard was read twice and the split doubled.
    let dir = corpus_with_json(|m| {
        let first = m["shards"][0].clone();
        m["shards"].as_array_mut().unwrap().push(first);
    });
    assert!(open_err(dir.path(), Split::Val).contains("listed twice"));
    let dir = corpus_with_json(|m| m["shards"][0]["file"] = "../train-00000.bin".into());
    assert!(
        open_err(dir.path(), Split::Val).contains("expected a file name in the corpus directory")
    );
}

#[test]
fn ids_outside_the_vocabulary_are_refused_when_read() {
    // A shard holding id 300 in a corpus of vocabulary 257: before the check it reached the model's embedding.
    let dir = corpus_with(&[]);
    let path = dir.path().join("val-00000.bin");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[32 + 2 * 5..32 + 2 * 6].copy_from_slice(&300u16.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
    let dataset = TokenDataset::open(dir.path(), Split::Val).unwrap();
    let mut out = vec![0; 10];
    let err = dataset.read(0, &mut out).unwrap_err().to_string();
    assert!(
        err.contains("val-00000.bin") && err.contains("token 5 is id 300"),
        "{err}"
    );
    assert!(dataset.read(0, &mut out[..5]).is_ok(), "ids before it read");
}

#[test]
fn an_eos_id_outside_the_vocabulary_is_refused() {
    let dir = corpus_with(&[ManifestEdit::Eos(Value::Delta(1))]);
    assert!(open_err(dir.path(), Split::Train).contains("`tokenizer.eos_id` 257"));
}

//! Mutation fuzzing of the GGUF reader and the GGUF model-loading path, and the regression tests of what it (and
//! the issue's own fuzzing) found.
//!
//! Two targets: a tiny `llama` model written by `gguf_writer` (every tensor is read, the embedded tokenizer and the
//! spec are extracted, and a small enough spec is loaded, f32 and quantized) and the committed `quants.gguf.bin`
//! fixture (eleven ggml types, every metadata value type). Each case applies a few mutations (see
//! `../../optimization/tests/mutate/mod.rs`); the reader must return `Ok` or an error naming the file.
//!
//! CI runs 256 cases per target (seconds). A longer run, e.g. a hundred thousand cases from another seed:
//!
//! ```text
//! EMBER_FUZZ_CASES=100000 EMBER_FUZZ_SEED=7 cargo test --release -p ember-model --test fuzz_gguf
//! ```

mod common;
mod gguf_writer;
#[path = "../../optimization/tests/mutate/mod.rs"]
mod mutate;

use std::path::Path;

use ember_model::gguf::{self, GgufError, GgufFile};
use mutate::{DEFAULT_CASES, Field, Mutation, ok_or_names};
use proptest::test_runner::TestCaseError;

const NAME: &str = "model.gguf";

/// Loads are attempted only for specs this small: a spec the reader passes but that is too large for a test
/// process to build is the spec's range checks to refuse (they are tested with the spec), not the reader's.
const MAX_LOADED_ELEMENTS: usize = 1 << 20;
const MAX_LOADED_CONTEXT: usize = 4096;

fn fields(raw: &[(usize, usize)]) -> Vec<Field> {
    raw.iter().map(|&(at, width)| Field { at, width }).collect()
}

/// How far each case got: refused at open, opened, spec extracted, model loaded.
#[derive(Debug, Default)]
struct Reached {
    refused: u32,
    opened: u32,
    spec: u32,
    loaded: u32,
}

/// Opens `path` and reads everything a command can read from a GGUF file, checking each result.
fn read_everything(path: &Path) -> Result<(), TestCaseError> {
    read_counting(path, &mut Reached::default())
}

fn read_counting(path: &Path, reached: &mut Reached) -> Result<(), TestCaseError> {
    let Some(file) = ok_or_names(GgufFile::open(path), NAME)? else {
        reached.refused += 1;
        return Ok(());
    };
    reached.opened += 1;
    for info in file.tensors() {
        if let Some(bytes) = ok_or_names(file.tensor_bytes(&info.name), NAME)? {
            proptest::prop_assert_eq!(Some(bytes.len() as u64), info.n_bytes());
        }
        ok_or_names(file.tensor_f32(&info.name), NAME)?;
    }
    ok_or_names(gguf::tokenizer_vocab(&file), NAME)?;
    let Some(spec) = ok_or_names(gguf::model_spec(&file).map(|(_, s)| s), NAME)? else {
        return Ok(());
    };
    reached.spec += 1;
    let elements: usize = spec.tensors().iter().map(|t| t.numel()).sum();
    if elements <= MAX_LOADED_ELEMENTS && spec.context_length <= MAX_LOADED_CONTEXT {
        let device = Default::default();
        ok_or_names(gguf::load::<common::B>(&file, &device, None), NAME)?;
        if ok_or_names(
            gguf::load_quantized::<common::B>(&file, &device, None),
            NAME,
        )?
        .is_some()
        {
            reached.loaded += 1;
        }
    }
    Ok(())
}

/// Runs `cases` mutated copies of `base` through [`read_everything`].
fn fuzz(base: &[u8], fields: &[Field], cases: u32) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(NAME);
    let mut runner = mutate::runner(cases);
    let strategy = mutate::mutations(!fields.is_empty(), 4);
    let reached = std::cell::RefCell::new(Reached::default());
    let result = runner.run(&strategy, |mutations: Vec<Mutation>| {
        std::fs::write(&path, mutate::apply(base, fields, &mutations)).unwrap();
        read_counting(&path, &mut reached.borrow_mut())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    // Shown with `--nocapture`: how deep the mutated files got (a target whose cases all stop at the header
    // would test little).
    eprintln!("{:?}", reached.into_inner());
}

#[test]
fn the_unmutated_files_read_and_load() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(NAME);
    std::fs::write(&path, gguf_writer::tiny_llama_file().0).unwrap();
    let file = GgufFile::open(&path).unwrap();
    let spec = gguf::model_spec(&file).map(|(_, s)| s).unwrap();
    assert_eq!(
        (spec.vocab_size, spec.hidden_size, spec.num_layers),
        (32, 32, 1)
    );
    gguf::load::<common::B>(&file, &Default::default(), None).unwrap();
    gguf::load_quantized::<common::B>(&file, &Default::default(), None).unwrap();
    assert_eq!(gguf::tokenizer_vocab(&file).unwrap().tokens.len(), 32);
    read_everything(&path).unwrap();
}

#[test]
fn fuzz_tiny_llama() {
    let (bytes, raw) = gguf_writer::tiny_llama_file();
    fuzz(&bytes, &fields(&raw), DEFAULT_CASES);
}

#[test]
fn fuzz_quants_fixture() {
    let bytes = std::fs::read(common::fixture("gguf").join("quants.gguf.bin")).unwrap();
    // No field list: byte, word and splice mutations find the fields on their own in a file this small.
    fuzz(&bytes, &[], DEFAULT_CASES);
}

// Regression tests: each constructs one hostile file and pins the error. Removing the check a test names makes
// it fail (a panic, an abort, or a file accepted).

/// Writes `bytes` as `model.gguf` and opens it.
fn open(bytes: &[u8]) -> (tempfile::TempDir, Result<GgufFile, GgufError>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(NAME);
    std::fs::write(&path, bytes).unwrap();
    let file = GgufFile::open(&path);
    (dir, file)
}

fn open_err(bytes: &[u8]) -> String {
    let (_dir, file) = open(bytes);
    let err = file.expect_err("the file should be refused").to_string();
    assert!(err.contains(NAME), "the error names the file: {err}");
    err
}

/// The tiny model with `edit` applied to its metadata and tensors.
fn tiny_with(
    edit: impl FnOnce(&mut Vec<(&'static str, gguf_writer::Value)>, &mut Vec<gguf_writer::Tensor>),
) -> Vec<u8> {
    let (mut metadata, mut tensors) = gguf_writer::tiny_llama();
    edit(&mut metadata, &mut tensors);
    gguf_writer::write(&metadata, &tensors).0
}

/// Header offsets of the tiny model: the tensor count is at 8, the metadata count at 16.
const TENSOR_COUNT_AT: usize = 8;
const METADATA_COUNT_AT: usize = 16;

fn set_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn huge_tensor_or_metadata_counts_are_refused_before_reading() {
    for (at, v) in [
        (TENSOR_COUNT_AT, u64::MAX),
        (TENSOR_COUNT_AT, 1 << 40),
        (METADATA_COUNT_AT, u64::MAX),
        (METADATA_COUNT_AT, 1 << 40),
    ] {
        let mut bytes = gguf_writer::tiny_llama_file().0;
        set_u64(&mut bytes, at, v);
        let err = open_err(&bytes);
        assert!(err.contains("tensor and metadata counts"), "{err}");
    }
}

#[test]
fn a_tensor_count_one_too_high_is_refused() {
    // The extra tensor info is read from the zero padding after the real ones: an empty name, no dims, F32,
    // offset 0, i.e. a plausible one-element tensor. Before the check, the file opened with a phantom tensor.
    let mut bytes = gguf_writer::tiny_llama_file().0;
    set_u64(&mut bytes, TENSOR_COUNT_AT, 12);
    let err = open_err(&bytes);
    assert!(err.contains("tensor info #11"), "{err}");
}

#[test]
fn a_metadata_count_one_too_high_is_refused() {
    let mut bytes = gguf_writer::tiny_llama_file().0;
    set_u64(&mut bytes, METADATA_COUNT_AT, 16);
    // The 16th key is read from the first tensor info; whatever it parses as, the tensor infos then start in the
    // wrong place and the file cannot be read.
    open_err(&bytes);
}

#[test]
fn string_and_array_lengths_past_the_end_are_refused() {
    let (bytes, fields) = gguf_writer::tiny_llama_file();
    // The first key's length field (offset 24), and the tokens array's element count.
    let mut long_key = bytes.clone();
    set_u64(&mut long_key, 24, u64::MAX - 3);
    assert!(open_err(&long_key).contains("metadata key #0"));

    let tokens_at = find(&bytes, b"tokenizer.ggml.tokens") + "tokenizer.ggml.tokens".len();
    // After the key: the value type (u32), the element type (u32), then the element count (u64).
    let count_at = tokens_at + 8;
    assert!(
        fields.contains(&(count_at, 8)),
        "the element count is a recorded field"
    );
    for claim in [u64::MAX, 1 << 33, bytes.len() as u64] {
        let mut lying = bytes.clone();
        set_u64(&mut lying, count_at, claim);
        let err = open_err(&lying);
        assert!(
            err.contains("tokenizer.ggml.tokens") && err.contains("left in the file"),
            "{err}"
        );
    }
}

#[test]
fn an_array_that_fits_the_file_but_exceeds_the_element_budget_is_refused() {
    // 17 million one-byte elements fit in the file, but would become 17 million 32-byte values.
    let n = (ember_model::gguf::MAX_METADATA_ELEMENTS + 1) as usize;
    let mut bytes = b"GGUF".to_vec();
    bytes.extend_from_slice(&3u32.to_le_bytes());
    bytes.extend_from_slice(&0u64.to_le_bytes());
    bytes.extend_from_slice(&1u64.to_le_bytes());
    bytes.extend_from_slice(&4u64.to_le_bytes());
    bytes.extend_from_slice(b"big!");
    bytes.extend_from_slice(&9u32.to_le_bytes());
    bytes.extend_from_slice(&0u32.to_le_bytes());
    bytes.extend_from_slice(&(n as u64).to_le_bytes());
    bytes.resize(bytes.len() + n, 0);
    let err = open_err(&bytes);
    assert!(err.contains("`big!`") && err.contains("limit"), "{err}");
}

#[test]
fn dims_whose_product_overflows_are_refused() {
    let bytes = tiny_with(|_, tensors| tensors[2].dims = vec![1 << 32, 1 << 32, 2]);
    let err = open_err(&bytes);
    assert!(
        err.contains("blk.0.attn_norm.weight") && err.contains("overflow"),
        "{err}"
    );
    // A product that fits in 64 bits but whose byte size (34 bytes per 32 Q8_0 elements) does not.
    let bytes = tiny_with(|_, tensors| tensors[3].dims = vec![1 << 59, 31]);
    let err = open_err(&bytes);
    assert!(
        err.contains("blk.0.attn_q.weight") && err.contains("2^64"),
        "{err}"
    );
}

#[test]
fn offsets_past_the_end_or_misaligned_are_refused() {
    let (bytes, _) = gguf_writer::tiny_llama_file();
    let file_len = bytes.len() as u64;
    // The last tensor's offset field is the last recorded field.
    let (at, _) = *gguf_writer::tiny_llama_file().1.last().unwrap();
    for (offset, expect) in [
        (file_len.div_ceil(32) * 32, "truncated"),
        (u64::MAX - 31, "overflow"),
        (33, "alignment"),
    ] {
        let mut lying = bytes.clone();
        set_u64(&mut lying, at, offset);
        let err = open_err(&lying);
        assert!(
            err.contains("blk.0.ffn_down.weight") && err.contains(expect),
            "{offset}: {err}"
        );
    }
}

#[test]
fn a_tensor_overlapping_the_next_one_is_refused() {
    // Point the first tensor's data at the second one's: both lie inside the file, and before the check the
    // embedding silently read the norm's bytes.
    let (bytes, fields) = gguf_writer::tiny_llama_file();
    let offsets: Vec<usize> = fields
        .iter()
        .filter(|&&(at, w)| w == 8 && at > find(&bytes, b"token_embd.weight"))
        .map(|&(at, _)| at)
        .collect();
    // Fields of the first tensor info after its name: the two dims, then the offset (after a u32 type).
    let embd_offset_at = offsets[2];
    let mut lying = bytes.clone();
    set_u64(&mut lying, embd_offset_at, 2048);
    let err = open_err(&lying);
    assert!(err.contains("overlaps"), "{err}");
}

#[test]
fn a_repeated_metadata_key_or_tensor_name_is_refused() {
    let bytes = tiny_with(|metadata, _| {
        metadata.push(("llama.block_count", gguf_writer::Value::U32(2)));
    });
    assert!(open_err(&bytes).contains("`llama.block_count` appears twice"));
    let bytes = tiny_with(|_, tensors| tensors[2].name = "output_norm.weight".into());
    assert!(open_err(&bytes).contains("`output_norm.weight` appears twice"));
}

#[test]
fn an_unknown_array_element_type_is_refused_even_when_empty() {
    let mut bytes = b"GGUF".to_vec();
    bytes.extend_from_slice(&3u32.to_le_bytes());
    bytes.extend_from_slice(&0u64.to_le_bytes());
    bytes.extend_from_slice(&1u64.to_le_bytes());
    bytes.extend_from_slice(&1u64.to_le_bytes());
    bytes.push(b'k');
    bytes.extend_from_slice(&9u32.to_le_bytes());
    bytes.extend_from_slice(&13u32.to_le_bytes());
    bytes.extend_from_slice(&0u64.to_le_bytes());
    assert!(open_err(&bytes).contains("unknown array element type 13"));
}

#[test]
fn sizes_that_disagree_with_the_tensors_name_the_file() {
    // Sizes the tensor infos contradict are refused while the spec is derived; before, a block count of 2^31
    // sized a 32 GiB table of per-layer attention windows and aborted.
    for (key, value, expect) in [
        ("llama.block_count", 1u32 << 31, "llama.block_count"),
        ("llama.block_count", 2, "llama.block_count"),
        ("llama.embedding_length", u32::MAX, "token_embd.weight"),
        ("llama.feed_forward_length", 96, "blk.0.ffn_down.weight"),
    ] {
        let bytes = tiny_with(|metadata, _| {
            metadata.retain(|(k, _)| *k != key);
            metadata.push((key, gguf_writer::Value::U32(value)));
        });
        let (_dir, file) = open(&bytes);
        let err = gguf::model_spec(&file.unwrap()).err().unwrap().to_string();
        assert!(
            err.contains(NAME) && err.contains(key) && err.contains(expect),
            "{err}"
        );
    }
    // A shape only the load can check (two KV heads: `attn_k` should have 32 rows, it has 16) names the file.
    let bytes = tiny_with(|metadata, _| {
        metadata.retain(|(k, _)| *k != "llama.attention.head_count_kv");
        metadata.push(("llama.attention.head_count_kv", gguf_writer::Value::U32(2)));
    });
    let (_dir, file) = open(&bytes);
    let err = gguf::load::<common::B>(&file.unwrap(), &Default::default(), None)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains(NAME) && err.contains("attn_k"), "{err}");
}

fn find(haystack: &[u8], needle: &[u8]) -> usize {
    haystack
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap()
}

//! Preparation: documents in, tokenized shards and a manifest out.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;

use crate::clean::{CleanOptions, Cleaner};
use crate::encoder::DocumentEncoder;
use crate::error::{DatasetError, Result};
use crate::hash::{stable_hash, unit_interval};
use crate::manifest::{
    InputInfo, MANIFEST_FILE, MANIFEST_VERSION, Manifest, Split, SplitMethod, SplitStats,
    TokenizerInfo,
};
use crate::shard::TokenDtype;
use crate::source::{Document, DocumentReader, InputFile, expand_inputs};
use crate::writer::CorpusWriter;

/// Default maximum number of tokens per shard file (64 Mi tokens: 128 MiB as u16).
pub const DEFAULT_SHARD_TOKENS: u64 = 1 << 26;
/// Default fraction of the corpus held out for validation.
pub const DEFAULT_VAL_FRACTION: f64 = 0.1;
/// Documents are read and tokenized in groups of about this many input bytes: enough to keep every core busy,
/// small enough that a corpus never needs to fit in memory.
const CHUNK_BYTES: u64 = 16 << 20;

/// What to prepare and how.
#[derive(Debug, Clone, PartialEq)]
pub struct PrepareOptions {
    /// Text files, directories (walked recursively in sorted order) and `.jsonl` files.
    pub inputs: Vec<PathBuf>,
    /// Output directory (created if missing) for the shards and `manifest.json`.
    pub output: PathBuf,
    /// Fraction of the corpus held out for validation, in `(0, 1)`.
    pub val_fraction: f64,
    /// JSONL field holding a document's text.
    pub text_field: String,
    /// Maximum number of tokens per shard file.
    pub shard_tokens: u64,
    /// Cleaning rules applied to every document before tokenizing; `None` keeps the text as read.
    pub clean: Option<CleanOptions>,
}

impl PrepareOptions {
    /// Options with the defaults: validation fraction 0.1, JSONL field `text`, [`DEFAULT_SHARD_TOKENS`], no
    /// cleaning.
    pub fn new(inputs: Vec<PathBuf>, output: PathBuf) -> Self {
        Self {
            inputs,
            output,
            val_fraction: DEFAULT_VAL_FRACTION,
            text_field: "text".into(),
            shard_tokens: DEFAULT_SHARD_TOKENS,
            clean: None,
        }
    }

    fn validate(&self) -> Result<()> {
        if !(self.val_fraction > 0.0 && self.val_fraction < 1.0) {
            return Err(DatasetError::InvalidOption(format!(
                "val_fraction must be in (0, 1), found {}",
                self.val_fraction
            )));
        }
        if self.shard_tokens == 0 {
            return Err(DatasetError::InvalidOption(
                "shard_tokens must be at least 1".into(),
            ));
        }
        if self.inputs.is_empty() {
            return Err(DatasetError::InvalidOption("no input given".into()));
        }
        Ok(())
    }
}

/// A snapshot of preparation progress, passed to the progress callback (from worker threads).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Input bytes tokenized so far.
    pub bytes_done: u64,
    /// Total input bytes (the sizes of all input files).
    pub bytes_total: u64,
    /// Documents tokenized so far.
    pub documents: u64,
    /// Tokens produced so far (separators excluded).
    pub tokens: u64,
}

/// The outcome of [`prepare`].
#[derive(Debug, Clone)]
pub struct PrepareReport {
    /// The manifest written to the output directory.
    pub manifest: Manifest,
    /// Things the user should know that did not stop preparation (replaced invalid UTF-8, a split left empty,
    /// no separator token), each naming the file concerned.
    pub warnings: Vec<String>,
}

/// A tokenized document.
struct Encoded {
    ids: Vec<u32>,
    split: Split,
}

/// Tokenizes the documents of `options.inputs` with `encoder` into shards and a manifest in `options.output`.
///
/// Documents are tokenized in parallel (rayon) and written in input order, so the output is identical for any
/// thread count; within a split, consecutive documents are separated by the encoder's EOS id.
/// Each document goes to the split chosen by the hash of its (cleaned) text; a corpus that hashing cannot split
/// (one document, or so few that a split would be empty) is split by a contiguous tail instead, as recorded in
/// the manifest's `split_method`. `progress` is called from worker threads as documents complete.
pub fn prepare(
    encoder: &dyn DocumentEncoder,
    options: &PrepareOptions,
    progress: &(dyn Fn(Progress) + Sync),
) -> Result<PrepareReport> {
    options.validate()?;
    let files = expand_inputs(&options.inputs)?;
    let output = &options.output;
    std::fs::create_dir_all(output).map_err(|e| DatasetError::io(output, e))?;
    remove_previous(output)?;

    let fingerprint = encoder.fingerprint();
    let dtype = TokenDtype::for_vocab(encoder.vocab_size());
    let mut writer = CorpusWriter::new(output, dtype, &fingerprint, options.shard_tokens);
    let mut state = WriteState::new(encoder.eos_id(), &files);
    let cleaner = options.clean.map(Cleaner::new);
    let counters = Counters::new(files.iter().map(|f| f.bytes).sum());
    let mut reader = DocumentReader::new(&files, &options.text_field);
    let mut split_method = SplitMethod::DocumentHash;
    let mut first_chunk = true;
    loop {
        let (docs, exhausted) = read_chunk(&mut reader)?;
        state.record_inputs(&docs);
        let encoded = docs
            .par_iter()
            .map(|doc| {
                let encoded = encode(encoder, cleaner.as_ref(), doc, options.val_fraction, &files);
                counters.add(
                    doc.bytes,
                    encoded.as_ref().map_or(0, |e| e.ids.len()),
                    progress,
                );
                encoded
            })
            .collect::<Result<Vec<_>>>()?;
        drop(docs);
        if first_chunk && exhausted && !hash_splits_both(&encoded) {
            split_method = SplitMethod::ContiguousTail;
            state.write_tail(&mut writer, encoded, options.val_fraction)?;
        } else {
            for doc in encoded {
                state.write_document(&mut writer, doc)?;
            }
        }
        first_chunk = false;
        if exhausted {
            break;
        }
    }
    if state.train.documents + state.val.documents == 0 {
        let inputs = options
            .inputs
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        return Err(DatasetError::EmptyCorpus { inputs });
    }
    let shards = writer.finish()?;
    let mut warnings = state.warnings(&files);
    if state.val.tokens == 0 {
        warnings.push(format!(
            "the validation split is empty: no document hashed below val_fraction {}",
            options.val_fraction
        ));
    }
    let manifest = Manifest {
        format_version: MANIFEST_VERSION,
        tokenizer: TokenizerInfo {
            fingerprint,
            vocab_size: encoder.vocab_size(),
            eos_id: encoder.eos_id(),
        },
        dtype,
        split_method,
        val_fraction: options.val_fraction,
        cleaned: options.clean.is_some(),
        train: state.train,
        val: state.val,
        skipped_empty_documents: state.skipped,
        inputs: state.inputs,
        shards,
    };
    manifest.save(output)?;
    Ok(PrepareReport { manifest, warnings })
}

/// Removes the manifest of an earlier preparation first, so that an interrupted run leaves no manifest pointing
/// at a mix of old and new shards, and removes the shards it listed.
fn remove_previous(output: &std::path::Path) -> Result<()> {
    let path = output.join(MANIFEST_FILE);
    if !path.exists() {
        return Ok(());
    }
    let old = Manifest::load(output).ok();
    std::fs::remove_file(&path).map_err(|e| DatasetError::io(&path, e))?;
    for shard in old.iter().flat_map(|m| &m.shards) {
        let shard_path = output.join(&shard.file);
        if shard_path.exists() {
            std::fs::remove_file(&shard_path).map_err(|e| DatasetError::io(&shard_path, e))?;
        }
    }
    Ok(())
}

/// Reads documents until about [`CHUNK_BYTES`] of input; also says whether the inputs are exhausted.
fn read_chunk(reader: &mut DocumentReader<'_>) -> Result<(Vec<Document>, bool)> {
    let mut docs = Vec::new();
    let mut bytes = 0;
    while bytes < CHUNK_BYTES {
        match reader.next() {
            Some(doc) => {
                let doc = doc?;
                bytes += doc.bytes;
                docs.push(doc);
            }
            None => return Ok((docs, true)),
        }
    }
    Ok((docs, false))
}

fn encode(
    encoder: &dyn DocumentEncoder,
    cleaner: Option<&Cleaner>,
    doc: &Document,
    val_fraction: f64,
    files: &[InputFile],
) -> Result<Encoded> {
    let cleaned;
    let text = match cleaner {
        Some(cleaner) => {
            cleaned = cleaner.clean(&doc.text);
            &cleaned
        }
        None => &doc.text,
    };
    let origin = || {
        let file = files[doc.input].path.display();
        doc.line
            .map_or_else(|| file.to_string(), |line| format!("{file}:{line}"))
    };
    let ids = encoder
        .encode(text)
        .map_err(|message| DatasetError::Encode {
            document: origin(),
            message,
        })?;
    let vocab_size = encoder.vocab_size();
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab_size) {
        return Err(DatasetError::TokenOutOfRange {
            id,
            vocab_size,
            document: origin(),
        });
    }
    let split = if unit_interval(stable_hash(text.as_bytes())) < val_fraction {
        Split::Val
    } else {
        Split::Train
    };
    Ok(Encoded { ids, split })
}

/// Whether hashing puts at least one non-empty document in each split.
fn hash_splits_both(encoded: &[Encoded]) -> bool {
    let mut seen = [false; 2];
    encoded
        .iter()
        .filter(|e| !e.ids.is_empty())
        .for_each(|e| seen[e.split as usize] = true);
    seen == [true, true]
}

/// Shared progress counters, updated from worker threads.
struct Counters {
    bytes_total: u64,
    bytes: AtomicU64,
    documents: AtomicU64,
    tokens: AtomicU64,
}

impl Counters {
    fn new(bytes_total: u64) -> Self {
        Self {
            bytes_total,
            bytes: AtomicU64::new(0),
            documents: AtomicU64::new(0),
            tokens: AtomicU64::new(0),
        }
    }

    fn add(&self, bytes: u64, tokens: usize, progress: &(dyn Fn(Progress) + Sync)) {
        progress(Progress {
            bytes_done: self.bytes.fetch_add(bytes, Ordering::Relaxed) + bytes,
            bytes_total: self.bytes_total,
            documents: self.documents.fetch_add(1, Ordering::Relaxed) + 1,
            tokens: self.tokens.fetch_add(tokens as u64, Ordering::Relaxed) + tokens as u64,
        });
    }
}

/// Split totals, per-input statistics and separator bookkeeping while writing.
struct WriteState {
    eos: Option<u32>,
    train: SplitStats,
    val: SplitStats,
    skipped: u64,
    inputs: Vec<InputInfo>,
    /// For each input, the first JSONL line holding invalid UTF-8.
    first_bad_line: Vec<Option<usize>>,
}

impl WriteState {
    fn new(eos: Option<u32>, files: &[InputFile]) -> Self {
        let inputs = files
            .iter()
            .map(|f| InputInfo {
                path: f.path.clone(),
                bytes: f.bytes,
                documents: 0,
                replaced_invalid_utf8: 0,
            })
            .collect();
        Self {
            eos,
            train: SplitStats::default(),
            val: SplitStats::default(),
            skipped: 0,
            inputs,
            first_bad_line: vec![None; files.len()],
        }
    }

    fn record_inputs(&mut self, docs: &[Document]) {
        for doc in docs {
            let info = &mut self.inputs[doc.input];
            info.documents += 1;
            info.replaced_invalid_utf8 += doc.replaced;
            if doc.replaced > 0 && self.first_bad_line[doc.input].is_none() {
                self.first_bad_line[doc.input] = doc.line;
            }
        }
    }

    fn stats(&mut self, split: Split) -> &mut SplitStats {
        match split {
            Split::Train => &mut self.train,
            Split::Val => &mut self.val,
        }
    }

    /// Writes a document to its split, after an EOS if the split already holds a document.
    fn write_document(&mut self, writer: &mut CorpusWriter, doc: Encoded) -> Result<()> {
        if doc.ids.is_empty() {
            self.skipped += 1;
            return Ok(());
        }
        let eos = self.eos;
        let stats = self.stats(doc.split);
        if let Some(eos) = eos.filter(|_| stats.documents > 0) {
            writer.push(doc.split, &[eos])?;
            stats.tokens += 1;
        }
        writer.push(doc.split, &doc.ids)?;
        stats.documents += 1;
        stats.tokens += doc.ids.len() as u64;
        Ok(())
    }

    /// Joins all documents with EOS into one stream and cuts it: the last `val_fraction` of the tokens (rounded,
    /// at least one when the stream has two or more) are validation.
    fn write_tail(
        &mut self,
        writer: &mut CorpusWriter,
        encoded: Vec<Encoded>,
        val_fraction: f64,
    ) -> Result<()> {
        let mut stream = Vec::new();
        let mut spans = Vec::new();
        for doc in encoded {
            if doc.ids.is_empty() {
                self.skipped += 1;
                continue;
            }
            if let Some(eos) = self.eos.filter(|_| !stream.is_empty()) {
                stream.push(eos);
            }
            spans.push((stream.len(), stream.len() + doc.ids.len()));
            stream.extend_from_slice(&doc.ids);
        }
        let n = stream.len();
        let val = if n >= 2 {
            ((n as f64 * val_fraction).round() as usize).clamp(1, n - 1)
        } else {
            0
        };
        let cut = n - val;
        writer.push(Split::Train, &stream[..cut])?;
        writer.push(Split::Val, &stream[cut..])?;
        self.train = SplitStats {
            documents: spans.iter().filter(|&&(start, _)| start < cut).count() as u64,
            tokens: cut as u64,
        };
        self.val = SplitStats {
            documents: spans.iter().filter(|&&(_, end)| end > cut).count() as u64,
            tokens: val as u64,
        };
        Ok(())
    }

    fn warnings(&self, files: &[InputFile]) -> Vec<String> {
        let mut warnings = Vec::new();
        for ((info, file), line) in self.inputs.iter().zip(files).zip(&self.first_bad_line) {
            if info.replaced_invalid_utf8 > 0 {
                let at = line
                    .map(|l| format!(" (first at line {l})"))
                    .unwrap_or_default();
                warnings.push(format!(
                    "{}: replaced {} invalid UTF-8 sequence(s) with U+FFFD{at}",
                    file.path.display(),
                    info.replaced_invalid_utf8
                ));
            }
        }
        if self.eos.is_none() {
            warnings.push(
                "the tokenizer has no end-of-text token: documents are joined without a separator"
                    .into(),
            );
        }
        warnings
    }
}

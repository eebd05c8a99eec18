//! Reading documents from the inputs: plain text files (one document each), directories of them, and JSONL.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use crate::error::{DatasetError, Result};

/// How a file's documents are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InputKind {
    /// The whole file is one document.
    Text,
    /// One JSON object per line; the document is one string field.
    Jsonl,
}

/// An input file found by expanding the inputs.
#[derive(Debug, Clone)]
pub(crate) struct InputFile {
    pub path: PathBuf,
    pub kind: InputKind,
    pub bytes: u64,
}

/// A document and where it came from.
#[derive(Debug)]
pub(crate) struct Document {
    /// Index of its file in the expanded inputs.
    pub input: usize,
    /// 1-based line number for JSONL documents.
    pub line: Option<usize>,
    /// The text, invalid UTF-8 replaced by U+FFFD.
    pub text: String,
    /// Bytes of input consumed to read it (for progress).
    pub bytes: u64,
    /// Invalid UTF-8 sequences replaced in it.
    pub replaced: u64,
}

/// Expands files and directories into the list of input files. Directories are walked recursively in sorted
/// order, skipping hidden entries (names starting with `.`), so the order does not depend on the file system.
/// Files ending in `.jsonl` or `.ndjson` are JSONL; every other file is plain text.
pub(crate) fn expand_inputs(inputs: &[PathBuf]) -> Result<Vec<InputFile>> {
    let mut files = Vec::new();
    for input in inputs {
        let meta = std::fs::metadata(input).map_err(|e| DatasetError::io(input, e))?;
        if meta.is_dir() {
            walk(input, &mut files)?;
        } else {
            files.push(input_file(input, meta.len()));
        }
    }
    Ok(files)
}

fn walk(dir: &Path, files: &mut Vec<InputFile>) -> Result<()> {
    let mut entries = std::fs::read_dir(dir)
        .and_then(|rd| rd.collect::<std::io::Result<Vec<_>>>())
        .map_err(|e| DatasetError::io(dir, e))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        let meta = std::fs::metadata(&path).map_err(|e| DatasetError::io(&path, e))?;
        if meta.is_dir() {
            walk(&path, files)?;
        } else if meta.is_file() {
            files.push(input_file(&path, meta.len()));
        }
    }
    Ok(())
}

fn input_file(path: &Path, bytes: u64) -> InputFile {
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    let kind = match ext.as_deref() {
        Some("jsonl" | "ndjson") => InputKind::Jsonl,
        _ => InputKind::Text,
    };
    InputFile {
        path: path.to_path_buf(),
        kind,
        bytes,
    }
}

/// Decodes `bytes` as UTF-8, replacing each invalid sequence by U+FFFD; returns the text and the number of
/// replacements.
pub(crate) fn decode_lossy(bytes: Vec<u8>) -> (String, u64) {
    match String::from_utf8(bytes) {
        Ok(text) => (text, 0),
        Err(err) => {
            let bytes = err.into_bytes();
            let mut text = String::with_capacity(bytes.len());
            let mut replaced = 0;
            for chunk in bytes.utf8_chunks() {
                text.push_str(chunk.valid());
                if !chunk.invalid().is_empty() {
                    text.push(char::REPLACEMENT_CHARACTER);
                    replaced += 1;
                }
            }
            (text, replaced)
        }
    }
}

/// Iterates over the documents of the expanded inputs, in order.
pub(crate) struct DocumentReader<'a> {
    files: &'a [InputFile],
    text_field: &'a str,
    next_file: usize,
    jsonl: Option<JsonlState>,
}

struct JsonlState {
    input: usize,
    reader: BufReader<File>,
    line: usize,
}

impl<'a> DocumentReader<'a> {
    pub fn new(files: &'a [InputFile], text_field: &'a str) -> Self {
        Self {
            files,
            text_field,
            next_file: 0,
            jsonl: None,
        }
    }

    fn next_jsonl(&mut self) -> Option<Result<Document>> {
        let state = self.jsonl.as_mut()?;
        let path = &self.files[state.input].path;
        let mut raw = Vec::new();
        loop {
            raw.clear();
            state.line += 1;
            match state.reader.read_until(b'\n', &mut raw) {
                Err(e) => return Some(Err(DatasetError::io(path, e))),
                Ok(0) => {
                    self.jsonl = None;
                    return None;
                }
                Ok(bytes) => {
                    if raw.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    let (line, replaced) = decode_lossy(std::mem::take(&mut raw));
                    let text =
                        jsonl_text(&line, self.text_field).map_err(|message| DatasetError::Jsonl {
                            path: path.clone(),
                            line: state.line,
                            message,
                        });
                    return Some(text.map(|text| Document {
                        input: state.input,
                        line: Some(state.line),
                        text,
                        bytes: bytes as u64,
                        replaced,
                    }));
                }
            }
        }
    }
}

/// The string field `field` of the JSON object on `line`.
fn jsonl_text(line: &str, field: &str) -> std::result::Result<String, String> {
    let value: serde_json::Value =
        serde_json::from_str(line).map_err(|e| format!("invalid JSON: {e}"))?;
    let serde_json::Value::Object(mut object) = value else {
        return Err(format!("expected a JSON object with a `{field}` field"));
    };
    match object.remove(field) {
        Some(serde_json::Value::String(text)) => Ok(text),
        Some(other) => Err(format!("field `{field}` is not a string (found {other})")),
        None => {
            let keys: Vec<&str> = object.keys().map(String::as_str).collect();
            Err(format!(
                "no field `{field}` (the object has: {})",
                keys.join(", ")
            ))
        }
    }
}

impl Iterator for DocumentReader<'_> {
    type Item = Result<Document>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.jsonl.is_some() {
                if let Some(doc) = self.next_jsonl() {
                    return Some(doc);
                }
                continue;
            }
            let input = self.next_file;
            let file = self.files.get(input)?;
            self.next_file += 1;
            match file.kind {
                InputKind::Text => {
                    let bytes = match std::fs::read(&file.path) {
                        Ok(bytes) => bytes,
                        Err(e) => return Some(Err(DatasetError::io(&file.path, e))),
                    };
                    let len = bytes.len() as u64;
                    let (text, replaced) = decode_lossy(bytes);
                    return Some(Ok(Document {
                        input,
                        line: None,
                        text,
                        bytes: len,
                        replaced,
                    }));
                }
                InputKind::Jsonl => match File::open(&file.path) {
                    Ok(f) => {
                        self.jsonl = Some(JsonlState {
                            input,
                            reader: BufReader::new(f),
                            line: 0,
                        })
                    }
                    Err(e) => return Some(Err(DatasetError::io(&file.path, e))),
                },
            }
        }
    }
}

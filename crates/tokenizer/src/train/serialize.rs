//! Writing a trained model as a standard HF `tokenizer.json`.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::error::{Result, TokenizerError};
use crate::tokenizer::Tokenizer;
use crate::train::merge::Learned;

/// A trained byte-level BPE, as the `tokenizer.json` document HF `tokenizers` reads.
#[derive(Debug, Clone)]
pub struct TrainedBpe {
    json: Value,
}

impl TrainedBpe {
    pub(crate) fn new(specials: &[String], learned: Learned) -> Self {
        let added: Vec<Value> = specials
            .iter()
            .enumerate()
            .map(|(id, content)| {
                json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
                       "normalized": false, "special": true})
            })
            .collect();
        let vocab: serde_json::Map<String, Value> = learned
            .vocab
            .iter()
            .enumerate()
            .map(|(id, t)| (t.clone(), json!(id)))
            .collect();
        let merges: Vec<Value> = learned.merges.iter().map(|(l, r)| json!([l, r])).collect();
        let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
        let json = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": byte_level,
            "post_processor": null,
            "decoder": byte_level,
            "model": {
                "type": "BPE",
                "dropout": null,
                "unk_token": null,
                "continuing_subword_prefix": null,
                "end_of_word_suffix": null,
                "fuse_unk": false,
                "byte_fallback": false,
                "ignore_merges": false,
                "vocab": vocab,
                "merges": merges,
            },
        });
        Self { json }
    }

    /// Number of merges learned.
    pub fn num_merges(&self) -> usize {
        self.json["model"]["merges"].as_array().map_or(0, Vec::len)
    }

    /// The `tokenizer.json` text (pretty-printed, deterministic).
    pub fn to_json_string(&self) -> String {
        serde_json::to_string_pretty(&self.json).expect("a JSON value always serializes")
    }

    /// Writes `dir/tokenizer.json` (creating `dir`) and returns the file's path.
    pub fn save(&self, dir: &Path) -> Result<PathBuf> {
        std::fs::create_dir_all(dir).map_err(|e| TokenizerError::io(dir, e))?;
        let path = dir.join("tokenizer.json");
        std::fs::write(&path, self.to_json_string()).map_err(|e| TokenizerError::io(&path, e))?;
        Ok(path)
    }

    /// The trained tokenizer, loaded from the same document HF would read.
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        Tokenizer::from_hf_json_bytes(
            self.to_json_string().as_bytes(),
            Path::new("<trained tokenizer.json>"),
        )
    }
}

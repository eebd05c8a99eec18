//! Reading a family's hyperparameters from GGUF metadata (`{arch}.embedding_length`, ...), as llama.cpp's
//! converter writes them, for the family's `Family::gguf_config` to turn into a Hugging Face `config.json`.
//!
//! Sizes the metadata claims are checked against the tensors the file holds before any spec is built from them,
//! so a lying header is an error naming the key, not a table sized by a count of 2^31.

use serde_json::{Value, json};

use super::{GgufError, GgufFile, TensorInfo};
use crate::arch::norm_eps;

/// GGUF tensor holding the token embedding `[vocab, hidden]`.
pub const TOKEN_EMBD: &str = "token_embd.weight";
/// GGUF tensor holding the untied LM head; absent when the head is tied to the embedding.
pub const OUTPUT: &str = "output.weight";

/// The metadata of one GGUF file under its architecture's prefix.
pub struct GgufHparams<'a> {
    file: &'a GgufFile,
    arch: &'a str,
}

impl<'a> GgufHparams<'a> {
    /// The hyperparameters of `file`, whose `general.architecture` is `arch`.
    pub fn new(file: &'a GgufFile, arch: &'a str) -> Self {
        Self { file, arch }
    }

    /// The file.
    pub fn file(&self) -> &'a GgufFile {
        self.file
    }

    /// The full key of `key` under the architecture's prefix (`llama.block_count`).
    pub fn key(&self, key: &str) -> String {
        format!("{}.{key}", self.arch)
    }

    /// Whether `{arch}.{key}` is present.
    pub fn has(&self, key: &str) -> bool {
        self.file.get(&self.key(key)).is_some()
    }

    /// The unsigned integer `{arch}.{key}`.
    pub fn uint(&self, key: &str) -> Result<u64, GgufError> {
        self.file.require_u64(&self.key(key))
    }

    /// The unsigned integer `{arch}.{key}` if present (of the wrong type: an error naming the key).
    pub fn opt_uint(&self, key: &str) -> Result<Option<u64>, GgufError> {
        self.has(key).then(|| self.uint(key)).transpose()
    }

    /// The float `{arch}.{key}`, refused unless finite: no model setting is NaN or infinite, and on its way into
    /// the family's config JSON a non-finite value would become `null`, which a family reads as absent and
    /// replaces with its default.
    pub fn float(&self, key: &str) -> Result<f64, GgufError> {
        let key = self.key(key);
        let value = self.file.require_f64(&key)?;
        if value.is_finite() {
            return Ok(value);
        }
        Err(self
            .file
            .metadata_error(&key, "a finite number", format!("{value}")))
    }

    /// The float `{arch}.{key}` if present.
    pub fn opt_float(&self, key: &str) -> Result<Option<f64>, GgufError> {
        self.has(key).then(|| self.float(key)).transpose()
    }

    /// The boolean `{arch}.{key}`, `default` when absent.
    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool, GgufError> {
        match self.file.get(&self.key(key)) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| {
                self.file
                    .metadata_error(&self.key(key), "a boolean", v.type_name())
            }),
        }
    }

    /// The info of tensor `name`, if the file holds it.
    pub fn tensor(&self, name: &str) -> Option<&'a TensorInfo> {
        self.file.tensor_info(name).ok()
    }

    /// Whether the LM head is tied: the file has no `output.weight`.
    pub fn tied(&self) -> bool {
        self.tensor(OUTPUT).is_none()
    }

    /// The vocabulary size: the height of `token_embd.weight`.
    pub fn vocab_size(&self) -> Result<u64, GgufError> {
        let embd = self.file.tensor_info(TOKEN_EMBD)?;
        match embd.dims.as_slice() {
            [_, vocab] => Ok(*vocab),
            dims => Err(GgufError::Corrupt {
                path: self.file.path().to_path_buf(),
                what: format!("tensor `{TOKEN_EMBD}`"),
                reason: format!("expected 2 dimensions, found {dims:?}"),
            }),
        }
    }

    /// `{arch}.embedding_length`, checked against the width of `token_embd.weight`.
    pub fn hidden_size(&self) -> Result<u64, GgufError> {
        let hidden = self.uint("embedding_length")?;
        let embd = self.file.tensor_info(TOKEN_EMBD)?;
        if embd.dims.first() != Some(&hidden) {
            return Err(self.file.metadata_error(
                &self.key("embedding_length"),
                &format!("the width of `{TOKEN_EMBD}` ({})", dim(embd.dims.first())),
                hidden.to_string(),
            ));
        }
        Ok(hidden)
    }

    /// `{arch}.block_count`, checked against the blocks whose tensors the file holds: every block has its own
    /// tensors, so a count beyond the file's tensor count cannot be true (and is refused before a name is built
    /// for an absurd index).
    pub fn block_count(&self) -> Result<u64, GgufError> {
        let blocks = self.uint("block_count")?;
        let last = blocks
            .checked_sub(1)
            .filter(|&last| last < self.file.tensors().len() as u64)
            .map(|last| format!("blk.{last}.attn_norm.weight"));
        if last
            .as_deref()
            .is_none_or(|name| self.tensor(name).is_none())
        {
            return Err(self.file.metadata_error(
                &self.key("block_count"),
                "a count of the blocks whose tensors the file holds (from 1, `blk.0.*`, up to the file's tensor count)",
                blocks.to_string(),
            ));
        }
        Ok(blocks)
    }

    /// `{arch}.feed_forward_length`, checked against the input width of `blk.0.ffn_down.weight` (the MLP's
    /// hidden width in every family, stacked gate/up or not).
    pub fn feed_forward_length(&self) -> Result<u64, GgufError> {
        let ffn = self.uint("feed_forward_length")?;
        if let Some(down) = self.tensor("blk.0.ffn_down.weight")
            && down.dims.first() != Some(&ffn)
        {
            return Err(self.file.metadata_error(
                &self.key("feed_forward_length"),
                &format!(
                    "the width of `blk.0.ffn_down.weight` ({})",
                    dim(down.dims.first())
                ),
                ffn.to_string(),
            ));
        }
        Ok(ffn)
    }

    /// `{arch}.rope.freq_base`, `default` when absent.
    pub fn rope_theta(&self, default: f64) -> Result<f64, GgufError> {
        Ok(self.opt_float("rope.freq_base")?.unwrap_or(default))
    }

    /// `{arch}.rope.scaling.*` as a Hugging Face `rope_scaling` object (`null` for none). Types ember cannot run
    /// (YaRN, LongRoPE) are errors naming the key.
    pub fn rope_scaling(&self) -> Result<Value, GgufError> {
        let key = self.key("rope.scaling.type");
        let kind = match self.file.get(&key) {
            None => return Ok(Value::Null),
            Some(v) => v
                .as_str()
                .ok_or_else(|| self.file.metadata_error(&key, "a string", v.type_name()))?,
        };
        match kind {
            "none" => Ok(Value::Null),
            "linear" => {
                Ok(json!({"rope_type": "linear", "factor": self.float("rope.scaling.factor")?}))
            }
            other => Err(self.file.metadata_error(
                &key,
                "\"none\" or \"linear\" (the scalings ember runs)",
                format!("{other:?}"),
            )),
        }
    }

    /// The keys every RoPE family of llama.cpp writes the same way, as `config.json` keys: sizes, heads, the
    /// RMSNorm epsilon, RoPE base and scaling, and a tied head when `output.weight` is absent. A family adds or
    /// overrides its own keys on the returned object.
    pub fn rope_lineage(&self, architecture: &str, default_theta: f64) -> Result<Value, GgufError> {
        let hidden = self.hidden_size()?;
        let heads = self.uint("attention.head_count")?;
        let kv_heads = self.opt_uint("attention.head_count_kv")?.unwrap_or(heads);
        let head_dim = match self.opt_uint("attention.key_length")? {
            Some(d) => d,
            None => hidden / heads.max(1),
        };
        Ok(json!({
            "architectures": [architecture],
            "vocab_size": self.vocab_size()?,
            "hidden_size": hidden,
            "intermediate_size": self.feed_forward_length()?,
            "num_hidden_layers": self.block_count()?,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "head_dim": head_dim,
            "max_position_embeddings": self.uint("context_length")?,
            "rms_norm_eps": norm_eps::from_gguf(self, "attention.layer_norm_rms_epsilon")?,
            "rope_theta": self.rope_theta(default_theta)?,
            "rope_scaling": self.rope_scaling()?,
            "tie_word_embeddings": self.tied(),
        }))
    }
}

/// A tensor dimension for a message: its value, or `none` when the tensor has fewer dimensions.
fn dim(d: Option<&u64>) -> String {
    d.map_or_else(|| "none".to_string(), u64::to_string)
}

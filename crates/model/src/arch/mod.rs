//! The architecture registry: `config.json`'s `architectures[0]` selects a [`Family`], which parses the config
//! into a [`ModelSpec`] and maps our canonical tensor names to the checkpoint's.
//!
//! Adding a family is one file in this directory and one line in [`REGISTRY`] (see docs/ARCHITECTURES.md).

use std::ops::Range;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{ModelError, Result};
use crate::gguf::{GgufError, GgufHparams, MetadataValue};
use crate::spec::ModelSpec;
use crate::tensors::TensorSpec;

pub use gguf_names::{GgufTensor, gguf_name};
pub use scratch::{ScratchShape, scratch_spec};

mod gemma;
mod gguf_names;
mod gpt2;
mod gpt_neo;
mod gpt_neox;
mod hf_names;
mod llama;
mod mistral;
pub(crate) mod norm_eps;
mod phi3;
mod qwen2;
mod qwen3;
pub(crate) mod rope;
mod scratch;

/// How a stored tensor is laid out relative to our canonical orientation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Same orientation as the canonical tensor (`[out, in]` for linear weights, PyTorch `nn.Linear`).
    Canonical,
    /// A linear weight stored `[in, out]` (GPT-2's `Conv1D`).
    Transposed,
}

/// Where one canonical tensor lives in a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSource {
    /// The checkpoint's tensor name.
    pub name: String,
    /// Orientation of the stored tensor.
    pub layout: Layout,
    /// The stored tensor's full shape, as in the file.
    pub stored_shape: Vec<usize>,
    /// For stacked tensors: the output rows (in canonical orientation) that make up this canonical tensor, in
    /// order; `None` takes the whole tensor.
    pub rows: Option<Vec<Range<usize>>>,
}

impl TensorSource {
    /// A tensor stored whole, in canonical orientation.
    pub fn whole(name: impl Into<String>, canonical: &TensorSpec) -> Self {
        TensorSource {
            name: name.into(),
            layout: Layout::Canonical,
            stored_shape: canonical.shape.clone(),
            rows: None,
        }
    }

    /// A slice of a stacked tensor: `rows` of a stored tensor whose canonical-orientation shape is `stacked_shape`.
    pub fn stacked(
        name: impl Into<String>,
        stacked_shape: Vec<usize>,
        rows: Vec<Range<usize>>,
    ) -> Self {
        TensorSource {
            name: name.into(),
            layout: Layout::Canonical,
            stored_shape: stacked_shape,
            rows: Some(rows),
        }
    }

    /// The same source with a `[in, out]` stored layout (the stored shape is swapped accordingly).
    pub fn transposed(mut self) -> Self {
        if self.stored_shape.len() == 2 {
            self.layout = Layout::Transposed;
            self.stored_shape.swap(0, 1);
        }
        self
    }
}

/// One model family: its config format and its checkpoint naming.
pub trait Family: Sync {
    /// The Hugging Face architecture name (`architectures[0]`).
    fn architecture(&self) -> &'static str;

    /// Builds the spec from a parsed `config.json`. Errors are messages naming the key; the caller adds the file.
    fn parse_config(&self, config: &Value) -> Result<ModelSpec, String>;

    /// Where the canonical tensor `tensor` of a model with `spec` is stored.
    fn source(&self, spec: &ModelSpec, tensor: &TensorSpec) -> TensorSource;

    /// The `config.json` that makes `transformers` rebuild exactly `spec`, or why this family cannot express it.
    fn to_config(&self, spec: &ModelSpec) -> Result<Value, String>;

    /// The `config.json` of a fresh model of this family with ember's shape keys (`model.architecture` in a
    /// run config); the LLaMA lineage's key names by default.
    fn scratch_config(&self, shape: &ScratchShape) -> Value {
        scratch::llama_lineage_config(self.architecture(), shape)
    }

    /// llama.cpp's `general.architecture` for this family, when ember reads the family from GGUF.
    fn gguf_architecture(&self) -> Option<&'static str> {
        None
    }

    /// The `config.json` equivalent to a GGUF file's metadata, as llama.cpp's converter wrote it from the
    /// Hugging Face config; [`Family::parse_config`] then reads it like any other.
    fn gguf_config(&self, hparams: &GgufHparams<'_>) -> Result<Value, GgufError> {
        Err(hparams.file().metadata_error(
            "general.architecture",
            "an architecture ember reads from GGUF",
            self.architecture().to_string(),
        ))
    }

    /// Where canonical `tensor` of a model with `spec` lives in a GGUF file of this family (llama.cpp's names
    /// by default); `None` when the family has no such tensor.
    fn gguf_tensor(&self, _spec: &ModelSpec, tensor: &TensorSpec) -> Option<GgufTensor> {
        gguf_names::whole(&tensor.name)
    }

    /// The `{arch}.*` metadata of a GGUF file holding a model of `spec`, as llama.cpp's converter writes it
    /// from the Hugging Face config (what [`Family::gguf_config`] reads back), or why this family is not written
    /// as GGUF.
    fn gguf_metadata(&self, _spec: &ModelSpec) -> Result<Vec<(String, MetadataValue)>, String> {
        Err(format!(
            "ember does not write {} models as GGUF (llama.cpp has no architecture for them)",
            self.architecture()
        ))
    }

    /// The 1-D f32 tensors a GGUF file of this family carries beside the weights, made from `spec` as the
    /// converter makes them (LLaMA 3's `rope_freqs.weight`, LongRoPE's two factor tensors): name and values.
    fn gguf_rope_tensors(&self, _spec: &ModelSpec) -> Vec<(&'static str, Vec<f32>)> {
        Vec::new()
    }
}

/// Every supported family. Keep in sync with docs/ARCHITECTURES.md.
pub static REGISTRY: &[&dyn Family] = &[
    &gpt2::Gpt2,
    &llama::Llama,
    &mistral::Mistral,
    &qwen2::Qwen2,
    &qwen3::Qwen3,
    &phi3::Phi3,
    &gpt_neox::GptNeoX,
    &gpt_neo::GptNeo,
    &gemma::Gemma2,
    &gemma::Gemma3,
];

/// The names of all supported architectures.
pub fn supported() -> Vec<&'static str> {
    REGISTRY.iter().map(|f| f.architecture()).collect()
}

/// The family registered under `architecture`.
pub fn family(architecture: &str) -> Option<&'static dyn Family> {
    REGISTRY
        .iter()
        .copied()
        .find(|f| f.architecture() == architecture)
}

/// The family llama.cpp calls `architecture` (`general.architecture` of a GGUF file).
pub fn gguf_family(architecture: &str) -> Option<&'static dyn Family> {
    REGISTRY
        .iter()
        .copied()
        .find(|f| f.gguf_architecture() == Some(architecture))
}

/// The GGUF architectures ember reads, in registry order.
pub fn gguf_supported() -> Vec<&'static str> {
    let mut supported: Vec<&'static str> = Vec::new();
    for arch in REGISTRY.iter().filter_map(|f| f.gguf_architecture()) {
        if !supported.contains(&arch) {
            supported.push(arch);
        }
    }
    supported
}

/// Parses `config` (the contents of the file at `path`, used in error messages) into its family and spec.
pub fn parse_config_value(config: &Value, path: &Path) -> Result<(&'static dyn Family, ModelSpec)> {
    let config_error = |message: String| ModelError::Config {
        path: path.to_path_buf(),
        message,
    };
    let architecture = config
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(Value::as_str)
        .ok_or_else(|| {
            config_error("missing key `architectures` (a list naming the model class)".to_string())
        })?;
    let family = family(architecture).ok_or_else(|| ModelError::UnknownArchitecture {
        path: path.to_path_buf(),
        found: architecture.to_string(),
        supported: supported(),
    })?;
    let spec = family.parse_config(config).map_err(config_error)?;
    spec.validate().map_err(|e| config_error(e.to_string()))?;
    Ok((family, spec))
}

/// Reads and parses a `config.json`.
pub fn read_config(path: &Path) -> Result<(&'static dyn Family, ModelSpec)> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let value: Value = serde_json::from_str(&text).map_err(|e| ModelError::Config {
        path: path.to_path_buf(),
        message: non_json_float(&text, &e).unwrap_or_else(|| format!("invalid JSON: {e}")),
    })?;
    parse_config_value(&value, path)
}

/// The message for a JSON syntax error at a bare `NaN`, `Infinity` or `-Infinity` under a key: Python's `json`
/// (and so transformers' `save_pretrained`) writes a non-finite float that way, and serde_json's error gives only
/// a line and column. Names the key and what it should hold.
fn non_json_float(text: &str, error: &serde_json::Error) -> Option<String> {
    if !error.is_syntax() {
        return None;
    }
    // serde_json's column is 1-based, in bytes, at the byte it stopped on: the `N` or `I` (after a `-`).
    let line_start: usize = text
        .split_inclusive('\n')
        .take(error.line().checked_sub(1)?)
        .map(str::len)
        .sum();
    let at = line_start + error.column().checked_sub(1)?;
    let (mut before, rest) = (text.get(..at)?, text.get(at..)?);
    let mut literal = ["NaN", "Infinity"]
        .into_iter()
        .find(|l| rest.starts_with(l))?
        .to_string();
    if let Some(sign) = before.strip_suffix('-') {
        (before, literal) = (sign, format!("-{literal}"));
    }
    let quoted = before
        .trim_end()
        .strip_suffix(':')?
        .trim_end()
        .strip_suffix('"')?;
    let key = &quoted[quoted.rfind('"')? + 1..];
    let expected = if norm_eps::CONFIG_KEYS.contains(&key) {
        norm_eps::EXPECTED
    } else {
        "a finite number"
    };
    Some(format!(
        "`{key}` is {literal}, a float JSON cannot hold (Python's json module writes it anyway), expected {expected}"
    ))
}

/// Deserialises a family's config struct, turning serde's error into a message that names the key: serde_json
/// alone says "invalid type: string \"8\", expected usize" without saying where.
pub(crate) fn from_value<T: DeserializeOwned>(config: &Value) -> Result<T, String> {
    serde_path_to_error::deserialize(config).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path.is_empty() || path == "." {
            inner.to_string()
        } else {
            format!("`{path}`: {inner}")
        }
    })
}

/// `n` as a layer count read from `key`, refused before anything is built per layer: a count of 2^40 would
/// otherwise size per-layer tables (windows, tensor lists) and abort before [`ModelSpec::validate`] runs.
pub(crate) fn layer_count(key: &str, n: usize) -> Result<usize, String> {
    use crate::spec::MAX_LAYERS;
    if n > MAX_LAYERS {
        return Err(format!("`{key}` is {n}, expected at most {MAX_LAYERS}"));
    }
    Ok(n)
}

/// `hidden / heads` for a family that derives the head width, refusing a split that truncates (heads that do
/// not divide the hidden size would silently drop columns).
pub(crate) fn derived_head_dim(
    hidden_key: &str,
    hidden: usize,
    heads_key: &str,
    heads: usize,
) -> Result<usize, String> {
    if heads == 0 {
        return Err(format!("`{heads_key}` must be positive"));
    }
    if !hidden.is_multiple_of(heads) {
        return Err(format!(
            "`{hidden_key}` ({hidden}) must be a multiple of `{heads_key}` ({heads})"
        ));
    }
    Ok(hidden / heads)
}

/// `factor * size` for a default such as GPT-2's `n_inner = 4 * n_embd`, an error instead of an overflow.
pub(crate) fn times(factor: usize, key: &str, size: usize) -> Result<usize, String> {
    factor
        .checked_mul(size)
        .ok_or_else(|| format!("`{key}` ({size}) is too large"))
}

/// Parses a Hugging Face activation name, naming the key on failure.
pub(crate) fn activation(key: &str, name: &str) -> Result<crate::spec::Activation, String> {
    crate::spec::Activation::from_hf(name)
        .ok_or_else(|| format!("unsupported `{key}` value `{name}` (supported: gelu, gelu_new, gelu_pytorch_tanh, silu, relu)"))
}

/// The `layer` index and the suffix after it of a canonical per-layer name (`layers.3.attn.q.weight`).
pub fn split_layer(name: &str) -> Option<(usize, &str)> {
    let rest = name.strip_prefix("layers.")?;
    let (index, suffix) = rest.split_once('.')?;
    Some((index.parse().ok()?, suffix))
}

//! The `llama` GGUF architecture: its metadata as a Hugging Face `LlamaForCausalLM` config, and its tensor names
//! and layouts mapped to ember's canonical tensors.
//!
//! llama.cpp's converter permutes the rows of the query and key projections so that each head's rotary pairs are
//! adjacent (`(x[2i], x[2i+1])`, GPT-J layout) instead of half a head apart (`(x[i], x[i + d/2])`, the Hugging Face
//! rotate-half layout). [`unpermute_rows`] undoes that, so a GGUF model loads into exactly the weights
//! `transformers` builds from the same file.

use std::path::Path;

use ember_optimization::QuantizedWeight;
use serde_json::{Value, json};

use super::{GgmlType, GgufError, GgufFile};
use crate::spec::ModelSpec;

/// GGUF tensor holding the token embedding `[vocab, hidden]`.
pub const TOKEN_EMBD: &str = "token_embd.weight";
/// GGUF tensor holding the untied LM head; absent when the head is tied to the embedding.
pub const OUTPUT: &str = "output.weight";

/// The `LlamaForCausalLM` `config.json` equivalent to a GGUF file's `llama.*` metadata.
pub fn hf_config(file: &GgufFile) -> Result<Value, GgufError> {
    let arch = file.require_str("general.architecture")?;
    if arch != "llama" {
        return Err(file.metadata_error(
            "general.architecture",
            "\"llama\" (the only GGUF architecture supported)",
            format!("{arch:?}"),
        ));
    }
    let key = |k: &str| format!("llama.{k}");
    let uint = |k: &str| file.require_u64(&key(k));
    let opt_uint = |k: &str| file.get(&key(k)).map(|_| uint(k)).transpose();
    let hidden = uint("embedding_length")?;
    let heads = uint("attention.head_count")?;
    let kv_heads = opt_uint("attention.head_count_kv")?.unwrap_or(heads);
    let head_dim = match opt_uint("attention.key_length")? {
        Some(d) => d,
        None => opt_uint("rope.dimension_count")?.unwrap_or(hidden / heads.max(1)),
    };
    let embd = file.tensor_info(TOKEN_EMBD)?;
    let vocab = embd
        .dims
        .get(1)
        .copied()
        .ok_or_else(|| GgufError::Corrupt {
            path: file.path().to_path_buf(),
            what: format!("tensor `{TOKEN_EMBD}`"),
            reason: format!("expected 2 dimensions, found {:?}", embd.dims),
        })?;
    check_against_tensors(
        file,
        hidden,
        uint("block_count")?,
        uint("feed_forward_length")?,
    )?;
    let theta = match file.get(&key("rope.freq_base")) {
        Some(_) => file.require_f64(&key("rope.freq_base"))?,
        None => 10_000.0,
    };
    let rope_scaling = match file.get(&key("rope.scaling.type")).and_then(|v| v.as_str()) {
        None | Some("none") => Value::Null,
        Some("linear") => {
            json!({"rope_type": "linear", "factor": file.require_f64(&key("rope.scaling.factor"))?})
        }
        Some(other) => {
            return Err(file.metadata_error(
                &key("rope.scaling.type"),
                "\"none\" or \"linear\"",
                format!("{other:?}"),
            ));
        }
    };
    Ok(json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": uint("feed_forward_length")?,
        "num_hidden_layers": uint("block_count")?,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": uint("context_length")?,
        "rms_norm_eps": file.require_f64(&key("attention.layer_norm_rms_epsilon"))?,
        "rope_theta": theta,
        "rope_scaling": rope_scaling,
        "tie_word_embeddings": file.tensor_info(OUTPUT).is_err(),
    }))
}

/// Checks the sizes the metadata claims against the tensors the file holds, so that a lying header is an error
/// naming the key before a spec (and the per-layer tables built from it) is sized by it: the embedding's width is
/// the hidden size, the last block's tensors exist (a block count of 2^31 otherwise sized a 32 GiB table), and the
/// first block's MLP has the claimed width.
fn check_against_tensors(
    file: &GgufFile,
    hidden: u64,
    blocks: u64,
    ffn: u64,
) -> Result<(), GgufError> {
    let embd = file.tensor_info(TOKEN_EMBD)?;
    if embd.dims.first() != Some(&hidden) {
        return Err(file.metadata_error(
            "llama.embedding_length",
            &format!("the width of `{TOKEN_EMBD}` ({})", dim(embd.dims.first())),
            hidden.to_string(),
        ));
    }
    // Every block has its own tensors, so a count beyond the file's tensors cannot be true; checking the count
    // first keeps the name below from being built for an absurd index.
    let last = blocks
        .checked_sub(1)
        .filter(|&last| last < file.tensors().len() as u64)
        .map(|last| format!("blk.{last}.attn_norm.weight"));
    if last
        .as_deref()
        .is_none_or(|name| file.tensor_info(name).is_err())
    {
        return Err(file.metadata_error(
            "llama.block_count",
            "a count of the blocks whose tensors the file holds (from 1, `blk.0.*`, up to the file's tensor count)",
            blocks.to_string(),
        ));
    }
    if let Ok(up) = file.tensor_info("blk.0.ffn_up.weight")
        && up.dims.get(1) != Some(&ffn)
    {
        return Err(file.metadata_error(
            "llama.feed_forward_length",
            &format!(
                "the height of `blk.0.ffn_up.weight` ({})",
                dim(up.dims.get(1))
            ),
            ffn.to_string(),
        ));
    }
    Ok(())
}

/// A tensor dimension for a message: its value, or `none` when the tensor has fewer dimensions.
fn dim(d: Option<&u64>) -> String {
    d.map_or_else(|| "none".to_string(), u64::to_string)
}

/// The [`ModelSpec`] of a `llama` GGUF file, validated like any Hugging Face config.
pub fn llama_spec(file: &GgufFile) -> crate::Result<ModelSpec> {
    let config = hf_config(file)?;
    let (_, spec) = crate::arch::parse_config_value(&config, file.path())?;
    Ok(spec)
}

/// The GGUF name of canonical tensor `canonical`, and, for the query and key projections, the number of heads
/// whose rows llama.cpp permuted.
pub fn gguf_name(spec: &ModelSpec, canonical: &str) -> Option<(String, Option<usize>)> {
    Some(match canonical {
        "embed.weight" => (TOKEN_EMBD.to_string(), None),
        "final_norm.weight" => ("output_norm.weight".to_string(), None),
        "lm_head.weight" => (OUTPUT.to_string(), None),
        _ => {
            let (layer, suffix) = crate::arch::split_layer(canonical)?;
            let (name, heads) = match suffix {
                "attn_norm.weight" => ("attn_norm.weight", None),
                "attn.q.weight" => ("attn_q.weight", Some(spec.num_heads)),
                "attn.k.weight" => ("attn_k.weight", Some(spec.num_kv_heads)),
                "attn.v.weight" => ("attn_v.weight", None),
                "attn.o.weight" => ("attn_output.weight", None),
                "mlp_norm.weight" => ("ffn_norm.weight", None),
                "mlp.gate.weight" => ("ffn_gate.weight", None),
                "mlp.up.weight" => ("ffn_up.weight", None),
                "mlp.down.weight" => ("ffn_down.weight", None),
                _ => return None,
            };
            (format!("blk.{layer}.{name}"), heads)
        }
    })
}

/// Undoes llama.cpp's query/key row permutation of a row-major `[heads * head_dim, cols]` matrix: GGUF row
/// `h*d + 2i + j` becomes row `h*d + j*(d/2) + i` (`j` in 0..2, `i` in 0..d/2).
///
/// Generic over the element so that quantized rows (packed codes, per-group scales) move the same way.
pub fn unpermute_rows<T: Copy + Default>(data: &[T], heads: usize, cols: usize) -> Vec<T> {
    let rows = data.len() / cols.max(1);
    let head_dim = rows / heads.max(1);
    let half = head_dim / 2;
    let mut out = vec![T::default(); data.len()];
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                let from = h * head_dim + 2 * i + j;
                let to = h * head_dim + j * half + i;
                out[to * cols..(to + 1) * cols]
                    .copy_from_slice(&data[from * cols..(from + 1) * cols]);
            }
        }
    }
    out
}

/// Whether `path` looks like a GGUF file (by its magic number), for callers that accept a directory or a file.
pub fn is_gguf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && &magic == b"GGUF"
}

/// Reads canonical tensors of a `llama` GGUF file, dequantized to f32 and un-permuted (see [`unpermute_rows`]).
pub struct GgufSource<'a> {
    file: &'a GgufFile,
    spec: &'a ModelSpec,
    keep_quantized: bool,
}

impl<'a> GgufSource<'a> {
    /// A source over `file` for a model of `spec` (from [`llama_spec`]).
    pub fn new(file: &'a GgufFile, spec: &'a ModelSpec) -> Self {
        Self {
            file,
            spec,
            keep_quantized: false,
        }
    }

    /// Hands Q8_0, Q4_0 and Q4_1 matrices over as quantized weights, block for block (see
    /// [`WeightSource::take_quantized`](crate::weights::WeightSource::take_quantized)).
    pub fn keep_quantized(mut self) -> Self {
        self.keep_quantized = true;
        self
    }

    /// The GGUF tensor behind canonical `tensor`, with its shape checked, and the query/key head count to
    /// un-permute by.
    fn locate(
        &self,
        tensor: &crate::tensors::TensorSpec,
    ) -> crate::Result<(&super::TensorInfo, Option<usize>)> {
        let (name, permuted_heads) =
            gguf_name(self.spec, &tensor.name).ok_or_else(|| crate::ModelError::MissingTensor {
                name: tensor.name.clone(),
                canonical: tensor.name.clone(),
                dir: self.file.path().to_path_buf(),
            })?;
        let info = self
            .file
            .tensor_info(&name)
            .map_err(|_| crate::ModelError::MissingTensor {
                name: name.clone(),
                canonical: tensor.name.clone(),
                dir: self.file.path().to_path_buf(),
            })?;
        if info.shape() != tensor.shape {
            return Err(crate::ModelError::ShapeMismatch {
                file: self.file.path().to_path_buf(),
                name,
                expected: tensor.shape.clone(),
                found: info.shape(),
            });
        }
        Ok((info, permuted_heads))
    }
}

impl crate::weights::WeightSource for GgufSource<'_> {
    fn take(&mut self, tensor: &crate::tensors::TensorSpec) -> crate::Result<Vec<f32>> {
        let (info, permuted_heads) = self.locate(tensor)?;
        let (_, values) = self.file.tensor_f32(&info.name)?;
        Ok(match permuted_heads {
            Some(heads) => unpermute_rows(&values, heads, tensor.shape[1]),
            None => values,
        })
    }

    fn take_quantized(
        &mut self,
        tensor: &crate::tensors::TensorSpec,
    ) -> crate::Result<Option<QuantizedWeight>> {
        if !self.keep_quantized || tensor.shape.len() != 2 {
            return Ok(None);
        }
        let (info, permuted_heads) = self.locate(tensor)?;
        let shape = [tensor.shape[0], tensor.shape[1]];
        let bytes = self.file.tensor_bytes(&info.name)?;
        let weight = match info.ggml_type {
            GgmlType::Q8_0 => QuantizedWeight::from_gguf_q8_0(bytes, shape),
            GgmlType::Q4_0 => QuantizedWeight::from_gguf_q4_0(bytes, shape),
            GgmlType::Q4_1 => QuantizedWeight::from_gguf_q4_1(bytes, shape),
            _ => return Ok(None),
        }
        .map_err(|e| self.blocks_error(info, e))?;
        let Some(heads) = permuted_heads else {
            return Ok(Some(weight));
        };
        let rows = |data: &[f32]| unpermute_rows(data, heads, weight.groups_per_row());
        QuantizedWeight::from_parts(
            weight.scheme(),
            shape,
            unpermute_rows(weight.packed_codes(), heads, weight.row_bytes()),
            rows(weight.scales()),
            weight.mins().map(rows),
        )
        .map(Some)
        .map_err(|e| self.blocks_error(info, e))
    }
}

impl GgufSource<'_> {
    /// Quantized blocks of a tensor that do not make a weight: the file's error, so it names the file.
    fn blocks_error(
        &self,
        info: &super::TensorInfo,
        e: ember_optimization::QuantError,
    ) -> crate::ModelError {
        GgufError::Corrupt {
            path: self.file.path().to_path_buf(),
            what: format!("tensor `{}`", info.name),
            reason: e.to_string(),
        }
        .into()
    }
}

/// Loads a `llama` GGUF model onto `device`: its spec and every weight dequantized to f32.
pub fn load<B: crate::EmberBackend>(
    file: &GgufFile,
    device: &B::Device,
    progress: Option<crate::weights::Progress<'_>>,
) -> crate::Result<crate::Transformer<B>> {
    let spec = llama_spec(file)?;
    crate::Transformer::from_source(&spec, &mut GgufSource::new(file, &spec), device, progress)
}

/// Loads a `llama` GGUF model onto `device` keeping its Q8_0, Q4_0 and Q4_1 matrices quantized exactly as
/// stored (the dequantized values are bit-identical to ggml's); tensors of other types load as f32.
pub fn load_quantized<B: crate::EmberBackend>(
    file: &GgufFile,
    device: &B::Device,
    progress: Option<crate::weights::Progress<'_>>,
) -> crate::Result<crate::Transformer<B>> {
    let spec = llama_spec(file)?;
    let mut source = GgufSource::new(file, &spec).keep_quantized();
    crate::Transformer::from_source(&spec, &mut source, device, progress)
}

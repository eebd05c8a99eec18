//! llama.cpp's tensor naming (`blk.{i}.attn_q.weight`, ...), shared by every family's GGUF mapping, and
//! [`GgufTensor`], where one canonical tensor lives in a GGUF file and what llama.cpp's converter did to it.

use std::ops::Range;

use super::split_layer;
use crate::spec::ModelSpec;
use crate::tensors::{EMBED, LM_HEAD, POS_EMBED, TensorSpec};

/// Where one canonical tensor lives in a GGUF file, and how the converter changed it.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufTensor {
    /// The GGUF tensor name.
    pub name: String,
    /// For stacked tensors (`attn_qkv`, Phi-3's `ffn_up`): the rows (canonical `[out, in]` orientation) that make up
    /// this canonical tensor; `None` takes the whole tensor.
    pub rows: Option<Range<usize>>,
    /// llama.cpp's query/key row permutation (rotary pairs made adjacent), by the head count it was applied with;
    /// undone on load (see [`crate::gguf::unpermute_rows`]).
    pub permuted_heads: Option<usize>,
    /// What the converter added to every value (Gemma stores its norms as `1 + weight`); subtracted on load.
    pub offset: f32,
}

impl GgufTensor {
    /// A tensor stored whole and unchanged under `name`.
    pub fn whole(name: impl Into<String>) -> Self {
        GgufTensor {
            name: name.into(),
            rows: None,
            permuted_heads: None,
            offset: 0.0,
        }
    }

    /// `rows` of the stacked tensor `name`.
    pub fn stacked(name: impl Into<String>, rows: Range<usize>) -> Self {
        GgufTensor {
            rows: Some(rows),
            ..Self::whole(name)
        }
    }

    /// The same tensor with its rows permuted by llama.cpp for `heads` heads.
    pub fn permuted(mut self, heads: usize) -> Self {
        self.permuted_heads = Some(heads);
        self
    }

    /// The same tensor stored with `offset` added to every value.
    pub fn offset(mut self, offset: f32) -> Self {
        self.offset = offset;
        self
    }
}

/// llama.cpp's name of the canonical module `module` of a block (`attn.q` -> `attn_q`); `None` for a module
/// llama.cpp has no separate tensor for.
fn block_module(module: &str) -> Option<&'static str> {
    Some(match module {
        "attn_norm" => "attn_norm",
        "attn.q" => "attn_q",
        "attn.k" => "attn_k",
        "attn.v" => "attn_v",
        "attn.o" => "attn_output",
        "attn.q_norm" => "attn_q_norm",
        "attn.k_norm" => "attn_k_norm",
        "mlp_norm" => "ffn_norm",
        "mlp.gate" => "ffn_gate",
        "mlp.up" => "ffn_up",
        "mlp.down" => "ffn_down",
        _ => return None,
    })
}

/// llama.cpp's name of canonical tensor `canonical` (`layers.3.attn.q.weight` -> `blk.3.attn_q.weight`).
pub fn gguf_name(canonical: &str) -> Option<String> {
    Some(match canonical {
        EMBED => "token_embd.weight".to_string(),
        POS_EMBED => "position_embd.weight".to_string(),
        LM_HEAD => "output.weight".to_string(),
        _ => {
            if let Some(param) = canonical.strip_prefix("final_norm.") {
                return Some(format!("output_norm.{param}"));
            }
            let (layer, suffix) = split_layer(canonical)?;
            let (module, param) = suffix.rsplit_once('.')?;
            format!("blk.{layer}.{}.{param}", block_module(module)?)
        }
    })
}

/// The canonical tensor stored whole under its llama.cpp name.
pub fn whole(canonical: &str) -> Option<GgufTensor> {
    gguf_name(canonical).map(GgufTensor::whole)
}

/// For `attn.{q,k,v}.{weight,bias}` of block `layer`: the rows of the stacked `blk.{layer}.attn_qkv` tensor
/// (`[q; k; v]`, llama.cpp's layout for GPT-2, GPT-NeoX and Phi-3), given the query and key/value widths.
pub fn stacked_qkv(layer: usize, suffix: &str, q: usize, kv: usize) -> Option<GgufTensor> {
    let (module, param) = suffix.rsplit_once('.')?;
    let rows = match module {
        "attn.q" => 0..q,
        "attn.k" => q..q + kv,
        "attn.v" => q + kv..q + 2 * kv,
        _ => return None,
    };
    Some(GgufTensor::stacked(
        format!("blk.{layer}.attn_qkv.{param}"),
        rows,
    ))
}

/// The query, key and value from the stacked `attn_qkv` (see [`stacked_qkv`]), every other tensor whole under its
/// llama.cpp name: the placement of GPT-2, GPT-NeoX and (outside its stacked MLP) Phi-3.
pub fn stacked_qkv_or_whole(spec: &ModelSpec, tensor: &TensorSpec) -> Option<GgufTensor> {
    split_layer(&tensor.name)
        .and_then(|(layer, suffix)| stacked_qkv(layer, suffix, spec.q_dim(), spec.kv_dim()))
        .or_else(|| whole(&tensor.name))
}

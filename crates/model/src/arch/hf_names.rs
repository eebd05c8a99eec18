//! The checkpoint naming shared by the LLaMA lineage (LLaMA, Mistral, Qwen2/3, Phi-3 outside its stacked layers).

use super::{TensorSource, split_layer};
use crate::tensors::{EMBED, LM_HEAD, TensorSpec};

/// `model.layers.{i}.self_attn.q_proj.weight` and friends for a canonical tensor.
pub(crate) fn llama_name(canonical: &str) -> String {
    if canonical == EMBED {
        return "model.embed_tokens.weight".to_string();
    }
    if canonical == LM_HEAD {
        return "lm_head.weight".to_string();
    }
    if let Some(rest) = canonical.strip_prefix("final_norm.") {
        return format!("model.norm.{rest}");
    }
    let Some((layer, suffix)) = split_layer(canonical) else {
        return canonical.to_string();
    };
    let (module, param) = suffix.rsplit_once('.').unwrap_or((suffix, ""));
    let hf = match module {
        "attn_norm" => "input_layernorm",
        "mlp_norm" => "post_attention_layernorm",
        "attn.q" => "self_attn.q_proj",
        "attn.k" => "self_attn.k_proj",
        "attn.v" => "self_attn.v_proj",
        "attn.o" => "self_attn.o_proj",
        "attn.q_norm" => "self_attn.q_norm",
        "attn.k_norm" => "self_attn.k_norm",
        "mlp.gate" => "mlp.gate_proj",
        "mlp.up" => "mlp.up_proj",
        "mlp.down" => "mlp.down_proj",
        other => other,
    };
    format!("model.layers.{layer}.{hf}.{param}")
}

/// The LLaMA-lineage source of a canonical tensor: stored whole under [`llama_name`].
pub(crate) fn llama_source(tensor: &TensorSpec) -> TensorSource {
    TensorSource::whole(llama_name(&tensor.name), tensor)
}

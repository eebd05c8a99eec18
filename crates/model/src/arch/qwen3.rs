//! `Qwen3ForCausalLM`: the LLaMA lineage with an RMSNorm over each query and key head (before RoPE), an explicit
//! `head_dim`, and Qwen2's sliding-window keys.

use serde_json::{Value, json};

use super::llama::{LineageDefaults, lineage_config, lineage_spec};
use super::qwen2::{qwen_windows, write_qwen_windows};
use super::{Family, TensorSource, hf_names};
use crate::gguf::{GgufError, GgufHparams, MetadataValue};
use crate::spec::{Biases, ModelSpec};
use crate::tensors::TensorSpec;

/// The Qwen3 family.
pub struct Qwen3;

impl Family for Qwen3 {
    fn architecture(&self) -> &'static str {
        "Qwen3ForCausalLM"
    }

    fn parse_config(&self, config: &Value) -> Result<ModelSpec, String> {
        let defaults = LineageDefaults {
            architecture: self.architecture(),
            rms_norm_eps: 1e-6,
            max_positions: 32768,
            head_dim: Some(128),
        };
        let (c, mut spec) = lineage_spec(config, &defaults)?;
        // Qwen3's MLP never has biases; `attention_bias` covers q, k, v and o.
        spec.features.biases = Biases {
            qkv: c.attention_bias,
            attn_out: c.attention_bias,
            mlp_in: false,
            mlp_out: false,
        };
        spec.features.qk_norm = true;
        spec.attention_windows = qwen_windows(config, spec.num_layers)?;
        Ok(spec)
    }

    fn source(&self, _spec: &ModelSpec, tensor: &TensorSpec) -> TensorSource {
        hf_names::llama_source(tensor)
    }

    fn to_config(&self, spec: &ModelSpec) -> Result<Value, String> {
        let b = spec.features.biases;
        if b.qkv != b.attn_out || b.mlp_in || b.mlp_out || !spec.features.qk_norm {
            return Err(
                "Qwen3 needs Q/K norm, no MLP biases and one attention_bias switch".to_string(),
            );
        }
        let mut config = lineage_config(spec, self.architecture(), "qwen3")?;
        config["attention_bias"] = json!(b.qkv);
        write_qwen_windows(&mut config, &spec.attention_windows)?;
        Ok(config)
    }

    fn gguf_architecture(&self) -> Option<&'static str> {
        Some("qwen3")
    }

    fn gguf_metadata(&self, spec: &ModelSpec) -> Result<Vec<(String, MetadataValue)>, String> {
        crate::gguf::rope_lineage_metadata("qwen3", spec)
    }

    fn gguf_config(&self, h: &GgufHparams<'_>) -> Result<Value, GgufError> {
        let mut config = h.rope_lineage(self.architecture(), 10_000.0)?;
        config["model_type"] = json!("qwen3");
        config["attention_bias"] = json!(h.tensor("blk.0.attn_q.bias").is_some());
        Ok(config)
    }
}

//! `MistralForCausalLM`: the LLaMA lineage with a sliding attention window on every layer.

use serde::Deserialize;
use serde_json::{Value, json};

use super::llama::{LineageDefaults, lineage_config, lineage_spec};
use super::{Family, GgufTensor, TensorSource, from_value, hf_names};
use crate::gguf::MetadataValue;
use crate::spec::ModelSpec;
use crate::tensors::TensorSpec;

/// The Mistral family.
pub struct Mistral;

#[derive(Deserialize)]
struct MistralKeys {
    /// transformers' default is 4096; `null` disables the window.
    #[serde(default = "default_window")]
    sliding_window: Option<usize>,
}

fn default_window() -> Option<usize> {
    Some(4096)
}

impl Family for Mistral {
    fn architecture(&self) -> &'static str {
        "MistralForCausalLM"
    }

    fn parse_config(&self, config: &Value) -> Result<ModelSpec, String> {
        let defaults = LineageDefaults {
            architecture: self.architecture(),
            rms_norm_eps: 1e-6,
            max_positions: 4096 * 32,
            head_dim: None,
        };
        let (_, mut spec) = lineage_spec(config, &defaults)?;
        // Mistral has no bias switches: transformers ignores attention_bias / mlp_bias for this class.
        spec.features.biases = Default::default();
        let keys: MistralKeys = from_value(config)?;
        spec.attention_windows = vec![keys.sliding_window; spec.num_layers];
        Ok(spec)
    }

    fn source(&self, _spec: &ModelSpec, tensor: &TensorSpec) -> TensorSource {
        hf_names::llama_source(tensor)
    }

    fn to_config(&self, spec: &ModelSpec) -> Result<Value, String> {
        let window = spec.attention_windows.first().copied().flatten();
        if spec.attention_windows.iter().any(|w| *w != window) {
            return Err("Mistral uses one window for every layer".to_string());
        }
        if spec.features.biases != Default::default() || spec.features.qk_norm {
            return Err("Mistral has no biases and no Q/K norm".to_string());
        }
        let mut config = lineage_config(spec, self.architecture(), "mistral")?;
        config["sliding_window"] = json!(window);
        Ok(config)
    }

    /// llama.cpp's converter writes Mistral as `llama`; such files read back as LLaMA (first in the registry
    /// with that architecture), the same model under LLaMA's name.
    fn gguf_architecture(&self) -> Option<&'static str> {
        Some("llama")
    }

    /// The converter drops Mistral's window, and llama.cpp runs every layer of a `llama` file in full, so a
    /// Mistral that slides (v0.1) is refused rather than written as another model; the later ones
    /// (`sliding_window: null`) are LLaMA.
    fn gguf_metadata(&self, spec: &ModelSpec) -> Result<Vec<(String, MetadataValue)>, String> {
        if let Some(window) = spec.attention_windows.iter().flatten().next() {
            return Err(format!(
                "llama.cpp runs every layer of a `llama` file in full, and this model's layers slide over \
                 {window} tokens"
            ));
        }
        crate::gguf::rope_lineage_metadata("llama", spec)
    }

    fn gguf_tensor(&self, spec: &ModelSpec, tensor: &TensorSpec) -> Option<GgufTensor> {
        super::llama::llama_gguf_tensor(spec, tensor)
    }
}

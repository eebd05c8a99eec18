//! `Qwen2ForCausalLM`: the LLaMA lineage with biases on the query, key and value projections, and optional
//! sliding windows on the upper layers.

use serde::Deserialize;
use serde_json::{Value, json};

use super::llama::{LineageDefaults, lineage_config, lineage_spec};
use super::{Family, TensorSource, from_value, hf_names};
use crate::gguf::{GgufError, GgufHparams, MetadataValue};
use crate::spec::ModelSpec;
use crate::tensors::TensorSpec;

/// The Qwen2 family.
pub struct Qwen2;

/// The sliding-window keys Qwen2 and Qwen3 share.
#[derive(Deserialize)]
pub(crate) struct QwenWindowKeys {
    #[serde(default)]
    use_sliding_window: bool,
    #[serde(default = "default_window")]
    sliding_window: Option<usize>,
    #[serde(default = "default_max_window_layers")]
    max_window_layers: usize,
    layer_types: Option<Vec<String>>,
}

fn default_window() -> Option<usize> {
    Some(4096)
}

fn default_max_window_layers() -> usize {
    28
}

/// Per-layer windows as transformers derives them: explicit `layer_types`, else layers from `max_window_layers`
/// upward slide when `use_sliding_window` is set.
pub(crate) fn qwen_windows(
    config: &Value,
    num_layers: usize,
) -> Result<Vec<Option<usize>>, String> {
    let keys: QwenWindowKeys = from_value(config)?;
    let window = if keys.use_sliding_window {
        keys.sliding_window
    } else {
        None
    };
    match keys.layer_types {
        Some(types) => {
            if types.len() != num_layers {
                return Err(format!(
                    "`layer_types` has {} entries for {num_layers} layers",
                    types.len()
                ));
            }
            types
                .iter()
                .map(|t| match t.as_str() {
                    "full_attention" => Ok(None),
                    "sliding_attention" => Ok(window),
                    other => Err(format!("unsupported `layer_types` entry `{other}`")),
                })
                .collect()
        }
        None => Ok((0..num_layers)
            .map(|i| {
                if i >= keys.max_window_layers {
                    window
                } else {
                    None
                }
            })
            .collect()),
    }
}

/// Writes `windows` as Qwen's keys: one window size, `layer_types` per layer, and `max_window_layers` for
/// transformers versions that predate `layer_types` (exact when the sliding layers are the upper ones).
pub(crate) fn write_qwen_windows(
    config: &mut Value,
    windows: &[Option<usize>],
) -> Result<(), String> {
    let sizes: Vec<usize> = windows.iter().flatten().copied().collect();
    if sizes.windows(2).any(|w| w[0] != w[1]) {
        return Err("Qwen layers share one sliding window size".to_string());
    }
    let types: Vec<&str> = windows
        .iter()
        .map(|w| {
            if w.is_some() {
                "sliding_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    config["use_sliding_window"] = json!(!sizes.is_empty());
    config["sliding_window"] = json!(sizes.first());
    config["max_window_layers"] = json!(
        windows
            .iter()
            .position(Option::is_some)
            .unwrap_or(windows.len())
    );
    config["layer_types"] = json!(types);
    Ok(())
}

impl Family for Qwen2 {
    fn architecture(&self) -> &'static str {
        "Qwen2ForCausalLM"
    }

    fn parse_config(&self, config: &Value) -> Result<ModelSpec, String> {
        let defaults = LineageDefaults {
            architecture: self.architecture(),
            rms_norm_eps: 1e-6,
            max_positions: 32768,
            head_dim: None,
        };
        let (_, mut spec) = lineage_spec(config, &defaults)?;
        spec.features.biases = crate::spec::Biases {
            qkv: true,
            ..Default::default()
        };
        spec.attention_windows = qwen_windows(config, spec.num_layers)?;
        Ok(spec)
    }

    fn source(&self, _spec: &ModelSpec, tensor: &TensorSpec) -> TensorSource {
        hf_names::llama_source(tensor)
    }

    fn to_config(&self, spec: &ModelSpec) -> Result<Value, String> {
        if spec.features.biases
            != (crate::spec::Biases {
                qkv: true,
                ..Default::default()
            })
            || spec.features.qk_norm
        {
            return Err("Qwen2 has biases on q, k, v only and no Q/K norm".to_string());
        }
        let mut config = lineage_config(spec, self.architecture(), "qwen2")?;
        write_qwen_windows(&mut config, &spec.attention_windows)?;
        Ok(config)
    }

    fn gguf_architecture(&self) -> Option<&'static str> {
        Some("qwen2")
    }

    /// The converter writes no sliding-window keys for Qwen2 (llama.cpp runs every layer in full), so none are
    /// read.
    fn gguf_metadata(&self, spec: &ModelSpec) -> Result<Vec<(String, MetadataValue)>, String> {
        crate::gguf::rope_lineage_metadata("qwen2", spec)
    }

    fn gguf_config(&self, h: &GgufHparams<'_>) -> Result<Value, GgufError> {
        let mut config = h.rope_lineage(self.architecture(), 10_000.0)?;
        config["model_type"] = json!("qwen2");
        Ok(config)
    }
}

//! `Phi3ForCausalLM`: the LLaMA lineage with the query, key and value projections stacked into `qkv_proj`
//! (`[q; k; v]` rows) and the gate and up projections stacked into `gate_up_proj` (`[gate; up]` rows).

use ember_attention::RopeScaling;
use serde::Deserialize;
use serde_json::{Value, json};

use super::llama::{LineageDefaults, lineage_config, lineage_spec};
use super::{Family, GgufTensor, TensorSource, from_value, gguf_names, hf_names, split_layer};
use crate::gguf::{GgufError, GgufHparams, MetadataValue};
use crate::spec::{ModelSpec, Positions};
use crate::tensors::TensorSpec;

/// The Phi-3 family.
pub struct Phi3;

#[derive(Deserialize)]
struct Phi3Keys {
    sliding_window: Option<usize>,
}

impl Family for Phi3 {
    fn architecture(&self) -> &'static str {
        "Phi3ForCausalLM"
    }

    fn parse_config(&self, config: &Value) -> Result<ModelSpec, String> {
        let defaults = LineageDefaults {
            architecture: self.architecture(),
            rms_norm_eps: 1e-5,
            max_positions: 4096,
            head_dim: None,
        };
        // Phi3Config's `original_max_position_embeddings` defaults to 4096 and wins over the one in
        // `rope_scaling` (transformers' `standardize_rope_params`).
        let mut config = config.clone();
        if config
            .get("original_max_position_embeddings")
            .is_none_or(Value::is_null)
        {
            config["original_max_position_embeddings"] = json!(4096);
        }
        let (_, mut spec) = lineage_spec(&config, &defaults)?;
        spec.features.biases = Default::default();
        let keys: Phi3Keys = from_value(&config)?;
        spec.attention_windows = vec![keys.sliding_window; spec.num_layers];
        Ok(spec)
    }

    fn source(&self, spec: &ModelSpec, tensor: &TensorSpec) -> TensorSource {
        let Some((layer, suffix)) = split_layer(&tensor.name) else {
            return hf_names::llama_source(tensor);
        };
        let (h, q, kv, ff) = (
            spec.hidden_size,
            spec.q_dim(),
            spec.kv_dim(),
            spec.intermediate_size,
        );
        let qkv = |rows| {
            TensorSource::stacked(
                format!("model.layers.{layer}.self_attn.qkv_proj.weight"),
                vec![q + 2 * kv, h],
                vec![rows],
            )
        };
        let gate_up = |rows| {
            TensorSource::stacked(
                format!("model.layers.{layer}.mlp.gate_up_proj.weight"),
                vec![2 * ff, h],
                vec![rows],
            )
        };
        match suffix {
            "attn.q.weight" => qkv(0..q),
            "attn.k.weight" => qkv(q..q + kv),
            "attn.v.weight" => qkv(q + kv..q + 2 * kv),
            "mlp.gate.weight" => gate_up(0..ff),
            "mlp.up.weight" => gate_up(ff..2 * ff),
            _ => hf_names::llama_source(tensor),
        }
    }

    fn to_config(&self, spec: &ModelSpec) -> Result<Value, String> {
        let window = spec.attention_windows.first().copied().flatten();
        if spec.attention_windows.iter().any(|w| *w != window) {
            return Err("Phi-3 uses one window for every layer".to_string());
        }
        if spec.features.biases != Default::default() || spec.features.qk_norm {
            return Err("Phi-3 has no biases and no Q/K norm".to_string());
        }
        let mut config = lineage_config(spec, self.architecture(), "phi3")?;
        config["sliding_window"] = json!(window);
        Ok(config)
    }

    fn gguf_architecture(&self) -> Option<&'static str> {
        Some("phi3")
    }

    /// Partial rotary from `rope.dimension_count`; `attention.sliding_window` 0 means none (the converter's mark
    /// of a model without one). LongRoPE (Phi-3 128k, Phi-3.5) is the two factor tensors
    /// `rope_factors_long.weight` / `rope_factors_short.weight`, `rope.scaling.attn_factor` and
    /// `rope.scaling.original_context_length`, as `Phi3MiniModel` in llama.cpp's converter writes them.
    fn gguf_config(&self, h: &GgufHparams<'_>) -> Result<Value, GgufError> {
        let mut config = h.rope_lineage(self.architecture(), 10_000.0)?;
        config["model_type"] = json!("phi3");
        if let Some(original) = h.opt_uint("rope.scaling.original_context_length")? {
            config["original_max_position_embeddings"] = json!(original);
        }
        if h.tensor(LONG_FACTORS).is_some() {
            config["rope_scaling"] = long_rope(h)?;
        }
        let head_dim = config["head_dim"].as_u64().unwrap_or(1).max(1);
        if let Some(rotary) = h.opt_uint("rope.dimension_count")? {
            config["partial_rotary_factor"] = json!(rotary as f64 / head_dim as f64);
        }
        let window = h.opt_uint("attention.sliding_window")?.filter(|&w| w > 0);
        config["sliding_window"] = json!(window);
        Ok(config)
    }

    /// As llama.cpp's converter writes Phi-3: the lineage's keys, the original context, the window (0 for none)
    /// and LongRoPE's attention factor, whose divisors go to [`Family::gguf_rope_tensors`].
    fn gguf_metadata(&self, spec: &ModelSpec) -> Result<Vec<(String, MetadataValue)>, String> {
        let window = spec.attention_windows.first().copied().flatten();
        if spec.attention_windows.iter().any(|w| *w != window) {
            return Err("Phi-3 uses one window for every layer".to_string());
        }
        let mut plain = spec.clone();
        let mut original = spec.context_length;
        let mut attention_factor = None;
        if let Positions::Rope(rope) = &mut plain.positions
            && let RopeScaling::LongRope {
                original_max_position_embeddings,
                attention_factor: factor,
                ..
            } = rope.scaling
        {
            original = original_max_position_embeddings;
            attention_factor = Some(factor);
            rope.scaling = RopeScaling::None;
        }
        let mut out = crate::gguf::rope_lineage_metadata("phi3", &plain)?;
        let count = crate::gguf::count_value;
        out.push((
            "phi3.rope.scaling.original_context_length".into(),
            count(original, "original context length")?,
        ));
        out.push((
            "phi3.attention.sliding_window".into(),
            count(window.unwrap_or(0), "sliding window")?,
        ));
        if let Some(factor) = attention_factor {
            out.push((
                "phi3.rope.scaling.attn_factor".into(),
                MetadataValue::F32(factor as f32),
            ));
        }
        Ok(out)
    }

    fn gguf_rope_tensors(&self, spec: &ModelSpec) -> Vec<(&'static str, Vec<f32>)> {
        let Positions::Rope(rope) = &spec.positions else {
            return Vec::new();
        };
        let RopeScaling::LongRope {
            short_factor,
            long_factor,
            ..
        } = &rope.scaling
        else {
            return Vec::new();
        };
        let f32s = |v: &[f64]| v.iter().map(|&f| f as f32).collect();
        vec![
            (LONG_FACTORS, f32s(long_factor)),
            (SHORT_FACTORS, f32s(short_factor)),
        ]
    }

    /// `attn_qkv` holds `[q; k; v]` and `ffn_up` holds `[gate; up]`, as in the Hugging Face checkpoint.
    fn gguf_tensor(&self, spec: &ModelSpec, tensor: &TensorSpec) -> Option<GgufTensor> {
        let Some((layer, suffix)) = split_layer(&tensor.name) else {
            return gguf_names::whole(&tensor.name);
        };
        let ff = spec.intermediate_size;
        match suffix {
            "mlp.gate.weight" => Some(GgufTensor::stacked(
                format!("blk.{layer}.ffn_up.weight"),
                0..ff,
            )),
            "mlp.up.weight" => Some(GgufTensor::stacked(
                format!("blk.{layer}.ffn_up.weight"),
                ff..2 * ff,
            )),
            _ => gguf_names::stacked_qkv_or_whole(spec, tensor),
        }
    }
}

/// LongRoPE's per-frequency divisors past the original context, and within it.
const LONG_FACTORS: &str = "rope_factors_long.weight";
const SHORT_FACTORS: &str = "rope_factors_short.weight";

/// The `rope_scaling` object of a LongRoPE file. Its lengths are checked by the spec (half the rotary width).
fn long_rope(h: &GgufHparams<'_>) -> Result<Value, GgufError> {
    let file = h.file();
    if h.tensor(SHORT_FACTORS).is_none() {
        return Err(file.metadata_error(
            &h.key("rope.scaling.attn_factor"),
            "both LongRoPE factor tensors",
            format!("`{LONG_FACTORS}` without `{SHORT_FACTORS}`"),
        ));
    }
    let (_, long) = file.tensor_f32(LONG_FACTORS)?;
    let (_, short) = file.tensor_f32(SHORT_FACTORS)?;
    let mut scaling = json!({
        "rope_type": "longrope",
        "long_factor": long,
        "short_factor": short,
    });
    if let Some(factor) = h.opt_float("rope.scaling.attn_factor")? {
        scaling["attention_factor"] = json!(factor);
    }
    Ok(scaling)
}

//! Reading RoPE settings from a Hugging Face config, in both the transformers 5 form (`rope_parameters`) and the
//! older one (`rope_theta` plus `rope_scaling`) that most published checkpoints still use.

use serde_json::{Map, Value, json};

use ember_attention::{RopeConfig, RopeLayout, RopeScaling};

/// Keys and defaults that differ between families.
pub(crate) struct RopeKeys {
    /// Legacy top-level key of the base (`rope_theta`, GPT-NeoX `rotary_emb_base`).
    pub theta_key: &'static str,
    /// Legacy top-level key of the rotated fraction (`partial_rotary_factor`, GPT-NeoX `rotary_pct`).
    pub partial_key: &'static str,
    /// The fraction when the config gives none (1, GPT-NeoX 0.25).
    pub default_partial: f64,
}

/// The usual keys: `rope_theta`, `partial_rotary_factor`, full rotation.
pub(crate) const STANDARD: RopeKeys = RopeKeys {
    theta_key: "rope_theta",
    partial_key: "partial_rotary_factor",
    default_partial: 1.0,
};

fn number(map: &Map<String, Value>, key: &str, what: &str) -> Result<f64, String> {
    map.get(key)
        .and_then(Value::as_f64)
        .ok_or_else(|| format!("`{what}` lacks the number `{key}`"))
}

/// The rotary spec of a config whose heads are `head_dim` wide and whose `max_position_embeddings` is `max_positions`.
pub(crate) fn parse(
    config: &Value,
    keys: &RopeKeys,
    head_dim: usize,
    max_positions: usize,
) -> Result<RopeConfig, String> {
    let (params, what) = match (config.get("rope_parameters"), config.get("rope_scaling")) {
        (Some(Value::Object(p)), _) => (p.clone(), "rope_parameters"),
        (_, Some(Value::Object(p))) => (p.clone(), "rope_scaling"),
        _ => (Map::new(), "rope_parameters"),
    };
    let theta = params
        .get("rope_theta")
        .or_else(|| config.get(keys.theta_key))
        .map(|v| {
            v.as_f64()
                .ok_or_else(|| format!("`{}` must be a number", keys.theta_key))
        })
        .transpose()?
        .unwrap_or(10_000.0);
    let partial = params
        .get("partial_rotary_factor")
        .or_else(|| config.get(keys.partial_key))
        .map(|v| {
            v.as_f64()
                .ok_or_else(|| format!("`{}` must be a number", keys.partial_key))
        })
        .transpose()?
        .unwrap_or(keys.default_partial);
    let kind = params
        .get("rope_type")
        .or_else(|| params.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let scaling = match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear {
            factor: number(&params, "factor", what)?,
        },
        "llama3" => RopeScaling::Llama3 {
            factor: number(&params, "factor", what)?,
            low_freq_factor: number(&params, "low_freq_factor", what)?,
            high_freq_factor: number(&params, "high_freq_factor", what)?,
            original_max_position_embeddings: number(
                &params,
                "original_max_position_embeddings",
                what,
            )? as usize,
        },
        "dynamic" => RopeScaling::Dynamic {
            factor: number(&params, "factor", what)?,
            max_position_embeddings: max_positions,
        },
        other => {
            return Err(format!(
                "unsupported rope type `{other}` in `{what}` (supported: default, linear, llama3, dynamic)"
            ));
        }
    };
    // transformers truncates the rotated width with int(); an odd result would break the pairing.
    let rotary_dim = ((head_dim as f64 * partial) as usize) & !1;
    Ok(RopeConfig {
        head_dim,
        rotary_dim,
        theta,
        layout: RopeLayout::RotateHalf,
        scaling,
    })
}

/// The transformers 5 `rope_parameters` object for `rope`.
pub(crate) fn to_parameters(rope: &RopeConfig) -> Value {
    let mut params = json!({ "rope_theta": rope.theta });
    match rope.scaling {
        RopeScaling::None => params["rope_type"] = json!("default"),
        RopeScaling::Linear { factor } => {
            params["rope_type"] = json!("linear");
            params["factor"] = json!(factor);
        }
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            params["rope_type"] = json!("llama3");
            params["factor"] = json!(factor);
            params["low_freq_factor"] = json!(low_freq_factor);
            params["high_freq_factor"] = json!(high_freq_factor);
            params["original_max_position_embeddings"] = json!(original_max_position_embeddings);
        }
        RopeScaling::Dynamic { factor, .. } => {
            params["rope_type"] = json!("dynamic");
            params["factor"] = json!(factor);
        }
    }
    if rope.rotary_dim != rope.head_dim {
        params["partial_rotary_factor"] = json!(rope.rotary_dim as f64 / rope.head_dim as f64);
    }
    params
}

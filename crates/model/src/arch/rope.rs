//! Reading RoPE settings from a Hugging Face config, in both the transformers 5 form (`rope_parameters`) and the
//! older one (`rope_theta` plus `rope_scaling`) that most published checkpoints still use.

use std::f64::consts::PI;

use ember_tokenizer::json_type_name as type_name;
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

/// `map[key]` as a number; absent or of another type is an error naming `what.key`.
fn number(map: &Map<String, Value>, key: &str, what: &str) -> Result<f64, String> {
    match map.get(key) {
        Some(v @ Value::Number(_)) => Ok(v.as_f64().unwrap_or(f64::NAN)),
        Some(other) => Err(format!(
            "`{what}.{key}` must be a number, found {}",
            type_name(other)
        )),
        None => Err(format!("`{what}` lacks the number `{key}`")),
    }
}

/// A number (absent or `null`: `None`), an error naming `name` when it is another type.
fn optional_number(value: Option<&Value>, name: &str) -> Result<Option<f64>, String> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(v @ Value::Number(_)) => Ok(v.as_f64()),
        Some(other) => Err(format!(
            "`{name}` must be a number, found {}",
            type_name(other)
        )),
    }
}

/// `config[key]` as a scaling object: absent or `null` is none, anything but an object is an error (a string
/// or array there used to be ignored, silently dropping e.g. LLaMA 3's scaling).
fn scaling_object<'c>(
    config: &'c Value,
    key: &str,
) -> Result<Option<&'c Map<String, Value>>, String> {
    match config.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(other) => Err(format!(
            "`{key}` must be an object (or null), found {}",
            type_name(other)
        )),
    }
}

/// A positive integer `value` named `name`.
fn positive_count(value: &Value, name: &str) -> Result<usize, String> {
    value
        .as_u64()
        .filter(|&n| n > 0)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| format!("`{name}` must be a positive integer, found {value}"))
}

/// `map[key]` as a list of numbers (LongRoPE's factors).
fn numbers(map: &Map<String, Value>, key: &str, what: &str) -> Result<Vec<f64>, String> {
    match map.get(key) {
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_f64().ok_or_else(|| {
                    format!("`{what}.{key}` must hold numbers, found {}", type_name(v))
                })
            })
            .collect(),
        Some(other) => Err(format!(
            "`{what}.{key}` must be a list of numbers, found {}",
            type_name(other)
        )),
        None => Err(format!("`{what}` lacks the list `{key}`")),
    }
}

/// The frequency scaling an object `what` describes. `top_original` is the config's top-level
/// `original_max_position_embeddings`, which transformers prefers to the one inside the object (Phi-3 writes it
/// there).
fn scaling(
    params: &Map<String, Value>,
    what: &str,
    max_positions: usize,
    top_original: Option<usize>,
) -> Result<RopeScaling, String> {
    let kind = match params.get("rope_type").or_else(|| params.get("type")) {
        Some(Value::String(kind)) => kind.as_str(),
        Some(other) => {
            return Err(format!(
                "`{what}.rope_type` must be a string, found {}",
                type_name(other)
            ));
        }
        // A factor without a type is a scaling that cannot be applied; dropping it would change the model.
        None if params.contains_key("factor") => {
            return Err(format!("`{what}` has a `factor` but no `rope_type`"));
        }
        None => "default",
    };
    Ok(match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear {
            factor: number(params, "factor", what)?,
        },
        "llama3" => RopeScaling::Llama3 {
            factor: number(params, "factor", what)?,
            low_freq_factor: number(params, "low_freq_factor", what)?,
            high_freq_factor: number(params, "high_freq_factor", what)?,
            original_max_position_embeddings: match params.get("original_max_position_embeddings") {
                Some(v) => positive_count(v, &format!("{what}.original_max_position_embeddings"))?,
                None => {
                    return Err(format!(
                        "`{what}` lacks the number `original_max_position_embeddings`"
                    ));
                }
            },
        },
        "dynamic" => RopeScaling::Dynamic {
            factor: number(params, "factor", what)?,
            max_position_embeddings: max_positions,
        },
        // transformers' `_compute_longrope_parameters`; Phi-3 configs still say `su`.
        "longrope" | "su" => {
            let original = match (top_original, params.get("original_max_position_embeddings")) {
                (Some(n), _) => n,
                (None, Some(v)) => {
                    positive_count(v, &format!("{what}.original_max_position_embeddings"))?
                }
                (None, None) => max_positions,
            };
            let factor = match optional_number(params.get("factor"), &format!("{what}.factor"))? {
                Some(f) => f,
                None => max_positions as f64 / original as f64,
            };
            let attention_factor = match optional_number(
                params.get("attention_factor"),
                &format!("{what}.attention_factor"),
            )? {
                Some(a) => a,
                None if factor <= 1.0 => 1.0,
                None => (1.0 + factor.ln() / (original as f64).ln()).sqrt(),
            };
            RopeScaling::LongRope {
                short_factor: numbers(params, "short_factor", what)?,
                long_factor: numbers(params, "long_factor", what)?,
                original_max_position_embeddings: original,
                attention_factor,
            }
        }
        other => {
            return Err(format!(
                "unsupported rope type `{other}` in `{what}` (supported: default, linear, llama3, dynamic, \
                 longrope)"
            ));
        }
    })
}

/// The rotary spec of a config whose heads are `head_dim` wide and whose `max_position_embeddings` is `max_positions`.
pub(crate) fn parse(
    config: &Value,
    keys: &RopeKeys,
    head_dim: usize,
    max_positions: usize,
) -> Result<RopeConfig, String> {
    let parameters = scaling_object(config, "rope_parameters")?;
    let legacy = scaling_object(config, "rope_scaling")?;
    let top_original = match config.get("original_max_position_embeddings") {
        None | Some(Value::Null) => None,
        Some(v) => Some(positive_count(v, "original_max_position_embeddings")?),
    };
    let scaling = match (parameters, legacy) {
        (Some(p), Some(l)) => {
            let (new, old) = (
                scaling(p, "rope_parameters", max_positions, top_original)?,
                scaling(l, "rope_scaling", max_positions, top_original)?,
            );
            // Both forms present: transformers reads one of them, depending on its version, so they must agree.
            if new != old {
                return Err(format!(
                    "`rope_parameters` ({new:?}) and `rope_scaling` ({old:?}) disagree"
                ));
            }
            new
        }
        (Some(p), None) => scaling(p, "rope_parameters", max_positions, top_original)?,
        (None, Some(l)) => scaling(l, "rope_scaling", max_positions, top_original)?,
        (None, None) => RopeScaling::None,
    };
    let params = parameters.or(legacy);
    let what = if parameters.is_some() {
        "rope_parameters"
    } else {
        "rope_scaling"
    };
    let in_params = |key: &str| params.and_then(|p| p.get(key));
    let theta = match optional_number(in_params("rope_theta"), &format!("{what}.rope_theta"))? {
        Some(t) => t,
        None => optional_number(config.get(keys.theta_key), keys.theta_key)?.unwrap_or(10_000.0),
    };
    let nested = format!("{what}.partial_rotary_factor");
    let (partial, partial_name) =
        match optional_number(in_params("partial_rotary_factor"), &nested)? {
            Some(p) => (p, nested.as_str()),
            None => (
                optional_number(config.get(keys.partial_key), keys.partial_key)?
                    .unwrap_or(keys.default_partial),
                keys.partial_key,
            ),
        };
    if !(partial > 0.0 && partial <= 1.0) {
        return Err(format!(
            "`{partial_name}` is {partial}, expected a fraction in (0, 1]"
        ));
    }
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
    match rope.scaling.clone() {
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
        RopeScaling::LongRope {
            short_factor,
            long_factor,
            original_max_position_embeddings,
            attention_factor,
        } => {
            params["rope_type"] = json!("longrope");
            params["short_factor"] = json!(short_factor);
            params["long_factor"] = json!(long_factor);
            params["original_max_position_embeddings"] = json!(original_max_position_embeddings);
            params["attention_factor"] = json!(attention_factor);
        }
    }
    if rope.rotary_dim != rope.head_dim {
        params["partial_rotary_factor"] = json!(rope.rotary_dim as f64 / rope.head_dim as f64);
    }
    params
}

/// The per-frequency divisors of `rope`'s scaling (`plain / scaled` inverse frequency per rotary pair), as
/// llama.cpp's converter stores LLaMA 3 scaling in `rope_freqs.weight`; [`llama3_from_factors`] reads them.
pub(crate) fn frequency_divisors(rope: &RopeConfig) -> Vec<f32> {
    let plain = RopeConfig::new(rope.rotary_dim).with_theta(rope.theta);
    plain
        .inv_freq(0)
        .iter()
        .zip(rope.inv_freq(0))
        .map(|(p, s)| (*p as f64 / s as f64) as f32)
        .collect()
}

/// The LLaMA 3 scaling whose per-frequency divisors are `factors` (llama.cpp's `rope_freqs.weight`: the
/// converter stores `inv_freq_plain / inv_freq_llama3` per rotary pair instead of the four parameters).
///
/// The parameters are not unique, only the frequencies they give: every frequency is kept (divisor 1), fully
/// scaled (divisor `factor`), or on the ramp, where `smooth = (1/wavelen - 1/T2) / (1/T1 - 1/T2)` is linear in
/// `1/wavelen` between the thresholds `T1 = context / high_freq_factor` and `T2 = context / low_freq_factor`.
/// The thresholds are solved from the ramp points (or placed between the bands when fewer than two are on it),
/// and the result is checked by recomputing every divisor.
pub(crate) fn llama3_from_factors(
    theta: f64,
    rotary_dim: usize,
    factors: &[f32],
) -> Result<RopeScaling, String> {
    if factors.len() != rotary_dim / 2 {
        return Err(format!(
            "{} values, expected {} (half the rotary dimension)",
            factors.len(),
            rotary_dim / 2
        ));
    }
    if factors.iter().any(|f| !f.is_finite() || *f < 1.0) {
        return Err("a divisor below 1 or not finite".to_string());
    }
    let factor = factors.iter().copied().fold(1.0f32, f32::max) as f64;
    if factor <= 1.0 {
        return Ok(RopeScaling::None);
    }
    let wavelen = |i: usize| 2.0 * PI * theta.powf((2 * i) as f64 / rotary_dim as f64);
    // f32 divisors: equal within a few ulps.
    let is = |f: f32, target: f64| ((f as f64) - target).abs() <= 1e-5 * target;
    let kept: Vec<f64> = (0..factors.len())
        .filter(|&i| is(factors[i], 1.0))
        .map(wavelen)
        .collect();
    let scaled: Vec<f64> = (0..factors.len())
        .filter(|&i| is(factors[i], factor))
        .map(wavelen)
        .collect();
    let ramp: Vec<(f64, f64)> = (0..factors.len())
        .filter(|&i| !is(factors[i], 1.0) && !is(factors[i], factor))
        .map(|i| {
            let smooth = (1.0 / factors[i] as f64 - 1.0 / factor) / (1.0 - 1.0 / factor);
            (1.0 / wavelen(i), smooth)
        })
        .collect();
    let longest_kept = kept.iter().copied().fold(0.0, f64::max);
    let shortest_scaled = scaled.iter().copied().fold(f64::INFINITY, f64::min);
    // In inverse wavelengths u = 1/wavelen: smooth = (u - u2) / (u1 - u2), u1 = 1/T1 > u2 = 1/T2.
    let (u1, u2) = match ramp.as_slice() {
        [] => {
            let between = if shortest_scaled.is_finite() {
                (longest_kept * shortest_scaled).sqrt()
            } else {
                2.0 * longest_kept.max(1.0)
            };
            (1.0 / between, 1.0 / (between * (1.0 + 1e-3)))
        }
        [(u, s)] => {
            let t2 = if shortest_scaled.is_finite() {
                (shortest_scaled / u).sqrt()
            } else {
                2.0 / u
            };
            let u2 = 1.0 / t2;
            (u2 + (u - u2) / s, u2)
        }
        [(ua, sa), .., (ub, sb)] => {
            let slope = (sa - sb) / (ua - ub);
            let u2 = ub - sb / slope;
            (u2 + 1.0 / slope, u2)
        }
    };
    if !(u1 > u2 && u2 > 0.0 && u1.is_finite()) {
        return Err("divisors that no LLaMA 3 frequency scaling gives".to_string());
    }
    let context = (1.0 / u2).ceil();
    let scaling = RopeScaling::Llama3 {
        factor,
        low_freq_factor: context * u2,
        high_freq_factor: context * u1,
        original_max_position_embeddings: context as usize,
    };
    let plain = RopeConfig::new(rotary_dim).with_theta(theta);
    let scaled_rope = plain.clone().with_scaling(scaling.clone());
    let matches = plain
        .inv_freq(0)
        .iter()
        .zip(scaled_rope.inv_freq(0))
        .zip(factors)
        .all(|((p, s), f)| ((*p as f64 / s as f64) - *f as f64).abs() <= 1e-4 * *f as f64);
    if !matches {
        return Err("divisors that no LLaMA 3 frequency scaling gives".to_string());
    }
    Ok(scaling)
}

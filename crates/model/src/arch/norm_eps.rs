//! The norm epsilon every family reads, from `config.json` and from GGUF metadata, refused under the key it came
//! from when the kernels could not use it.
//!
//! The kernels add eps in f32: a value that is not a positive f32 (negative, zero, NaN, infinite, or so small or
//! large that f32 rounds it to 0 or infinity) makes every norm output NaN or infinite. It is checked where it is
//! read, not only in [`crate::ModelSpec::validate`], because on the way from GGUF a NaN becomes JSON `null` (JSON
//! has no NaN), which a family whose key may be absent would read as absent and replace with its default.

use serde_json::Value;

use crate::gguf::{GgufError, GgufHparams};

/// What a norm epsilon must be, for error messages.
pub(crate) const EXPECTED: &str = "a positive number that f32 can hold (e.g. 1e-5)";

/// The `config.json` keys of the norm epsilon: the LLaMA lineage's and Gemma's, GPT-2's and GPT-Neo's, GPT-NeoX's.
pub(crate) const CONFIG_KEYS: [&str; 3] = ["rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps"];

/// Whether the kernels can add `eps` (see the module header).
fn usable(eps: f64) -> bool {
    let eps = eps as f32;
    eps.is_finite() && eps > 0.0
}

/// `config[key]`, `default` when the key is absent. Anything else that is not a usable number (`null`, a string,
/// a negative number) is an error naming the key.
pub(crate) fn from_config(config: &Value, key: &str, default: f64) -> Result<f64, String> {
    match config.get(key) {
        None => Ok(default),
        Some(value) => value
            .as_f64()
            .filter(|&eps| usable(eps))
            .ok_or_else(|| format!("`{key}` is {value}, expected {EXPECTED}")),
    }
}

/// GGUF metadata `{arch}.{key}`: an error naming the full key unless it is a usable number (read raw rather than
/// through [`GgufHparams::float`], so a non-finite eps gets this error's expectation too).
pub(crate) fn from_gguf(h: &GgufHparams<'_>, key: &str) -> Result<f64, GgufError> {
    let eps = h.file().require_f64(&h.key(key))?;
    if usable(eps) {
        return Ok(eps);
    }
    // The converter writes f32: show it as f32 (`-1e-5`, not `-9.999999747378752e-6`) where that is exact.
    let shown = eps as f32;
    let found = if f64::from(shown) == eps {
        format!("{shown:e}")
    } else {
        format!("{eps:e}")
    };
    Err(h.file().metadata_error(&h.key(key), EXPECTED, found))
}

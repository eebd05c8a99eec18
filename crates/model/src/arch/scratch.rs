//! Models trained from scratch in any registered family (`model.architecture` in a run config): ember's shape keys
//! become the family's own `config.json` keys, and the family's parser builds the spec, so a from-scratch model
//! of a family is exactly what `transformers` builds from that config (its defaults for every other knob).

use serde_json::{Value, json};

use super::{family, supported};
use crate::spec::{ModelSpec, Positions};

/// The shape of a model trained from scratch, in the run config's key names (`model.*`).
#[derive(Debug, Clone, PartialEq)]
pub struct ScratchShape {
    /// The tokenizer's vocabulary size.
    pub vocab_size: usize,
    /// `model.hidden_size`: width of the residual stream.
    pub hidden_size: usize,
    /// `model.num_layers`.
    pub num_layers: usize,
    /// `model.num_heads`: query heads.
    pub num_heads: usize,
    /// `model.num_kv_heads`: key/value heads (equal to `num_heads` for families without GQA).
    pub num_kv_heads: usize,
    /// `model.intermediate_size`: width of the MLP.
    pub intermediate_size: usize,
    /// `model.block_size`: the context the position table or RoPE cache is built for.
    pub context_length: usize,
    /// `model.rope_theta`, for families with rotary positions.
    pub rope_theta: f64,
    /// `model.norm_eps`, of RMSNorm or LayerNorm as the family uses.
    pub norm_eps: f64,
    /// `model.tie_embeddings`.
    pub tie_embeddings: bool,
}

/// The `config.json` keys of the LLaMA lineage (Llama, Mistral, Qwen2/3, Phi-3, Gemma 2/3), which most families
/// share; [`super::Family::scratch_config`] of the others (GPT-2, GPT-Neo, GPT-NeoX) names their own.
pub(crate) fn llama_lineage_config(architecture: &str, s: &ScratchShape) -> Value {
    json!({
        "architectures": [architecture],
        "vocab_size": s.vocab_size,
        "hidden_size": s.hidden_size,
        "num_hidden_layers": s.num_layers,
        "num_attention_heads": s.num_heads,
        "num_key_value_heads": s.num_kv_heads,
        "head_dim": s.hidden_size / s.num_heads.max(1),
        "intermediate_size": s.intermediate_size,
        "max_position_embeddings": s.context_length,
        "rope_theta": s.rope_theta,
        "rms_norm_eps": s.norm_eps,
        "tie_word_embeddings": s.tie_embeddings,
    })
}

/// The spec of a fresh `architecture` model of shape `shape`, or an error naming the `model.*` key the family
/// cannot honour (GPT-2 has no grouped-query attention, for one) or listing the supported architectures.
pub fn scratch_spec(architecture: &str, shape: &ScratchShape) -> Result<ModelSpec, String> {
    let family = family(architecture).ok_or_else(|| {
        format!(
            "model.architecture: `{architecture}` is not a supported architecture (supported: {})",
            supported().join(", ")
        )
    })?;
    if shape.num_heads == 0 || !shape.hidden_size.is_multiple_of(shape.num_heads) {
        return Err(format!(
            "model.hidden_size: {} is not a multiple of model.num_heads ({})",
            shape.hidden_size, shape.num_heads
        ));
    }
    let config = family.scratch_config(shape);
    let spec = family
        .parse_config(&config)
        .map_err(|e| format!("model.architecture {architecture}: {e}"))?;
    let theta = match &spec.positions {
        Positions::Rope(rope) => Some(rope.theta),
        _ => None,
    };
    let checks: [(&str, String, String); 8] = [
        (
            "hidden_size",
            shape.hidden_size.to_string(),
            spec.hidden_size.to_string(),
        ),
        (
            "num_layers",
            shape.num_layers.to_string(),
            spec.num_layers.to_string(),
        ),
        (
            "num_heads",
            shape.num_heads.to_string(),
            spec.num_heads.to_string(),
        ),
        (
            "num_kv_heads",
            shape.num_kv_heads.to_string(),
            spec.num_kv_heads.to_string(),
        ),
        (
            "intermediate_size",
            shape.intermediate_size.to_string(),
            spec.intermediate_size.to_string(),
        ),
        (
            "block_size",
            shape.context_length.to_string(),
            spec.context_length.to_string(),
        ),
        (
            "norm_eps",
            shape.norm_eps.to_string(),
            spec.features.norm.eps.to_string(),
        ),
        (
            "tie_embeddings",
            shape.tie_embeddings.to_string(),
            spec.features.tied_embeddings.to_string(),
        ),
    ];
    for (key, wanted, got) in checks {
        if wanted != got {
            return Err(format!(
                "model.{key}: {architecture} cannot be built with {wanted} (its config gives {got})"
            ));
        }
    }
    if let Some(theta) = theta
        && theta != shape.rope_theta
    {
        return Err(format!(
            "model.rope_theta: {architecture} cannot be built with {} (its config gives {theta})",
            shape.rope_theta
        ));
    }
    if spec.vocab_size != shape.vocab_size {
        return Err(format!(
            "{architecture}: the tokenizer's {} ids became a vocabulary of {}",
            shape.vocab_size, spec.vocab_size
        ));
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(kv: usize) -> ScratchShape {
        ScratchShape {
            vocab_size: 512,
            hidden_size: 64,
            num_layers: 2,
            num_heads: 4,
            num_kv_heads: kv,
            intermediate_size: 128,
            context_length: 64,
            rope_theta: 10_000.0,
            norm_eps: 1e-5,
            tie_embeddings: true,
        }
    }

    /// Every registered family builds from ember's shape keys, with the sizes asked for and its own architecture;
    /// the spec saves as a config.json that parses back to itself (the HF writer can express it).
    #[test]
    fn every_family_builds_from_the_shape_keys() {
        for architecture in supported() {
            let f = family(architecture).unwrap();
            // Families without grouped-query attention need num_kv_heads = num_heads.
            let spec = scratch_spec(architecture, &shape(2))
                .or_else(|_| scratch_spec(architecture, &shape(4)))
                .unwrap_or_else(|e| panic!("{architecture}: {e}"));
            assert_eq!(spec.architecture, architecture);
            assert_eq!(
                (spec.hidden_size, spec.num_layers, spec.num_heads),
                (64, 2, 4)
            );
            assert_eq!(
                (spec.intermediate_size, spec.context_length, spec.vocab_size),
                (128, 64, 512)
            );
            let config = f
                .to_config(&spec)
                .unwrap_or_else(|e| panic!("{architecture}: {e}"));
            assert_eq!(f.parse_config(&config).unwrap(), spec, "{architecture}");
        }
    }

    #[test]
    fn a_knob_the_family_cannot_honour_is_an_error_naming_the_key() {
        let e = scratch_spec("GPT2LMHeadModel", &shape(2)).unwrap_err();
        assert!(e.contains("model.num_kv_heads"), "{e}");
        let e = scratch_spec("NoSuchForCausalLM", &shape(2)).unwrap_err();
        assert!(
            e.contains("model.architecture") && e.contains("LlamaForCausalLM"),
            "{e}"
        );
        let mut odd = shape(2);
        odd.hidden_size = 66;
        assert!(
            scratch_spec("LlamaForCausalLM", &odd)
                .unwrap_err()
                .contains("model.hidden_size")
        );
    }
}

//! `LlamaForCausalLM`: LLaMA 1/2/3 (with `llama3` / `linear` / `dynamic` rope scaling), SmolLM, TinyLlama, and
//! ember's own models. Also the shared config reader of the LLaMA lineage (Mistral, Qwen2/3, Phi-3).

use ember_attention::{RopeLayout, RopeScaling};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{
    Family, GgufTensor, TensorSource, activation, derived_head_dim, from_value, gguf_names,
    hf_names, layer_count, norm_eps, rope, split_layer,
};
use crate::gguf::{GgufError, GgufHparams, MetadataValue};
use crate::spec::{Biases, Features, MlpKind, ModelSpec, NormKind, NormSpec, Positions, Residual};
use crate::tensors::TensorSpec;

/// The LLaMA family.
pub struct Llama;

/// The config keys every LLaMA-lineage family shares; family-specific keys are read by the family itself.
#[derive(Deserialize)]
pub(crate) struct LineageConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    pub max_position_embeddings: Option<usize>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
}

fn default_act() -> String {
    "silu".to_string()
}

/// Family defaults for keys a config may omit.
pub(crate) struct LineageDefaults {
    pub architecture: &'static str,
    pub rms_norm_eps: f64,
    pub max_positions: usize,
    pub head_dim: Option<usize>,
}

/// The spec of a LLaMA-lineage config, with biases from `attention_bias` (q, k, v, o) and `mlp_bias`, no windows.
pub(crate) fn lineage_spec(
    config: &Value,
    defaults: &LineageDefaults,
) -> Result<(LineageConfig, ModelSpec), String> {
    let c: LineageConfig = from_value(config)?;
    if c.num_attention_heads == 0 {
        return Err("`num_attention_heads` must be positive".to_string());
    }
    let num_layers = layer_count("num_hidden_layers", c.num_hidden_layers)?;
    let head_dim = match c.head_dim.or(defaults.head_dim) {
        Some(d) => d,
        None => derived_head_dim(
            "hidden_size",
            c.hidden_size,
            "num_attention_heads",
            c.num_attention_heads,
        )?,
    };
    let context_length = c.max_position_embeddings.unwrap_or(defaults.max_positions);
    let rope = rope::parse(config, &rope::STANDARD, head_dim, context_length)?;
    let spec = ModelSpec {
        architecture: defaults.architecture.to_string(),
        vocab_size: c.vocab_size,
        hidden_size: c.hidden_size,
        num_layers,
        num_heads: c.num_attention_heads,
        num_kv_heads: c.num_key_value_heads.unwrap_or(c.num_attention_heads),
        head_dim,
        intermediate_size: c.intermediate_size,
        context_length,
        positions: Positions::Rope(rope),
        attention_windows: vec![None; num_layers],
        features: Features {
            norm: NormSpec {
                kind: NormKind::RmsNorm,
                eps: norm_eps::from_config(config, "rms_norm_eps", defaults.rms_norm_eps)?,
                bias: false,
            },
            activation: activation("hidden_act", &c.hidden_act)?,
            biases: Biases {
                qkv: c.attention_bias,
                attn_out: c.attention_bias,
                mlp_in: c.mlp_bias,
                mlp_out: c.mlp_bias,
            },
            tied_embeddings: c.tie_word_embeddings,
            ..Features::default()
        },
    };
    Ok((c, spec))
}

/// The config keys of the LLaMA lineage for `spec` (family-specific keys are added by the caller).
pub(crate) fn lineage_config(
    spec: &ModelSpec,
    architecture: &str,
    model_type: &str,
) -> Result<Value, String> {
    super::gemma::refuse_gemma_knobs(spec, architecture)?;
    let Positions::Rope(rope) = &spec.positions else {
        return Err("learned position embeddings are not expressible (needs RoPE)".to_string());
    };
    if spec.features.norm.kind != NormKind::RmsNorm
        || spec.features.residual != Residual::Sequential
        || spec.features.mlp != MlpKind::Gated
    {
        return Err("needs RMSNorm, a sequential residual and a gated MLP".to_string());
    }
    if rope.layout != RopeLayout::RotateHalf || spec.features.attention_scale.is_some() {
        return Err("needs rotate-half RoPE and the default attention scale".to_string());
    }
    let mut config = json!({
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "hidden_act": spec.features.activation.hf_name(),
        "max_position_embeddings": spec.context_length,
        "rms_norm_eps": spec.features.norm.eps,
        "tie_word_embeddings": spec.features.tied_embeddings,
        "rope_theta": rope.theta,
        "rope_parameters": rope::to_parameters(rope),
        "torch_dtype": "float32",
    });
    // transformers prefers a top-level original context to the one in `rope_parameters`, and Phi-3's config
    // class defaults it to 4096, so LongRoPE's must be written there too.
    if let RopeScaling::LongRope {
        original_max_position_embeddings,
        ..
    } = rope.scaling
    {
        config["original_max_position_embeddings"] = json!(original_max_position_embeddings);
    }
    Ok(config)
}

impl Family for Llama {
    fn architecture(&self) -> &'static str {
        "LlamaForCausalLM"
    }

    fn parse_config(&self, config: &Value) -> Result<ModelSpec, String> {
        let defaults = LineageDefaults {
            architecture: self.architecture(),
            rms_norm_eps: 1e-6,
            max_positions: 2048,
            head_dim: None,
        };
        Ok(lineage_spec(config, &defaults)?.1)
    }

    fn source(&self, _spec: &ModelSpec, tensor: &TensorSpec) -> TensorSource {
        hf_names::llama_source(tensor)
    }

    fn to_config(&self, spec: &ModelSpec) -> Result<Value, String> {
        let b = spec.features.biases;
        if b.qkv != b.attn_out || b.mlp_in != b.mlp_out {
            return Err(
                "LLaMA biases are all-or-nothing per sublayer (attention_bias, mlp_bias)"
                    .to_string(),
            );
        }
        if spec.features.qk_norm || spec.attention_windows.iter().any(Option::is_some) {
            return Err("LLaMA has no Q/K norm and no sliding windows".to_string());
        }
        let mut config = lineage_config(spec, self.architecture(), "llama")?;
        config["attention_bias"] = json!(b.qkv);
        config["mlp_bias"] = json!(b.mlp_in);
        Ok(config)
    }

    /// llama.cpp converts LLaMA, Mistral (its window is dropped: llama.cpp runs every layer in full), SmolLM and
    /// TinyLlama to `llama`.
    fn gguf_architecture(&self) -> Option<&'static str> {
        Some("llama")
    }

    /// LLaMA 3 scaling has no keys: the converter stores its divisors as `rope_freqs.weight`
    /// ([`Family::gguf_rope_tensors`]).
    fn gguf_metadata(&self, spec: &ModelSpec) -> Result<Vec<(String, MetadataValue)>, String> {
        crate::gguf::rope_lineage_metadata("llama", &without_llama3_scaling(spec))
    }

    fn gguf_rope_tensors(&self, spec: &ModelSpec) -> Vec<(&'static str, Vec<f32>)> {
        match &spec.positions {
            Positions::Rope(rope) if matches!(rope.scaling, RopeScaling::Llama3 { .. }) => {
                vec![(ROPE_FREQS, rope::frequency_divisors(rope))]
            }
            _ => Vec::new(),
        }
    }

    fn gguf_config(&self, h: &GgufHparams<'_>) -> Result<Value, GgufError> {
        let mut config = h.rope_lineage(self.architecture(), 10_000.0)?;
        config["model_type"] = json!("llama");
        // The converter writes `head_dim` as the rope dimension when it has no `attention.key_length`.
        if !h.has("attention.key_length")
            && let Some(d) = h.opt_uint("rope.dimension_count")?
        {
            config["head_dim"] = json!(d);
        }
        config["attention_bias"] = json!(h.tensor("blk.0.attn_q.bias").is_some());
        config["mlp_bias"] = json!(h.tensor("blk.0.ffn_up.bias").is_some());
        if h.tensor(ROPE_FREQS).is_some() {
            config["rope_scaling"] = llama3_scaling(h, &config)?;
        }
        Ok(config)
    }

    /// llama.cpp's names, with the query and key rows (weights and biases) permuted by the converter
    /// (`LlamaModel.permute`: by the query heads for `q`, by the key/value heads for `k`).
    fn gguf_tensor(&self, spec: &ModelSpec, tensor: &TensorSpec) -> Option<GgufTensor> {
        llama_gguf_tensor(spec, tensor)
    }
}

/// The GGUF tensor of per-frequency RoPE divisors the converter writes for LLaMA 3 scaling.
const ROPE_FREQS: &str = "rope_freqs.weight";

/// `spec` with LLaMA 3 scaling taken out of its RoPE, for the metadata that does not carry it.
fn without_llama3_scaling(spec: &ModelSpec) -> ModelSpec {
    let mut plain = spec.clone();
    if let Positions::Rope(rope) = &mut plain.positions
        && matches!(rope.scaling, RopeScaling::Llama3 { .. })
    {
        rope.scaling = RopeScaling::None;
    }
    plain
}

/// llama.cpp's placement of a LLaMA tensor: its usual name, q/k rows permuted.
pub(crate) fn llama_gguf_tensor(spec: &ModelSpec, tensor: &TensorSpec) -> Option<GgufTensor> {
    let place = gguf_names::whole(&tensor.name)?;
    Some(match split_layer(&tensor.name).map(|(_, suffix)| suffix) {
        Some("attn.q.weight" | "attn.q.bias") => place.permuted(spec.num_heads),
        Some("attn.k.weight" | "attn.k.bias") => place.permuted(spec.num_kv_heads),
        _ => place,
    })
}

/// The `rope_scaling` of a LLaMA 3 file, recovered from its `rope_freqs.weight` divisors (the converter keeps
/// only those; see [`rope::llama3_from_factors`]).
fn llama3_scaling(h: &GgufHparams<'_>, config: &Value) -> Result<Value, GgufError> {
    let file = h.file();
    let (_, factors) = file.tensor_f32(ROPE_FREQS)?;
    let theta = config["rope_theta"].as_f64().unwrap_or(10_000.0);
    let rotary_dim = config["head_dim"].as_u64().unwrap_or(0) as usize;
    let scaling = rope::llama3_from_factors(theta, rotary_dim, &factors).map_err(|reason| {
        GgufError::Corrupt {
            path: file.path().to_path_buf(),
            what: format!("tensor `{ROPE_FREQS}`"),
            reason,
        }
    })?;
    let rope = ember_attention::RopeConfig::new(rotary_dim)
        .with_theta(theta)
        .with_scaling(scaling);
    Ok(rope::to_parameters(&rope))
}

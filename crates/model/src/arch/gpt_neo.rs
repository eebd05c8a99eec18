//! `GPTNeoForCausalLM`: GPT-2's layout with separate unbiased q/k/v projections, unscaled attention scores, and
//! alternating global and local (sliding-window) layers from `attention_types`.

use serde::Deserialize;
use serde_json::{Value, json};

use super::{
    Family, ScratchShape, TensorSource, activation, derived_head_dim, from_value, layer_count,
    norm_eps, split_layer, times,
};
use crate::spec::{Biases, Features, MlpKind, ModelSpec, NormKind, NormSpec, Positions, Residual};
use crate::tensors::{EMBED, LM_HEAD, POS_EMBED, TensorSpec};

/// The GPT-Neo family.
pub struct GptNeo;

#[derive(Deserialize)]
struct GptNeoConfig {
    vocab_size: usize,
    max_position_embeddings: usize,
    hidden_size: usize,
    num_layers: usize,
    num_heads: usize,
    intermediate_size: Option<usize>,
    /// `[[["global", "local"], 12]]`: a pattern of layer kinds and how often it repeats.
    attention_types: Option<Vec<(Vec<String>, usize)>>,
    #[serde(default = "default_window")]
    window_size: usize,
    #[serde(default = "default_act")]
    activation_function: String,
    #[serde(default = "default_true")]
    tie_word_embeddings: bool,
}

fn default_window() -> usize {
    256
}

fn default_act() -> String {
    "gelu_new".to_string()
}

fn default_true() -> bool {
    true
}

impl Family for GptNeo {
    fn architecture(&self) -> &'static str {
        "GPTNeoForCausalLM"
    }

    fn scratch_config(&self, s: &ScratchShape) -> Value {
        json!({
            "architectures": [self.architecture()],
            "vocab_size": s.vocab_size,
            "hidden_size": s.hidden_size,
            "num_layers": s.num_layers,
            "num_heads": s.num_heads,
            "intermediate_size": s.intermediate_size,
            "max_position_embeddings": s.context_length,
            // Every layer global: a local window is a knob of its own, not one of the shape keys.
            "attention_types": [[["global"], s.num_layers]],
            "layer_norm_epsilon": s.norm_eps,
            "tie_word_embeddings": s.tie_embeddings,
        })
    }

    fn parse_config(&self, config: &Value) -> Result<ModelSpec, String> {
        let c: GptNeoConfig = from_value(config)?;
        let num_layers = layer_count("num_layers", c.num_layers)?;
        let head_dim = derived_head_dim("hidden_size", c.hidden_size, "num_heads", c.num_heads)?;
        let intermediate_size = match c.intermediate_size {
            Some(n) => n,
            None => times(4, "hidden_size", c.hidden_size)?,
        };
        let pattern = c
            .attention_types
            .unwrap_or_else(|| vec![(vec!["global".into(), "local".into()], 12)]);
        // Count the layers the pattern expands to before expanding it: a repeat count of 2^40 would otherwise
        // push 2^40 windows and abort.
        let mut expanded = 0usize;
        for (kinds, repeat) in &pattern {
            expanded = kinds
                .len()
                .checked_mul(*repeat)
                .and_then(|n| n.checked_add(expanded))
                .ok_or_else(|| {
                    "`attention_types` expands to more layers than fit in memory".to_string()
                })?;
        }
        if expanded != num_layers {
            return Err(format!(
                "`attention_types` expands to {expanded} layers, `num_layers` is {num_layers}"
            ));
        }
        let mut windows = Vec::with_capacity(num_layers);
        for (kinds, repeat) in &pattern {
            for _ in 0..*repeat {
                for kind in kinds {
                    windows.push(match kind.as_str() {
                        "global" => None,
                        "local" => Some(c.window_size),
                        other => {
                            return Err(format!("unsupported `attention_types` entry `{other}`"));
                        }
                    });
                }
            }
        }
        Ok(ModelSpec {
            architecture: self.architecture().to_string(),
            vocab_size: c.vocab_size,
            hidden_size: c.hidden_size,
            num_layers,
            num_heads: c.num_heads,
            num_kv_heads: c.num_heads,
            head_dim,
            intermediate_size,
            context_length: c.max_position_embeddings,
            positions: Positions::Learned,
            attention_windows: windows,
            features: Features {
                norm: NormSpec {
                    kind: NormKind::LayerNorm,
                    eps: norm_eps::from_config(config, "layer_norm_epsilon", 1e-5)?,
                    bias: true,
                },
                activation: activation("activation_function", &c.activation_function)?,
                mlp: MlpKind::Plain,
                biases: Biases {
                    qkv: false,
                    attn_out: true,
                    mlp_in: true,
                    mlp_out: true,
                },
                // GPT-Neo never divides scores by sqrt(head_dim).
                attention_scale: Some(1.0),
                tied_embeddings: c.tie_word_embeddings,
                ..Features::default()
            },
        })
    }

    fn source(&self, _spec: &ModelSpec, tensor: &TensorSpec) -> TensorSource {
        let name = match tensor.name.as_str() {
            EMBED => "transformer.wte.weight".to_string(),
            POS_EMBED => "transformer.wpe.weight".to_string(),
            LM_HEAD => "lm_head.weight".to_string(),
            other => match (other.strip_prefix("final_norm."), split_layer(other)) {
                (Some(param), _) => format!("transformer.ln_f.{param}"),
                (None, Some((layer, suffix))) => {
                    let (module, param) = suffix.rsplit_once('.').unwrap_or((suffix, ""));
                    let hf = match module {
                        "attn_norm" => "ln_1",
                        "mlp_norm" => "ln_2",
                        "attn.q" => "attn.attention.q_proj",
                        "attn.k" => "attn.attention.k_proj",
                        "attn.v" => "attn.attention.v_proj",
                        "attn.o" => "attn.attention.out_proj",
                        "mlp.up" => "mlp.c_fc",
                        "mlp.down" => "mlp.c_proj",
                        other => other,
                    };
                    format!("transformer.h.{layer}.{hf}.{param}")
                }
                (None, None) => other.to_string(),
            },
        };
        TensorSource::whole(name, tensor)
    }

    fn to_config(&self, spec: &ModelSpec) -> Result<Value, String> {
        super::gemma::refuse_gemma_knobs(spec, self.architecture())?;
        let sizes: Vec<usize> = spec.attention_windows.iter().flatten().copied().collect();
        let expressible = matches!(spec.positions, Positions::Learned)
            && spec.features.norm.kind == NormKind::LayerNorm
            && spec.features.norm.bias
            && spec.features.mlp == MlpKind::Plain
            && spec.features.residual == Residual::Sequential
            && spec.features.biases
                == (Biases {
                    qkv: false,
                    attn_out: true,
                    mlp_in: true,
                    mlp_out: true,
                })
            && spec.num_kv_heads == spec.num_heads
            && spec.head_dim * spec.num_heads == spec.hidden_size
            && !spec.features.qk_norm
            && spec.features.attention_scale == Some(1.0)
            && sizes.windows(2).all(|w| w[0] == w[1]);
        if !expressible {
            return Err("GPT-Neo needs learned positions, LayerNorm, unbiased q/k/v, unscaled scores and one \
                        local window size"
                .to_string());
        }
        let attention_types: Vec<Value> = spec
            .attention_windows
            .iter()
            .map(|w| json!([[if w.is_some() { "local" } else { "global" }], 1]))
            .collect();
        Ok(json!({
            "architectures": [self.architecture()],
            "model_type": "gpt_neo",
            "vocab_size": spec.vocab_size,
            "max_position_embeddings": spec.context_length,
            "hidden_size": spec.hidden_size,
            "num_layers": spec.num_layers,
            "num_heads": spec.num_heads,
            "intermediate_size": spec.intermediate_size,
            "attention_types": attention_types,
            "window_size": sizes.first().copied().unwrap_or(256),
            "activation_function": spec.features.activation.hf_name(),
            "layer_norm_epsilon": spec.features.norm.eps,
            "tie_word_embeddings": spec.features.tied_embeddings,
            "torch_dtype": "float32",
        }))
    }
}

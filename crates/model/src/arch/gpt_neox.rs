//! `GPTNeoXForCausalLM` (Pythia): query, key and value stacked in `query_key_value` and interleaved per head
//! (`[heads, 3, head_dim]` rows), partial rotary (`rotary_pct`), parallel residual, LayerNorm, untied `embed_out`.

use ember_attention::RopeLayout;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{
    Family, GgufTensor, ScratchShape, TensorSource, activation, derived_head_dim, from_value,
    gguf_names, layer_count, norm_eps, rope, split_layer,
};
use crate::gguf::{GgufError, GgufHparams, MetadataValue};
use crate::spec::{Biases, Features, MlpKind, ModelSpec, NormKind, NormSpec, Positions, Residual};
use crate::tensors::{EMBED, LM_HEAD, TensorSpec};

/// The GPT-NeoX family.
pub struct GptNeoX;

#[derive(Deserialize)]
struct GptNeoXConfig {
    vocab_size: usize,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    intermediate_size: usize,
    #[serde(default = "default_act")]
    hidden_act: String,
    #[serde(default = "default_positions")]
    max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default = "default_true")]
    use_parallel_residual: bool,
    #[serde(default = "default_true")]
    attention_bias: bool,
}

fn default_act() -> String {
    "gelu".to_string()
}

fn default_positions() -> usize {
    2048
}

fn default_true() -> bool {
    true
}

const NEOX_ROPE: rope::RopeKeys = rope::RopeKeys {
    theta_key: "rotary_emb_base",
    partial_key: "rotary_pct",
    default_partial: 0.25,
};

impl Family for GptNeoX {
    fn architecture(&self) -> &'static str {
        "GPTNeoXForCausalLM"
    }

    fn scratch_config(&self, s: &ScratchShape) -> Value {
        json!({
            "architectures": [self.architecture()],
            "vocab_size": s.vocab_size,
            "hidden_size": s.hidden_size,
            "num_hidden_layers": s.num_layers,
            "num_attention_heads": s.num_heads,
            "intermediate_size": s.intermediate_size,
            "max_position_embeddings": s.context_length,
            "rotary_emb_base": s.rope_theta,
            "layer_norm_eps": s.norm_eps,
            "tie_word_embeddings": s.tie_embeddings,
        })
    }

    fn parse_config(&self, config: &Value) -> Result<ModelSpec, String> {
        let c: GptNeoXConfig = from_value(config)?;
        let num_layers = layer_count("num_hidden_layers", c.num_hidden_layers)?;
        let head_dim = derived_head_dim(
            "hidden_size",
            c.hidden_size,
            "num_attention_heads",
            c.num_attention_heads,
        )?;
        Ok(ModelSpec {
            architecture: self.architecture().to_string(),
            vocab_size: c.vocab_size,
            hidden_size: c.hidden_size,
            num_layers,
            num_heads: c.num_attention_heads,
            num_kv_heads: c.num_attention_heads,
            head_dim,
            intermediate_size: c.intermediate_size,
            context_length: c.max_position_embeddings,
            positions: Positions::Rope(rope::parse(
                config,
                &NEOX_ROPE,
                head_dim,
                c.max_position_embeddings,
            )?),
            attention_windows: vec![None; num_layers],
            features: Features {
                norm: NormSpec {
                    kind: NormKind::LayerNorm,
                    eps: norm_eps::from_config(config, "layer_norm_eps", 1e-5)?,
                    bias: true,
                },
                residual: if c.use_parallel_residual {
                    Residual::Parallel
                } else {
                    Residual::Sequential
                },
                activation: activation("hidden_act", &c.hidden_act)?,
                mlp: MlpKind::Plain,
                biases: Biases {
                    qkv: c.attention_bias,
                    attn_out: c.attention_bias,
                    mlp_in: true,
                    mlp_out: true,
                },
                tied_embeddings: c.tie_word_embeddings,
                ..Features::default()
            },
        })
    }

    fn source(&self, spec: &ModelSpec, tensor: &TensorSpec) -> TensorSource {
        match tensor.name.as_str() {
            EMBED => return TensorSource::whole("gpt_neox.embed_in.weight", tensor),
            LM_HEAD => return TensorSource::whole("embed_out.weight", tensor),
            _ => {}
        }
        if let Some(param) = tensor.name.strip_prefix("final_norm.") {
            return TensorSource::whole(format!("gpt_neox.final_layer_norm.{param}"), tensor);
        }
        let Some((layer, suffix)) = split_layer(&tensor.name) else {
            return TensorSource::whole(tensor.name.clone(), tensor);
        };
        let (module, param) = suffix.rsplit_once('.').unwrap_or((suffix, ""));
        let prefix = format!("gpt_neox.layers.{layer}");
        // Output rows of query_key_value are [head][q|k|v][head_dim]: part `which` of every head.
        let (h, d) = (spec.hidden_size, spec.head_dim);
        let qkv = |which: usize| {
            let rows = (0..spec.num_heads)
                .map(|head| (head * 3 + which) * d..(head * 3 + which + 1) * d)
                .collect();
            let stacked = if param == "weight" {
                vec![3 * h, h]
            } else {
                vec![3 * h]
            };
            TensorSource::stacked(
                format!("{prefix}.attention.query_key_value.{param}"),
                stacked,
                rows,
            )
        };
        let hf = match module {
            "attn.q" => return qkv(0),
            "attn.k" => return qkv(1),
            "attn.v" => return qkv(2),
            "attn_norm" => "input_layernorm",
            "mlp_norm" => "post_attention_layernorm",
            "attn.o" => "attention.dense",
            "mlp.up" => "mlp.dense_h_to_4h",
            "mlp.down" => "mlp.dense_4h_to_h",
            other => other,
        };
        TensorSource::whole(format!("{prefix}.{hf}.{param}"), tensor)
    }

    fn to_config(&self, spec: &ModelSpec) -> Result<Value, String> {
        super::gemma::refuse_gemma_knobs(spec, self.architecture())?;
        let b = spec.features.biases;
        let Positions::Rope(rope) = &spec.positions else {
            return Err("GPT-NeoX uses RoPE".to_string());
        };
        let expressible = spec.features.norm.kind == NormKind::LayerNorm
            && spec.features.norm.bias
            && spec.features.mlp == MlpKind::Plain
            && b.qkv == b.attn_out
            && b.mlp_in
            && b.mlp_out
            && spec.num_kv_heads == spec.num_heads
            && spec.head_dim * spec.num_heads == spec.hidden_size
            && !spec.features.qk_norm
            && spec.attention_windows.iter().all(Option::is_none)
            && spec.features.attention_scale.is_none()
            && rope.layout == RopeLayout::RotateHalf;
        if !expressible {
            return Err("GPT-NeoX needs LayerNorm, a plain biased MLP, multi-head attention, rotate-half RoPE \
                        and no windows"
                .to_string());
        }
        let mut params = rope::to_parameters(rope);
        let partial = rope.rotary_dim as f64 / rope.head_dim as f64;
        params["partial_rotary_factor"] = json!(partial);
        Ok(json!({
            "architectures": [self.architecture()],
            "model_type": "gpt_neox",
            "vocab_size": spec.vocab_size,
            "hidden_size": spec.hidden_size,
            "num_hidden_layers": spec.num_layers,
            "num_attention_heads": spec.num_heads,
            "intermediate_size": spec.intermediate_size,
            "hidden_act": spec.features.activation.hf_name(),
            "max_position_embeddings": spec.context_length,
            "layer_norm_eps": spec.features.norm.eps,
            "tie_word_embeddings": spec.features.tied_embeddings,
            "use_parallel_residual": spec.features.residual == Residual::Parallel,
            "attention_bias": b.qkv,
            "rotary_pct": partial,
            "rotary_emb_base": rope.theta,
            "rope_parameters": params,
            "torch_dtype": "float32",
        }))
    }

    fn gguf_architecture(&self) -> Option<&'static str> {
        Some("gptneox")
    }

    /// The keys llama.cpp's `gptneox` reads; the rest (LayerNorm, GELU, biases on every projection) is fixed
    /// by the architecture, and the spec check after writing refuses a GPT-NeoX spec they cannot carry.
    fn gguf_metadata(&self, spec: &ModelSpec) -> Result<Vec<(String, MetadataValue)>, String> {
        let Positions::Rope(rope) = &spec.positions else {
            return Err("GPT-NeoX uses RoPE".to_string());
        };
        if rope.scaling != ember_attention::RopeScaling::None {
            return Err("llama.cpp's gptneox reads no RoPE scaling".to_string());
        }
        let count = crate::gguf::count_value;
        let key = |k: &str| format!("gptneox.{k}");
        Ok(vec![
            (
                key("context_length"),
                count(spec.context_length, "context length")?,
            ),
            (
                key("embedding_length"),
                count(spec.hidden_size, "hidden size")?,
            ),
            (key("block_count"), count(spec.num_layers, "layer count")?),
            (
                key("feed_forward_length"),
                count(spec.intermediate_size, "MLP width")?,
            ),
            (
                key("rope.dimension_count"),
                count(rope.rotary_dim, "rotary width")?,
            ),
            (key("rope.freq_base"), MetadataValue::F32(rope.theta as f32)),
            (
                key("attention.head_count"),
                count(spec.num_heads, "head count")?,
            ),
            (
                key("use_parallel_residual"),
                MetadataValue::Bool(spec.features.residual == Residual::Parallel),
            ),
            (
                key("attention.layer_norm_epsilon"),
                MetadataValue::F32(spec.features.norm.eps as f32),
            ),
        ])
    }

    fn gguf_config(&self, h: &GgufHparams<'_>) -> Result<Value, GgufError> {
        let hidden = h.hidden_size()?;
        let heads = h.uint("attention.head_count")?;
        let head_dim = hidden / heads.max(1);
        let rotary = h.opt_uint("rope.dimension_count")?.unwrap_or(head_dim);
        Ok(json!({
            "architectures": [self.architecture()],
            "model_type": "gpt_neox",
            "vocab_size": h.vocab_size()?,
            "hidden_size": hidden,
            "num_hidden_layers": h.block_count()?,
            "num_attention_heads": heads,
            "intermediate_size": h.feed_forward_length()?,
            "max_position_embeddings": h.uint("context_length")?,
            "layer_norm_eps": norm_eps::from_gguf(h, "attention.layer_norm_epsilon")?,
            "use_parallel_residual": h.bool_or("use_parallel_residual", true)?,
            "attention_bias": h.tensor("blk.0.attn_qkv.bias").is_some(),
            "rotary_pct": rotary as f64 / head_dim.max(1) as f64,
            "rotary_emb_base": h.rope_theta(10_000.0)?,
            "tie_word_embeddings": h.tied(),
        }))
    }

    /// The converter de-interleaves `query_key_value` (`[head][q, k, v][dim]` rows) into `[q; k; v]`.
    fn gguf_tensor(&self, spec: &ModelSpec, tensor: &TensorSpec) -> Option<GgufTensor> {
        gguf_names::stacked_qkv_or_whole(spec, tensor)
    }
}

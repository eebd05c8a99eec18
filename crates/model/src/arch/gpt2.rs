//! `GPT2LMHeadModel`: learned positions, LayerNorm with bias, biases everywhere, a plain GELU MLP, and `Conv1D`
//! weights stored `[in, out]`, with the query, key and value stacked in `c_attn`.

use serde::Deserialize;
use serde_json::{Value, json};

use super::{
    Family, GgufTensor, ScratchShape, TensorSource, activation, derived_head_dim, from_value,
    gguf_names, layer_count, norm_eps, split_layer, times,
};
use crate::gguf::{GgufError, GgufHparams, MetadataValue};
use crate::spec::{Biases, Features, MlpKind, ModelSpec, NormKind, NormSpec, Positions, Residual};
use crate::tensors::{EMBED, LM_HEAD, POS_EMBED, TensorSpec};

/// The GPT-2 family.
pub struct Gpt2;

#[derive(Deserialize)]
struct Gpt2Config {
    vocab_size: usize,
    n_positions: usize,
    n_embd: usize,
    n_layer: usize,
    n_head: usize,
    n_inner: Option<usize>,
    #[serde(default = "default_act")]
    activation_function: String,
    #[serde(default = "default_true")]
    tie_word_embeddings: bool,
    #[serde(default = "default_true")]
    scale_attn_weights: bool,
    #[serde(default)]
    scale_attn_by_inverse_layer_idx: bool,
}

fn default_act() -> String {
    "gelu_new".to_string()
}

fn default_true() -> bool {
    true
}

impl Family for Gpt2 {
    fn architecture(&self) -> &'static str {
        "GPT2LMHeadModel"
    }

    fn scratch_config(&self, s: &ScratchShape) -> Value {
        json!({
            "architectures": [self.architecture()],
            "vocab_size": s.vocab_size,
            "n_embd": s.hidden_size,
            "n_layer": s.num_layers,
            "n_head": s.num_heads,
            "n_inner": s.intermediate_size,
            "n_positions": s.context_length,
            "layer_norm_epsilon": s.norm_eps,
            "tie_word_embeddings": s.tie_embeddings,
        })
    }

    fn parse_config(&self, config: &Value) -> Result<ModelSpec, String> {
        let c: Gpt2Config = from_value(config)?;
        if c.scale_attn_by_inverse_layer_idx {
            return Err("`scale_attn_by_inverse_layer_idx: true` is not supported".to_string());
        }
        let num_layers = layer_count("n_layer", c.n_layer)?;
        let head_dim = derived_head_dim("n_embd", c.n_embd, "n_head", c.n_head)?;
        let intermediate_size = match c.n_inner {
            Some(n) => n,
            None => times(4, "n_embd", c.n_embd)?,
        };
        Ok(ModelSpec {
            architecture: self.architecture().to_string(),
            vocab_size: c.vocab_size,
            hidden_size: c.n_embd,
            num_layers,
            num_heads: c.n_head,
            num_kv_heads: c.n_head,
            head_dim,
            intermediate_size,
            context_length: c.n_positions,
            positions: Positions::Learned,
            attention_windows: vec![None; num_layers],
            features: Features {
                norm: NormSpec {
                    kind: NormKind::LayerNorm,
                    eps: norm_eps::from_config(config, "layer_norm_epsilon", 1e-5)?,
                    bias: true,
                },
                activation: activation("activation_function", &c.activation_function)?,
                mlp: MlpKind::Plain,
                biases: Biases {
                    qkv: true,
                    attn_out: true,
                    mlp_in: true,
                    mlp_out: true,
                },
                attention_scale: (!c.scale_attn_weights).then_some(1.0),
                tied_embeddings: c.tie_word_embeddings,
                ..Features::default()
            },
        })
    }

    fn source(&self, spec: &ModelSpec, tensor: &TensorSpec) -> TensorSource {
        let h = spec.hidden_size;
        match tensor.name.as_str() {
            EMBED => return TensorSource::whole("transformer.wte.weight", tensor),
            POS_EMBED => return TensorSource::whole("transformer.wpe.weight", tensor),
            LM_HEAD => return TensorSource::whole("lm_head.weight", tensor),
            _ => {}
        }
        if let Some(param) = tensor.name.strip_prefix("final_norm.") {
            return TensorSource::whole(format!("transformer.ln_f.{param}"), tensor);
        }
        let Some((layer, suffix)) = split_layer(&tensor.name) else {
            return TensorSource::whole(tensor.name.clone(), tensor);
        };
        let (module, param) = suffix.rsplit_once('.').unwrap_or((suffix, ""));
        let prefix = format!("transformer.h.{layer}");
        let conv1d =
            |hf: &str| TensorSource::whole(format!("{prefix}.{hf}.{param}"), tensor).transposed();
        let c_attn = |rows: std::ops::Range<usize>| {
            let stacked = if param == "weight" {
                vec![3 * h, h]
            } else {
                vec![3 * h]
            };
            TensorSource::stacked(format!("{prefix}.attn.c_attn.{param}"), stacked, vec![rows])
                .transposed()
        };
        match module {
            "attn_norm" => TensorSource::whole(format!("{prefix}.ln_1.{param}"), tensor),
            "mlp_norm" => TensorSource::whole(format!("{prefix}.ln_2.{param}"), tensor),
            "attn.q" => c_attn(0..h),
            "attn.k" => c_attn(h..2 * h),
            "attn.v" => c_attn(2 * h..3 * h),
            "attn.o" => conv1d("attn.c_proj"),
            "mlp.up" => conv1d("mlp.c_fc"),
            "mlp.down" => conv1d("mlp.c_proj"),
            _ => TensorSource::whole(format!("{prefix}.{suffix}"), tensor),
        }
    }

    fn to_config(&self, spec: &ModelSpec) -> Result<Value, String> {
        super::gemma::refuse_gemma_knobs(spec, self.architecture())?;
        let expressible = matches!(spec.positions, Positions::Learned)
            && spec.features.norm.kind == NormKind::LayerNorm
            && spec.features.norm.bias
            && spec.features.mlp == MlpKind::Plain
            && spec.features.residual == Residual::Sequential
            && spec.features.biases
                == (Biases {
                    qkv: true,
                    attn_out: true,
                    mlp_in: true,
                    mlp_out: true,
                })
            && spec.num_kv_heads == spec.num_heads
            && spec.head_dim * spec.num_heads == spec.hidden_size
            && !spec.features.qk_norm
            && spec.attention_windows.iter().all(Option::is_none)
            && matches!(spec.features.attention_scale, None | Some(1.0));
        if !expressible {
            return Err(
                "GPT-2 needs learned positions, LayerNorm, a plain MLP, biases everywhere, \
                        multi-head attention and no windows"
                    .to_string(),
            );
        }
        Ok(json!({
            "architectures": [self.architecture()],
            "model_type": "gpt2",
            "vocab_size": spec.vocab_size,
            "n_positions": spec.context_length,
            "n_embd": spec.hidden_size,
            "n_layer": spec.num_layers,
            "n_head": spec.num_heads,
            "n_inner": spec.intermediate_size,
            "activation_function": spec.features.activation.hf_name(),
            "layer_norm_epsilon": spec.features.norm.eps,
            "tie_word_embeddings": spec.features.tied_embeddings,
            "scale_attn_weights": spec.features.attention_scale.is_none(),
            "torch_dtype": "float32",
        }))
    }

    fn gguf_architecture(&self) -> Option<&'static str> {
        Some("gpt2")
    }

    /// The converter writes `4 * n_embd` as the feed-forward length whatever `n_inner` is, so the MLP width is
    /// read from `ffn_down`'s shape instead.
    /// The keys llama.cpp's `gpt2` reads; the rest (GELU, learned positions, LayerNorm) is fixed by the
    /// architecture, and the spec check after writing refuses a GPT-2 spec they cannot carry.
    fn gguf_metadata(&self, spec: &ModelSpec) -> Result<Vec<(String, MetadataValue)>, String> {
        let count = crate::gguf::count_value;
        Ok(vec![
            (
                "gpt2.context_length".into(),
                count(spec.context_length, "context length")?,
            ),
            (
                "gpt2.embedding_length".into(),
                count(spec.hidden_size, "hidden size")?,
            ),
            (
                "gpt2.feed_forward_length".into(),
                count(spec.intermediate_size, "MLP width")?,
            ),
            (
                "gpt2.block_count".into(),
                count(spec.num_layers, "layer count")?,
            ),
            (
                "gpt2.attention.head_count".into(),
                count(spec.num_heads, "head count")?,
            ),
            (
                "gpt2.attention.layer_norm_epsilon".into(),
                MetadataValue::F32(spec.features.norm.eps as f32),
            ),
        ])
    }

    fn gguf_config(&self, h: &GgufHparams<'_>) -> Result<Value, GgufError> {
        let hidden = h.hidden_size()?;
        let inner = h
            .tensor("blk.0.ffn_down.weight")
            .and_then(|t| t.dims.first().copied())
            .map_or_else(|| h.uint("feed_forward_length"), Ok)?;
        Ok(json!({
            "architectures": [self.architecture()],
            "model_type": "gpt2",
            "vocab_size": h.vocab_size()?,
            "n_positions": h.uint("context_length")?,
            "n_embd": hidden,
            "n_layer": h.block_count()?,
            "n_head": h.uint("attention.head_count")?,
            "n_inner": inner,
            "activation_function": "gelu_new",
            "layer_norm_epsilon": norm_eps::from_gguf(h, "attention.layer_norm_epsilon")?,
            "tie_word_embeddings": h.tied(),
        }))
    }

    /// The converter transposes GPT-2's `Conv1D` weights to `[out, in]`, so only `c_attn` stays special: the
    /// stacked `attn_qkv` (`[q; k; v]` rows).
    fn gguf_tensor(&self, spec: &ModelSpec, tensor: &TensorSpec) -> Option<GgufTensor> {
        gguf_names::stacked_qkv_or_whole(spec, tensor)
    }
}

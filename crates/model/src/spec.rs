//! [`ModelSpec`]: one typed description of everything that varies between decoder-only transformer families.
//!
//! The generic [`crate::Transformer`] reads nothing else, so a family is fully described by the spec its config
//! parser produces. Parameter count and memory follow from the spec alone ([`ModelSpec::tensors`]), without
//! allocating weights.

use ember_attention::RopeConfig;
use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};
use crate::tensors::{TensorRole, TensorSpec};

/// Normalisation layer kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormKind {
    /// `(x - mean) / sqrt(var + eps) * weight (+ bias)`.
    LayerNorm,
    /// `x / sqrt(mean(x²) + eps) * weight`.
    RmsNorm,
}

/// A normalisation layer: kind, epsilon and whether it has a bias (LayerNorm only).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct NormSpec {
    /// LayerNorm or RMSNorm.
    pub kind: NormKind,
    /// The epsilon added to the variance.
    pub eps: f64,
    /// Whether the norm has a learned bias (`beta`).
    pub bias: bool,
}

/// How the two sublayers of a block combine with the residual stream. Every supported family normalises the
/// input of a sublayer (pre-norm); they differ in whether the MLP sees the attention output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Residual {
    /// `h = x + attn(norm1(x)); out = h + mlp(norm2(h))` (GPT-2, LLaMA, ...).
    Sequential,
    /// `out = x + attn(norm1(x)) + mlp(norm2(x))` (GPT-NeoX with `use_parallel_residual`).
    Parallel,
}

/// The feed-forward non-linearity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// Exact GELU, `x·Φ(x)` (HF `gelu`).
    Gelu,
    /// The tanh approximation of GELU (HF `gelu_new`, `gelu_pytorch_tanh`, `gelu_fast`).
    GeluTanh,
    /// `x·sigmoid(x)` (HF `silu`, `swish`).
    Silu,
    /// `max(x, 0)`.
    Relu,
}

impl Activation {
    /// Parses a Hugging Face `hidden_act` / `activation_function` value.
    pub fn from_hf(name: &str) -> Option<Self> {
        Some(match name {
            "gelu" => Activation::Gelu,
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Activation::GeluTanh,
            "silu" | "swish" => Activation::Silu,
            "relu" => Activation::Relu,
            _ => return None,
        })
    }

    /// The Hugging Face name that selects exactly this function.
    pub fn hf_name(self) -> &'static str {
        match self {
            Activation::Gelu => "gelu",
            Activation::GeluTanh => "gelu_new",
            Activation::Silu => "silu",
            Activation::Relu => "relu",
        }
    }
}

/// The feed-forward block's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MlpKind {
    /// `down(act(up(x)))`.
    Plain,
    /// `down(act(gate(x)) * up(x))` (SwiGLU when the activation is SiLU).
    Gated,
}

/// How token positions enter the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum Positions {
    /// A learned `[context_length, hidden]` table added to the token embeddings (GPT-2, GPT-Neo).
    Learned,
    /// Rotary embeddings applied to queries and keys (layout, partial rotary, theta, scaling).
    Rope(RopeConfig),
}

/// Which linear projections carry a bias.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Biases {
    /// Query, key and value projections.
    pub qkv: bool,
    /// Attention output projection.
    pub attn_out: bool,
    /// MLP input projections (`up`, and `gate` when gated).
    pub mlp_in: bool,
    /// MLP output projection (`down`).
    pub mlp_out: bool,
}

/// Everything that varies between the supported decoder-only families: the sizes, the positions and windows
/// (which are shaped by the sizes), and the architectural [`Features`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelSpec {
    /// The Hugging Face architecture this spec was read from and is saved as (e.g. `LlamaForCausalLM`).
    pub architecture: String,
    /// Vocabulary size (rows of the embedding and the LM head).
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Number of transformer blocks.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (`< num_heads` is grouped-query attention).
    pub num_kv_heads: usize,
    /// Width of one head (not necessarily `hidden_size / num_heads`, e.g. Qwen3).
    pub head_dim: usize,
    /// Width of the MLP's hidden layer.
    pub intermediate_size: usize,
    /// Maximum positions (size of the learned table; the trained context for RoPE models).
    pub context_length: usize,
    /// Learned or rotary positions (a rotary config carries the head width it rotates).
    pub positions: Positions,
    /// Per layer, the sliding attention window (`Some(w)`: a query attends to the `w` most recent keys, itself
    /// included), or `None` for full causal attention.
    pub attention_windows: Vec<Option<usize>>,
    /// How the blocks are built, beyond their sizes.
    #[serde(flatten)]
    pub features: Features,
}

/// The architectural choices of a family that do not depend on its sizes. The default is plain LLaMA, so a
/// family's spec names only what differs (`..Features::default()`), and a new knob is one field here with its
/// LLaMA value in [`Default`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Features {
    /// Every norm in the model (block norms and the final norm).
    pub norm: NormSpec,
    /// Sequential or parallel residual.
    pub residual: Residual,
    /// MLP non-linearity.
    pub activation: Activation,
    /// Plain or gated MLP.
    pub mlp: MlpKind,
    /// Which projections carry biases.
    pub biases: Biases,
    /// RMSNorm over each query and key head before RoPE (Qwen3).
    pub qk_norm: bool,
    /// The softmax scale of attention scores; `None` is the usual `1/sqrt(head_dim)` (GPT-Neo uses 1).
    pub attention_scale: Option<f64>,
    /// Whether the LM head reuses the token embedding matrix.
    pub tied_embeddings: bool,
}

impl Default for Features {
    /// LLaMA: RMSNorm (eps 1e-5), sequential pre-norm residual, SwiGLU, no biases, no q/k norm, the usual
    /// attention scale, an untied LM head.
    fn default() -> Self {
        Features {
            norm: NormSpec {
                kind: NormKind::RmsNorm,
                eps: 1e-5,
                bias: false,
            },
            residual: Residual::Sequential,
            activation: Activation::Silu,
            mlp: MlpKind::Gated,
            biases: Biases::default(),
            qk_norm: false,
            attention_scale: None,
            tied_embeddings: false,
        }
    }
}

/// Bytes per parameter for the storage types `ember info` reports.
pub const DTYPES: [(&str, f64); 4] = [
    ("f32", 4.0),
    ("f16", 2.0),
    ("bf16", 2.0),
    ("q8_0", 34.0 / 32.0),
];

impl ModelSpec {
    /// A LLaMA-style model (RMSNorm, RoPE with theta 10000, SwiGLU, no biases, untied head): ember's default for
    /// models trained from scratch, saved as `LlamaForCausalLM`.
    pub fn llama_style(
        vocab_size: usize,
        hidden_size: usize,
        num_layers: usize,
        num_heads: usize,
        num_kv_heads: usize,
        intermediate_size: usize,
        context_length: usize,
    ) -> Self {
        let head_dim = hidden_size / num_heads.max(1);
        ModelSpec {
            architecture: "LlamaForCausalLM".to_string(),
            vocab_size,
            hidden_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            intermediate_size,
            context_length,
            positions: Positions::Rope(RopeConfig::new(head_dim)),
            attention_windows: vec![None; num_layers],
            features: Features::default(),
        }
    }

    /// Checks that the sizes agree with each other; every constructor path (config parsers, training configs)
    /// goes through this before a model is built.
    pub fn validate(&self) -> Result<()> {
        let fail = |msg: String| Err(ModelError::InvalidSpec(msg));
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
            ("num_kv_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("intermediate_size", self.intermediate_size),
            ("context_length", self.context_length),
        ];
        if let Some((key, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return fail(format!("{key} must be positive"));
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return fail(format!(
                "num_heads ({}) must be a multiple of num_kv_heads ({})",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.attention_windows.len() != self.num_layers {
            return fail(format!(
                "attention_windows has {} entries for {} layers",
                self.attention_windows.len(),
                self.num_layers
            ));
        }
        if self.attention_windows.contains(&Some(0)) {
            return fail("an attention window must be at least 1".to_string());
        }
        if let Positions::Rope(rope) = &self.positions {
            if rope.head_dim != self.head_dim {
                return fail(format!(
                    "rope head_dim {} differs from head_dim {}",
                    rope.head_dim, self.head_dim
                ));
            }
            rope.validate()
                .map_err(|e| ModelError::InvalidSpec(e.to_string()))?;
        }
        if self.features.norm.bias && self.features.norm.kind == NormKind::RmsNorm {
            return fail("RMSNorm has no bias".to_string());
        }
        Ok(())
    }

    /// Width of all query heads together.
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Width of all key (or value) heads together.
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Every parameter tensor, in a fixed order, under its canonical name with its canonical shape.
    pub fn tensors(&self) -> Vec<TensorSpec> {
        crate::tensors::expected_tensors(self)
    }

    /// The exact number of parameters (a tied LM head is counted once).
    pub fn parameter_count(&self) -> u64 {
        self.tensors().iter().map(|t| t.numel() as u64).sum()
    }

    /// Parameters excluding token and position embeddings (the usual "non-embedding" count in scaling laws).
    pub fn non_embedding_parameter_count(&self) -> u64 {
        self.tensors()
            .iter()
            .filter(|t| t.role != TensorRole::Embedding)
            .map(|t| t.numel() as u64)
            .sum()
    }

    /// Bytes of the weights stored as `bytes_per_param` each.
    pub fn weight_bytes(&self, bytes_per_param: f64) -> u64 {
        (self.parameter_count() as f64 * bytes_per_param).ceil() as u64
    }

    /// Bytes of KV cache per token of context (keys and values, all layers) at `bytes_per_value`.
    pub fn kv_cache_bytes_per_token(&self, bytes_per_value: usize) -> u64 {
        (2 * self.num_layers * self.kv_dim() * bytes_per_value) as u64
    }
}

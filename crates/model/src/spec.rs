//! [`ModelSpec`]: one typed description of everything that varies between decoder-only transformer families.
//!
//! The generic [`crate::Transformer`] reads nothing else, so a family is fully described by the spec its config
//! parser produces. Parameter count and memory follow from the spec alone ([`ModelSpec::tensors`]), without
//! allocating weights.

use ember_attention::RopeConfig;
use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};
use crate::tensors::{ModuleShape, TensorRole, TensorSpec};

/// The largest vocabulary, width, head count, context or window a spec may have: token ids, positions and
/// tensor indices travel as 32-bit integers (burn's `Int` element is `i32` on the GPU backends), so a larger
/// size could not be indexed. Published models stay far below it (the longest context is about 10M).
pub const MAX_SIZE: usize = i32::MAX as usize;

/// The most layers a spec may have: 30x the deepest published decoder (LLaMA 3.1 405B, 126 layers). Config
/// parsers check it before building anything per layer, so a count of 2^40 is an error, not an abort.
pub const MAX_LAYERS: usize = 4096;

/// The most memory a shape may need ([`MemoryNeeds::total`]): 2^47 bytes (128 TiB), the user address space of
/// x86-64 and AArch64 with 4-level page tables, so no machine ember runs on could allocate more, while the
/// largest dense model published (LLaMA 3.1 405B: 1.6 TB of f32 weights plus 0.13 TB of KV cache for its
/// full 128k context) needs 80x less. Whether a shape below it fits this machine is for the loader to say.
pub const MAX_MODEL_BYTES: u128 = 1 << 47;

/// What a shape needs in memory at f32, from [`ModelSpec::memory_needs`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryNeeds {
    /// Parameters (a tied LM head counted once), equal to [`ModelSpec::parameter_count`].
    pub parameters: u128,
    /// The weights in f32.
    pub weight_bytes: u128,
    /// RoPE cos/sin tables covering the whole context (0 for learned positions). Tables are built for the
    /// positions in use, so this is what the longest sequence would need.
    pub rope_table_bytes: u128,
    /// Keys and values of every layer for one sequence as long as the context, in f32.
    pub kv_cache_bytes: u128,
}

impl MemoryNeeds {
    /// Weights, RoPE tables and the KV cache together.
    pub fn total(&self) -> u128 {
        self.weight_bytes + self.rope_table_bytes + self.kv_cache_bytes
    }
}

/// `bytes` in binary units (three decimals), for messages.
fn human_bytes(bytes: u128) -> String {
    const UNITS: [&str; 7] = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{value:.3} {}", UNITS[unit])
    }
}

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
    /// Token embeddings multiplied by `sqrt(hidden_size)` after the lookup (Gemma's `normalizer`).
    #[serde(default)]
    pub scaled_embeddings: bool,
    /// Every norm scales by `1 + weight` instead of `weight` (Gemma's RMSNorm), q/k norms included.
    #[serde(default)]
    pub norm_unit_offset: bool,
    /// Each sublayer's output is normed again before the residual add (`attn_post_norm`, `mlp_post_norm`:
    /// Gemma 2/3's "sandwich" of pre- and post-norms).
    #[serde(default)]
    pub post_norms: bool,
    /// Cap `c` of the scaled attention scores, `c * tanh(s / c)` before masking (Gemma 2's
    /// `attn_logit_softcapping`).
    #[serde(default)]
    pub attn_softcap: Option<f64>,
    /// Cap `c` of the LM head's logits, `c * tanh(logits / c)` (Gemma 2's `final_logit_softcapping`).
    #[serde(default)]
    pub final_softcap: Option<f64>,
    /// The RoPE of the sliding-window layers when it differs from the global one in [`ModelSpec::positions`]
    /// (Gemma 3's `rope_local_base_freq`); `None`: every layer uses the global RoPE.
    #[serde(default)]
    pub local_rope: Option<RopeConfig>,
}

impl Default for Features {
    /// LLaMA: RMSNorm (eps 1e-5), sequential pre-norm residual, SwiGLU, no biases, no q/k norm, the usual
    /// attention scale, an untied LM head; none of Gemma's knobs (unscaled embeddings, plain norm weights, no
    /// post-norms, no soft caps, one RoPE).
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
            scaled_embeddings: false,
            norm_unit_offset: false,
            post_norms: false,
            attn_softcap: None,
            final_softcap: None,
            local_rope: None,
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

    /// Checks that the sizes agree with each other and that the shape fits in memory; every constructor path
    /// (config parsers, GGUF headers, training configs) goes through this before a model is built. The checks
    /// run in an order that never overflows: each size is bounded before any product of sizes is formed.
    pub fn validate(&self) -> Result<()> {
        let fail = |msg: String| Err(ModelError::InvalidSpec(msg));
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
            ("num_kv_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("intermediate_size", self.intermediate_size),
            ("context_length", self.context_length),
        ];
        if let Some((key, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return fail(format!("{key} must be positive"));
        }
        if let Some((key, v)) = sizes.iter().find(|(_, v)| *v > MAX_SIZE) {
            return fail(format!(
                "{key} is {v}, expected at most {MAX_SIZE} (ids, positions and tensor indices are 32-bit)"
            ));
        }
        if self.num_layers > MAX_LAYERS {
            return fail(format!(
                "num_layers is {}, expected at most {MAX_LAYERS}",
                self.num_layers
            ));
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
        if let Some(w) = self
            .attention_windows
            .iter()
            .flatten()
            .find(|&&w| w == 0 || w > MAX_SIZE)
        {
            return fail(format!(
                "an attention window is {w}, expected 1 to {MAX_SIZE}"
            ));
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
        let norm = self.features.norm;
        if norm.bias && norm.kind == NormKind::RmsNorm {
            return fail("RMSNorm has no bias".to_string());
        }
        // The kernels add eps in f32: a value that is not a positive f32 (negative, zero, NaN, infinite, or so
        // small or large that f32 rounds it to 0 or infinity) makes every norm output NaN or infinite.
        let eps = norm.eps as f32;
        if !(eps.is_finite() && eps > 0.0) {
            return fail(format!(
                "norm eps is {:e}, expected a positive number that f32 can hold (e.g. 1e-5)",
                norm.eps
            ));
        }
        if let Some(scale) = self.features.attention_scale
            && !((scale as f32).is_finite() && scale > 0.0)
        {
            return fail(format!(
                "attention scale is {scale}, expected a positive finite number"
            ));
        }
        for (key, cap) in [
            ("attention soft cap", self.features.attn_softcap),
            ("final logit soft cap", self.features.final_softcap),
        ] {
            if let Some(cap) = cap
                && !((cap as f32).is_finite() && cap > 0.0)
            {
                return fail(format!("{key} is {cap}, expected a positive finite number"));
            }
        }
        if let Some(local) = &self.features.local_rope {
            let Positions::Rope(_) = &self.positions else {
                return fail("a local RoPE needs rotary positions".to_string());
            };
            if local.head_dim != self.head_dim {
                return fail(format!(
                    "local rope head_dim {} differs from head_dim {}",
                    local.head_dim, self.head_dim
                ));
            }
            local
                .validate()
                .map_err(|e| ModelError::InvalidSpec(format!("local rope: {e}")))?;
        }
        let needs = self.memory_needs().expect("every size was bounded above");
        if needs.total() > MAX_MODEL_BYTES {
            return fail(format!(
                "this shape needs {}: weights {} ({} parameters in f32), RoPE tables {} and a KV cache of {} \
                 for one sequence of {} positions; ember refuses shapes beyond {} (2^47 bytes, the user \
                 address space of x86-64 and AArch64), which no machine can allocate",
                human_bytes(needs.total()),
                human_bytes(needs.weight_bytes),
                needs.parameters,
                human_bytes(needs.rope_table_bytes),
                human_bytes(needs.kv_cache_bytes),
                self.context_length,
                human_bytes(MAX_MODEL_BYTES),
            ));
        }
        Ok(())
    }

    /// What running this shape needs in f32, computed without allocating anything (not even the tensor
    /// list), in 128-bit arithmetic so no shape overflows it. `None` when a size exceeds [`MAX_SIZE`] or the
    /// layers [`MAX_LAYERS`], the bounds [`ModelSpec::validate`] checks first.
    pub fn memory_needs(&self) -> Option<MemoryNeeds> {
        let sizes = [
            self.vocab_size,
            self.hidden_size,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.intermediate_size,
            self.context_length,
        ];
        if sizes.iter().any(|&s| s > MAX_SIZE) || self.num_layers > MAX_LAYERS {
            return None;
        }
        let n = |x: usize| x as u128;
        let norm_bias = self.features.norm.bias && self.features.norm.kind == NormKind::LayerNorm;
        let module = |shape: ModuleShape| match shape {
            ModuleShape::Norm { dim } => n(dim) * if norm_bias { 2 } else { 1 },
            ModuleShape::Linear {
                inputs,
                outputs,
                bias,
            } => n(inputs) * n(outputs) + if bias { n(outputs) } else { 0 },
        };
        // One block's modules, counted once and multiplied: the same shapes `tensors()` lists per layer.
        let per_layer: u128 = crate::tensors::block_modules(self)
            .into_iter()
            .map(|(_, shape)| module(shape))
            .sum();
        let (h, vocab, context) = (
            n(self.hidden_size),
            n(self.vocab_size),
            n(self.context_length),
        );
        let heads = if self.features.tied_embeddings { 1 } else { 2 };
        let positions = match self.positions {
            Positions::Learned => context * h,
            Positions::Rope(_) => 0,
        };
        let parameters = heads * vocab * h
            + positions
            + n(self.num_layers) * per_layer
            + module(ModuleShape::Norm {
                dim: self.hidden_size,
            });
        let tables = if self.features.local_rope.is_some() {
            2
        } else {
            1
        };
        let rope_table_bytes = match &self.positions {
            // A cos and a sin table, one f32 row of head_dim per position (twice with a local RoPE).
            Positions::Rope(_) => tables * 2 * context * n(self.head_dim) * 4,
            Positions::Learned => 0,
        };
        Some(MemoryNeeds {
            parameters,
            weight_bytes: parameters * 4,
            rope_table_bytes,
            kv_cache_bytes: context * 2 * n(self.num_layers) * n(self.kv_dim()) * 4,
        })
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

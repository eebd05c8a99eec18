//! Canonical parameter names and shapes.
//!
//! Every family's weight mapper translates its checkpoint names to these, and the model, the loader, the saver
//! and the parameter count all iterate the same list, so they cannot disagree. Linear weights have the PyTorch
//! shape `[out, in]` here, whatever the layout inside a checkpoint or a burn module.

use serde::Serialize;

use crate::spec::{MlpKind, ModelSpec, NormKind, Positions};

/// What a parameter is, which decides its initialisation and its layout conversions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum TensorRole {
    /// A lookup table `[rows, hidden]` (tokens or learned positions).
    Embedding,
    /// A linear weight `[out, in]`.
    LinearWeight,
    /// A linear bias `[out]`.
    Bias,
    /// A norm's scale `[dim]` (initialised to one).
    NormWeight,
    /// A norm's shift `[dim]` (initialised to zero).
    NormBias,
}

/// One parameter tensor: canonical name, canonical shape and role.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TensorSpec {
    /// Canonical name, e.g. `layers.3.attn.q.weight`.
    pub name: String,
    /// Canonical shape (`[out, in]` for linear weights).
    pub shape: Vec<usize>,
    /// What the tensor is.
    pub role: TensorRole,
}

impl TensorSpec {
    fn new(name: impl Into<String>, shape: Vec<usize>, role: TensorRole) -> Self {
        TensorSpec {
            name: name.into(),
            shape,
            role,
        }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Canonical name of the token embedding `[vocab, hidden]`.
pub const EMBED: &str = "embed.weight";
/// Canonical name of the learned position table `[context, hidden]`.
pub const POS_EMBED: &str = "pos_embed.weight";
/// Canonical name of the untied LM head `[vocab, hidden]`.
pub const LM_HEAD: &str = "lm_head.weight";
/// Canonical prefix of the final norm (`final_norm.weight`, `final_norm.bias`).
pub const FINAL_NORM: &str = "final_norm";

/// Canonical name of a parameter of block `layer`, e.g. `layer_name(2, "attn.q.weight")`.
pub fn layer_name(layer: usize, suffix: &str) -> String {
    format!("layers.{layer}.{suffix}")
}

/// The shape of one module of a block, as [`block_modules`] lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModuleShape {
    /// A norm over `dim` features (with a bias for LayerNorm with bias).
    Norm {
        /// Features normalised.
        dim: usize,
    },
    /// A projection `[outputs, inputs]`, with a bias `[outputs]` when `bias`.
    Linear {
        /// Input features.
        inputs: usize,
        /// Output features.
        outputs: usize,
        /// Whether it has a bias.
        bias: bool,
    },
}

/// Every module of one block of `spec` under its canonical suffix, in canonical order: the spec's side of
/// [`crate::nn::Block::modules`], from which [`ModelSpec::tensors`] (and so loading, saving and the parameter
/// count) follows.
pub fn block_modules(spec: &ModelSpec) -> Vec<(&'static str, ModuleShape)> {
    let (h, q, kv, ff) = (
        spec.hidden_size,
        spec.q_dim(),
        spec.kv_dim(),
        spec.intermediate_size,
    );
    let b = spec.features.biases;
    let linear = |inputs, outputs, bias| ModuleShape::Linear {
        inputs,
        outputs,
        bias,
    };
    let norm = |dim| ModuleShape::Norm { dim };
    let mut modules = vec![
        ("attn_norm", norm(h)),
        ("attn.q", linear(h, q, b.qkv)),
        ("attn.k", linear(h, kv, b.qkv)),
        ("attn.v", linear(h, kv, b.qkv)),
    ];
    if spec.features.qk_norm {
        modules.push(("attn.q_norm", norm(spec.head_dim)));
        modules.push(("attn.k_norm", norm(spec.head_dim)));
    }
    modules.push(("attn.o", linear(q, h, b.attn_out)));
    if spec.features.post_norms {
        modules.push(("attn_post_norm", norm(h)));
    }
    modules.push(("mlp_norm", norm(h)));
    if spec.features.mlp == MlpKind::Gated {
        modules.push(("mlp.gate", linear(h, ff, b.mlp_in)));
    }
    modules.push(("mlp.up", linear(h, ff, b.mlp_in)));
    modules.push(("mlp.down", linear(ff, h, b.mlp_out)));
    if spec.features.post_norms {
        modules.push(("mlp_post_norm", norm(h)));
    }
    modules
}

fn push_module(out: &mut Vec<TensorSpec>, spec: &ModelSpec, prefix: &str, shape: ModuleShape) {
    let tensor = |suffix: &str, shape: Vec<usize>, role| {
        TensorSpec::new(format!("{prefix}.{suffix}"), shape, role)
    };
    match shape {
        ModuleShape::Norm { dim } => {
            out.push(tensor("weight", vec![dim], TensorRole::NormWeight));
            if spec.features.norm.bias && spec.features.norm.kind == NormKind::LayerNorm {
                out.push(tensor("bias", vec![dim], TensorRole::NormBias));
            }
        }
        ModuleShape::Linear {
            inputs,
            outputs,
            bias,
        } => {
            out.push(tensor(
                "weight",
                vec![outputs, inputs],
                TensorRole::LinearWeight,
            ));
            if bias {
                out.push(tensor("bias", vec![outputs], TensorRole::Bias));
            }
        }
    }
}

/// Every parameter of a model with this spec (see [`ModelSpec::tensors`]).
pub(crate) fn expected_tensors(spec: &ModelSpec) -> Vec<TensorSpec> {
    let h = spec.hidden_size;
    let mut out = vec![TensorSpec::new(
        EMBED,
        vec![spec.vocab_size, h],
        TensorRole::Embedding,
    )];
    if matches!(spec.positions, Positions::Learned) {
        out.push(TensorSpec::new(
            POS_EMBED,
            vec![spec.context_length, h],
            TensorRole::Embedding,
        ));
    }
    let modules = block_modules(spec);
    for layer in 0..spec.num_layers {
        for &(suffix, shape) in &modules {
            push_module(&mut out, spec, &layer_name(layer, suffix), shape);
        }
    }
    push_module(&mut out, spec, FINAL_NORM, ModuleShape::Norm { dim: h });
    if !spec.features.tied_embeddings {
        out.push(TensorSpec::new(
            LM_HEAD,
            vec![spec.vocab_size, h],
            TensorRole::LinearWeight,
        ));
    }
    out
}

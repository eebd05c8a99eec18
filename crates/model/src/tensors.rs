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

/// The `(suffix, in, out, has_bias)` of every linear layer of one block, in canonical order.
pub fn block_linears(spec: &ModelSpec) -> Vec<(&'static str, usize, usize, bool)> {
    let (h, q, kv, ff) = (
        spec.hidden_size,
        spec.q_dim(),
        spec.kv_dim(),
        spec.intermediate_size,
    );
    let b = spec.biases;
    let mut linears = vec![
        ("attn.q", h, q, b.qkv),
        ("attn.k", h, kv, b.qkv),
        ("attn.v", h, kv, b.qkv),
        ("attn.o", q, h, b.attn_out),
    ];
    if spec.mlp == MlpKind::Gated {
        linears.push(("mlp.gate", h, ff, b.mlp_in));
    }
    linears.push(("mlp.up", h, ff, b.mlp_in));
    linears.push(("mlp.down", ff, h, b.mlp_out));
    linears
}

fn push_norm(out: &mut Vec<TensorSpec>, spec: &ModelSpec, prefix: &str, dim: usize) {
    out.push(TensorSpec::new(
        format!("{prefix}.weight"),
        vec![dim],
        TensorRole::NormWeight,
    ));
    if spec.norm.bias && spec.norm.kind == NormKind::LayerNorm {
        out.push(TensorSpec::new(
            format!("{prefix}.bias"),
            vec![dim],
            TensorRole::NormBias,
        ));
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
    for layer in 0..spec.num_layers {
        let linear =
            |out: &mut Vec<TensorSpec>, (suffix, d_in, d_out, bias): (&str, usize, usize, bool)| {
                let name = layer_name(layer, suffix);
                out.push(TensorSpec::new(
                    format!("{name}.weight"),
                    vec![d_out, d_in],
                    TensorRole::LinearWeight,
                ));
                if bias {
                    out.push(TensorSpec::new(
                        format!("{name}.bias"),
                        vec![d_out],
                        TensorRole::Bias,
                    ));
                }
            };
        let linears = block_linears(spec);
        push_norm(&mut out, spec, &layer_name(layer, "attn_norm"), h);
        for &l in &linears[..3] {
            linear(&mut out, l);
        }
        if spec.qk_norm {
            push_norm(
                &mut out,
                spec,
                &layer_name(layer, "attn.q_norm"),
                spec.head_dim,
            );
            push_norm(
                &mut out,
                spec,
                &layer_name(layer, "attn.k_norm"),
                spec.head_dim,
            );
        }
        linear(&mut out, linears[3]);
        push_norm(&mut out, spec, &layer_name(layer, "mlp_norm"), h);
        for &l in &linears[4..] {
            linear(&mut out, l);
        }
    }
    push_norm(&mut out, spec, FINAL_NORM, h);
    if !spec.tied_embeddings {
        out.push(TensorSpec::new(
            LM_HEAD,
            vec![spec.vocab_size, h],
            TensorRole::LinearWeight,
        ));
    }
    out
}

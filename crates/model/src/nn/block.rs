//! One transformer block: pre-norm attention and MLP (each optionally post-normed too, Gemma's sandwich),
//! combined sequentially or in parallel.

use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use ember_attention::{EmberBackend, KvCache};

use super::attention::CallPositions;
use super::{Linear, Mlp, Norm, SelfAttention};
use crate::error::Result;
use crate::spec::Residual;

/// A decoder block.
#[derive(Module, Debug)]
pub struct Block<B: Backend> {
    /// Norm before attention.
    pub attn_norm: Norm<B>,
    /// Self-attention.
    pub attn: SelfAttention<B>,
    /// Norm of the attention output before the residual add (Gemma 2/3 `post_attention_layernorm`).
    pub attn_post_norm: Option<Norm<B>>,
    /// Norm before the MLP.
    pub mlp_norm: Norm<B>,
    /// Feed-forward.
    pub mlp: Mlp<B>,
    /// Norm of the MLP output before the residual add (Gemma 2/3 `post_feedforward_layernorm`).
    pub mlp_post_norm: Option<Norm<B>>,
    /// Sequential or parallel residual.
    #[module(skip)]
    pub residual: Residual,
    /// Sliding window of this layer (`None`: full causal attention).
    #[module(skip)]
    pub window: Option<usize>,
}

impl<B: EmberBackend> Block<B> {
    /// `x` `[batch, seq, hidden]` to `[batch, seq, hidden]`.
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        layer: usize,
        scale: Option<f64>,
        at: &CallPositions<'_, B>,
        cache: Option<&mut (dyn KvCache<B> + '_)>,
    ) -> Result<Tensor<B, 3>> {
        let attn = self.attn.forward(
            self.attn_norm.forward(x.clone()),
            layer,
            self.window,
            scale,
            at,
            cache,
        )?;
        let post = |norm: &Option<Norm<B>>, y: Tensor<B, 3>| match norm {
            Some(norm) => norm.forward(y),
            None => y,
        };
        let attn = post(&self.attn_post_norm, attn);
        Ok(match self.residual {
            Residual::Sequential => {
                let h = x + attn;
                let mlp = self.mlp.forward(self.mlp_norm.forward(h.clone()));
                h + post(&self.mlp_post_norm, mlp)
            }
            Residual::Parallel => {
                let mlp = self.mlp.forward(self.mlp_norm.forward(x.clone()));
                x + attn + post(&self.mlp_post_norm, mlp)
            }
        })
    }
}

/// One module of a block, as [`Block::modules`] lists it.
#[derive(Clone, Copy, Debug)]
pub enum BlockModule<'a, B: Backend> {
    /// A LayerNorm or RMSNorm.
    Norm(&'a Norm<B>),
    /// A projection.
    Linear(&'a Linear<B>),
}

impl<B: Backend> Block<B> {
    /// Every module of the block under its canonical suffix (`attn_norm`, `attn.q`, ..., a canonical tensor name
    /// without `layers.{i}.` and `.weight`), in canonical order. Parameter lookup, saving, quantization and weight
    /// memory all read this one list; it equals the spec's [`crate::tensors::block_modules`] (tested).
    pub fn modules(&self) -> Vec<(&'static str, BlockModule<'_, B>)> {
        use BlockModule::{Linear, Norm};
        let (attn, mlp) = (&self.attn, &self.mlp);
        let mut out = vec![
            ("attn_norm", Norm(&self.attn_norm)),
            ("attn.q", Linear(&attn.q)),
            ("attn.k", Linear(&attn.k)),
            ("attn.v", Linear(&attn.v)),
        ];
        out.extend(attn.q_norm.as_ref().map(|n| ("attn.q_norm", Norm(n))));
        out.extend(attn.k_norm.as_ref().map(|n| ("attn.k_norm", Norm(n))));
        out.push(("attn.o", Linear(&attn.o)));
        out.extend(
            self.attn_post_norm
                .as_ref()
                .map(|n| ("attn_post_norm", Norm(n))),
        );
        out.push(("mlp_norm", Norm(&self.mlp_norm)));
        out.extend(mlp.gate.as_ref().map(|l| ("mlp.gate", Linear(l))));
        out.push(("mlp.up", Linear(&mlp.up)));
        out.push(("mlp.down", Linear(&mlp.down)));
        out.extend(
            self.mlp_post_norm
                .as_ref()
                .map(|n| ("mlp_post_norm", Norm(n))),
        );
        out
    }

    /// The module under canonical suffix `suffix` (see [`Block::modules`]).
    pub fn module(&self, suffix: &str) -> Option<BlockModule<'_, B>> {
        self.modules()
            .into_iter()
            .find_map(|(name, module)| (name == suffix).then_some(module))
    }

    /// The projections under their canonical suffixes, mutable (quantization, adapters), in the order of
    /// [`Block::modules`].
    pub fn linears_mut(&mut self) -> Vec<(&'static str, &mut Linear<B>)> {
        let (attn, mlp) = (&mut self.attn, &mut self.mlp);
        let mut out: Vec<(&'static str, &mut Linear<B>)> = vec![
            ("attn.q", &mut attn.q),
            ("attn.k", &mut attn.k),
            ("attn.v", &mut attn.v),
            ("attn.o", &mut attn.o),
        ];
        if let Some(gate) = mlp.gate.as_mut() {
            out.push(("mlp.gate", gate));
        }
        out.push(("mlp.up", &mut mlp.up));
        out.push(("mlp.down", &mut mlp.down));
        out
    }

    /// Bytes the block's weights occupy on the device (f32, or quantized codes plus scales).
    pub fn memory_bytes(&self) -> usize {
        self.modules()
            .into_iter()
            .map(|(_, module)| match module {
                BlockModule::Norm(norm) => norm.memory_bytes(),
                BlockModule::Linear(linear) => linear.memory_bytes(),
            })
            .sum()
    }
}

//! One transformer block: pre-norm attention and MLP, combined sequentially or in parallel.

use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use ember_attention::{AttentionBackend, KvCache};

use super::attention::Positions;
use super::{Mlp, Norm, SelfAttention};
use crate::error::Result;
use crate::spec::Residual;

/// A decoder block.
#[derive(Module, Debug)]
pub struct Block<B: Backend> {
    /// Norm before attention.
    pub attn_norm: Norm<B>,
    /// Self-attention.
    pub attn: SelfAttention<B>,
    /// Norm before the MLP.
    pub mlp_norm: Norm<B>,
    /// Feed-forward.
    pub mlp: Mlp<B>,
    /// Sequential or parallel residual.
    #[module(skip)]
    pub residual: Residual,
    /// Sliding window of this layer (`None`: full causal attention).
    #[module(skip)]
    pub window: Option<usize>,
}

impl<B: AttentionBackend> Block<B> {
    /// `x` `[batch, seq, hidden]` to `[batch, seq, hidden]`.
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        layer: usize,
        scale: Option<f64>,
        at: &Positions<'_, B>,
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
        Ok(match self.residual {
            Residual::Sequential => {
                let h = x + attn;
                h.clone() + self.mlp.forward(self.mlp_norm.forward(h))
            }
            Residual::Parallel => {
                let mlp = self.mlp.forward(self.mlp_norm.forward(x.clone()));
                x + attn + mlp
            }
        })
    }
}

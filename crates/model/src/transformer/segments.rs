//! The forward pass cut at block boundaries, for activation checkpointing: a trainer runs the whole pass once
//! without recording it, keeping only each block's input, then re-runs one block at a time while recording, so at
//! most one block's activations are alive during the backward pass.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};
use ember_attention::{EmberBackend, Rope};

use super::Transformer;
use crate::error::Result;
use crate::nn::attention::CallPositions;

/// [`Transformer::forward`] as separate pieces on whole sequences from position 0 (no cache, no padding):
/// `head(block(n - 1, ... block(0, embed(tokens))))` is the forward pass's logits, computed by the same calls.
pub struct Segments<'m, B: EmberBackend> {
    model: &'m Transformer<B>,
    rope: Option<Rope<B>>,
    local_rope: Option<Rope<B>>,
}

impl<B: EmberBackend> Transformer<B> {
    /// The forward pass in pieces on `device` (the rotary tables are fetched once for all of them).
    pub fn segments(&self, device: &B::Device) -> Result<Segments<'_, B>> {
        let (rope, local_rope) = self.ropes(device)?;
        Ok(Segments {
            model: self,
            rope,
            local_rope,
        })
    }
}

impl<B: EmberBackend> Segments<'_, B> {
    /// Number of blocks.
    pub fn blocks(&self) -> usize {
        self.model.layers.len()
    }

    /// The first block's input `[batch, seq, hidden]`: embeddings (scaled, with learned positions) in the compute
    /// dtype.
    pub fn embed(&self, tokens: Tensor<B, 2, Int>) -> Result<Tensor<B, 3>> {
        self.model.embed_tokens(tokens, None, 0)
    }

    /// Whether [`embed`](Self::embed)'s output depends on a parameter that requires a gradient (the token or
    /// position tables train).
    pub fn embeds_trainably(&self) -> bool {
        struct AnyTrainable(bool);
        impl<B: Backend> ModuleVisitor<B> for AnyTrainable {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                self.0 |= param.val().is_require_grad();
            }
        }
        let mut any = AnyTrainable(false);
        self.model.embed.visit(&mut any);
        self.model.pos_embed.visit(&mut any);
        any.0
    }

    /// Block `layer` applied to its input `x` `[batch, seq, hidden]`.
    pub fn block(&self, layer: usize, x: Tensor<B, 3>) -> Result<Tensor<B, 3>> {
        let at = CallPositions {
            rope: self.rope.as_ref(),
            local_rope: self.local_rope.as_ref(),
            offset: 0,
            explicit: None,
            key_padding: None,
            kernel: self.model.kernel,
        };
        self.model.layers[layer].forward(
            x,
            layer,
            self.model.spec.features.attention_scale,
            &at,
            None,
        )
    }

    /// Logits `[batch, seq, vocab]` (f32) of the last block's output: final norm, then the LM head.
    pub fn head(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        self.model.head(self.model.final_norm.forward(x))
    }
}

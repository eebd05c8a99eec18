//! The feed-forward sublayer: plain (`down(act(up x))`) or gated (`down(act(gate x) * up x)`).

use burn::module::Module;
use burn::tensor::{Tensor, activation, backend::Backend};
use ember_attention::{EmberBackend, swiglu};

use super::Linear;
use crate::spec::Activation;

/// The MLP of one block.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    /// `[intermediate, hidden]`, present for gated MLPs.
    pub gate: Option<Linear<B>>,
    /// `[intermediate, hidden]`.
    pub up: Linear<B>,
    /// `[hidden, intermediate]`.
    pub down: Linear<B>,
    /// The non-linearity.
    #[module(skip)]
    pub activation: Activation,
}

/// Applies `act` element-wise.
pub fn activate<B: Backend, const D: usize>(act: Activation, x: Tensor<B, D>) -> Tensor<B, D> {
    match act {
        Activation::Gelu => activation::gelu(x),
        Activation::GeluTanh => activation::gelu_approximate(x),
        Activation::Silu => activation::silu(x),
        Activation::Relu => activation::relu(x),
    }
}

impl<B: EmberBackend> Mlp<B> {
    /// `x` `[batch, seq, hidden]` to `[batch, seq, hidden]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let hidden = match &self.gate {
            // SwiGLU (LLaMA, Mistral, Qwen, Phi-3): one backend kernel instead of sigmoid, two multiplies and
            // their graph nodes.
            Some(gate) if self.activation == Activation::Silu => {
                let [gate, up] = Linear::forward_many([gate, &self.up], x);
                swiglu(gate, up)
            }
            Some(gate) => activate(self.activation, gate.forward(x.clone())) * self.up.forward(x),
            None => activate(self.activation, self.up.forward(x)),
        };
        self.down.forward(hidden)
    }
}

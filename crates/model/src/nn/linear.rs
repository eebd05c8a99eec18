//! A linear layer in PyTorch's weight layout, so checkpoints load and save without transposing.

use burn::module::{Module, Param};
use burn::tensor::{Tensor, backend::Backend, module::linear};

/// `y = x · Wᵀ + b` with `W` `[out, in]`.
#[derive(Module, Debug)]
pub struct Linear<B: Backend> {
    /// `[out, in]`.
    pub weight: Param<Tensor<B, 2>>,
    /// `[out]`.
    pub bias: Option<Param<Tensor<B, 1>>>,
}

impl<B: Backend> Linear<B> {
    /// Applies the layer to `x` `[..., in]`, giving `[..., out]`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        linear(
            x,
            self.weight.val().transpose(),
            self.bias.as_ref().map(Param::val),
        )
    }
}

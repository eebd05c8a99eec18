//! The building blocks of [`crate::Transformer`], each reading only its part of the [`crate::ModelSpec`].

pub(crate) mod attention;
mod block;
mod embedding;
mod linear;
mod lora;
mod mlp;
mod norm;

pub use attention::SelfAttention;
pub use block::{Block, BlockModule};
pub use embedding::Embedding;
pub use linear::{DenseLinear, Linear};
pub use lora::LoraAdapter;
pub use mlp::Mlp;
pub use norm::Norm;

use burn::tensor::{DType, Tensor, backend::Backend};

/// `t` in `dtype`; no operation when it already is (a cast is a copy, and an extra autodiff node).
pub(crate) fn in_dtype<B: Backend, const D: usize>(t: Tensor<B, D>, dtype: DType) -> Tensor<B, D> {
    if t.dtype() == dtype { t } else { t.cast(dtype) }
}

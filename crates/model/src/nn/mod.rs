//! The building blocks of [`crate::Transformer`], each reading only its part of the [`crate::ModelSpec`].

pub(crate) mod attention;
mod block;
mod embedding;
mod linear;
mod mlp;
mod norm;

pub use attention::SelfAttention;
pub use block::Block;
pub use embedding::Embedding;
pub use linear::{DenseLinear, Linear};
pub use mlp::Mlp;
pub use norm::Norm;

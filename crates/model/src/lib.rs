//! ember model: decoder-only transformers described by a `ModelSpec`, built from Hugging Face configs, loading
//! safetensors and GGUF weights.

pub mod arch;
pub mod error;
pub mod gguf;
mod load;
pub mod lora;
pub mod nn;
mod quantize;
mod quantized_io;
mod save;
pub mod spec;
pub mod tensors;
mod transformer;
pub mod weights;

pub use ember_attention::{
    AttentionKernel, EmberBackend, GgmlProducts, RopeConfig, RopeLayout, RopeScaling,
};
pub use ember_optimization::QuantScheme;
pub use error::{ModelError, Result};
pub use load::{Loaded, ModelDir, load};
pub use quantize::{Quantization, head_scheme};
pub use quantized_io::{QUANTIZED_FILE, save_quantized};
pub use save::save;
pub use spec::{
    Activation, Biases, Features, MlpKind, ModelSpec, NormKind, NormSpec, Positions, Residual,
};
pub use transformer::{Segments, Step, Transformer};

//! Weight quantization: schemes, host-side quantized matrices, GGUF block import (mapped onto ember's
//! groups, or kept as ggml blocks: [`ggml_weight`], [`ggml_linear`]), the on-device
//! [`QuantizedLinear`](linear::QuantizedLinear) and safetensors checkpoints.

pub mod checkpoint;
pub mod ggml_linear;
pub mod ggml_weight;
pub mod gguf;
pub mod header;
pub mod linear;
pub mod scheme;
pub mod weight;

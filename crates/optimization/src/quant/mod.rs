//! Weight quantization: schemes, host-side quantized matrices, GGUF block import, the on-device
//! [`QuantizedLinear`](linear::QuantizedLinear) and safetensors checkpoints.

pub mod checkpoint;
pub mod gguf;
pub mod header;
pub mod linear;
pub mod scheme;
pub mod weight;

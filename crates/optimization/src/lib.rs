//! ember optimization: making models smaller and serving leaner.
//!
//! - **Weight quantization** ([`quant`]): INT8 per-output-channel (or group-wise) symmetric and INT4
//!   group-wise symmetric/asymmetric schemes written from scratch, a [`QuantizedLinear`] that keeps
//!   codes packed on the device and dequantizes tiles on the fly, GGUF Q8_0/Q4_0/Q4_1 import
//!   without an f32 round trip, and safetensors checkpoints ([`QuantizedCheckpoint`]).
//! - **Paged KV cache** ([`paged`]): a [`PagedKvPool`] of fixed-size K/V blocks with block tables,
//!   copy-on-write prefix sharing ([`PagedKvPool::fork`]) and a hard budget, exposed to models as
//!   the attention crate's `KvCache` through [`PagedKvCache`].

pub mod error;
pub mod paged;
pub mod quant;

pub use error::{PoolError, QuantError};
pub use paged::blocks::{BlockManager, PoolStats, SeqId};
pub use paged::cache::PagedKvCache;
pub use paged::pool::{GatheredKv, PagedKvConfig, PagedKvPool};
pub use quant::checkpoint::{DenseTensor, QuantizedCheckpoint};
pub use quant::ggml_linear::GgmlLinear;
pub use quant::ggml_weight::{GgmlWeight, PackedWeight};
pub use quant::linear::QuantizedLinear;
pub use quant::scheme::{Granularity, QuantScheme};
pub use quant::weight::QuantizedWeight;

//! ember's kernel layer: grouped-query attention behind three interchangeable kernels, rotary position
//! embeddings and a KV cache, and the one backend trait, [`EmberBackend`], through which every ember kernel runs
//! (attention and the dense, norm, SwiGLU, loss and quantized kernels the model is built from). Everything is
//! generic over a burn backend.
//!
//! # API
//! - [`attention`]`(kernel, q, k, v, &options)`: q `[batch, q_heads, q_len, head_dim]`, k/v
//!   `[batch, kv_heads, kv_len, head_dim]` (`q_heads` a multiple of `kv_heads`) -> `[batch, q_heads, q_len,
//!   head_dim]`. [`AttentionOptions`] carries the causal flag, query offset (cached positions), sliding window,
//!   key padding mask `[batch, kv_len]` (`true` = padding), softmax scale and an optional soft cap of the scores.
//! - [`AttentionKernel`]: `manual` (reference, O(T²) memory), `fused` (burn's op), `flash` (tiled online
//!   softmax with its own recomputing backward, O(T) memory). Parses from and displays as those names.
//! - [`EmberBackend`]: the one backend bound of every model, training and inference function, holding all of
//!   ember's kernels: flash attention and RoPE's rotation, and the linear layer, RMSNorm, SwiGLU's gate, the
//!   cross-entropy loss and quantized products ([`linear`], [`rms_norm`], [`swiglu`], [`cross_entropy`]).
//!   Implemented for `Flex` (always; native one-pass kernels in `src/cpu/`), `NdArray`, `Wgpu`, `Cuda` (crate
//!   features of the same names) and `Autodiff<B>`.
//! - [`Rope`] / [`RopeConfig`]: rotate-half or interleaved layout, partial rotary dimension, theta, and
//!   linear / LLaMA 3 / dynamic NTK scaling, with cos/sin tables cached on the device.
//! - [`KvCache`] and [`ContiguousKvCache`]: per-layer append returning everything cached so far.
//!
//! # Example
//! ```
//! use burn::backend::Flex;
//! use burn::tensor::{Distribution, Tensor};
//! use ember_attention::{
//!     AttentionKernel, AttentionOptions, ContiguousKvCache, KvCache, Rope, RopeConfig, attention,
//! };
//!
//! let device = Default::default();
//! let (batch, q_heads, kv_heads, seq, head_dim) = (1, 4, 2, 5, 16);
//! let rope = Rope::<Flex>::new(RopeConfig::new(head_dim), 128, &device).unwrap();
//! let mut cache = ContiguousKvCache::<Flex>::new(1);
//!
//! let q = Tensor::<Flex, 4>::random([batch, q_heads, seq, head_dim], Distribution::Default, &device);
//! let k = Tensor::<Flex, 4>::random([batch, kv_heads, seq, head_dim], Distribution::Default, &device);
//! let v = Tensor::<Flex, 4>::random([batch, kv_heads, seq, head_dim], Distribution::Default, &device);
//!
//! let offset = cache.len();
//! let (q, k) = (rope.apply(q, offset), rope.apply(k, offset));
//! let (k, v) = cache.append(0, k, v).unwrap();
//! let options = AttentionOptions::causal().with_offset(offset);
//! let out = attention("flash".parse::<AttentionKernel>().unwrap(), q, k, v, &options);
//! assert_eq!(out.dims(), [batch, q_heads, seq, head_dim]);
//! ```

mod autodiff;
mod backend;
mod cpu;
#[cfg(feature = "cube")]
mod cube;
mod error;
mod flash;
mod fused;
mod kernel;
mod kv_cache;
mod manual;
mod mask;
mod ops;
mod options;
mod paged;
mod portable;
mod products;
mod rope;

pub use backend::EmberBackend;
pub use cpu::{kernel_threads, with_kernel_threads};
pub use error::AttentionError;
pub use flash::{FlashBlocks, FlashConfig, flash_backward, flash_forward};
pub use kernel::{AttentionKernel, attention, check_shapes, flash_attention};
pub use kv_cache::{Appended, ContiguousKvCache, KvCache};
pub use ops::{
    CodeLayout, IGNORE_TARGET, cross_entropy, linear, rms_norm, select_rows, swiglu, write_block,
    write_rows,
};
pub use options::{AttentionOptions, MaskSpec};
pub use paged::{PagedConfig, PagedRows, paged_attention};
pub use products::GgmlProducts;
pub use rope::{Rope, RopeCache, RopeConfig, RopeLayout, RopeScaling};

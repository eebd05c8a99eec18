//! The native kernels against the portable tensor-op versions they replace, on both sides of the parallel
//! threshold: the shared helpers here, the element-wise kernels (SwiGLU, RoPE, cross-entropy, RMSNorm) and the
//! products (dense, flash attention, the thread limit) in the submodules.

use burn::backend::{Autodiff, Flex};
use burn::tensor::{Tensor, TensorData, TensorPrimitive, backend::Backend};

use crate::portable::portable_rope_rotate;
use crate::portable::{portable_swiglu, portable_swiglu_backward};
use crate::{EmberBackend, Rope, RopeConfig, RopeLayout, swiglu};

type A = Autodiff<Flex>;

/// Deterministic values in about [-scale, scale].
pub(in crate::cpu) fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

pub(in crate::cpu) fn tensor<B: Backend, const D: usize>(
    shape: [usize; D],
    seed: u64,
    scale: f32,
) -> Tensor<B, D> {
    let n = shape.iter().product();
    Tensor::from_data(
        TensorData::new(values(n, seed, scale), shape),
        &Default::default(),
    )
}

pub(in crate::cpu) fn floats<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec().expect("f32 data")
}

pub(in crate::cpu) fn primitive<B: Backend, const D: usize>(
    t: Tensor<B, D>,
) -> burn::tensor::ops::FloatTensor<B> {
    t.into_primitive().tensor()
}

pub(in crate::cpu) fn from_primitive<B: Backend, const D: usize>(
    t: burn::tensor::ops::FloatTensor<B>,
) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// Largest `|a - b| / (|b| + floor)`.
fn max_rel(a: &[f32], b: &[f32], floor: f32) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / (y.abs() + floor))
        .fold(0.0, f32::max)
}

mod elementwise;
mod products;
mod quantized;

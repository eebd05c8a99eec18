//! The GPU code path, checked against the CPU reference backend. With the `wgpu` feature these run on whatever
//! adapter wgpu finds; on CPU-only machines that is Mesa's software Vulkan driver (lavapipe), installed by
//! `scripts/install_deps.sh`, so every CI run exercises the same kernels a GPU would.
#![cfg(feature = "wgpu")]

use burn::backend::{Autodiff, Flex, Wgpu};
use burn::tensor::{Distribution, Tensor, TensorData, activation, backend::Backend};

fn random<B: Backend, const D: usize>(
    shape: [usize; D],
    seed: u64,
    device: &B::Device,
) -> Tensor<B, D> {
    B::seed(device, seed);
    Tensor::random(shape, Distribution::Normal(0.0, 1.0), device)
}

/// Copies a CPU tensor's values onto the wgpu device, so both backends see identical inputs.
fn to_wgpu<const D: usize>(t: &Tensor<Flex, D>) -> Tensor<Wgpu, D> {
    Tensor::from_data(t.to_data(), &Default::default())
}

fn max_abs_diff(a: TensorData, b: TensorData) -> f32 {
    let a = a.to_vec::<f32>().unwrap();
    let b = b.to_vec::<f32>().unwrap();
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn wgpu_matmul_and_softmax_match_cpu() {
    let cpu = Default::default();
    let a = random::<Flex, 3>([2, 33, 64], 1, &cpu);
    let b = random::<Flex, 3>([2, 64, 47], 2, &cpu);
    let want = activation::softmax(a.clone().matmul(b.clone()), 2);
    let got = activation::softmax(to_wgpu(&a).matmul(to_wgpu(&b)), 2);
    // Both accumulate 64 f32 products, in different orders: differences of a few ulps of values O(10) before
    // softmax, far below 1e-4 after it.
    let diff = max_abs_diff(want.into_data(), got.into_data());
    assert!(diff < 1e-4, "max |cpu - wgpu| = {diff}");
}

#[test]
fn wgpu_gradients_match_cpu() {
    let cpu = Default::default();
    let x = random::<Flex, 2>([16, 32], 3, &cpu);
    let w = random::<Flex, 2>([32, 8], 4, &cpu);

    fn grad_of_w<B: burn::tensor::backend::AutodiffBackend>(
        x: Tensor<B, 2>,
        w: Tensor<B, 2>,
    ) -> TensorData {
        let w = w.require_grad();
        let loss = activation::gelu(x.matmul(w.clone())).powi_scalar(2).mean();
        let grads = loss.backward();
        w.grad(&grads).expect("w requires grad").into_data()
    }

    let want =
        grad_of_w::<Autodiff<Flex>>(Tensor::from_inner(x.clone()), Tensor::from_inner(w.clone()));
    let got = grad_of_w::<Autodiff<Wgpu>>(
        Tensor::from_inner(to_wgpu(&x)),
        Tensor::from_inner(to_wgpu(&w)),
    );
    // Gradients are means over 128 outputs of O(1) terms: f32 reordering error stays below 1e-5.
    let diff = max_abs_diff(want, got);
    assert!(diff < 1e-5, "max |cpu - wgpu| gradient = {diff}");
}

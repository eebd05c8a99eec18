//! ember's CubeCL flash kernel (the forward of `flash` on wgpu and CUDA) against the float64 oracle of
//! `common::reference`, forward and the gradients of q, k and v (the portable backward recomputes its tiles
//! from the kernel's log-sum-exp, so wrong log-sum-exp values show up in the gradients). The same cases run on
//! each GPU backend compiled in: wgpu on whatever adapter it finds (Mesa's software Vulkan, lavapipe, on CPU-only
//! machines), CUDA on the first NVIDIA GPU (`cargo test -p ember-attention --features cuda`).

#![cfg(any(feature = "wgpu", feature = "cuda"))]

mod common;

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, FloatDType, Tensor};
use common::{Case, assert_close, max_abs_diff, random_inputs, reference, tensor, to_vec};
use ember_attention::{AttentionKernel, EmberBackend, attention};

/// Allowed error `atol + rtol * |expected|`, as (atol, rtol), of outputs and of gradients.
#[derive(Clone, Copy)]
struct Tolerance {
    output: (f64, f64),
    grads: (f64, f64),
}

/// f32 on wgpu. Vulkan lets `exp`/`log` be off by 3 + 2|x| ulp (lavapipe measured ~1e-6 relative on exponentials
/// of scores up to ~20), on top of the f32 rounding the cpu kernels see; 1e-4 on outputs in [-2, 2] is still two
/// orders of magnitude below what a wrong mask or key range moves them (~0.1). Gradients add the backward's
/// cancellation (`dP - rowsum(dO ∘ O)`) to that: one more digit.
#[cfg(feature = "wgpu")]
const F32: Tolerance = Tolerance {
    output: (1e-4, 1e-4),
    grads: (1e-3, 1e-3),
};

/// f32 on CUDA. The forward is ember's kernel in plain f32 (6e-7 from the oracle on an H200), but CubeCL runs f32
/// matrix products on tensor cores in TF32 whenever its autotune picks such a kernel (inputs rounded to 10-bit
/// mantissas, a relative step of 2^-10), and the portable backward is made of such products: dq measured 2.8e-3
/// from the oracle at head_dim 32. Sums over head_dim 128 about double that; 1e-2 keeps a margin and is still an
/// order of magnitude below what a wrong mask or key range moves them.
#[cfg(feature = "cuda")]
const F32_TF32_MATMULS: Tolerance = Tolerance {
    output: (1e-4, 1e-4),
    grads: (1e-2, 1e-2),
};

/// Half precision: rounding q and k moves the scaled scores, the kernel rounds its output, and the portable
/// backward stores every intermediate (probabilities, their gradients, partial sums) in the same type. Measured
/// largest errors against the f64 oracle on these cases: f16 6.6e-3 on the cpu (flex) and 1.6e-2 on lavapipe,
/// whose f16 arithmetic is coarser; bf16 (3 fewer significant bits: 8x the rounding) 4.0e-2 on the cpu. A half
/// buffer read as f32 (or the reverse) gives garbage or NaN, far outside these; the masks and key ranges are
/// checked to f32 precision by the f32 cases on the same generic kernel.
fn half(dtype: FloatDType) -> Tolerance {
    let bound = match dtype {
        FloatDType::BF16 => (1.5e-1, 5e-2),
        _ => (5e-2, 2e-2),
    };
    Tolerance {
        output: bound,
        grads: bound,
    }
}

/// Runs `case` on `B` with q, k, v and the output gradient in `dtype` and checks the output and the gradients
/// of q, k and v, printing the largest error of each (`--nocapture`) to show how tight the tolerance is.
fn check_as<B: AutodiffBackend + EmberBackend>(
    case: Case,
    seed: u64,
    dtype: FloatDType,
    tol: Tolerance,
) {
    let x = random_inputs(&case, seed);
    let expected = reference(&case, &x);
    let device = Default::default();
    let input =
        |values: &[f64], shape| -> Tensor<B, 4> { tensor::<B>(values, shape, &device).cast(dtype) };
    let q = input(&x.q, case.q_shape()).require_grad();
    let k = input(&x.k, case.kv_shape()).require_grad();
    let v = input(&x.v, case.kv_shape()).require_grad();
    let out = attention(
        AttentionKernel::Flash,
        q.clone(),
        k.clone(),
        v.clone(),
        &case.options::<B>(&device),
    );
    assert_eq!(
        out.dtype(),
        DType::from(dtype),
        "the output keeps the inputs' dtype"
    );
    let grad_out = input(&x.grad_out, case.q_shape());
    let grads = out.clone().mul(grad_out).sum().backward();
    let what = |t: &str| format!("cube flash {t} in {dtype:?} on {case:?}");
    let checked = |name: &str, got: Vec<f64>, want: &[f64], (atol, rtol): (f64, f64)| {
        eprintln!(
            "{}: max |error| {:.2e}",
            what(name),
            max_abs_diff(&got, want)
        );
        assert_close(&what(name), &got, want, atol, rtol);
    };
    checked("output", to_vec(out), &expected.out, tol.output);
    for (name, got, want) in [
        ("dq", q.grad(&grads), &expected.dq),
        ("dk", k.grad(&grads), &expected.dk),
        ("dv", v.grad(&grads), &expected.dv),
    ] {
        checked(name, to_vec(got.expect("gradient")), want, tol.grads);
    }
}

/// Batch 2, so padding and per-row masks differ between rows.
fn case(q_heads: usize, kv_heads: usize, head_dim: usize, q_len: usize, kv_len: usize) -> Case {
    Case::new(2, q_heads, kv_heads, head_dim, q_len, kv_len)
}

/// The cases on backend `$backend`: f32 within tolerance `$f32`, and each of the `$half` float types the device
/// supports.
macro_rules! flash_kernel_cases {
    ($module:ident, $backend:ty, $f32:expr, [$($half:expr),*]) => {
        mod $module {
            use super::*;

            type B = burn::backend::Autodiff<$backend>;

            fn check(case: Case, seed: u64) {
                check_as::<B>(case, seed, FloatDType::F32, $f32);
            }

            #[test]
            fn cube_flash_matches_oracle_causal_multi_head_d32() {
                check(
                    Case {
                        causal: true,
                        ..case(4, 4, 32, 37, 37)
                    },
                    1,
                );
            }

            #[test]
            fn cube_flash_matches_oracle_with_gqa_window_and_offset_d64_d80() {
                check(
                    Case {
                        causal: true,
                        window: Some(9),
                        ..case(6, 2, 64, 21, 21)
                    },
                    2,
                );
                // Decoding with a cache: 3 new queries after 30 cached positions, multi-query attention.
                check(
                    Case {
                        causal: true,
                        offset: 30,
                        ..case(4, 1, 80, 3, 33)
                    },
                    3,
                );
            }

            #[test]
            fn cube_flash_matches_oracle_with_padding_d128_and_fully_hidden_rows() {
                check(
                    Case {
                        left_pad: vec![5, 0],
                        ..case(2, 2, 128, 19, 19)
                    },
                    4,
                );
                // Causal + left padding: the first 4 query rows of batch row 0 see no key at all and must give 0.
                check(
                    Case {
                        causal: true,
                        left_pad: vec![4, 1],
                        ..case(4, 2, 32, 11, 11)
                    },
                    5,
                );
            }

            /// The CubeCL kernel has no score cap: a capped call must reach the portable kernel, not drop the cap.
            #[test]
            fn cube_flash_applies_the_soft_cap() {
                check(
                    Case {
                        causal: true,
                        window: Some(9),
                        softcap: Some(1.0),
                        ..case(4, 2, 32, 21, 21)
                    },
                    8,
                );
            }

            /// A kernel instantiated for the backend's f32 whatever its inputs would read half buffers as f32.
            #[test]
            fn cube_flash_matches_oracle_in_half_precision() {
                let device = Default::default();
                for dtype in [$($half),*] {
                    if !<B as Backend>::supports_dtype(&device, DType::from(dtype)) {
                        eprintln!("skipped {dtype:?}: this device does not support it");
                        continue;
                    }
                    check_as::<B>(
                        Case {
                            causal: true,
                            ..case(4, 2, 64, 21, 21)
                        },
                        6,
                        dtype,
                        half(dtype),
                    );
                    // The padding mask is cast to the inputs' type.
                    check_as::<B>(
                        Case {
                            causal: true,
                            left_pad: vec![3, 0],
                            ..case(2, 2, 32, 11, 11)
                        },
                        7,
                        dtype,
                        half(dtype),
                    );
                }
            }
        }
    };
}

// lavapipe has f16 but no working bf16 (a bf16 cast returned garbage there rather than an error).
#[cfg(feature = "wgpu")]
flash_kernel_cases!(wgpu, burn::backend::Wgpu, F32, [FloatDType::F16]);

#[cfg(feature = "cuda")]
flash_kernel_cases!(
    cuda,
    burn::backend::Cuda,
    F32_TF32_MATMULS,
    [FloatDType::F16, FloatDType::BF16]
);

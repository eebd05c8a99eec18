//! ember's CubeCL flash kernel (the forward of `flash` on wgpu and CUDA) against the float64 oracle of
//! `common::reference`, forward and the gradients of q, k and v (the portable backward recomputes its tiles
//! from the kernel's log-sum-exp, so wrong log-sum-exp values show up in the gradients). Runs on whatever adapter
//! wgpu finds: Mesa's software Vulkan (lavapipe) on CPU-only machines.

#![cfg(feature = "wgpu")]

mod common;

use burn::backend::{Autodiff, Wgpu};
use common::{Case, assert_close, random_inputs, reference, tensor, to_vec};
use ember_attention::{AttentionKernel, attention};

type B = Autodiff<Wgpu>;

/// Vulkan lets `exp`/`log` be off by 3 + 2|x| ulp (lavapipe measured ~1e-6 relative on exponentials of scores
/// up to ~20), on top of the f32 rounding the cpu kernels see; 1e-4 on outputs in [-2, 2] is still two orders
/// of magnitude below what a wrong mask or key range moves them (~0.1).
const FORWARD_ATOL: f64 = 1e-4;
const FORWARD_RTOL: f64 = 1e-4;
/// Gradients add the backward's cancellation (`dP - rowsum(dO ∘ O)`) to that: one more digit.
const GRAD_ATOL: f64 = 1e-3;
const GRAD_RTOL: f64 = 1e-3;

fn check(case: Case, seed: u64) {
    let x = random_inputs(&case, seed);
    let expected = reference(&case, &x);
    let device = Default::default();
    let q = tensor::<B>(&x.q, case.q_shape(), &device).require_grad();
    let k = tensor::<B>(&x.k, case.kv_shape(), &device).require_grad();
    let v = tensor::<B>(&x.v, case.kv_shape(), &device).require_grad();
    let out = attention(
        AttentionKernel::Flash,
        q.clone(),
        k.clone(),
        v.clone(),
        &case.options::<B>(&device),
    );
    let grad_out = tensor::<B>(&x.grad_out, case.q_shape(), &device);
    let grads = out.clone().mul(grad_out).sum().backward();
    let what = |t: &str| format!("cube flash {t} on {case:?}");
    assert_close(
        &what("output"),
        &to_vec(out),
        &expected.out,
        FORWARD_ATOL,
        FORWARD_RTOL,
    );
    for (name, got, want) in [
        ("dq", q.grad(&grads), &expected.dq),
        ("dk", k.grad(&grads), &expected.dk),
        ("dv", v.grad(&grads), &expected.dv),
    ] {
        let got = to_vec(got.expect("gradient"));
        assert_close(&what(name), &got, want, GRAD_ATOL, GRAD_RTOL);
    }
}

/// Batch 2, so padding and per-row masks differ between rows.
fn case(q_heads: usize, kv_heads: usize, head_dim: usize, q_len: usize, kv_len: usize) -> Case {
    Case::new(2, q_heads, kv_heads, head_dim, q_len, kv_len)
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

//! All three kernels (and burn's `attention_fallback`) against the float64 oracle of `common::reference`,
//! forward and gradients of q, k, v, over a grid of shapes, masks and tile sizes.

mod common;

use burn::backend::{Autodiff, Flex};
use burn::tensor::{DType, Tensor, TensorData, module, ops::AttentionModuleOptions};
use common::{Case, Inputs, assert_close, random_inputs, reference, tensor, to_vec};
use ember_attention::{
    AttentionError, AttentionKernel, FlashBlocks, FlashConfig, attention, check_shapes,
    flash_attention, flash_backward, flash_forward,
};

type B = Autodiff<Flex>;

/// f32 forward tolerance. Each output is a convex combination of values in [-2, 2] whose weights come from
/// f32 dot products of length <= 128 (relative error ~1e-6 * sqrt(128)) and an f32 softmax; observed
/// errors are ~1e-6, so 2e-5 absolute leaves an order of magnitude of headroom without hiding a wrong
/// mask (which moves outputs by ~0.1).
const FORWARD_ATOL: f64 = 2e-5;
const FORWARD_RTOL: f64 = 1e-5;
/// Gradients sum up to kv_len (or q_len * group) products, each with f32 rounding, and dq/dk involve the
/// difference `dP - rowsum(dO ∘ O)`: cancellation loses ~1 more digit than the forward pass.
const GRAD_ATOL: f64 = 2e-4;
const GRAD_RTOL: f64 = 1e-4;

/// How a candidate computes attention.
#[derive(Clone, Copy, Debug)]
enum Candidate {
    /// Through `attention` on `Autodiff<Flex>` (flash: burn-flex's native kernel, forward and backward).
    Kernel(AttentionKernel),
    /// Through `flash_attention` with explicit tiles (burn-flex runs it natively: tiles do not apply).
    FlashTiles(FlashBlocks),
    /// The portable tensor-op flash kernel (what wgpu's backward, CUDA's backward and ndarray run), forward and
    /// backward called directly on burn-flex.
    PortableFlash(FlashBlocks),
}

/// Output and gradients of the portable flash kernel on the inner backend.
fn run_portable(case: &Case, x: &Inputs, blocks: FlashBlocks) -> [Vec<f64>; 4] {
    let device = Default::default();
    let [q, k, v] = [
        (&x.q, case.q_shape()),
        (&x.k, case.kv_shape()),
        (&x.v, case.kv_shape()),
    ]
    .map(|(values, shape)| tensor::<Flex>(values, shape, &device));
    let options = case.options::<Flex>(&device);
    let config = FlashConfig {
        mask: options.mask,
        scale: options.resolved_scale(case.head_dim),
        softcap: options.softcap,
        blocks,
    };
    let padding = options.key_padding.clone();
    let (out, lse) = flash_forward(q.clone(), k.clone(), v.clone(), padding.clone(), &config);
    let grad_out = tensor::<Flex>(&x.grad_out, case.q_shape(), &device);
    let (dq, dk, dv) = flash_backward(q, k, v, padding, out.clone(), lse, grad_out, &config);
    [to_vec(out), to_vec(dq), to_vec(dk), to_vec(dv)]
}

fn run(case: &Case, x: &Inputs, candidate: Candidate) -> [Vec<f64>; 4] {
    if let Candidate::PortableFlash(blocks) = candidate {
        return run_portable(case, x, blocks);
    }
    let device = Default::default();
    let q = tensor::<B>(&x.q, case.q_shape(), &device).require_grad();
    let k = tensor::<B>(&x.k, case.kv_shape(), &device).require_grad();
    let v = tensor::<B>(&x.v, case.kv_shape(), &device).require_grad();
    let options = case.options::<B>(&device);
    let out = match candidate {
        Candidate::Kernel(kernel) => attention(kernel, q.clone(), k.clone(), v.clone(), &options),
        Candidate::FlashTiles(blocks) => {
            flash_attention(q.clone(), k.clone(), v.clone(), &options, blocks)
        }
        Candidate::PortableFlash(_) => unreachable!("handled above"),
    };
    let grad_out = tensor::<B>(&x.grad_out, case.q_shape(), &device);
    let grads = out.clone().mul(grad_out).sum().backward();
    [
        to_vec(out),
        to_vec(q.grad(&grads).expect("q grad")),
        to_vec(k.grad(&grads).expect("k grad")),
        to_vec(v.grad(&grads).expect("v grad")),
    ]
}

fn check_case(case: &Case, seed: u64) {
    let x = random_inputs(case, seed);
    let expected = reference(case, &x);
    let candidates = [
        Candidate::Kernel(AttentionKernel::Manual),
        Candidate::Kernel(AttentionKernel::Fused),
        Candidate::Kernel(AttentionKernel::Flash),
        Candidate::FlashTiles(FlashBlocks { query: 16, key: 32 }),
        // Tiles that divide nothing, so every tile edge case (partial, fully masked, fully visible) occurs.
        Candidate::PortableFlash(FlashBlocks { query: 7, key: 5 }),
        Candidate::PortableFlash(FlashBlocks { query: 16, key: 32 }),
        Candidate::PortableFlash(FlashBlocks::default()),
    ];
    for candidate in candidates {
        let [out, dq, dk, dv] = run(case, &x, candidate);
        let what = |t: &str| format!("{candidate:?} {t} on {case:?}");
        assert_close(
            &what("output"),
            &out,
            &expected.out,
            FORWARD_ATOL,
            FORWARD_RTOL,
        );
        assert_close(&what("dq"), &dq, &expected.dq, GRAD_ATOL, GRAD_RTOL);
        assert_close(&what("dk"), &dk, &expected.dk, GRAD_ATOL, GRAD_RTOL);
        assert_close(&what("dv"), &dv, &expected.dv, GRAD_ATOL, GRAD_RTOL);
    }
}

fn case(
    batch: usize,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    q_len: usize,
    kv_len: usize,
) -> Case {
    Case::new(batch, q_heads, kv_heads, head_dim, q_len, kv_len)
}

#[test]
fn kernels_match_oracle_causal_multi_head_d32() {
    check_case(
        &Case {
            causal: true,
            ..case(2, 4, 4, 32, 37, 37)
        },
        1,
    );
}

#[test]
fn kernels_match_oracle_with_gqa_and_sliding_window_d64() {
    check_case(
        &Case {
            causal: true,
            window: Some(9),
            ..case(1, 8, 2, 64, 45, 45)
        },
        2,
    );
}

#[test]
fn kernels_match_oracle_with_multi_query_and_offset_d80() {
    // Chunked prefill: 7 new queries after 43 cached positions, all query heads sharing one KV head.
    check_case(
        &Case {
            causal: true,
            offset: 43,
            ..case(2, 4, 1, 80, 7, 50)
        },
        3,
    );
}

#[test]
fn kernels_match_oracle_bidirectional_with_padding_d128() {
    check_case(
        &Case {
            left_pad: vec![3],
            ..case(1, 2, 2, 128, 33, 33)
        },
        4,
    );
}

#[test]
fn kernels_match_oracle_on_left_padded_causal_batch() {
    // Row 2's first 12 queries see only padding: they must output 0 and pass no gradient, not NaN.
    check_case(
        &Case {
            causal: true,
            left_pad: vec![0, 5, 12],
            ..case(3, 6, 3, 32, 29, 29)
        },
        5,
    );
}

#[test]
fn kernels_match_oracle_with_padding_inside_rows() {
    // Padded keys after a row's first real one (any bool mask is allowed), and a row whose every key is padding
    // (leading run and holes together): it outputs 0 and passes no gradient. Decode-like (one query per row),
    // as a server batch attends, and a causal prefill across two query-row blocks of the native kernel.
    let hidden =
        |row: usize, keys: &[usize]| keys.iter().map(move |&j| (row, j)).collect::<Vec<_>>();
    let mut all = hidden(0, &[3, 4, 9]);
    all.extend(hidden(2, &(2..20).collect::<Vec<_>>()));
    check_case(
        &Case {
            causal: true,
            offset: 19,
            left_pad: vec![0, 6, 2],
            hidden: all,
            ..case(3, 4, 2, 32, 1, 20)
        },
        13,
    );
    check_case(
        &Case {
            causal: true,
            left_pad: vec![5, 0],
            hidden: [hidden(0, &[7, 70, 71]), hidden(1, &[0, 64, 65, 90])].concat(),
            ..case(2, 2, 1, 16, 96, 96)
        },
        14,
    );
}

#[test]
fn kernels_match_oracle_decoding_one_token_with_window_and_gqa() {
    check_case(
        &Case {
            causal: true,
            offset: 40,
            window: Some(16),
            ..case(2, 4, 2, 64, 1, 41)
        },
        6,
    );
}

#[test]
fn kernels_match_oracle_with_window_wider_than_sequence_d128() {
    check_case(
        &Case {
            causal: true,
            window: Some(100),
            ..case(1, 4, 2, 128, 70, 70)
        },
        7,
    );
}

#[test]
fn fused_matches_burn_attention_fallback() {
    // burn's unfused reference op on explicitly repeated K/V and an explicit mask is a second, burn-side
    // oracle for the fused kernel (same f32 arithmetic, so the tolerance is the forward one).
    let case = Case {
        causal: true,
        offset: 3,
        window: Some(6),
        left_pad: vec![0, 2],
        ..case(2, 4, 2, 32, 11, 14)
    };
    let x = random_inputs(&case, 8);
    let device = Default::default();
    let q = tensor::<Flex>(&x.q, case.q_shape(), &device);
    let k = tensor::<Flex>(&x.k, case.kv_shape(), &device);
    let v = tensor::<Flex>(&x.v, case.kv_shape(), &device);
    let fused = to_vec(attention(
        AttentionKernel::Fused,
        q.clone(),
        k.clone(),
        v.clone(),
        &case.options::<Flex>(&device),
    ));
    let group = case.q_heads / case.kv_heads;
    let k = k
        .reshape([2, 2, 1, 14, 32])
        .expand([2, 2, group, 14, 32])
        .reshape([2, 4, 14, 32]);
    let v = v
        .reshape([2, 2, 1, 14, 32])
        .expand([2, 2, group, 14, 32])
        .reshape([2, 4, 14, 32]);
    let hidden: Vec<bool> = (0..case.batch)
        .flat_map(|b| (0..case.q_heads).map(move |h| (b, h)))
        .flat_map(|(b, _)| {
            let case = &case;
            (0..case.q_len).flat_map(move |i| (0..case.kv_len).map(move |j| !case.visible(b, i, j)))
        })
        .collect();
    let mask = Tensor::from_data(TensorData::new(hidden, [2, 4, 11, 14]), &device);
    let fallback = to_vec(module::attention_fallback(
        q,
        k,
        v,
        Some(mask),
        None,
        AttentionModuleOptions {
            scale: None,
            softcap: None,
            is_causal: false,
        },
    ));
    assert_close(
        "fused vs attention_fallback",
        &fused,
        &fallback,
        FORWARD_ATOL,
        FORWARD_RTOL,
    );
    assert_close(
        "fallback vs f64",
        &fallback,
        &reference(&case, &x).out,
        FORWARD_ATOL,
        FORWARD_RTOL,
    );
}

#[test]
fn softcapped_kernels_match_oracle_with_gqa_window_and_offset() {
    // Cap 1.0 against scores of spread ~1 (inputs in [-2, 2], d = 32): tanh bends most scores, so a kernel
    // that ignored the cap, or capped after masking, would miss the oracle by ~0.1. Covers manual, burn's
    // fused op, the flash kernel on burn-flex (which routes capped calls to the portable tiles) and the
    // portable tiles directly, forward and gradients.
    check_case(
        &Case {
            causal: true,
            offset: 3,
            window: Some(7),
            softcap: Some(1.0),
            ..case(2, 4, 2, 32, 13, 16)
        },
        21,
    );
    check_case(
        &Case {
            left_pad: vec![0, 4],
            causal: true,
            softcap: Some(0.5),
            ..case(2, 2, 1, 16, 9, 9)
        },
        22,
    );
}

#[test]
fn a_soft_cap_that_is_not_a_positive_number_is_refused() {
    let case = case(1, 2, 1, 8, 3, 3);
    let x = random_inputs(&case, 23);
    let device = Default::default();
    let q = tensor::<Flex>(&x.q, case.q_shape(), &device);
    let k = tensor::<Flex>(&x.k, case.kv_shape(), &device);
    let v = tensor::<Flex>(&x.v, case.kv_shape(), &device);
    for cap in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let options = case.options::<Flex>(&device).with_softcap(cap);
        let err = check_shapes(&q, &k, &v, &options).unwrap_err();
        assert!(
            matches!(err, AttentionError::InvalidSoftcap(_)),
            "{cap}: {err}"
        );
    }
}

#[test]
fn custom_scale_is_applied_by_every_kernel() {
    // Scale 1/sqrt(d) * 3 equals the default scale on q * 3: compare each kernel with itself.
    let case = Case {
        causal: true,
        ..case(1, 2, 1, 32, 9, 9)
    };
    let x = random_inputs(&case, 9);
    let device = Default::default();
    let scaled_q: Vec<f64> = x.q.iter().map(|v| v * 3.0).collect();
    for kernel in AttentionKernel::ALL {
        let k = tensor::<Flex>(&x.k, case.kv_shape(), &device);
        let v = tensor::<Flex>(&x.v, case.kv_shape(), &device);
        let options = case.options::<Flex>(&device).with_scale(3.0 / 32f64.sqrt());
        let custom = attention(
            kernel,
            tensor(&x.q, case.q_shape(), &device),
            k.clone(),
            v.clone(),
            &options,
        );
        let reference = attention(
            kernel,
            tensor(&scaled_q, case.q_shape(), &device),
            k,
            v,
            &case.options::<Flex>(&device),
        );
        assert_close(
            &format!("{kernel} scale"),
            &to_vec(custom),
            &to_vec(reference),
            FORWARD_ATOL,
            FORWARD_RTOL,
        );
    }
}

#[test]
fn kernels_match_oracle_in_half_precision() {
    // f16 has a 2^-11 relative step: inputs in [-2, 2] are rounded by up to 1e-3, scores (32-term dot
    // products scaled by 1/sqrt(32), |s| <~ 4) carry ~4e-3 absolute error, which perturbs softmax weights
    // by ~4e-3 relative, so outputs (|out| <= 2) can be off by ~1e-2; 3e-2 allows for the f16 rounding of the
    // output itself. A masking or grouping bug moves outputs by ~0.3.
    const HALF_ATOL: f64 = 3e-2;
    let case = Case {
        causal: true,
        offset: 2,
        window: Some(12),
        left_pad: vec![0, 4],
        ..case(2, 4, 2, 32, 19, 21)
    };
    let x = random_inputs(&case, 10);
    let expected = reference(&case, &x).out;
    let device = Default::default();
    let half = |values: &[f64], shape| {
        let values: Vec<f32> = values.iter().map(|v| *v as f32).collect();
        Tensor::<Flex, 4>::from_data(TensorData::new(values, shape), (&device, DType::F16))
    };
    for kernel in AttentionKernel::ALL {
        let out = attention(
            kernel,
            half(&x.q, case.q_shape()),
            half(&x.k, case.kv_shape()),
            half(&x.v, case.kv_shape()),
            &case.options::<Flex>(&device),
        );
        assert_eq!(out.dtype(), DType::F16, "{kernel} keeps the input dtype");
        assert_close(
            &format!("{kernel} f16"),
            &to_vec(out),
            &expected,
            HALF_ATOL,
            0.0,
        );
    }
}

#[test]
fn kernels_match_oracle_across_query_row_blocks_with_gqa_and_window() {
    // More query rows than burn-flex's native kernel takes per block (64), so later blocks start mid-sequence
    // and see key ranges that begin past 0 (the window).
    check_case(
        &Case {
            causal: true,
            window: Some(50),
            ..case(1, 4, 2, 32, 150, 150)
        },
        9,
    );
}

#[test]
fn kernels_match_oracle_on_a_bidirectional_chunk_after_a_cache() {
    check_case(
        &Case {
            offset: 20,
            ..case(2, 2, 1, 16, 70, 90)
        },
        10,
    );
}

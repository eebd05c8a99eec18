//! The dense product, native flash attention and the kernel thread limit.

use super::*;

/// The dense kernel against burn's matmul, for decode-sized rows (one, three: split by column unless the
/// product is tiny) and prefill/training-sized rows, with and without a bias. Both sum `in` products in f32,
/// in different orders: 1e-5 relative to the row's largest |x|·|w| sum (about 1 here).
#[test]
fn dense_kernel_matches_burns_matmul() {
    use crate::portable::portable_linear;
    for (rows, inputs, out) in [
        (1, 576, 1000),
        (3, 576, 1000),
        (2, 8, 24),
        (130, 96, 200),
        (0, 8, 24),
    ] {
        let x = tensor::<Flex, 2>([rows, inputs], 13, 1.0);
        let w = tensor::<Flex, 2>([out, inputs], 14, 0.1);
        let b = tensor::<Flex, 1>([out], 15, 1.0);
        for bias in [None, Some(b)] {
            let ours = crate::cpu::dense(
                &primitive(x.clone()),
                &primitive(w.clone()),
                bias.clone().map(primitive).as_ref(),
            )
            .expect("the kernel takes contiguous f32 operands");
            let reference = portable_linear::<Flex>(
                primitive(x.clone()),
                primitive(w.clone()),
                bias.clone().map(primitive),
            );
            let err = max_rel(
                &floats(from_primitive::<Flex, 2>(ours)),
                &floats(from_primitive::<Flex, 2>(reference)),
                1.0,
            );
            assert!(err < 1e-5, "{rows}x{inputs}x{out}: relative error {err}");
        }
    }
    // A transposed (strided) input is declined, and the public function still gets it right.
    let xt = tensor::<Flex, 2>([64, 5], 16, 1.0).transpose();
    let w = tensor::<Flex, 2>([7, 64], 17, 0.1);
    assert!(crate::cpu::dense(&primitive(xt.clone()), &primitive(w.clone()), None).is_none());
    let expected = floats(xt.clone().matmul(w.clone().transpose()));
    let err = max_rel(&floats(crate::linear(xt, w, None)), &expected, 1.0);
    assert!(err < 1e-5, "strided input: relative error {err}");
}

/// The linear layer's gradients through its graph node (the native backward) against autodiff through burn's
/// `linear` on the transposed weight. The weight's gradient also comes back in the weight's own, contiguous
/// layout (burn's comes back as a transposed view, which the optimizer then copies). Same f32 sums in
/// different orders: 1e-5 relative, with a floor of 1 (gradients of unit scale).
#[test]
fn dense_gradients_match_autodiff_through_tensor_ops() {
    let (rows, inputs, out) = (70, 48, 40);
    let grad = tensor::<A, 2>([rows, out], 24, 1.0);
    let run = |native: bool| {
        let x = tensor::<A, 2>([rows, inputs], 21, 1.0).require_grad();
        let w = tensor::<A, 2>([out, inputs], 22, 0.3).require_grad();
        let b = tensor::<A, 1>([out], 23, 1.0).require_grad();
        let y = if native {
            crate::linear(x.clone(), w.clone(), Some(b.clone()))
        } else {
            burn::tensor::module::linear(x.clone(), w.clone().transpose(), Some(b.clone()))
        };
        let grads = (y * grad.clone()).sum().backward();
        let dw = w.grad(&grads).expect("weight gradient");
        let contiguous = dw
            .clone()
            .into_primitive()
            .tensor()
            .layout()
            .is_contiguous();
        let all = [
            floats(x.grad(&grads).expect("x gradient")),
            floats(dw),
            floats(b.grad(&grads).expect("bias gradient")),
        ];
        (all, contiguous)
    };
    let ((ours, contiguous), (reference, _)) = (run(true), run(false));
    assert!(
        contiguous,
        "the weight gradient is not in the weight's layout"
    );
    for (what, (a, b)) in ["d_x", "d_weight", "d_bias"]
        .iter()
        .zip(ours.iter().zip(&reference))
    {
        let err = max_rel(a, b, 1.0);
        assert!(err < 1e-5, "{what}: relative error {err}");
    }
    let x = tensor::<Flex, 2>([rows, inputs], 21, 1.0);
    let w = tensor::<Flex, 2>([out, inputs], 22, 0.3);
    let g = tensor::<Flex, 2>([rows, out], 24, 1.0);
    assert!(
        crate::cpu::dense_backward(&primitive(x), &primitive(w), &primitive(g)).is_some(),
        "the native backward declined contiguous f32 operands"
    );
}

/// A frozen weight (no `require_grad`, a LoRA base) takes the input-gradient-only path of the graph node, which
/// gives the same `d_x` as the full backward step: one product, the same f32 sums, so 1e-6 relative with a floor
/// of 1 (gradients of unit scale; the order of the sums is the same, so only the thread split may differ).
#[test]
fn dense_with_a_frozen_weight_gives_the_same_input_gradient() {
    let (rows, inputs, out) = (70, 48, 40);
    let grad = tensor::<A, 2>([rows, out], 24, 1.0);
    let d_x = |frozen: bool| {
        let x = tensor::<A, 2>([rows, inputs], 21, 1.0).require_grad();
        let w = tensor::<A, 2>([out, inputs], 22, 0.3);
        let w = if frozen { w } else { w.require_grad() };
        let grads = (crate::linear(x.clone(), w.clone(), None) * grad.clone())
            .sum()
            .backward();
        assert_eq!(
            w.grad(&grads).is_some(),
            !frozen,
            "weight gradient presence"
        );
        floats(x.grad(&grads).expect("x gradient"))
    };
    let err = max_rel(&d_x(true), &d_x(false), 1.0);
    assert!(err < 1e-6, "d_x: relative error {err}");
    let w = tensor::<Flex, 2>([out, inputs], 22, 0.3);
    let g = tensor::<Flex, 2>([rows, out], 24, 1.0);
    assert!(
        crate::cpu::dense_input_grad(&primitive(w), &primitive(g)).is_some(),
        "the native input gradient declined contiguous f32 operands"
    );
}

/// The native flash kernel takes the unpadded f32 calls burn-flex gets (so the oracle tests of `attention` on
/// burn-flex check it, not the portable fallback), with contiguous heads or heads that are a transposed view of
/// a `[batch, seq, heads, dim]` projection (read in place), and agrees with the portable tensor-op kernel: both
/// sum f32 dot products in different orders, so within 1e-5 (outputs of unit scale). Its output and gradients
/// are position-major in memory, so the transposes back to `[batch, seq, heads * dim]` cost no copy.
#[test]
fn native_flash_runs_and_agrees_with_the_portable_kernel() {
    let heads = |shape: [usize; 4], seed: u64, transposed: bool| {
        let [b, h, s, d] = shape;
        if transposed {
            tensor::<Flex, 4>([b, s, h, d], seed, 1.0).swap_dims(1, 2)
        } else {
            tensor::<Flex, 4>(shape, seed, 1.0)
        }
    };
    for transposed in [false, true] {
        let (q, k, v, grad) = (
            heads([2, 4, 100, 16], 20, transposed),
            heads([2, 2, 100, 16], 21, transposed),
            heads([2, 2, 100, 16], 22, transposed),
            heads([2, 4, 100, 16], 23, transposed),
        );
        native_flash_case(q, k, v, grad);
    }
}

fn native_flash_case(
    q: Tensor<Flex, 4>,
    k: Tensor<Flex, 4>,
    v: Tensor<Flex, 4>,
    grad: Tensor<Flex, 4>,
) {
    use crate::{FlashBlocks, FlashConfig, MaskSpec, flash_backward, flash_forward};
    let mask = MaskSpec {
        causal: true,
        query_offset: 0,
        window: Some(30),
    };
    let config = FlashConfig {
        mask,
        scale: 0.25,
        softcap: None,
        blocks: FlashBlocks::default(),
    };
    let (out, lse) = crate::cpu::flash_forward(
        &primitive(q.clone()),
        &primitive(k.clone()),
        &primitive(v.clone()),
        None,
        &mask,
        config.scale,
    )
    .expect("the native kernel takes an unpadded f32 call");
    let (dq, dk, dv) = crate::cpu::flash_backward(
        &primitive(q.clone()),
        &primitive(k.clone()),
        &primitive(v.clone()),
        None,
        &out,
        &lse,
        &primitive(grad.clone()),
        &mask,
        config.scale,
    )
    .expect("the native backward takes it too");
    let (e_out, e_lse) = flash_forward(q.clone(), k.clone(), v.clone(), None, &config);
    let (e_dq, e_dk, e_dv) =
        flash_backward(q, k, v, None, e_out.clone(), e_lse.clone(), grad, &config);
    let close = |what: &str, a: Vec<f32>, b: Vec<f32>| {
        let err = max_rel(&a, &b, 1.0);
        assert!(err < 1e-5, "{what}: differs by {err}");
    };
    for (what, t) in [("output", &out), ("dq", &dq), ("dk", &dk), ("dv", &dv)] {
        let merged = from_primitive::<Flex, 4>(t.clone()).swap_dims(1, 2);
        let layout = merged.into_primitive().tensor();
        assert!(
            layout.layout().is_contiguous(),
            "{what} is not position-major"
        );
    }
    close(
        "output",
        floats(from_primitive::<Flex, 4>(out)),
        floats(e_out),
    );
    close("lse", floats(from_primitive::<Flex, 3>(lse)), floats(e_lse));
    close("dq", floats(from_primitive::<Flex, 4>(dq)), floats(e_dq));
    close("dk", floats(from_primitive::<Flex, 4>(dk)), floats(e_dk));
    close("dv", floats(from_primitive::<Flex, 4>(dv)), floats(e_dv));
}

/// `with_kernel_threads` caps the kernels of the calling thread only, only while its closure runs (also when
/// it unwinds), and a product computed serially agrees with the split one (same sums per output column; gemm
/// may block them differently: 1e-5 relative).
#[test]
fn kernel_thread_limit_is_scoped_to_the_thread_and_closure() {
    let pool = crate::kernel_threads();
    assert_eq!(pool, rayon::current_num_threads());
    crate::with_kernel_threads(1, || {
        assert_eq!(crate::kernel_threads(), 1);
        let elsewhere = std::thread::spawn(crate::kernel_threads)
            .join()
            .expect("thread");
        assert_eq!(elsewhere, pool, "the limit leaked to another thread");
    });
    assert_eq!(crate::kernel_threads(), pool);
    let unwound = std::panic::catch_unwind(|| crate::with_kernel_threads(1, || panic!("inside")));
    assert!(unwound.is_err());
    assert_eq!(crate::kernel_threads(), pool, "the limit outlived a panic");

    let x = tensor::<Flex, 2>([64, 576], 40, 1.0);
    let w = tensor::<Flex, 2>([1000, 576], 41, 0.1);
    let split = floats(crate::linear(x.clone(), w.clone(), None));
    let serial = floats(crate::with_kernel_threads(1, || crate::linear(x, w, None)));
    let err = max_rel(&serial, &split, 1.0);
    assert!(err < 1e-5, "serial and split products differ by {err}");
}

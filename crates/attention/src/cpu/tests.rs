//! The native kernels against the portable tensor-op versions they replace, on both sides of the parallel
//! threshold.

use burn::backend::{Autodiff, Flex};
use burn::tensor::{Tensor, TensorData, TensorPrimitive, backend::Backend};

use crate::backend::portable_rope_rotate;
use crate::kernels::{portable_swiglu, portable_swiglu_backward};
use crate::{AttentionBackend, KernelBackend, Rope, RopeConfig, RopeLayout, swiglu};

type A = Autodiff<Flex>;

/// Deterministic values in about [-scale, scale].
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
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

fn tensor<B: Backend, const D: usize>(shape: [usize; D], seed: u64, scale: f32) -> Tensor<B, D> {
    let n = shape.iter().product();
    Tensor::from_data(
        TensorData::new(values(n, seed, scale), shape),
        &Default::default(),
    )
}

fn floats<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec().expect("f32 data")
}

fn primitive<B: Backend, const D: usize>(t: Tensor<B, D>) -> burn::tensor::ops::FloatTensor<B> {
    t.into_primitive().tensor()
}

fn from_primitive<B: Backend, const D: usize>(
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

// Shapes below and above `PARALLEL_MIN` (32,768 elements).
const SWIGLU_SHAPES: [[usize; 3]; 2] = [[1, 3, 100], [2, 64, 1536]];

/// Our `exp` is within 2 ulp and libm's within 1, so sigmoid, and the products after it, differ by a few ulp:
/// 1e-6 relative (8 ulp), with a 1e-30 floor for outputs that are exactly 0 on both sides.
const SWIGLU_RTOL: f32 = 1e-6;

#[test]
fn swiglu_matches_the_tensor_op_version_in_place_and_out_of_place() {
    for shape in SWIGLU_SHAPES {
        // Gates up to +-12: sigmoid's saturated tails and its steep middle.
        let gate = tensor::<Flex, 3>(shape, 1, 12.0);
        let up = tensor::<Flex, 3>(shape, 2, 3.0);
        let expected = floats(from_primitive::<Flex, 3>(portable_swiglu::<Flex>(
            primitive(gate.clone()),
            primitive(up.clone()),
        )));
        assert!(crate::cpu::swiglu(&primitive(gate.clone()), primitive(up.clone())).is_ok());
        // `up` shared: the kernel must write a new buffer and leave `up` as it was.
        let kept = up.clone();
        let shared = floats(swiglu(gate.clone(), up.clone()));
        assert_eq!(
            floats(kept),
            floats(up.clone()),
            "{shape:?}: up was overwritten"
        );
        // `up` unique: written in place.
        let unique = floats(swiglu(gate, up));
        assert_eq!(shared, unique, "{shape:?}");
        let err = max_rel(&unique, &expected, 1e-30);
        assert!(err < SWIGLU_RTOL, "{shape:?}: relative error {err}");
    }
}

/// `d_gate = grad * up * s * (1 + g (1 - s))` cancels near `g = -1.28`, where the sigmoid's few-ulp relative
/// error (about 3e-7 absolute) becomes an absolute error of `|g| * 3e-7 * |grad * up|`: at most 6e-6 for the
/// |g| <= 10, |grad * up| <= 2 drawn here. So d_gate is compared relative to `|expected| + 1`: 1e-5 absolute for
/// small gradients, relative for large ones.
const D_GATE_FLOOR: f32 = 1.0;

#[test]
fn swiglu_gradients_match_autodiff_through_tensor_ops() {
    for shape in SWIGLU_SHAPES {
        let gate = tensor::<A, 3>(shape, 3, 8.0).require_grad();
        let up = tensor::<A, 3>(shape, 4, 2.0).require_grad();
        let weights = tensor::<A, 3>(shape, 5, 1.0);
        let grads = (swiglu(gate.clone(), up.clone()) * weights.clone())
            .sum()
            .backward();
        let (d_gate, d_up) = (gate.grad(&grads).unwrap(), up.grad(&grads).unwrap());

        // The reference: burn's autodiff through sigmoid and multiplies.
        let (gate2, up2) = (
            gate.clone().detach().require_grad(),
            up.clone().detach().require_grad(),
        );
        let out = from_primitive::<A, 3>(portable_swiglu::<A>(
            primitive(gate2.clone()),
            primitive(up2.clone()),
        ));
        let grads2 = (out * weights).sum().backward();
        let (e_gate, e_up) = (gate2.grad(&grads2).unwrap(), up2.grad(&grads2).unwrap());

        let err_gate = max_rel(&floats(d_gate), &floats(e_gate), D_GATE_FLOOR);
        let err_up = max_rel(&floats(d_up), &floats(e_up), 1e-6);
        assert!(
            err_gate < 1e-5,
            "{shape:?}: d_gate relative error {err_gate}"
        );
        assert!(
            err_up < SWIGLU_RTOL,
            "{shape:?}: d_up relative error {err_up}"
        );
    }
}

#[test]
fn swiglu_backward_kernel_matches_its_formula() {
    let shape = [2, 64, 1536];
    let (gate, up, grad) = (
        tensor::<Flex, 3>(shape, 6, 10.0),
        tensor::<Flex, 3>(shape, 7, 2.0),
        tensor::<Flex, 3>(shape, 8, 1.0),
    );
    let (d_gate, d_up) = <Flex as KernelBackend>::swiglu_backward(
        primitive(gate.clone()),
        primitive(up.clone()),
        primitive(grad.clone()),
    );
    let (e_gate, e_up) =
        portable_swiglu_backward::<Flex>(primitive(gate), primitive(up), primitive(grad));
    let f = |t| floats(from_primitive::<Flex, 3>(t));
    assert!(max_rel(&f(d_gate), &f(e_gate), D_GATE_FLOOR) < 1e-5);
    assert!(max_rel(&f(d_up), &f(e_up), 1e-30) < SWIGLU_RTOL);
}

/// `[batch, seq, heads, head_dim]` transposed to `[batch, heads, seq, head_dim]`: the strided view attention
/// hands to RoPE.
fn heads<B: Backend>(
    batch: usize,
    heads: usize,
    seq: usize,
    head_dim: usize,
    seed: u64,
) -> Tensor<B, 4> {
    tensor::<B, 4>([batch, seq, heads, head_dim], seed, 2.0).swap_dims(1, 2)
}

fn rope_configs() -> Vec<RopeConfig> {
    let mut partial = RopeConfig::new(64);
    partial.rotary_dim = 16; // GPT-NeoX rotary_pct 0.25
    let mut interleaved = RopeConfig::new(32);
    interleaved.layout = RopeLayout::Interleaved; // GPT-J
    vec![RopeConfig::new(64), partial, interleaved]
}

#[test]
fn rope_kernel_equals_the_tensor_op_version_bit_for_bit() {
    for config in rope_configs() {
        let d = config.head_dim;
        let rope = Rope::<Flex>::new(config.clone(), 512, &Default::default()).unwrap();
        // Decode-sized (serial) and prefill-sized (parallel) inputs, shared and per-row tables.
        for (batch, h, seq, offset) in [(1, 3, 1, 37), (2, 9, 200, 5)] {
            let x = heads::<Flex>(batch, h, seq, d, 9);
            let cos = rope
                .cos
                .clone()
                .slice([offset..offset + seq, 0..d])
                .reshape([1, 1, seq, d]);
            let sin = rope
                .sin
                .clone()
                .slice([offset..offset + seq, 0..d])
                .reshape([1, 1, seq, d]);
            let per_row = |t: Tensor<Flex, 4>| t.repeat_dim(0, batch);
            for (cos, sin) in [(cos.clone(), sin.clone()), (per_row(cos), per_row(sin))] {
                let rotation = primitive(rope.rotation.clone());
                let kernel = crate::cpu::rope_rotate(
                    &primitive(x.clone()),
                    &primitive(cos.clone()),
                    &primitive(sin.clone()),
                    &config,
                );
                assert!(
                    kernel.is_some(),
                    "the kernel declined: the comparison would be vacuous"
                );
                let ours = <Flex as AttentionBackend>::rope_rotate(
                    primitive(x.clone()),
                    primitive(cos.clone()),
                    primitive(sin.clone()),
                    rotation.clone(),
                    &config,
                );
                let portable = portable_rope_rotate::<Flex>(
                    primitive(x.clone()),
                    primitive(cos),
                    primitive(sin),
                    rotation,
                );
                assert_eq!(
                    floats(from_primitive::<Flex, 4>(ours)),
                    floats(from_primitive::<Flex, 4>(portable)),
                    "{config:?} batch {batch} seq {seq}"
                );
            }
        }
    }
}

#[test]
fn rope_gradient_is_the_backward_rotation_autodiff_computes() {
    for config in rope_configs() {
        let d = config.head_dim;
        let rope = Rope::<A>::new(config.clone(), 256, &Default::default()).unwrap();
        let x = heads::<A>(2, 3, 40, d, 10).require_grad();
        let weights = tensor::<A, 4>([2, 3, 40, d], 11, 1.0);
        let grads = (rope.apply(x.clone(), 7) * weights.clone())
            .sum()
            .backward();
        let ours = floats(x.grad(&grads).unwrap());

        let x2 = x.clone().detach().require_grad();
        let cos = rope.cos.clone().slice([7..47, 0..d]).reshape([1, 1, 40, d]);
        let sin = rope.sin.clone().slice([7..47, 0..d]).reshape([1, 1, 40, d]);
        let out = from_primitive::<A, 4>(portable_rope_rotate::<A>(
            primitive(x2.clone()),
            primitive(cos),
            primitive(sin),
            primitive(rope.rotation.clone()),
        ));
        let grads2 = (out * weights).sum().backward();
        let expected = floats(x2.grad(&grads2).unwrap());
        // The rotation's backward through autodiff is `g cos + (g sin) R^T`, ours `g cos + (g R)(-sin)`: the same
        // products in another order, equal within one rounding of values up to |g| (|g| <= 1 here).
        let err = ours
            .iter()
            .zip(&expected)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(err < 1e-6, "{config:?}: gradient differs by {err}");
    }
}

/// `(mean loss, d loss / d logits)` in f64 for logits `[rows, vocab]` (row-major) and targets.
fn cross_entropy_f64(logits: &[f32], targets: &[usize], vocab: usize) -> (f64, Vec<f64>) {
    let rows = targets.len();
    let mut loss = 0.0;
    let mut grad = vec![0.0; logits.len()];
    for (r, &t) in targets.iter().enumerate() {
        let row: Vec<f64> = logits[r * vocab..(r + 1) * vocab]
            .iter()
            .map(|&x| f64::from(x))
            .collect();
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
        loss += lse - row[t];
        for (j, x) in row.iter().enumerate() {
            grad[r * vocab + j] = ((x - lse).exp() - f64::from(u8::from(j == t))) / rows as f64;
        }
    }
    (loss / rows as f64, grad)
}

/// Losses and gradients of the fused kernel (burn-flex, on `Autodiff`) and of the portable default (the path
/// GPU backends take) against f64, at a size under and over the parallel threshold. Logits reach +-100, past
/// f32's `exp` overflow at 88.7: a missing max shift gives inf or NaN, and a wrong row's log-sum-exp shows.
/// Tolerances: the loss is a mean of f32 `lse - logit` terms of magnitude up to ~200, each within a few ulp
/// (1.5e-5 at 100), so 1e-4 absolute; gradient entries are `softmax / rows`, whose exponent `x - lse` carries
/// about 100 * 2^-24 absolute rounding (6e-6 relative after exp), so 1e-5 relative to the largest entry.
#[test]
fn cross_entropy_and_its_gradient_match_float64() {
    use crate::kernels::{portable_cross_entropy, portable_cross_entropy_backward};
    for (batch, seq, vocab) in [(1, 3, 50), (4, 64, 2048)] {
        let rows = batch * seq;
        let logits = tensor::<Flex, 3>([batch, seq, vocab], 12, 100.0);
        let targets: Vec<usize> = (0..rows).map(|r| (r * 7919 + 13) % vocab).collect();
        let target_tensor = || {
            let ids: Vec<i64> = targets.iter().map(|&t| t as i64).collect();
            Tensor::<A, 2, burn::tensor::Int>::from_data(
                TensorData::new(ids, [batch, seq]),
                &Default::default(),
            )
        };
        let (want_loss, want_grad) = cross_entropy_f64(&floats(logits.clone()), &targets, vocab);
        let grad_scale = want_grad.iter().fold(0.0f64, |m, g| m.max(g.abs()));
        let check = |what: &str, loss: f32, grad: Vec<f32>| {
            assert!(
                (f64::from(loss) - want_loss).abs() < 1e-4,
                "{what} {rows}x{vocab}: loss {loss} vs {want_loss}"
            );
            let err = grad
                .iter()
                .zip(&want_grad)
                .map(|(g, w)| (f64::from(*g) - w).abs())
                .fold(0.0, f64::max);
            assert!(
                err < 1e-5 * grad_scale,
                "{what} {rows}x{vocab}: gradient off by {err}"
            );
        };

        // The fused kernel through autodiff, with the output gradient scaled by 3 (`grad` must be applied).
        let x = Tensor::<A, 3>::from_inner(logits.clone()).require_grad();
        let loss = crate::cross_entropy(x.clone(), target_tensor());
        let loss_value = floats(loss.clone())[0];
        let grads = loss.mul_scalar(3.0).backward();
        let grad: Vec<f32> = floats(x.grad(&grads).unwrap())
            .iter()
            .map(|g| g / 3.0)
            .collect();
        check("fused", loss_value, grad);

        // The portable default.
        let flat = primitive(logits.reshape([rows, vocab]));
        let ids = target_tensor().inner().reshape([rows]).into_primitive();
        let kernel = crate::cpu::cross_entropy(&flat, &ids);
        assert!(
            kernel.is_some(),
            "the kernel declined {rows}x{vocab}: the fused check ran the default"
        );
        let (loss, lse) = portable_cross_entropy::<Flex>(flat.clone(), ids.clone());
        let one = primitive(Tensor::<Flex, 1>::ones([1], &Default::default()));
        let grad = portable_cross_entropy_backward::<Flex>(flat, ids, lse, one);
        check(
            "portable",
            floats(from_primitive::<Flex, 1>(loss))[0],
            floats(from_primitive::<Flex, 2>(grad)),
        );
    }
}

/// The dense kernel against burn's matmul, for decode-sized rows (one, three: split by column unless the
/// product is tiny) and prefill/training-sized rows, with and without a bias. Both sum `in` products in f32,
/// in different orders: 1e-5 relative to the row's largest |x|·|w| sum (about 1 here).
#[test]
fn dense_kernel_matches_burns_matmul() {
    use crate::kernels::portable_linear;
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
        blocks: FlashBlocks::default(),
    };
    let (out, lse) = crate::cpu::flash_forward(
        &primitive(q.clone()),
        &primitive(k.clone()),
        &primitive(v.clone()),
        &mask,
        config.scale,
    )
    .expect("the native kernel takes an unpadded f32 call");
    let (dq, dk, dv) = crate::cpu::flash_backward(
        &primitive(q.clone()),
        &primitive(k.clone()),
        &primitive(v.clone()),
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

/// RMSNorm in f64, the reference for the kernel and the portable ops.
fn rms_norm_f64(x: &[f32], w: &[f32], eps: f64) -> Vec<f64> {
    let dim = w.len();
    x.chunks_exact(dim)
        .flat_map(|row| {
            let ms = row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / dim as f64;
            let r = 1.0 / (ms + eps).sqrt();
            row.iter()
                .zip(w)
                .map(move |(&v, &w)| f64::from(v) * r * f64::from(w))
        })
        .collect()
}

// Shapes below and above `PARALLEL_MIN` (the larger one splits its rows, and the weight gradient's sums,
// across tasks).
const NORM_SHAPES: [[usize; 3]; 2] = [[3, 7, 100], [2, 64, 576]];

/// The RMSNorm kernel and the portable ops against f64: a mean of <= 576 f32 squares and a few roundings after
/// it, so 1e-5 relative (floor 1e-3 for outputs near 0).
#[test]
fn rms_norm_kernel_matches_f64() {
    use crate::kernels::portable_rms_norm;
    for shape in NORM_SHAPES {
        let x = tensor::<Flex, 3>(shape, 30, 2.0);
        let w = tensor::<Flex, 1>([shape[2]], 31, 1.5);
        let expected = rms_norm_f64(&floats(x.clone()), &floats(w.clone()), 1e-5);
        let expected: Vec<f32> = expected.iter().map(|&v| v as f32).collect();
        let native = crate::cpu::rms_norm(&primitive(x.clone()), &primitive(w.clone()), 1e-5)
            .expect("the kernel takes contiguous f32 rows");
        let portable = portable_rms_norm::<Flex>(primitive(x), primitive(w), 1e-5);
        for (what, got) in [("native", native), ("portable", portable)] {
            let err = max_rel(&floats(from_primitive::<Flex, 3>(got)), &expected, 1e-3);
            assert!(err < 1e-5, "{what} {shape:?}: relative error {err}");
        }
    }
}

/// RMSNorm's gradients through its graph node (the native backward, and the portable backward) against autodiff
/// through the tensor ops: different formulas for the same derivative in f32, so 1e-4 relative with a floor of
/// 1e-2 (gradients of unit scale; `dweight` sums up to 128 rows).
#[test]
fn rms_norm_gradients_match_autodiff_through_tensor_ops() {
    use crate::kernels::{portable_rms_norm, portable_rms_norm_backward};
    for shape in NORM_SHAPES {
        let grad = tensor::<A, 3>(shape, 34, 1.0);
        let run = |native: bool| {
            let x = tensor::<A, 3>(shape, 32, 2.0).require_grad();
            let w = tensor::<A, 1>([shape[2]], 33, 1.5).require_grad();
            let y = if native {
                crate::rms_norm(x.clone(), w.clone(), 1e-5)
            } else {
                from_primitive(portable_rms_norm::<A>(
                    primitive(x.clone()),
                    primitive(w.clone()),
                    1e-5,
                ))
            };
            let grads = (y * grad.clone()).sum().backward();
            [
                floats(x.grad(&grads).expect("x gradient")),
                floats(w.grad(&grads).expect("weight gradient")),
            ]
        };
        let (ours, reference) = (run(true), run(false));
        let (x, w, g) = (
            primitive(tensor::<Flex, 3>(shape, 32, 2.0)),
            primitive(tensor::<Flex, 1>([shape[2]], 33, 1.5)),
            primitive(tensor::<Flex, 3>(shape, 34, 1.0)),
        );
        assert!(
            crate::cpu::rms_norm_backward(&x, &w, 1e-5, &g).is_some(),
            "the native backward declined contiguous f32 rows"
        );
        let (px, pw) = portable_rms_norm_backward::<Flex>(x, w, 1e-5, g);
        let portable = [
            floats(from_primitive::<Flex, 3>(px)),
            floats(from_primitive::<Flex, 1>(pw)),
        ];
        for (what, got) in [("native", &ours), ("portable", &portable)] {
            for (name, (a, b)) in ["d_x", "d_weight"].iter().zip(got.iter().zip(&reference)) {
                let err = max_rel(a, b, 1e-2);
                assert!(err < 1e-4, "{what} {name} {shape:?}: relative error {err}");
            }
        }
    }
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

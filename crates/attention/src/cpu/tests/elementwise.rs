//! SwiGLU, RoPE, the cross-entropy loss and RMSNorm: kernel against portable ops, f64 and autodiff.

use super::*;

// Shapes below and above `PARALLEL_MIN` (32,768 elements).
// The middle two (a batch-8 decode step's, and an uneven split) run on the spinning workers, the last on rayon.
const SWIGLU_SHAPES: [[usize; 3]; 4] = [[1, 3, 100], [1, 8, 1536], [1, 7, 1531], [2, 64, 1536]];

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
    let (d_gate, d_up) = <Flex as EmberBackend>::swiglu_backward(
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
                let ours = <Flex as EmberBackend>::rope_rotate(
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

/// `(mean loss, d loss / d logits)` in f64 for logits `[rows, vocab]` (row-major) and targets (`None`: an ignored
/// row, out of the mean, zero gradient).
fn cross_entropy_f64(logits: &[f32], targets: &[Option<usize>], vocab: usize) -> (f64, Vec<f64>) {
    let rows = targets.iter().flatten().count().max(1);
    let mut loss = 0.0;
    let mut grad = vec![0.0; logits.len()];
    for (r, t) in targets.iter().enumerate() {
        let Some(t) = *t else { continue };
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
/// about 100 * 2^-24 absolute rounding (6e-6 relative after exp), so 1e-5 relative to the largest entry. Every
/// third row's target is `IGNORE_TARGET` in the second pass of each size (a chat prompt's tokens): those rows
/// must leave the mean and get a zero gradient; a batch of only ignored rows has loss 0 and no gradient.
#[test]
fn cross_entropy_and_its_gradient_match_float64() {
    use crate::portable::{portable_cross_entropy, portable_cross_entropy_backward};
    let cases = [(1, 3, 50), (4, 64, 2048)]
        .into_iter()
        .flat_map(|shape| [(shape, 0), (shape, 3), (shape, 1)]);
    for ((batch, seq, vocab), ignore_every) in cases {
        let rows = batch * seq;
        let logits = tensor::<Flex, 3>([batch, seq, vocab], 12, 100.0);
        let targets: Vec<Option<usize>> = (0..rows)
            .map(|r| {
                (ignore_every == 0 || r % ignore_every != 0).then_some((r * 7919 + 13) % vocab)
            })
            .collect();
        let target_tensor = || {
            let ids: Vec<i64> = targets
                .iter()
                .map(|t| t.map_or(crate::IGNORE_TARGET, |t| t as i64))
                .collect();
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
                "{what} {rows}x{vocab} (ignoring every {ignore_every}): loss {loss} vs {want_loss}"
            );
            let err = grad
                .iter()
                .zip(&want_grad)
                .map(|(g, w)| (f64::from(*g) - w).abs())
                .fold(0.0, f64::max);
            // `<=`: with every row ignored both gradients are exactly zero.
            assert!(
                err <= 1e-5 * grad_scale,
                "{what} {rows}x{vocab} (ignoring every {ignore_every}): gradient off by {err}"
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
// The middle one is split across the spinning workers in whole rows (nine and eight).
const NORM_SHAPES: [[usize; 3]; 3] = [[3, 7, 100], [1, 17, 576], [2, 64, 576]];

/// The RMSNorm kernel and the portable ops against f64: a mean of <= 576 f32 squares and a few roundings after
/// it, so 1e-5 relative (floor 1e-3 for outputs near 0).
#[test]
fn rms_norm_kernel_matches_f64() {
    use crate::portable::portable_rms_norm;
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
    use crate::portable::{portable_rms_norm, portable_rms_norm_backward};
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

/// `write_block` equals `slice_assign` on every dimension count and block position, writes a uniquely owned f32
/// tensor in place (its buffer keeps its address: a KV-cache append must not copy the cache), and leaves a
/// shared tensor untouched, copying it as `slice_assign` does.
#[test]
fn write_block_equals_slice_assign_and_writes_a_unique_tensor_in_place() {
    use std::ops::Range;

    use crate::write_block;

    fn check<const D: usize>(shape: [usize; D], block: [Range<usize>; D], seed: u64) {
        let dst = tensor::<Flex, D>(shape, seed, 1.0);
        let value = tensor::<Flex, D>(block.clone().map(|r| r.len()), seed + 1, 1.0);
        let expected = floats(dst.clone().slice_assign(block.clone(), value.clone()));
        let address = |t: &Tensor<Flex, D>| {
            t.clone()
                .into_primitive()
                .tensor()
                .storage::<f32>()
                .as_ptr()
        };
        let before = address(&dst);
        let written = write_block(dst, block.clone(), value.clone());
        assert_eq!(
            address(&written),
            before,
            "{shape:?} {block:?}: the buffer was copied"
        );
        assert_eq!(floats(written), expected, "{shape:?} {block:?}");
    }
    // A one-dimensional block is an array of one range.
    #[allow(clippy::single_range_in_vec_init)]
    check([7], [2..5], 1);
    check([5, 6], [1..4, 0..6], 2);
    check([4, 3, 8], [2..4, 0..3, 0..8], 3);
    check([2, 3, 9, 4], [0..2, 1..3, 5..9, 1..3], 4);
    check([2, 3, 9, 4], [1..2, 0..3, 0..0, 0..4], 5);

    // A transposed (strided) value is read through its layout, as the caches' swapped K/V rows are.
    let dst = tensor::<Flex, 3>([4, 3, 8], 8, 1.0);
    let value = tensor::<Flex, 3>([3, 2, 8], 9, 1.0).swap_dims(0, 1);
    let expected = floats(dst.clone().slice_assign([2..4, 0..3, 0..8], value.clone()));
    assert_eq!(
        floats(write_block(dst, [2..4, 0..3, 0..8], value)),
        expected
    );

    let dst = tensor::<Flex, 2>([3, 4], 6, 1.0);
    let original = floats(dst.clone());
    let shared = dst.clone();
    let written = write_block(dst, [1..2, 0..4], tensor::<Flex, 2>([1, 4], 7, 1.0));
    assert_eq!(
        floats(shared),
        original,
        "a shared tensor must not change under its other holder"
    );
    assert_ne!(floats(written), original);
}

/// `select_rows` equals `select(0, rows)`: rows repeated, reordered, none, a strided (transposed) source, and
/// enough rows to be copied in parallel.
#[test]
fn select_rows_equals_select_along_the_first_dimension() {
    use burn::tensor::{Int, TensorData};

    use crate::select_rows;

    fn check<const D: usize>(source: Tensor<Flex, D>, rows: &[usize]) {
        let index: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
        let index = Tensor::<Flex, 1, Int>::from_data(
            TensorData::new(index, [rows.len()]),
            &Default::default(),
        );
        let expected = source.clone().select(0, index);
        let got = select_rows(source, rows);
        assert_eq!(got.dims(), expected.dims(), "{rows:?}");
        assert_eq!(floats(got), floats(expected), "{rows:?}");
    }
    let pool = tensor::<Flex, 3>([9, 3, 8], 11, 1.0);
    check(pool.clone(), &[4, 0, 0, 8, 4]);
    check(pool.clone(), &[]);
    check(pool.swap_dims(1, 2), &[2, 7]);
    check(tensor::<Flex, 1>([5], 12, 1.0), &[4, 1]);
    // Enough rows (over 2^15 elements) to be split across the kernel threads.
    let rows: Vec<usize> = (0..301).map(|i| (i * 7) % 600).collect();
    check(tensor::<Flex, 3>([600, 3, 64], 13, 1.0), &rows);
}

/// `write_rows` (burn-flex's in-place copy, and the portable one write per run of consecutive rows) puts row
/// `i` of the value over row `rows[i]` and leaves every other row as it was: scattered rows, a run, none, and a
/// shared tensor (the in-place path declines, the portable one copies, the other holder unchanged).
#[test]
fn write_rows_replaces_exactly_the_listed_rows() {
    use crate::backend::portable_write_rows;
    use crate::write_rows;

    fn expected(mut base: Vec<f32>, row: usize, rows: &[usize], value: &[f32]) -> Vec<f32> {
        for (i, &r) in rows.iter().enumerate() {
            base[r * row..(r + 1) * row].copy_from_slice(&value[i * row..(i + 1) * row]);
        }
        base
    }
    for rows in [&[5, 0, 7][..], &[2, 3, 4, 8], &[]] {
        let base = tensor::<Flex, 3>([9, 3, 4], 21, 1.0);
        let value = tensor::<Flex, 3>([rows.len(), 3, 4], 22, 1.0);
        let want = expected(floats(base.clone()), 12, rows, &floats(value.clone()));
        // Uniquely owned: written in place.
        let got = write_rows(base, rows, value.clone());
        assert_eq!(floats(got), want, "{rows:?}");
        // Shared: copied, the other holder unchanged.
        let base = tensor::<Flex, 3>([9, 3, 4], 21, 1.0);
        let shared = base.clone();
        let got = write_rows(base, rows, value.clone());
        assert_eq!(floats(got), want, "{rows:?}");
        let untouched = tensor::<Flex, 3>([9, 3, 4], 21, 1.0);
        assert_eq!(floats(shared.clone()), floats(untouched));
        let portable = portable_write_rows::<Flex>(primitive(shared), rows, primitive(value));
        assert_eq!(
            floats(Tensor::<Flex, 3>::from_primitive(TensorPrimitive::Float(
                portable
            ))),
            want
        );
    }
}

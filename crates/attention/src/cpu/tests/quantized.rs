//! The quantized product read from packed codes, against a float64 evaluation of the same weights.

use burn::tensor::{DType, Int};

use super::*;
use crate::CodeLayout;
use crate::cpu::quantized_dense;

/// Codes, scales and minimums of a random `[out, in]` weight in `layout`, with random padding codes past
/// `in_features` (they must not count: their columns do not exist).
struct Packed {
    codes: Vec<u8>,
    scales: Vec<f32>,
    mins: Option<Vec<f32>>,
    row_bytes: usize,
    groups: usize,
}

fn packed(out: usize, layout: CodeLayout, seed: u64) -> Packed {
    let groups = layout.in_features.div_ceil(layout.group_len);
    // Rows padded to whole groups, as `QuantizedWeight` stores them.
    let row_bytes = groups * layout.group_len * layout.bits / 8;
    let codes = values(out * row_bytes, seed, 1.0)
        .into_iter()
        .map(|v| ((v + 1.0) * 127.99) as u8)
        .collect();
    let scales = values(out * groups, seed + 1, 0.01)
        .into_iter()
        .map(|s| s.abs() + 1e-3)
        .collect();
    let mins = layout
        .zero_code
        .is_none()
        .then(|| values(out * groups, seed + 2, 0.1));
    Packed {
        codes,
        scales,
        mins,
        row_bytes,
        groups,
    }
}

/// `(y, bound)` in f64: the exact product, and `Σ |terms|`, which scales the f32 rounding error.
fn reference(
    x: &[f32],
    rows: usize,
    p: &Packed,
    bias: Option<&[f32]>,
    layout: CodeLayout,
) -> (Vec<f64>, Vec<f64>) {
    let (n, out) = (layout.in_features, p.scales.len() / p.groups);
    let mut y = vec![0f64; rows * out];
    let mut bound = vec![0f64; rows * out];
    for r in 0..rows {
        for o in 0..out {
            let (mut sum, mut abs) = (bias.map_or(0.0, |b| b[o] as f64), 0f64);
            for i in 0..n {
                let code = if layout.bits == 8 {
                    p.codes[o * p.row_bytes + i]
                } else {
                    (p.codes[o * p.row_bytes + i / 2] >> (4 * (i % 2))) & 0x0f
                } as f64;
                let g = o * p.groups + i / layout.group_len;
                let scale = p.scales[g] as f64;
                let w = match (&p.mins, layout.zero_code) {
                    (Some(mins), _) => code * scale + mins[g] as f64,
                    (None, zero) => (code - zero.unwrap() as f64) * scale,
                };
                let xi = x[r * n + i] as f64;
                sum += w * xi;
                abs += (w * xi).abs() + p.mins.as_ref().map_or(0.0, |m| (m[g] as f64 * xi).abs());
            }
            y[r * out + o] = sum;
            bound[r * out + o] = abs;
        }
    }
    (y, bound)
}

fn codes_tensor(p: &Packed, out: usize) -> burn::tensor::ops::IntTensor<Flex> {
    Tensor::<Flex, 2, Int>::from_data(
        TensorData::new(p.codes.clone(), [out, p.row_bytes]),
        (&Default::default(), DType::U8),
    )
    .into_primitive()
}

fn floats_tensor(v: &[f32], shape: [usize; 3]) -> burn::tensor::ops::FloatTensor<Flex> {
    primitive(Tensor::<Flex, 3>::from_data(
        TensorData::new(v.to_vec(), shape),
        &Default::default(),
    ))
}

/// INT8 per channel and in groups (GGUF Q8_0), INT4 symmetric and asymmetric (GGUF Q4_1), with a last group
/// cut short and an odd INT4 width; one row (decode), a few, and the most the streaming path takes, then more
/// (the dequantize-and-gemm path); more output channels than one parallel task holds. The kernel sums in f32 in another order than the reference: the error is
/// bounded by about `(in + groups)·2⁻²⁴·Σ|terms|`, and 2⁻¹⁶·Σ|terms| (256x looser, still far below any
/// decoding mistake: a wrong nibble or group moves a result by about a whole term) holds it with margin.
#[test]
fn quantized_kernel_matches_float64() {
    let layouts = [
        (8, 600, 600, Some(128.0)),
        (8, 600, 32, Some(128.0)),
        (8, 100, 32, Some(128.0)),
        (4, 600, 32, Some(8.0)),
        (4, 101, 32, Some(8.0)),
        (4, 600, 32, None),
        (4, 88, 64, None),
    ];
    for (bits, in_features, group_len, zero_code) in layouts {
        let layout = CodeLayout {
            bits,
            in_features,
            group_len,
            zero_code,
        };
        let out = 200;
        let p = packed(out, layout, bits as u64 * 1000 + in_features as u64);
        let bias = values(out, 77, 1.0);
        let mut alone = Vec::new();
        for rows in [1, 3, 16, 17, 40] {
            let x = values(rows * in_features, rows as u64, 1.0);
            for with_bias in [false, true] {
                let bias = with_bias.then_some(&bias[..]);
                let ours = run_kernel(&x, rows, &p, bias, layout);
                // Up to the streaming limit a row's result is bit-identical alone and in a batch: a continuously
                // batched server must not change a request's output by what runs beside it.
                if rows <= crate::cpu::quantized::MAX_ROWS {
                    for r in 0..rows {
                        let row = &x[r * in_features..(r + 1) * in_features];
                        alone.clear();
                        alone.extend(run_kernel(row, 1, &p, bias, layout));
                        assert_eq!(
                            &ours[r * out..(r + 1) * out],
                            &alone[..],
                            "{layout:?}: row {r} of {rows}"
                        );
                    }
                }
                let (want, bound) = reference(&x, rows, &p, bias, layout);
                for (i, ((a, b), m)) in ours.iter().zip(&want).zip(&bound).enumerate() {
                    assert!(
                        (*a as f64 - b).abs() <= m * 2f64.powi(-16) + 1e-6,
                        "{layout:?}, {rows} rows, bias {with_bias}: output {i} is {a}, want {b} (terms {m})"
                    );
                }
            }
        }
    }
}

/// The kernel's `[rows, out]` output for `x` `[rows, in_features]`.
fn run_kernel(
    x: &[f32],
    rows: usize,
    p: &Packed,
    bias: Option<&[f32]>,
    layout: CodeLayout,
) -> Vec<f32> {
    let out = p.scales.len() / p.groups;
    let ours = quantized_dense(
        &primitive(Tensor::<Flex, 2>::from_data(
            TensorData::new(x.to_vec(), [rows, layout.in_features]),
            &Default::default(),
        )),
        &codes_tensor(p, out),
        &floats_tensor(&p.scales, [out, p.groups, 1]),
        p.mins
            .as_ref()
            .map(|m| floats_tensor(m, [out, p.groups, 1]))
            .as_ref(),
        bias.map(|b| primitive(Tensor::<Flex, 1>::from_floats(b, &Default::default())))
            .as_ref(),
        layout,
    )
    .expect("the kernel takes these inputs");
    floats(from_primitive::<Flex, 2>(ours))
}

/// What the kernel does not take it declines, for the caller's tensor-op path: a layout that does not match the
/// codes' width, and a group that splits a byte. Any number of rows is taken, on one path or the other.
#[test]
fn quantized_kernel_declines_what_it_does_not_handle() {
    let layout = CodeLayout {
        bits: 4,
        in_features: 64,
        group_len: 32,
        zero_code: Some(8.0),
    };
    let p = packed(8, layout, 5);
    let run = |rows: usize, layout: CodeLayout| {
        quantized_dense(
            &primitive(tensor::<Flex, 2>([rows, layout.in_features], 1, 1.0)),
            &codes_tensor(&p, 8),
            &floats_tensor(&p.scales, [8, p.groups, 1]),
            None,
            None,
            layout,
        )
    };
    assert!(run(1, layout).is_some());
    assert!(run(crate::cpu::quantized::MAX_ROWS, layout).is_some());
    assert!(run(crate::cpu::quantized::MAX_ROWS + 1, layout).is_some());
    assert!(run(1, CodeLayout { bits: 8, ..layout }).is_none());
    // 62 columns would be one short group of 32, the same bytes; 30 would not fill the stored row.
    assert!(
        run(
            1,
            CodeLayout {
                in_features: 30,
                ..layout
            }
        )
        .is_none()
    );
    assert!(
        run(
            1,
            CodeLayout {
                group_len: 3,
                ..layout
            }
        )
        .is_none()
    );
}

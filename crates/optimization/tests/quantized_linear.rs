//! `QuantizedLinear` on the reference CPU backend: on-device dequantization, tiled matmul, row
//! lookup and read-back, each checked against host-side or float64 references.

mod common;

use burn::backend::Flex;
use burn::tensor::{Int, Tensor, TensorData};
use ember_optimization::{Granularity, QuantScheme, QuantizedLinear, QuantizedWeight};

type B = Flex;

const SCHEMES: [&str; 6] = [
    "int8",
    "int8-g32",
    "int4-g32",
    "int4-g64-asym",
    "int4-g128",
    "int4-g128-asym",
];

fn to_vec<const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec::<f32>().unwrap()
}

fn linear(
    scheme: QuantScheme,
    [rows, cols]: [usize; 2],
    seed: u64,
) -> (QuantizedWeight, Vec<f32>, QuantizedLinear<B>) {
    let device = Default::default();
    let weight =
        QuantizedWeight::quantize(&common::weights(rows * cols, seed), [rows, cols], scheme)
            .unwrap();
    let bias = common::activations(rows, seed + 100);
    let bias_tensor = Tensor::<B, 1>::from_data(TensorData::new(bias.clone(), [rows]), &device);
    let layer = QuantizedLinear::new(&weight, Some(bias_tensor), &device).unwrap();
    (weight, bias, layer)
}

/// The device unpacks codes and computes `(c - z) * s` or `c * s + m` with the same f32
/// operations as the host dequantizer, so the values must be bit-identical.
#[test]
fn device_dequantization_is_bit_identical_to_host() {
    for scheme in SCHEMES {
        let (weight, _, layer) = linear(scheme.parse().unwrap(), [24, 200], 5);
        assert_eq!(to_vec(layer.dequantize()), weight.dequantize(), "{scheme}");
    }
}

/// `forward` against a float64 matmul with the host-dequantized weight, on both of burn-flex's paths:
/// 6 rows (streamed from the packed codes, as in a decode step) and 21 (tiles dequantized, then
/// multiplied with gemm). Tolerance: an f32 dot product of length n has error at most
/// `n * eps/2 * sum|terms|` (the classic gamma_n bound, valid for any summation order), plus one
/// rounding of the bias addition. The terms are `x_i w_i`, except that the kernel sums an
/// asymmetric group as `s * sum(c_i x_i) + m * sum(x_i)`, whose terms `c_i s x_i` and `m x_i` can be
/// larger than their sum.
#[test]
fn quantized_matmul_equals_matmul_with_dequantized_weight() {
    let device = Default::default();
    let [rows, cols] = [40, 200];
    for [batch, seq] in [[2, 3], [3, 7]] {
        let x = common::activations(batch * seq * cols, 9);
        for scheme in SCHEMES {
            for tile_rows in [7, rows] {
                let (weight, bias, layer) = linear(scheme.parse().unwrap(), [rows, cols], 6);
                let layer = layer.with_tile_rows(tile_rows);
                let input = Tensor::<B, 3>::from_data(
                    TensorData::new(x.clone(), [batch, seq, cols]),
                    &device,
                );
                let y = layer.forward(input);
                assert_eq!(y.dims(), [batch, seq, rows]);
                let y = to_vec(y);
                let w = weight.dequantize();
                let asymmetric = weight.mins().is_some();
                for t in 0..batch * seq {
                    for o in 0..rows {
                        let terms = (0..cols)
                            .map(|i| f64::from(x[t * cols + i]) * f64::from(w[o * cols + i]));
                        let exact: f64 = terms.clone().sum::<f64>() + f64::from(bias[o]);
                        let magnitude: f64 = (0..cols)
                            .map(|i| {
                                let (xi, wi) =
                                    (f64::from(x[t * cols + i]), f64::from(w[o * cols + i]));
                                if asymmetric {
                                    let cs = f64::from(weight.code(o, i))
                                        * f64::from(weight.scale(o, i));
                                    (cs * xi).abs() + ((wi - cs) * xi).abs()
                                } else {
                                    (wi * xi).abs()
                                }
                            })
                            .sum();
                        let eps = f64::from(f32::EPSILON) / 2.0;
                        let tol = cols as f64 * eps * magnitude + 2.0 * eps * exact.abs();
                        let got = f64::from(y[t * rows + o]);
                        assert!(
                            (got - exact).abs() <= tol,
                            "{scheme}, tile {tile_rows}, token {t}, channel {o}: {got} vs {exact} (tol {tol})"
                        );
                    }
                }
            }
        }
    }
}

/// Against the original f32 weight, the quantized layer's error is bounded by the quantization
/// error: `|y_q - y| = |sum_i x_i (deq_i - w_i)| <= sum_i |x_i| * s_i / 2` (plus the f32 matmul
/// error of both products, covered by the same gamma_n term as above).
#[test]
fn quantized_output_error_is_bounded_by_half_scale_times_input_magnitude() {
    let [rows, cols] = [16, 256];
    let x = common::activations(cols, 21);
    let w = common::weights(rows * cols, 22);
    for scheme in ["int8", "int4-g32", "int4-g128-asym"] {
        let scheme: QuantScheme = scheme.parse().unwrap();
        let weight = QuantizedWeight::quantize(&w, [rows, cols], scheme).unwrap();
        let layer = QuantizedLinear::<B>::new(&weight, None, &Default::default()).unwrap();
        let input =
            Tensor::<B, 2>::from_data(TensorData::new(x.clone(), [1, cols]), &Default::default());
        let y = to_vec(layer.forward(input));
        for o in 0..rows {
            let exact: f64 = (0..cols)
                .map(|i| f64::from(x[i]) * f64::from(w[o * cols + i]))
                .sum();
            let bound: f64 = (0..cols)
                .map(|i| f64::from(x[i].abs()) * f64::from(weight.scale(o, i)) / 2.0)
                .sum();
            let magnitude: f64 = (0..cols)
                .map(|i| f64::from((x[i] * w[o * cols + i]).abs()) * 2.0)
                .sum();
            let tol = bound + cols as f64 * f64::from(f32::EPSILON) * magnitude;
            let err = (f64::from(y[o]) - exact).abs();
            assert!(
                err <= tol,
                "{scheme} channel {o}: error {err} > bound {tol}"
            );
        }
    }
}

/// `embed` gathers and dequantizes only the requested rows: each must equal the host row.
#[test]
fn embed_returns_the_dequantized_rows_of_the_ids() {
    let device = Default::default();
    for scheme in ["int8", "int4-g32-asym"] {
        let (weight, _, layer) = linear(scheme.parse().unwrap(), [50, 96], 31);
        let ids = [[3, 49, 3], [0, 17, 22]];
        let ids_tensor = Tensor::<B, 2, Int>::from_data(
            TensorData::new(
                ids.concat().iter().map(|&i| i as i32).collect::<Vec<_>>(),
                [2, 3],
            ),
            &device,
        );
        let rows = to_vec(layer.embed(ids_tensor));
        let host = weight.dequantize();
        for (k, &id) in ids.concat().iter().enumerate() {
            assert_eq!(
                &rows[k * 96..(k + 1) * 96],
                &host[id * 96..(id + 1) * 96],
                "{scheme} id {id}"
            );
        }
    }
}

/// Reading the device copy back reproduces the host weight exactly (codes, scales, mins).
#[test]
fn to_weight_reads_back_the_uploaded_weight() {
    for scheme in SCHEMES {
        let (weight, _, layer) = linear(scheme.parse().unwrap(), [10, 200], 41);
        assert_eq!(layer.to_weight().unwrap(), weight, "{scheme}");
    }
}

/// Device memory: INT8 keeps 1 byte per weight and INT4 half a byte, plus the f32 group params and
/// bias, i.e. about 4x and 8x below f32 (`memory_bytes` counts what was uploaded).
#[test]
fn memory_bytes_reflect_packed_codes() {
    let [rows, cols] = [64, 256];
    let (_, _, int8) = linear(QuantScheme::INT8, [rows, cols], 51);
    assert_eq!(int8.memory_bytes(), rows * cols + 4 * rows + 4 * rows);
    let scheme = QuantScheme::Int8 {
        granularity: Granularity::Group(64),
    };
    let (_, _, grouped) = linear(scheme, [rows, cols], 51);
    assert_eq!(
        grouped.memory_bytes(),
        rows * cols + 4 * rows * 4 + 4 * rows
    );
    let (_, _, int4) = linear(QuantScheme::INT4_G32, [rows, cols], 51);
    assert_eq!(
        int4.memory_bytes(),
        rows * cols / 2 + 4 * rows * 8 + 4 * rows
    );
}

/// `quantize` from a dense device tensor gives the same layer as quantizing the host values.
#[test]
fn quantize_from_dense_tensor_matches_host_quantization() {
    let device = Default::default();
    let w = common::weights(8 * 64, 61);
    let dense = Tensor::<B, 2>::from_data(TensorData::new(w.clone(), [8, 64]), &device);
    let layer = QuantizedLinear::quantize(dense, None, QuantScheme::INT4_G32).unwrap();
    let host = QuantizedWeight::quantize(&w, [8, 64], QuantScheme::INT4_G32).unwrap();
    assert_eq!(layer.to_weight().unwrap(), host);
}

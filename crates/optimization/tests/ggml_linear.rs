//! [`GgmlLinear`] products of every packed ggml type, exact and native paths (the native decode path both in
//! integer arithmetic, its default, and in f32), against the f64 product of the dequantized weight (whose values
//! are pinned bit for bit to ggml's by tests/ggml_blocks.rs).

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};
use ember_attention::GgmlProducts;
use ember_ggml::GgmlType;
use ember_optimization::{GgmlLinear, GgmlWeight};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Byte offsets of each block's f16 fields (ggml's block structs), which random bytes must not make NaN.
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        _ => &[0],
    }
}

/// A `[rows, cols]` weight of random valid blocks: every integer field random, f16 fields finite.
fn random_weight(ty: GgmlType, [rows, cols]: [usize; 2], rng: &mut ChaCha8Rng) -> GgmlWeight {
    let (block_len, block_bytes) = ty.block_geometry().unwrap();
    let n = rows * cols / block_len;
    let mut blocks = vec![0u8; n * block_bytes];
    rng.fill(&mut blocks[..]);
    for block in blocks.chunks_exact_mut(block_bytes) {
        for &at in f16_fields(ty) {
            let value = half::f16::from_f32(rng.random_range(-0.1f32..0.1));
            block[at..at + 2].copy_from_slice(&value.to_le_bytes());
        }
    }
    GgmlWeight::new(ty, [rows, cols], blocks).unwrap()
}

/// `x W^T + b` in f64; per element the sum of `|x_i w_i|` (plus `|b|`) that bounds its rounding error; and the
/// bound `Σ_i |w_i| d_i / 2` of the integer path's activation rounding (`d_i = max |x| / 127` over the 32-column
/// chunk holding column `i`).
fn reference(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    cols: usize,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let out = w.len() / cols;
    let mut exact = Vec::new();
    let mut scale = Vec::new();
    let mut activation = Vec::new();
    for row in x.chunks_exact(cols) {
        let steps: Vec<f64> = row
            .chunks_exact(32)
            .map(|c| f64::from(c.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0))
            .collect();
        for (o, w) in w.chunks_exact(cols).enumerate() {
            activation.push(
                w.iter()
                    .enumerate()
                    .map(|(i, &w)| f64::from(w).abs() * steps[i / 32] / 2.0)
                    .sum::<f64>(),
            );
            let b = bias.map_or(0.0, |b| f64::from(b[o]));
            let terms = row
                .iter()
                .zip(w)
                .map(|(&x, &w)| f64::from(x) * f64::from(w));
            exact.push(terms.clone().sum::<f64>() + b);
            scale.push(terms.map(f64::abs).sum::<f64>() + b.abs());
        }
    }
    assert_eq!(exact.len(), x.len() / cols * out);
    (exact, scale, activation)
}

#[test]
fn every_type_multiplies_like_the_f64_product_of_its_dequantized_weight() {
    let device = Default::default();
    let mut rng = ChaCha8Rng::seed_from_u64(22);
    // 130 output channels: three parallel tasks of the decode kernel, the last one partial. 512 columns: two
    // K-quant super-blocks, sixteen 32-element blocks.
    let [out, cols] = [130, 512];
    for ty in GgmlType::BLOCK_QUANTIZED {
        let weight = random_weight(ty, [out, cols], &mut rng);
        let w = weight.dequantize();
        let bias: Vec<f32> = (0..out).map(|_| rng.random_range(-1.0..1.0)).collect();
        for with_bias in [false, true] {
            let bias = with_bias.then_some(&bias[..]);
            let bias_tensor = bias
                .map(|b| Tensor::<Flex, 1>::from_data(TensorData::new(b.to_vec(), [out]), &device));
            let mut layer = GgmlLinear::<Flex>::new(weight.clone(), bias_tensor, &device).unwrap();
            // 1 and 3 rows take the decode kernel, 17 the tiled gemm path.
            for rows in [1, 3, 17] {
                let x: Vec<f32> = (0..rows * cols)
                    .map(|_| rng.random_range(-1.0..1.0))
                    .collect();
                let input =
                    Tensor::<Flex, 2>::from_data(TensorData::new(x.clone(), [rows, cols]), &device);
                let (exact, scale, activation) = reference(&x, &w, bias, cols);
                // Decode-sized inputs (up to 16 rows) take the integer path unless the exact one is chosen;
                // prompts do too on CPUs with AVX-512 VNNI.
                let integer = rows <= 16 || GgmlProducts::Integer.integer_prompts();
                let native = layer.forward(input.clone());
                layer.set_products(GgmlProducts::Exact);
                let native_f32 = layer.forward(input.clone());
                layer.set_products(GgmlProducts::Integer);
                let paths = [
                    ("native", native, integer),
                    ("native-f32", native_f32, false),
                    ("exact", layer.forward_exact(input), false),
                ];
                for (path, y, integer) in paths {
                    assert_eq!(y.dims(), [rows, out]);
                    let y = y.into_data().into_vec::<f32>().unwrap();
                    for (i, (&y, (&e, &s))) in y.iter().zip(exact.iter().zip(&scale)).enumerate() {
                        // Any f32 summation order of `cols` products plus the bias is within
                        // `(cols + 1) * u * sum |terms|` of the exact sum (u = eps / 2, the unit roundoff);
                        // `cols * eps` leaves a factor of two. A wrong block, scale or row is off by O(|y|).
                        // The integer path adds its activation rounding's bound (crates/attention's ggml decode
                        // tests pin the path itself to f32 rounding when that rounding is zero).
                        let tolerance = cols as f64 * f64::from(f32::EPSILON) * s
                            + if integer { activation[i] } else { 0.0 };
                        assert!(
                            (f64::from(y) - e).abs() <= tolerance,
                            "{ty} {path} rows={rows} bias={with_bias} element {i}: {y} vs {e} (tolerance {tolerance})"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn a_ggml_table_embeds_the_rows_it_is_asked_for_and_counts_its_bytes() {
    let device = Default::default();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let weight = random_weight(GgmlType::Q6_K, [10, 256], &mut rng);
    let table = GgmlLinear::<Flex>::new(weight.clone(), None, &device).unwrap();
    assert_eq!(table.memory_bytes(), 10 * 210);
    let ids = Tensor::<Flex, 2, burn::tensor::Int>::from_data(
        TensorData::new(vec![3i64, 9, 0], [1, 3]),
        &device,
    );
    let rows = table.embed(ids).into_data().into_vec::<f32>().unwrap();
    let expected: Vec<f32> = [3, 9, 0]
        .iter()
        .flat_map(|&r| weight.dequantize_rows(r, 1))
        .collect();
    assert_eq!(rows, expected);
    let wrong_bias = Tensor::<Flex, 1>::zeros([9], &device);
    assert!(GgmlLinear::<Flex>::new(weight, Some(wrong_bias), &device).is_err());
}

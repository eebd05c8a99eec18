//! The integer prompt path (AVX-512 VNNI) against the f64 product of the dequantized weights and against the
//! decode path, for every packed type, on row counts that leave partial row blocks and tiles.

use super::decode::{SHAPE, on_grid, product, random_blocks, reference};
use crate::cpu::ggml::decode::few_rows;
use crate::cpu::ggml::prompt::many_rows;
use crate::cpu::isa::Vnni;
use crate::cpu::tests::values;
use ember_ggml::{GgmlMatrix, GgmlType};

/// `many_rows` as a kernel of the decode path's signature; it must take the input (the caller checked VNNI).
fn gemm(x: &[f32], rows: usize, weight: GgmlMatrix<'_>, bias: Option<&[f32]>, dst: &mut [f32]) {
    assert!(many_rows(x, rows, weight, bias, dst), "VNNI declined");
}

fn vnni_or_skip() -> bool {
    let has = Vnni::detect().is_some();
    if !has {
        eprintln!(
            "skipped: this CPU lacks AVX-512 VNNI, so the integer prompt path never runs here"
        );
    }
    has
}

// 3 and 8: one paired block (eight rows, two lanes each), partial and full; 12: one unpaired block (a single
// block's chunks are packed across threads); 17: one full row block and one of a single row; 40: a tile of two
// blocks and a tile of one (partial); 64: two full tiles. SHAPE's 130 channels leave a tile of two channels
// after 32 of four.
const ROWS: [usize; 6] = [3, 8, 12, 17, 40, 64];

#[test]
fn on_grid_activations_make_the_integer_prompt_path_exact_up_to_f32_rounding() {
    if !vnni_or_skip() {
        return;
    }
    let [out, cols] = SHAPE;
    for (t, ty) in GgmlType::BLOCK_QUANTIZED.into_iter().enumerate() {
        let blocks = random_blocks(ty, SHAPE, 600 + t as u64);
        let weight = GgmlMatrix::new(ty, SHAPE, &blocks).unwrap();
        let bias = values(out, 8, 1.0);
        for rows in ROWS {
            let x = on_grid(rows * cols, 30 + rows as u64);
            let bias = (rows != 40).then_some(&bias[..]);
            let reference = reference(&x, rows, weight, bias);
            let y = product(gemm, &x, rows, weight, bias);
            for (i, (&y, &(exact, _, rounding))) in y.iter().zip(&reference).enumerate() {
                // The reference's f32 rounding bound: the integer sums are exact, each chunk's terms meet a few
                // f32 roundings (see the decode path's tests). A wrong lane, row or channel is off by O(|y|).
                assert!(
                    (f64::from(y) - exact).abs() <= rounding,
                    "{ty} rows={rows} element {i}: {y} vs {exact} (tolerance {rounding})"
                );
            }
        }
    }
}

#[test]
fn the_integer_prompt_path_agrees_with_the_decode_path_off_the_grid() {
    if !vnni_or_skip() {
        return;
    }
    let [out, cols] = SHAPE;
    for (t, (ty, rows)) in GgmlType::BLOCK_QUANTIZED
        .into_iter()
        .flat_map(|ty| [(ty, 7), (ty, 40)])
        .enumerate()
    {
        let blocks = random_blocks(ty, SHAPE, 700 + t as u64);
        let weight = GgmlMatrix::new(ty, SHAPE, &blocks).unwrap();
        let x = values(rows * cols, 40 + t as u64, 2.0);
        let reference = reference(&x, rows, weight, None);
        let y = product(gemm, &x, rows, weight, None);
        for r in 0..rows {
            // The decode path, row by row: the same activation chunks and exact integer sums, so the two differ
            // only by the f32 order of the per-chunk terms; both lie within the activation rounding's bound of
            // the exact product.
            let decode = product(few_rows, &x[r * cols..(r + 1) * cols], 1, weight, None);
            for (o, &decode) in decode.iter().enumerate() {
                let i = r * out + o;
                let (exact, activation, rounding) = reference[i];
                assert!(
                    (f64::from(y[i]) - f64::from(decode)).abs() <= 2.0 * rounding,
                    "{ty} row {r} channel {o}: prompt path {} vs decode path {decode}",
                    y[i]
                );
                assert!(
                    (f64::from(y[i]) - exact).abs() <= activation + rounding,
                    "{ty} row {r} channel {o}: {} vs {exact} (bound {activation} + {rounding})",
                    y[i]
                );
            }
        }
    }
}

#[test]
fn the_avx2_chunk_quantizer_makes_the_portable_ones_chunks_bit_for_bit() {
    use crate::cpu::ggml::q8::{Q8Chunk, quantize, quantize_chunk};
    use crate::cpu::isa::Avx2;
    let Some(avx2) = Avx2::detect() else {
        eprintln!("skipped: this CPU lacks AVX2, FMA or F16C");
        return;
    };
    let n = 64 * 32;
    let mut x = values(n, 9, 3.0);
    // Ties (x.5 steps), zeros, signed zeros, NaN, infinity, a lone extreme and tiny values, one chunk each.
    for (i, v) in x[..32].iter_mut().enumerate() {
        *v = (i as f32 - 16.0) * 0.5 * (127.0 / 8.0) / 127.0 * 16.0;
    }
    x[32..64].fill(0.0);
    x[64..96].fill(-0.0);
    x[100] = f32::NAN;
    x[140] = f32::INFINITY;
    x[170] = 1e30;
    x[200..232].iter_mut().for_each(|v| *v *= 1e-30);
    let mut portable = vec![Q8Chunk::default(); n / 32];
    quantize(&x, &mut portable);
    for (c, (values, want)) in x.chunks_exact(32).zip(&portable).enumerate() {
        let got = quantize_avx2(avx2, values);
        assert_eq!(got.q, want.q, "chunk {c}: integers");
        assert_eq!(got.d.to_bits(), want.d.to_bits(), "chunk {c}: scale");
        let bits = |s: [f32; 2]| s.map(|s| if s.is_nan() { u32::MAX } else { s.to_bits() });
        assert_eq!(bits(got.sums), bits(want.sums), "chunk {c}: half sums");
        assert_eq!(got.qsums, want.qsums, "chunk {c}: integer half sums");
    }

    /// `quantize_chunk` compiled with the features it assumes.
    fn quantize_avx2(avx2: Avx2, values: &[f32]) -> Q8Chunk {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn run(avx2: Avx2, values: &[f32]) -> Q8Chunk {
            quantize_chunk(avx2, values)
        }
        // SAFETY: `avx2` proves the features.
        unsafe { run(avx2, values) }
    }
}

#[test]
fn products_taken_together_equal_one_product_per_weight_bit_for_bit() {
    use burn::backend::Flex;

    use crate::cpu::tests::{floats, from_primitive, primitive, tensor};
    use crate::{EmberBackend, GgmlProducts};
    if !vnni_or_skip() {
        return;
    }
    // A layer's query, key and value (or a K-quant file's mix of types), biased and not. Each channel's sums
    // are the same operations in the same order whichever thread and hand-off run them, so the results taken
    // together must equal the separate ones exactly.
    let cols = 512;
    let specs = [
        (GgmlType::Q4_K, 96, true),
        (GgmlType::Q6_K, 32, false),
        (GgmlType::Q8_0, 37, true),
    ];
    let blocks: Vec<Vec<u8>> = specs
        .iter()
        .enumerate()
        .map(|(i, &(ty, out, _))| random_blocks(ty, [out, cols], 900 + i as u64))
        .collect();
    let weights: Vec<GgmlMatrix<'_>> = specs
        .iter()
        .zip(&blocks)
        .map(|(&(ty, out, _), b)| GgmlMatrix::new(ty, [out, cols], b).unwrap())
        .collect();
    for rows in [3, 8, 12, 40] {
        let x = tensor::<Flex, 2>([rows, cols], 60 + rows as u64, 2.0);
        let biases: Vec<_> = specs
            .iter()
            .enumerate()
            .map(|(i, &(_, out, biased))| {
                biased.then(|| primitive(tensor::<Flex, 1>([out], 70 + i as u64, 1.0)))
            })
            .collect();
        let together_in: Vec<_> = weights
            .iter()
            .copied()
            .zip(biases.iter().cloned())
            .collect();
        let together =
            Flex::ggml_dense_many(primitive(x.clone()), &together_in, GgmlProducts::Integer)
                .expect("the integer tiles take 3+ rows of block-quantized weights");
        assert_eq!(together.len(), weights.len());
        for (k, (together, (weight, bias))) in together.into_iter().zip(together_in).enumerate() {
            let alone = Flex::ggml_dense(primitive(x.clone()), weight, bias, GgmlProducts::Integer)
                .unwrap();
            let (together, alone) = (
                floats(from_primitive::<Flex, 2>(together)),
                floats(from_primitive::<Flex, 2>(alone)),
            );
            assert_eq!(together.len(), rows * specs[k].1);
            let same = together
                .iter()
                .zip(&alone)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "rows={rows} weight {k}: products together and separate differ"
            );
        }
    }
    // Too few rows for the tiles (the decode kernel's), or widths that do not match: the caller's loop.
    let x = tensor::<Flex, 2>([2, cols], 80, 1.0);
    let pairs: Vec<_> = weights.iter().map(|&w| (w, None)).collect();
    assert!(Flex::ggml_dense_many(primitive(x), &pairs, GgmlProducts::Integer).is_none());
    let narrow = tensor::<Flex, 2>([8, 256], 81, 1.0);
    assert!(Flex::ggml_dense_many(primitive(narrow), &pairs, GgmlProducts::Integer).is_none());
    // The exact products never take the tiles: the caller runs the float path per weight.
    let x = tensor::<Flex, 2>([8, cols], 82, 1.0);
    assert!(Flex::ggml_dense_many(primitive(x), &pairs, GgmlProducts::Exact).is_none());
}

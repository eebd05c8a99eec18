//! ember's GGML quantizer against ggml itself: the bytes `ggml_quantize_chunk` (no importance matrix) wrote
//! for hard rows (fixtures from `scripts/fixtures/ggml_quantize_fixtures.py`), the round trip through the
//! dequantizer, and the errors.

use std::path::PathBuf;

use ember_ggml::{GgmlType, QuantizeError, can_quantize, dequantize, quantize};

/// Every type `quantize` writes, by the names the fixtures use.
const TYPES: [GgmlType; 15] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Bf16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
];

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ggml_quantize")
}

struct Fixture {
    rows: usize,
    cols: usize,
    row_kinds: Vec<String>,
    input: Vec<f32>,
}

fn fixture() -> Fixture {
    let dir = fixture_dir();
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap();
    let rows = meta["rows"].as_u64().unwrap() as usize;
    let cols = meta["cols"].as_u64().unwrap() as usize;
    let row_kinds = meta["row_kinds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap().to_owned())
        .collect();
    let bytes = std::fs::read(dir.join("input.f32")).unwrap();
    let input: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(input.len(), rows * cols);
    Fixture {
        rows,
        cols,
        row_kinds,
        input,
    }
}

#[test]
fn every_type_matches_ggml_bit_for_bit() {
    let f = fixture();
    let mut failures = Vec::new();
    for ty in TYPES {
        let expected = std::fs::read(fixture_dir().join(format!("{ty}.bin"))).unwrap();
        let ours = quantize(ty, &f.input, f.cols).unwrap();
        assert_eq!(ours.len(), expected.len(), "{ty}: output length");
        let (block_len, block_bytes) = ty.block_geometry().unwrap();
        let blocks_per_row = f.cols / block_len;
        let differing: Vec<usize> = ours
            .chunks_exact(block_bytes)
            .zip(expected.chunks_exact(block_bytes))
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .map(|(i, _)| i)
            .collect();
        if let Some(&first) = differing.first() {
            let a = &ours[first * block_bytes..(first + 1) * block_bytes];
            let b = &expected[first * block_bytes..(first + 1) * block_bytes];
            let byte = a.iter().zip(b).position(|(x, y)| x != y).unwrap();
            let row = first / blocks_per_row;
            failures.push(format!(
                "{ty}: {} of {} blocks differ; first is block {first} (row {row}, `{}`, block {} of the row), \
                 byte {byte}: ember {:#04x}, ggml {:#04x}",
                differing.len(),
                ours.len() / block_bytes,
                f.row_kinds[row],
                first % blocks_per_row,
                a[byte],
                b[byte],
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    assert_eq!(f.rows * f.cols, f.input.len());
}

/// The largest `|x - dequantize(quantize(x))|` a type may leave, as `(rel, abs)`: `rel * amax + abs` for an
/// element of a block (a K-quant super-block) whose largest magnitude is `amax`.
///
/// `rel` is the type's level step as argued per type. `abs` covers scales that are f16 subnormals (tiny
/// blocks), whose rounding is absolute, up to 2^-25, and multiplies every unit of the largest product of
/// levels that scale meets; where a scale rounds to 0 it also covers the whole block, which then comes back
/// as zeros (tiny blocks lose everything, in ggml too).
fn error_bound(ty: GgmlType) -> (f32, f32) {
    // Relative rounding of a normal f16 scale.
    let f16_rel = 2f32.powi(-11);
    let sub = 2f32.powi(-25);
    match ty {
        GgmlType::F32 => (0.0, 0.0),
        // Per element, so rounding relative to the element (below amax).
        GgmlType::F16 => (f16_rel, sub),
        GgmlType::Bf16 => (2f32.powi(-8), 0.0),
        // Half a step of d = amax / 127, plus d's f16 rounding times up to 127 levels.
        GgmlType::Q8_0 => (0.5 / 127.0 + f16_rel, 127.0 * sub),
        // d = max / -8 maps the extreme to level -8 exactly; its opposite (+8 steps) clamps to 7, one whole step
        // of amax / 8 off, the most any element can be.
        GgmlType::Q4_0 => (1.0 / 8.0 + f16_rel, 8.0 * sub),
        // As Q4_0 with 16 levels each side.
        GgmlType::Q5_0 => (1.0 / 16.0 + f16_rel, 16.0 * sub),
        // Half a step of (max - min) / 15 (the range is at most 2 amax), plus the f16 rounding of d (times 15
        // levels) and of the minimum.
        GgmlType::Q4_1 => (1.0 / 15.0 + 3.0 * f16_rel, 16.0 * sub),
        GgmlType::Q5_1 => (1.0 / 31.0 + 3.0 * f16_rel, 32.0 * sub),
        other => searched_bound(other, sub),
    }
}

/// The searched types: their stored sub-block scales are rounded again (to 4, 6 or 8 bits of the super-block
/// scale), which can shrink a sub-block's grid so its extremes clamp, and a least-squares scale need not reach
/// the extremes at all, so an element can be off by up to a whole level step of the super-block's largest
/// sub-block scale (and, with minimums, the minimum's own rounding on top). `rel` is that step (the sub-block
/// range is at most 2 amax); `abs` the level products of the stored integer scales.
fn searched_bound(ty: GgmlType, sub: f32) -> (f32, f32) {
    match ty {
        // 2-bit levels: a step of up to 2 amax / 3; the 4-bit scales and minimums round by half a step of the
        // super-block's largest each.
        GgmlType::Q2_K => (0.5, 64.0 * sub),
        // Levels -4..3: a step of amax / 4 at the largest sub-block scale, plus the 6-bit scale's rounding.
        GgmlType::Q3_K => (0.3, 128.0 * sub),
        // 4-bit levels: a step of 2 amax / 15, plus the 6-bit scale and minimum roundings.
        GgmlType::Q4_K => (0.15, 1024.0 * sub),
        // 5-bit levels: a step of 2 amax / 31, plus the same roundings.
        GgmlType::Q5_K => (0.08, 2048.0 * sub),
        // Levels -32..31: a step of amax / 32, plus the 8-bit scale's rounding.
        GgmlType::Q6_K => (0.04, 4096.0 * sub),
        // The widest gaps of the IQ4 grid are 23-24 of its 127 (half: ~0.1 amax), its positive end falls 14/127
        // short of the negative, and the least-squares scale moves the grid by up to ~10%.
        GgmlType::IQ4_NL => (0.15, 128.0 * sub),
        GgmlType::IQ4_XS => (0.16, 4096.0 * sub),
        _ => unreachable!("{ty}"),
    }
}

/// Seeded rows of several scales in addition to the fixture's, so the bound is not only tested on those.
fn extra_rows(cols: usize) -> Vec<f32> {
    // A small LCG: the test needs variety, not statistical quality.
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let mut out = Vec::new();
    for scale in [1e-3f32, 0.05, 1.0, 300.0] {
        for _ in 0..cols {
            let v = next();
            out.push(scale * v * v * v);
        }
    }
    out
}

#[test]
fn round_trip_error_is_bounded() {
    let f = fixture();
    let mut values = f.input.clone();
    values.extend(extra_rows(f.cols));
    let mut failures = Vec::new();
    for ty in TYPES {
        let (rel, abs) = error_bound(ty);
        let (block_len, _) = ty.block_geometry().unwrap();
        let back = dequantize(ty, &quantize(ty, &values, f.cols).unwrap()).unwrap();
        assert_eq!(back.len(), values.len(), "{ty}");
        let mut worst = (0f32, 0usize);
        for (b, (xs, ys)) in values
            .chunks_exact(block_len.max(32))
            .zip(back.chunks_exact(block_len.max(32)))
            .enumerate()
        {
            let amax = xs.iter().fold(0f32, |m, x| m.max(x.abs()));
            let bound = rel * amax + abs;
            for (i, (x, y)) in xs.iter().zip(ys).enumerate() {
                let err = (x - y).abs();
                if amax > 0.0 {
                    worst.0 = worst.0.max((err - abs).max(0.0) / amax);
                }
                if err > bound {
                    worst.1 += 1;
                    if worst.1 == 1 {
                        failures.push(format!(
                            "{ty}: element {} of block {b}: {x} came back {y}, error {err} > {bound}",
                            i,
                        ));
                    }
                }
            }
        }
        println!(
            "{ty}: worst error {:.5} of the block's amax (bound {rel:.5})",
            worst.0
        );
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn errors_name_the_problem() {
    let values = vec![0.25f32; 512];
    let other = GgmlType::Other(16);
    assert!(!can_quantize(other));
    assert_eq!(
        quantize(other, &values, 256),
        Err(QuantizeError::Unsupported(other))
    );
    assert!(
        QuantizeError::Unsupported(other)
            .to_string()
            .contains("IQ2_XXS")
    );
    assert_eq!(
        quantize(GgmlType::Q4_K, &values, 128),
        Err(QuantizeError::Cols {
            ty: GgmlType::Q4_K,
            cols: 128,
            block_len: 256,
        })
    );
    let cols_message = quantize(GgmlType::Q8_0, &values, 48)
        .unwrap_err()
        .to_string();
    assert!(
        cols_message.contains("48") && cols_message.contains("32"),
        "{cols_message}"
    );
    assert_eq!(
        quantize(GgmlType::Q8_0, &values[..500], 64),
        Err(QuantizeError::Length { len: 500, cols: 64 })
    );
    assert_eq!(
        quantize(GgmlType::Q4_0, &[1.0], 0),
        Err(QuantizeError::Length { len: 1, cols: 0 })
    );
    assert_eq!(quantize(GgmlType::Q4_0, &[], 0), Ok(Vec::new()));
    for ty in TYPES {
        assert!(can_quantize(ty), "{ty}");
    }
}

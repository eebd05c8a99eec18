//! Quantize → dequantize error bounds of every scheme, against independently computed group
//! statistics.

mod common;

use ember_optimization::{Granularity, QuantError, QuantScheme, QuantizedWeight};

/// Schemes under test; `in_features = 200` leaves a partial last group for every group size.
fn schemes() -> Vec<QuantScheme> {
    let mut schemes = vec![
        QuantScheme::INT8,
        QuantScheme::Int8 {
            granularity: Granularity::Group(32),
        },
    ];
    for group_size in [32, 64, 128] {
        for symmetric in [true, false] {
            schemes.push(QuantScheme::Int4 {
                group_size,
                symmetric,
            });
        }
    }
    schemes
}

/// Per-element check of `|w - deq(q(w))| <= s / 2`.
///
/// Why the bound holds: symmetric codes are `round(w / s)` with `s = max|w| / qmax`, so
/// `|w / s| <= qmax` never clamps and the rounding error is at most 1/2 a step; asymmetric codes
/// are `round((w - m) / s)` with `(w - m) / s` in `[0, 15]`, again at most 1/2 a step.
/// The slack covers f32 rounding in `w / s`, `c * s` and `+ m`: each is one rounding of a value no
/// larger than `max|w| + (max - min)`, so `4 * eps * (max|w| + range)` is generous.
#[test]
fn dequantize_error_is_within_half_a_scale_step_for_every_scheme() {
    let [rows, cols] = [12, 200];
    let weights = common::weights(rows * cols, 1);
    for scheme in schemes() {
        let q = QuantizedWeight::quantize(&weights, [rows, cols], scheme).unwrap();
        let deq = q.dequantize();
        let group = scheme.group_len(cols);
        let mut worst_ratio = 0.0f64;
        for row in 0..rows {
            for start in (0..cols).step_by(group) {
                let idx = row * cols + start..row * cols + (start + group).min(cols);
                let block = &weights[idx.clone()];
                let amax = block.iter().fold(0.0f32, |a, w| a.max(w.abs()));
                let (lo, hi) = block
                    .iter()
                    .fold((f32::MAX, f32::MIN), |(l, h), &w| (l.min(w), h.max(w)));
                let scale = q.scale(row, start);
                // The scale is exactly the scheme's definition, computed independently here.
                let expected_scale = if scheme.is_asymmetric() {
                    (hi - lo) / 15.0
                } else {
                    amax / if scheme.bits() == 8 { 127.0 } else { 7.0 }
                };
                assert_eq!(scale, expected_scale, "{scheme} row {row} group at {start}");
                let slack = 4.0 * f32::EPSILON * (amax + (hi - lo));
                for i in idx {
                    let err = (weights[i] - deq[i]).abs();
                    assert!(
                        err <= scale / 2.0 + slack,
                        "{scheme}: element {i}: |{} - {}| = {err} > s/2 = {}",
                        weights[i],
                        deq[i],
                        scale / 2.0
                    );
                    worst_ratio = worst_ratio.max(f64::from(err) / f64::from(scale / 2.0));
                }
            }
        }
        // Round-to-nearest errors spread over the whole half step: with 2400 elements the worst
        // one lands close to the bound, so the bound is tight rather than vacuous.
        assert!(
            worst_ratio > 0.9,
            "{scheme}: worst error ratio {worst_ratio}"
        );
    }
}

/// Symmetric schemes map 0.0 to the zero code and an all-zero group to scale 0, both exact.
#[test]
fn symmetric_schemes_represent_zero_exactly() {
    let mut weights = common::weights(4 * 64, 2);
    weights[..64].fill(0.0);
    weights[70] = 0.0;
    for scheme in [QuantScheme::INT8, QuantScheme::INT4_G32] {
        let q = QuantizedWeight::quantize(&weights, [4, 64], scheme).unwrap();
        let deq = q.dequantize();
        assert_eq!(q.scale(0, 0), 0.0, "{scheme}");
        assert!(deq[..64].iter().all(|&v| v == 0.0), "{scheme}");
        assert_eq!(deq[70], 0.0, "{scheme}");
        assert_eq!(q.code(1, 6), scheme.zero_code().unwrap(), "{scheme}");
    }
}

/// The largest-magnitude element of a symmetric group gets the extreme code (±qmax), and an
/// asymmetric group's minimum and maximum get codes 0 and 15, so the full range is used.
#[test]
fn extreme_elements_take_the_extreme_codes() {
    let weights = vec![0.5, -1.0, 0.25, 0.75, -0.5, 0.0, 0.125, 2.0];
    let sym = QuantizedWeight::quantize(
        &weights,
        [1, 8],
        QuantScheme::Int4 {
            group_size: 8,
            symmetric: true,
        },
    )
    .unwrap();
    assert_eq!(sym.code(0, 7), 8 + 7);
    let asym = QuantizedWeight::quantize(
        &weights,
        [1, 8],
        QuantScheme::Int4 {
            group_size: 8,
            symmetric: false,
        },
    )
    .unwrap();
    assert_eq!((asym.code(0, 1), asym.code(0, 7)), (0, 15));
    assert_eq!(asym.dequantize()[1], -1.0);
    let int8 = QuantizedWeight::quantize(&weights, [1, 8], QuantScheme::INT8).unwrap();
    // -0.5 / (2 / 127) = -31.75 rounds to -32, far from a rounding tie.
    assert_eq!((int8.code(0, 7), int8.code(0, 4)), (128 + 127, 128 - 32));
}

/// Packed storage is what the schemes promise: 1 byte (INT8) or 1/2 byte (INT4) per weight plus
/// 4 bytes per group for the scale (and 4 more for the minimum when asymmetric).
#[test]
fn storage_bytes_match_the_packed_layout() {
    let [rows, cols] = [64, 256];
    let weights = common::weights(rows * cols, 3);
    let cases = [
        (QuantScheme::INT8, rows * cols + 4 * rows),
        (QuantScheme::INT4_G32, rows * cols / 2 + 4 * rows * 8),
        (
            "int4-g128-asym".parse().unwrap(),
            rows * cols / 2 + 8 * rows * 2,
        ),
    ];
    for (scheme, expected) in cases {
        let q = QuantizedWeight::quantize(&weights, [rows, cols], scheme).unwrap();
        assert_eq!(q.storage_bytes(), expected, "{scheme}");
    }
}

#[test]
fn scheme_strings_round_trip_and_bad_ones_are_rejected() {
    for text in ["int8", "int8-g32", "int4-g32", "int4-g64", "int4-g128-asym"] {
        let scheme: QuantScheme = text.parse().unwrap();
        assert_eq!(scheme.to_string(), text);
    }
    // Bare `int4` is the asymmetric grid (Q4_1's); a spelled group size is symmetric unless `-asym` follows.
    assert_eq!("int4".parse::<QuantScheme>().unwrap(), QuantScheme::INT4);
    assert_eq!(QuantScheme::INT4.to_string(), "int4-g32-asym");
    assert_eq!(
        "int4-sym".parse::<QuantScheme>().unwrap(),
        QuantScheme::INT4_G32
    );
    assert!(matches!(
        "int4-g12".parse::<QuantScheme>(),
        Err(QuantError::InvalidGroupSize { group_size: 12 })
    ));
    for bad in ["int3", "int8-asym", "int4-gx", "int4-g32-g64", ""] {
        assert!(
            matches!(
                bad.parse::<QuantScheme>(),
                Err(QuantError::UnknownScheme { .. })
            ),
            "{bad}"
        );
    }
}

#[test]
fn quantize_rejects_bad_input_with_named_errors() {
    let mut weights = vec![0.5f32; 64];
    assert!(matches!(
        QuantizedWeight::quantize(&weights, [2, 64], QuantScheme::INT8),
        Err(QuantError::LengthMismatch {
            expected: 128,
            actual: 64,
            ..
        })
    ));
    weights[37] = f32::NAN;
    assert!(matches!(
        QuantizedWeight::quantize(&weights, [2, 32], QuantScheme::INT8),
        Err(QuantError::NonFinite { row: 1, col: 5, .. })
    ));
}

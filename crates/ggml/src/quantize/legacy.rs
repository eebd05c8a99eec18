//! ggml's reference quantizers of the 32-element block types (`quantize_row_q4_0_ref` ... `quantize_row_q8_0_ref`):
//! one scale (and for Q4_1/Q5_1 a minimum) straight from the block's extremes, no search.
//!
//! Each function writes one block of [`BLOCK_LEN`] values of `x` into `out` (the block's whole byte length, as
//! [`crate::legacy`] reads it back). The float-to-integer conversions are C's truncating casts, as the
//! shipped x86-64 library performs them ([`c_trunc`]), so even out-of-range values narrow to the same bytes.

use super::f16_le;
use super::search::c_trunc;
use crate::legacy::BLOCK_LEN;

const HALF: usize = BLOCK_LEN / 2;

/// The element of largest magnitude (the first on ties), ggml's `amax < fabsf(v)` scan.
fn signed_abs_max(x: &[f32]) -> f32 {
    super::search::abs_max(x).1
}

/// The block's minimum and maximum, from ggml's `FLT_MAX` / `-FLT_MAX` start.
fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// `1 / d`, or 0 where `d` is 0 (an all-zero block quantizes to level 0 rather than NaN).
fn inverse(d: f32) -> f32 {
    if d != 0.0 { 1.0 / d } else { 0.0 }
}

/// `[d: f16][qs: 16]`: `d = max / -8`, the extreme maps to level 0 and its opposite to 16, clamped to 15.
pub(super) fn q4_0(x: &[f32], out: &mut [u8]) {
    let d = signed_abs_max(x) / -8.0;
    let id = inverse(d);
    out[0..2].copy_from_slice(&f16_le(d).0);
    for j in 0..HALF {
        let level = |v: f32| (c_trunc(v * id + 8.5) as i8).min(15) as u8;
        out[2 + j] = level(x[j]) | (level(x[HALF + j]) << 4);
    }
}

/// `[d: f16][m: f16][qs: 16]`: `d = (max - min) / 15`, `m = min`.
pub(super) fn q4_1(x: &[f32], out: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = inverse(d);
    out[0..2].copy_from_slice(&f16_le(d).0);
    out[2..4].copy_from_slice(&f16_le(min).0);
    for j in 0..HALF {
        let level = |v: f32| (c_trunc((v - min) * id + 0.5) as i8).min(15) as u8;
        out[4 + j] = level(x[j]) | (level(x[HALF + j]) << 4);
    }
}

/// The 5-bit levels `q` of a block as Q5_0/Q5_1 store them: low nibbles in `qs` (element `j` and `j + 16` share
/// byte `j`), bit 4 of element `i` as bit `i` of the returned `qh` word.
fn pack_five_bit(qs: &mut [u8], level: impl Fn(usize) -> u8) -> u32 {
    let mut qh = 0u32;
    for (j, q) in qs[..HALF].iter_mut().enumerate() {
        let (q0, q1) = (level(j), level(HALF + j));
        *q = (q0 & 0x0F) | ((q1 & 0x0F) << 4);
        qh |= u32::from((q0 & 0x10) >> 4) << j;
        qh |= u32::from((q1 & 0x10) >> 4) << (j + HALF);
    }
    qh
}

/// `[d: f16][qh: u32][qs: 16]`: `d = max / -16`, levels clamped to 31.
pub(super) fn q5_0(x: &[f32], out: &mut [u8]) {
    let d = signed_abs_max(x) / -16.0;
    let id = inverse(d);
    out[0..2].copy_from_slice(&f16_le(d).0);
    let qh = pack_five_bit(&mut out[6..22], |i| {
        (c_trunc(x[i] * id + 16.5) as i8).min(31) as u8
    });
    out[2..6].copy_from_slice(&qh.to_le_bytes());
}

/// `[d: f16][m: f16][qh: u32][qs: 16]`: `d = (max - min) / 31`, `m = min`; ggml does not clamp these levels.
pub(super) fn q5_1(x: &[f32], out: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = inverse(d);
    out[0..2].copy_from_slice(&f16_le(d).0);
    out[2..4].copy_from_slice(&f16_le(min).0);
    let qh = pack_five_bit(&mut out[8..24], |i| c_trunc((x[i] - min) * id + 0.5) as u8);
    out[4..8].copy_from_slice(&qh.to_le_bytes());
}

/// `[d: f16][qs: i8 x 32]`: `d = amax / 127`, levels rounded half away from zero (C's `roundf`).
pub(super) fn q8_0(x: &[f32], out: &mut [u8]) {
    // ggml's `MAX(amax, fabsf(v))`, which keeps the running maximum only when it compares greater.
    let amax = x
        .iter()
        .fold(0f32, |amax, &v| if amax > v.abs() { amax } else { v.abs() });
    let d = amax / 127.0;
    let id = inverse(d);
    out[0..2].copy_from_slice(&f16_le(d).0);
    for (q, &v) in out[2..2 + BLOCK_LEN].iter_mut().zip(x) {
        *q = c_trunc((v * id).round()) as u8;
    }
}

//! The 256-element super-block types (ggml's `block_q2_K` ... `block_q6_K`, `block_iq4_xs`): one f16 scale for
//! the super-block and small integer scales for its 16- or 32-element sub-blocks.
//!
//! Each function expands one super-block into `out[..256]` with ggml's reference `dequantize_row_*` float
//! operations in the same order (`d * scale` first, then times the weight, minus the scaled minimum), so values
//! match ggml and the `gguf` Python package bit for bit.

use super::f16_at;
use super::legacy::IQ4_LEVELS;

/// Elements in a K-quant super-block (ggml's `QK_K`).
pub const QK_K: usize = 256;

/// `[scales: 16][qs: 64][d: f16][dmin: f16]`: 16-element sub-block `s` has scale `scales[s] & 15` and minimum
/// `scales[s] >> 4`; element `e = 128h + 32j + l` is bits `2j..2j+2` of `qs[32h + l]`;
/// `x = (d * sc) * q - dmin * m`.
#[inline(always)]
pub fn q2_k(b: &[u8], out: &mut [f32]) {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    for (s, out) in out[..QK_K].chunks_exact_mut(16).enumerate() {
        let dl = d * f32::from(scales[s] & 0x0F);
        let ml = dmin * f32::from(scales[s] >> 4);
        for (i, x) in out.iter_mut().enumerate() {
            let e = 16 * s + i;
            let (h, j, l) = (e / 128, (e % 128) / 32, e % 32);
            let q = (qs[32 * h + l] >> (2 * j)) & 0x03;
            *x = dl * f32::from(q) - ml;
        }
    }
}

/// The sixteen 6-bit scales of Q3_K, unsigned (0..64): the low nibbles are those of bytes 0..8 (scales 0..8)
/// then their high nibbles (scales 8..16); the top two bits of scale `s` are bit pair `s / 4` of byte `8 + s % 4`.
#[inline(always)]
pub fn q3_k_scale(scales: &[u8], s: usize) -> u8 {
    let low = (scales[s % 8] >> (4 * (s / 8))) & 0x0F;
    let high = (scales[8 + s % 4] >> (2 * (s / 4))) & 0x03;
    low | (high << 4)
}

/// `[hmask: 32][qs: 64][scales: 12][d: f16]`: element `e = 128h + 32j + l` has low bits `2j..2j+2` of
/// `qs[32h + l]` and loses 4 unless bit `e / 32` of `hmask[l]` is set; `x = (d * (sc - 32)) * q`.
#[inline(always)]
pub fn q3_k(b: &[u8], out: &mut [f32]) {
    let (hmask, qs, scales) = (&b[0..32], &b[32..96], &b[96..108]);
    let d = f16_at(b, 108);
    for (s, out) in out[..QK_K].chunks_exact_mut(16).enumerate() {
        let dl = d * f32::from(q3_k_scale(scales, s) as i8 - 32);
        for (i, x) in out.iter_mut().enumerate() {
            let e = 16 * s + i;
            let (h, j, l) = (e / 128, (e % 128) / 32, e % 32);
            let low = ((qs[32 * h + l] >> (2 * j)) & 0x03) as i8;
            let high = if (hmask[l] >> (e / 32)) & 1 == 1 {
                0
            } else {
                4
            };
            *x = dl * f32::from(low - high);
        }
    }
}

/// The eight 6-bit `(scale, min)` pairs packed into 12 bytes (ggml's `get_scale_min_k4`): bytes 0..4 hold the low
/// six bits of scales 0..4, bytes 4..8 those of mins 0..4, bytes 8..12 the low nibbles of scales/mins 4..8, whose
/// top two bits are the top bits of bytes 0..8.
#[inline(always)]
pub fn scale_min_k4(scales: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 0x3F, scales[j + 4] & 0x3F)
    } else {
        let sc = (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4);
        let m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
        (sc, m)
    }
}

/// Shared by Q4_K and Q5_K: `[d: f16][dmin: f16][scales: 12]` then weights; sub-block `j` of 32 elements is
/// `x = (d * sc_j) * q - dmin * m_j`, with `q` from `weight(j, l)`.
#[inline(always)]
fn k4_family(b: &[u8], out: &mut [f32], weight: impl Fn(usize, usize) -> u8) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    for (j, out) in out[..QK_K].chunks_exact_mut(32).enumerate() {
        let (sc, m) = scale_min_k4(scales, j);
        let (dl, ml) = (d * f32::from(sc), dmin * f32::from(m));
        for (l, x) in out.iter_mut().enumerate() {
            *x = dl * f32::from(weight(j, l)) - ml;
        }
    }
}

/// Q4_K: 128 bytes of nibbles after the scales; sub-blocks `2c` and `2c + 1` are the low and high nibbles of the
/// 32 bytes `qs[32c..32c + 32]`.
#[inline(always)]
pub fn q4_k(b: &[u8], out: &mut [f32]) {
    let qs = &b[16..144];
    k4_family(b, out, |j, l| {
        (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F
    });
}

/// Q5_K: `qh[32]` then `qs[128]` after the scales; as Q4_K plus bit `j` of `qh[l]` as the weight's bit 4.
#[inline(always)]
pub fn q5_k(b: &[u8], out: &mut [f32]) {
    let qh = &b[16..48];
    let qs = &b[48..176];
    k4_family(b, out, |j, l| {
        let low = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F;
        low | (((qh[l] >> j) & 1) << 4)
    });
}

/// `[ql: 128][qh: 64][scales: i8 x 16][d: f16]`: each 128-element half `h` takes its low four bits from
/// `ql[64h..64h + 64]` (low nibbles for elements 0..64, high for 64..128) and its top two bits from bit pair
/// `i / 32` of `qh[32h + i % 32]`; `x = (d * scale[e / 16]) * (q - 32)`.
#[inline(always)]
pub fn q6_k(b: &[u8], out: &mut [f32]) {
    let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    for (e, x) in out[..QK_K].iter_mut().enumerate() {
        let (h, i) = (e / 128, e % 128);
        let low = (ql[64 * h + i % 64] >> (4 * (i / 64))) & 0x0F;
        let high = (qh[32 * h + i % 32] >> (2 * (i / 32))) & 0x03;
        let q = i32::from(low | (high << 4)) - 32;
        let scale = d * f32::from(scales[e / 16] as i8);
        *x = scale * q as f32;
    }
}

/// `[d: f16][scales_h: u16][scales_l: 4][qs: 128]`: 32-element sub-block `s` has the 6-bit scale
/// `(nibble s of scales_l) | (bit pair s of scales_h) << 4`, minus 32, and its 16 bytes `qs[16s..16s + 16]` hold
/// IQ4_NL indices ordered as Q4_0's; `x = (d * sc) * IQ4_LEVELS[q]`.
#[inline(always)]
pub fn iq4_xs(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    let (scales_l, qs) = (&b[4..8], &b[8..136]);
    for (s, out) in out[..QK_K].chunks_exact_mut(32).enumerate() {
        let low = (scales_l[s / 2] >> (4 * (s % 2))) & 0x0F;
        let high = ((scales_h >> (2 * s)) & 0x03) as u8;
        let dl = d * f32::from((low | (high << 4)) as i8 - 32);
        let qs = &qs[16 * s..16 * s + 16];
        for (i, x) in out.iter_mut().enumerate() {
            let q = super::legacy::nibble(qs, i);
            *x = dl * f32::from(IQ4_LEVELS[usize::from(q)]);
        }
    }
}

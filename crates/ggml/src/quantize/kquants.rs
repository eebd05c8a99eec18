//! ggml's reference quantizers of the 256-element K-quant super-blocks (`quantize_row_q2_K_ref` ...
//! `quantize_row_q6_K_ref`): each sub-block's scale (and minimum) is searched for ([`super::search`]), the
//! super-block stores them as small integers times one or two f16 scales, and every weight is then chosen
//! again for the scale actually stored.
//!
//! Each function writes one super-block of [`QK_K`] values of `x` into `out`, in the layout
//! [`crate::kquants`] reads back.

use super::f16_le;
use super::search::{
    AffineSearch, GROUP_MAX_EPS, make_q3_quants, make_qkx2_quants, make_qx_quants, nearest_int,
    pack_scale_min_k4,
};
use crate::kquants::{QK_K, q3_k_scale, scale_min_k4};

/// Packs 2-bit levels as Q2_K and Q3_K store them: element `128h + 32j + l` is bits `2j..2j+2` of byte
/// `32h + l`.
fn pack_two_bit(levels: &[u8; QK_K], qs: &mut [u8]) {
    for h in 0..QK_K / 128 {
        let levels = &levels[128 * h..];
        for l in 0..32 {
            qs[32 * h + l] =
                levels[l] | (levels[l + 32] << 2) | (levels[l + 64] << 4) | (levels[l + 96] << 6);
        }
    }
}

/// `[scales: 16][qs: 64][d: f16][dmin: f16]`: sixteen 16-element sub-blocks with 4-bit scales and minimums.
pub(super) fn q2_k(x: &[f32], out: &mut [u8]) {
    const SEARCH: AffineSearch = AffineSearch {
        nmax: 3,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: true,
    };
    let mut levels = [0u8; QK_K];
    let mut aux = [0u8; 16];
    let mut weights = [0f32; 16];
    let (mut scales, mut mins) = ([0f32; 16], [0f32; 16]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for (j, xs) in x.chunks_exact(16).enumerate() {
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = v.abs();
        }
        let levels = &mut levels[16 * j..16 * j + 16];
        (scales[j], mins[j]) = make_qkx2_quants(&SEARCH, xs, &weights, levels, &mut aux);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }

    let mut packed = [0u8; 16];
    let d = if max_scale > 0.0 {
        let iscale = 15.0 / max_scale;
        for (p, &s) in packed.iter_mut().zip(&scales) {
            *p = nearest_int(iscale * s) as u8;
        }
        f16_le(max_scale / 15.0)
    } else {
        f16_le(0.0)
    };
    let dmin = if max_min > 0.0 {
        let iscale = 15.0 / max_min;
        for (p, &m) in packed.iter_mut().zip(&mins) {
            *p |= (nearest_int(iscale * m) << 4) as u8;
        }
        f16_le(max_min / 15.0)
    } else {
        f16_le(0.0)
    };

    for (j, xs) in x.chunks_exact(16).enumerate() {
        let dl = d.1 * f32::from(packed[j] & 0x0F);
        // A sub-block of zero scale keeps the search's levels (they decode to `-dm` alike).
        if dl == 0.0 {
            continue;
        }
        let dm = dmin.1 * f32::from(packed[j] >> 4);
        for (l, &v) in levels[16 * j..16 * j + 16].iter_mut().zip(xs) {
            *l = nearest_int((v + dm) / dl).clamp(0, 3) as u8;
        }
    }

    out[0..16].copy_from_slice(&packed);
    pack_two_bit(&levels, &mut out[16..80]);
    out[80..82].copy_from_slice(&d.0);
    out[82..84].copy_from_slice(&dmin.0);
}

/// `[hmask: 32][qs: 64][scales: 12][d: f16]`: sixteen 16-element sub-blocks with 6-bit signed scales, 3-bit
/// levels whose top bit lives in `hmask`.
pub(super) fn q3_k(x: &[f32], out: &mut [u8]) {
    let mut levels = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut amax) = (0f32, 0f32);
    for (j, xs) in x.chunks_exact(16).enumerate() {
        scales[j] = make_q3_quants(4, xs, &mut levels[16 * j..16 * j + 16]);
        if scales[j].abs() > amax {
            amax = scales[j].abs();
            max_scale = scales[j];
        }
    }

    let mut packed = [0u8; 12];
    // C's `if (max_scale)`: NaN counts as set.
    let d = if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for (j, &s) in scales.iter().enumerate() {
            // ggml narrows to `int8_t` before clamping.
            let l = ((nearest_int(iscale * s) as i8).clamp(-32, 31) + 32) as u8;
            if j < 8 {
                packed[j] = l & 0x0F;
            } else {
                packed[j - 8] |= (l & 0x0F) << 4;
            }
            packed[8 + j % 4] |= (l >> 4) << (2 * (j / 4));
        }
        f16_le(1.0 / iscale)
    } else {
        f16_le(0.0)
    };

    for (j, xs) in x.chunks_exact(16).enumerate() {
        let dl = d.1 * f32::from(q3_k_scale(&packed, j) as i8 - 32);
        if dl == 0.0 {
            continue;
        }
        for (l, &v) in levels[16 * j..16 * j + 16].iter_mut().zip(xs) {
            *l = (nearest_int(v / dl).clamp(-4, 3) + 4) as i8;
        }
    }

    // Bit 2 of element `e` goes to bit `e / 32` of `hmask[e % 32]`; the low two bits stay.
    let mut hmask = [0u8; QK_K / 8];
    let mut low = [0u8; QK_K];
    for (e, (&l, low)) in levels.iter().zip(low.iter_mut()).enumerate() {
        let mut l = l;
        if l > 3 {
            hmask[e % 32] |= 1 << (e / 32);
            l -= 4;
        }
        *low = l as u8;
    }

    out[0..32].copy_from_slice(&hmask);
    pack_two_bit(&low, &mut out[32..96]);
    out[96..108].copy_from_slice(&packed);
    out[108..110].copy_from_slice(&d.0);
}

/// Shared by Q4_K and Q5_K: searches each 32-element sub-block's scale and minimum (weights `rms + |x|`),
/// writes `[d: f16][dmin: f16][scales: 12]` into `header` and returns the levels (`0..=search.nmax`) for the
/// stored scales.
fn k4_family(x: &[f32], search: &AffineSearch, header: &mut [u8]) -> [u8; QK_K] {
    let mut levels = [0u8; QK_K];
    let mut aux = [0u8; 32];
    let mut weights = [0f32; 32];
    let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for (j, xs) in x.chunks_exact(32).enumerate() {
        let mut sum_x2 = 0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let levels = &mut levels[32 * j..32 * j + 32];
        (scales[j], mins[j]) = make_qkx2_quants(search, xs, &weights, levels, &mut aux);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }

    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let packed = &mut header[4..16];
    for j in 0..8 {
        // ggml narrows to `uint8_t` before the clamp.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        pack_scale_min_k4(packed, j, ls, lm);
    }
    let d = f16_le(max_scale / 63.0);
    let dmin = f16_le(max_min / 63.0);

    let nmax = search.nmax;
    for (j, xs) in x.chunks_exact(32).enumerate() {
        let (sc, m) = scale_min_k4(packed, j);
        let dl = d.1 * f32::from(sc);
        if dl == 0.0 {
            continue;
        }
        let dm = dmin.1 * f32::from(m);
        for (l, &v) in levels[32 * j..32 * j + 32].iter_mut().zip(xs) {
            *l = nearest_int((v + dm) / dl).clamp(0, nmax) as u8;
        }
    }
    header[0..2].copy_from_slice(&d.0);
    header[2..4].copy_from_slice(&dmin.0);
    levels
}

/// `[d: f16][dmin: f16][scales: 12][qs: 128]`: eight 32-element sub-blocks, 4-bit levels; sub-blocks `2c` and
/// `2c + 1` share bytes `32c..32c + 32` as low and high nibbles.
pub(super) fn q4_k(x: &[f32], out: &mut [u8]) {
    const SEARCH: AffineSearch = AffineSearch {
        nmax: 15,
        rmin: -1.0,
        rdelta: 0.1,
        nstep: 20,
        use_mad: false,
    };
    let levels = k4_family(x, &SEARCH, &mut out[0..16]);
    let qs = &mut out[16..144];
    for c in 0..QK_K / 64 {
        for l in 0..32 {
            qs[32 * c + l] = levels[64 * c + l] | (levels[64 * c + 32 + l] << 4);
        }
    }
}

/// `[d: f16][dmin: f16][scales: 12][qh: 32][qs: 128]`: as Q4_K with 5-bit levels, bit 4 of sub-block `j`'s
/// element `l` as bit `j` of `qh[l]`.
pub(super) fn q5_k(x: &[f32], out: &mut [u8]) {
    const SEARCH: AffineSearch = AffineSearch {
        nmax: 31,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: false,
    };
    let levels = k4_family(x, &SEARCH, &mut out[0..16]);
    let (qh, qs) = out[16..176].split_at_mut(32);
    qh.fill(0);
    for c in 0..QK_K / 64 {
        for l in 0..32 {
            let (lo, hi) = (levels[64 * c + l], levels[64 * c + 32 + l]);
            qh[l] |= ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1));
            qs[32 * c + l] = (lo & 0x0F) | ((hi & 0x0F) << 4);
        }
    }
}

/// `[ql: 128][qh: 64][scales: i8 x 16][d: f16]`: sixteen 16-element sub-blocks with 8-bit signed scales,
/// 6-bit levels offset by 32.
pub(super) fn q6_k(x: &[f32], out: &mut [u8]) {
    let mut levels = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
    for (ib, xs) in x.chunks_exact(16).enumerate() {
        scales[ib] = make_qx_quants(32, xs, &mut levels[16 * ib..16 * ib + 16]);
        if scales[ib].abs() > max_abs_scale {
            max_abs_scale = scales[ib].abs();
            max_scale = scales[ib];
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        out.fill(0);
        return;
    }

    let iscale = -128.0 / max_scale;
    let d = f16_le(1.0 / iscale);
    let mut packed = [0i8; 16];
    for (p, &s) in packed.iter_mut().zip(&scales) {
        *p = nearest_int(iscale * s).min(127) as i8;
    }
    for (j, xs) in x.chunks_exact(16).enumerate() {
        let dl = d.1 * f32::from(packed[j]);
        if dl == 0.0 {
            continue;
        }
        for (l, &v) in levels[16 * j..16 * j + 16].iter_mut().zip(xs) {
            *l = (nearest_int(v / dl).clamp(-32, 31) + 32) as i8;
        }
    }

    let (ql, rest) = out.split_at_mut(QK_K / 2);
    let (qh, rest) = rest.split_at_mut(QK_K / 4);
    for h in 0..QK_K / 128 {
        let level = |i: usize| levels[128 * h + i] as u8;
        for l in 0..32 {
            let (q1, q2, q3, q4) = (level(l), level(l + 32), level(l + 64), level(l + 96));
            ql[64 * h + l] = (q1 & 0x0F) | ((q3 & 0x0F) << 4);
            ql[64 * h + l + 32] = (q2 & 0x0F) | ((q4 & 0x0F) << 4);
            qh[32 * h + l] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
        }
    }
    for (b, &s) in rest[..16].iter_mut().zip(&packed) {
        *b = s as u8;
    }
    rest[16..18].copy_from_slice(&d.0);
}

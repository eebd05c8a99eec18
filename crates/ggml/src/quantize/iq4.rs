//! ggml's IQ4_NL and IQ4_XS quantizers (`quantize_row_iq4_nl_impl` as `ggml_quantize_chunk` calls it: no
//! importance weights, seven tries either side): 4-bit indices into the non-uniform [`IQ4_LEVELS`] grid.
//!
//! IQ4_NL is one 32-element block with an f16 scale; IQ4_XS is a 256-element super-block of eight such
//! sub-blocks whose scales are re-expressed as 6-bit multiples of one f16 scale, after which every index is
//! chosen again for the scale actually stored.

use super::f16_le;
use super::search::{GROUP_MAX_EPS, abs_max, nearest_int};
use crate::kquants::QK_K;
use crate::legacy::{BLOCK_LEN, IQ4_LEVELS};

/// The tries either side of the plain scale (ggml's `ntry` for `quantize_iq4_nl` / `quantize_iq4_xs`).
const NTRY: i32 = 7;

/// The index of the grid level nearest `x` (the upper one on ties), as ggml's `best_index_int8`.
fn best_index(x: f32) -> u8 {
    let level = |i: usize| f32::from(IQ4_LEVELS[i]);
    let last = IQ4_LEVELS.len() - 1;
    if x <= level(0) {
        return 0;
    }
    if x >= level(last) {
        return last as u8;
    }
    let (mut lo, mut hi) = (0, last);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < level(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - level(hi - 1) < level(hi) - x {
        (hi - 1) as u8
    } else {
        hi as u8
    }
}

/// The least-squares scale of one 32-element sub-block: the fit of the indices that `max` mapped to the grid's
/// end gives, then of `2 NTRY + 1` neighbouring spacings, keeping the best `x^2`-weighted fit; 0 for an all-zero
/// sub-block.
fn sub_block_scale(x: &[f32]) -> f32 {
    let (amax, max) = abs_max(x);
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let first = f32::from(IQ4_LEVELS[0]);
    // The weighted sums sum(w q x) and sum(w q^2) of the indices that `id` maps `x` to.
    let sums = |id: f32| {
        let (mut sumqx, mut sumq2) = (0f32, 0f32);
        for &v in x {
            let q = f32::from(IQ4_LEVELS[usize::from(best_index(id * v))]);
            let w = v * v;
            sumqx += w * q * v;
            sumq2 += w * q * q;
        }
        (sumqx, sumq2)
    };
    let (sumqx, sumq2) = sums(1.0 / (-max / first));
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -NTRY..=NTRY {
        // ggml adds the integers first, then converts.
        let (sumqx, sumq2) = sums((itry + i32::from(IQ4_LEVELS[0])) as f32 / max);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Packs 32 indices of `levels` into 16 bytes the way Q4_0 orders nibbles (element `j` low, `j + 16` high).
fn pack_indices(levels: &[u8], qs: &mut [u8]) {
    for j in 0..BLOCK_LEN / 2 {
        qs[j] = levels[j] | (levels[j + BLOCK_LEN / 2] << 4);
    }
}

/// `[d: f16][qs: 16]`.
pub(super) fn iq4_nl(x: &[f32], out: &mut [u8]) {
    let d = sub_block_scale(x);
    out[0..2].copy_from_slice(&f16_le(d).0);
    // Indices for the unrounded f32 scale, as ggml picks them.
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut levels = [0u8; BLOCK_LEN];
    for (l, &v) in levels.iter_mut().zip(x) {
        *l = best_index(id * v);
    }
    pack_indices(&levels, &mut out[2..18]);
}

/// `[d: f16][scales_h: u16][scales_l: 4][qs: 128]`: sub-block `ib`'s scale is `d * (l - 32)` for a 6-bit `l`
/// split into a nibble of `scales_l` and a bit pair of `scales_h`.
pub(super) fn iq4_xs(x: &[f32], out: &mut [u8]) {
    const SUBS: usize = QK_K / BLOCK_LEN;
    let mut scales = [0f32; SUBS];
    let (mut max_scale, mut amax_scale) = (0f32, 0f32);
    for (scale, xb) in scales.iter_mut().zip(x.chunks_exact(BLOCK_LEN)) {
        *scale = sub_block_scale(xb);
        if scale.abs() > amax_scale {
            amax_scale = scale.abs();
            max_scale = *scale;
        }
    }
    // ggml keeps this f32 `d`, not its f16 rounding, for the indices below.
    let d = -max_scale / 32.0;
    out[0..2].copy_from_slice(&f16_le(d).0);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut scales_h = 0u16;
    let mut scales_l = [0u8; SUBS / 2];
    let mut levels = [0u8; BLOCK_LEN];
    for (ib, (&scale, xb)) in scales.iter().zip(x.chunks_exact(BLOCK_LEN)).enumerate() {
        let l = nearest_int(id * scale).clamp(-32, 31);
        let dl = d * l as f32;
        let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
        for (q, &v) in levels.iter_mut().zip(xb) {
            *q = best_index(idl * v);
        }
        pack_indices(&levels, &mut out[8 + 16 * ib..8 + 16 * ib + 16]);
        let l = (l + 32) as u8;
        scales_l[ib / 2] |= (l & 0x0F) << (4 * (ib % 2));
        scales_h |= u16::from(l >> 4) << (2 * ib);
    }
    out[2..4].copy_from_slice(&scales_h.to_le_bytes());
    out[4..8].copy_from_slice(&scales_l);
}

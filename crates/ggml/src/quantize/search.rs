//! The scale searches ggml's reference quantizers share (`nearest_int`, `make_qx_quants`, `make_q3_quants`,
//! `make_qkx2_quants` of `ggml-quants.c`), with ggml's float operations in ggml's order.
//!
//! Bit-exactness with ggml hangs on that order: every sum is accumulated left to right in f32, every product is
//! associated as C's left-to-right `w*x*l` is (`(w * x) * l`), integers are widened to f32 where C promotes them,
//! and nothing is fused into a multiply-add (Rust never contracts; the shipped x86-64 `libggml-base` is built
//! without FMA, so neither does it).

/// Below this absolute maximum a group counts as all zero (ggml's `GROUP_MAX_EPS`).
pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

/// `x` rounded to the nearest integer, ties to even, by ggml's magic-number trick: adding 1.5 * 2^23 leaves the
/// rounded value in the low mantissa bits.
///
/// Exact for `|x| <= 2^22 - 1`, as in ggml; beyond that (or for NaN) the result is a meaningless integer, which
/// every caller clamps, so it never panics.
#[inline(always)]
pub(super) fn nearest_int(x: f32) -> i32 {
    let bits = (x + 12_582_912.0).to_bits() as i32;
    (bits & 0x007F_FFFF) - 0x0040_0000
}

/// C's `(int)` conversion of a float as x86-64 performs it (`cvttss2si`): truncation toward zero, and the
/// "integer indefinite" `i32::MIN` for NaN or a value out of range, where Rust's `as` would saturate instead.
/// The legacy quantizers narrow the result to a byte the way C does (`as u8`/`as i8`, keeping the low bits).
#[inline(always)]
pub(super) fn c_trunc(x: f32) -> i32 {
    if x.is_nan() || !(-2_147_483_648.0..2_147_483_648.0).contains(&x) {
        i32::MIN
    } else {
        x as i32
    }
}

/// The element of largest magnitude of `x` (the first one on ties) and that magnitude; `(0, 0)` for an empty or
/// all-zero group. NaNs never win the comparison, as in ggml.
#[inline(always)]
pub(super) fn abs_max(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

/// Symmetric levels `levels[i] = nmax + clamp(round(x[i] / scale), -nmax, nmax - 1)` and their scale, as
/// ggml's `make_qx_quants` with `rmse_type == 1` and no importance weights (the one way the reference Q6_K
/// quantizer calls it): the weights are `x^2`, and nineteen candidate scales around `max / nmax` are tried for
/// the least weighted squared error.
pub(super) fn make_qx_quants(nmax: i32, x: &[f32], levels: &mut [i8]) -> f32 {
    let (amax, max) = abs_max(x);
    if amax < GROUP_MAX_EPS {
        levels.fill(0);
        return 0.0;
    }
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    // The weighted sums sum(w x l) and sum(w l^2) for the levels of `iscale`.
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0f32, 0f32);
        for &v in x {
            let l = level(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let mut write_levels = |iscale: f32| {
        for (out, &v) in levels.iter_mut().zip(x) {
            *out = (nmax + level(iscale, v)) as i8;
        }
    };

    let iscale = -(nmax as f32) / max;
    write_levels(iscale);
    let (sumlx, suml2) = sums(iscale);
    // C's `suml2 ? ... : 0`: a NaN sum counts as non-zero there too.
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            write_levels(iscale);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Symmetric levels in `0..2 nmax` and their (signed) scale, as ggml's `make_q3_quants` with `do_rmse` (the
/// reference Q3_K quantizer's call): start from `max / nmax`, then up to five passes that move single levels
/// whenever that lowers the `x^2`-weighted error of the least-squares scale.
pub(super) fn make_q3_quants(nmax: i32, x: &[f32], levels: &mut [i8]) -> f32 {
    let (amax, max) = abs_max(x);
    if amax < GROUP_MAX_EPS {
        levels.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for (out, &v) in levels.iter_mut().zip(x) {
        let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *out = l as i8;
        let (w, l) = (v * v, l as f32);
        sumlx += w * v * l;
        suml2 += w * l * l;
    }
    for _ in 0..5 {
        let mut changed = false;
        for (out, &v) in levels.iter_mut().zip(x) {
            let w = v * v;
            let current = f32::from(*out);
            let mut slx = sumlx - w * v * current;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * current * current;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != i32::from(*out) {
                    let l = new_l as f32;
                    slx += w * v * l;
                    sl2 += w * l * l;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *out = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    for out in levels.iter_mut() {
        *out = out.wrapping_add(nmax as i8);
    }
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}

/// The search of ggml's `make_qkx2_quants`: the parameters of one asymmetric sub-block's least-squares fit.
pub(super) struct AffineSearch {
    /// The largest level (levels are `0..=nmax`).
    pub nmax: i32,
    /// The first candidate's offset from `nmax` levels across the range.
    pub rmin: f32,
    /// The step between candidates.
    pub rdelta: f32,
    /// Candidates after the first (`nstep + 1` in all).
    pub nstep: i32,
    /// Whether the error is weighted absolute (true) or weighted squared.
    pub use_mad: bool,
}

/// Asymmetric levels `levels[i] = clamp(round((x[i] - min) / scale), 0, nmax)` for `x ~ scale * l - the_min`,
/// returning `(scale, the_min)`, as ggml's `make_qkx2_quants`: from the plain range fit, try `nstep + 1` level
/// spacings, refit scale and minimum by weighted least squares for each (the minimum never above 0), and keep
/// the one of least weighted error. `aux` is scratch of `x.len()` levels.
pub(super) fn make_qkx2_quants(
    search: &AffineSearch,
    x: &[f32],
    weights: &[f32],
    levels: &mut [u8],
    aux: &mut [u8],
) -> (f32, f32) {
    let AffineSearch {
        nmax,
        rmin,
        rdelta,
        nstep,
        use_mad,
    } = *search;
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for (&v, &w) in x.iter().zip(weights).skip(1) {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
        sum_w += w;
        sum_x += w * v;
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        levels.fill(0);
        return (0.0, -min);
    }
    let error = |scale: f32, min: f32, levels: &[u8]| {
        let mut total = 0f32;
        for ((&l, &v), &w) in levels.iter().zip(x).zip(weights) {
            let diff = scale * f32::from(l) + min - v;
            total += w * if use_mad { diff.abs() } else { diff * diff };
        }
        total
    };
    // `min` is an argument because ggml's loop keeps using the variable it overwrites with each better fit:
    // later candidates are spaced, and levelled, from the minimum found so far.
    let quantize = |iscale: f32, min: f32, out: &mut [u8]| {
        for (out, &v) in out.iter_mut().zip(x) {
            *out = nearest_int(iscale * (v - min)).clamp(0, nmax) as u8;
        }
    };

    let iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    quantize(iscale, min, levels);
    let mut best_error = error(scale, min, levels);
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        let iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        quantize(iscale, min, aux);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for ((&l, &v), &w) in aux.iter().zip(x).zip(weights) {
            let l = f32::from(l);
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * v;
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let this_error = error(this_scale, this_min, aux);
            if this_error < best_error {
                levels.copy_from_slice(aux);
                best_error = this_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Packs sub-block `j`'s 6-bit scale `ls` and minimum `lm` (both `<= 63`) into the 12 bytes of a Q4_K/Q5_K
/// super-block, the layout [`crate::kquants::scale_min_k4`] reads back. Sub-blocks 0..4 must come first:
/// they assign bytes 0..8, whose top bits 4..8 then OR in.
pub(super) fn pack_scale_min_k4(scales: &mut [u8], j: usize, ls: u8, lm: u8) {
    if j < 4 {
        scales[j] = ls;
        scales[j + 4] = lm;
    } else {
        scales[j + 4] = (ls & 0x0F) | ((lm & 0x0F) << 4);
        scales[j - 4] |= (ls >> 4) << 6;
        scales[j] |= (lm >> 4) << 6;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_ties_to_even() {
        for (x, n) in [
            (0.5, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (3.49, 3),
            (-7.6, -8),
        ] {
            assert_eq!(nearest_int(x), n, "{x}");
        }
        // Out of range or NaN: garbage, but no panic.
        let _ = (
            nearest_int(f32::NAN),
            nearest_int(f32::INFINITY),
            nearest_int(-1e30),
        );
    }

    #[test]
    fn c_trunc_is_x86_cvttss2si() {
        assert_eq!(c_trunc(16.9), 16);
        assert_eq!(c_trunc(-0.7), 0);
        assert_eq!(c_trunc(f32::NAN), i32::MIN);
        assert_eq!(c_trunc(f32::INFINITY), i32::MIN);
        assert_eq!(c_trunc(3e9), i32::MIN);
    }
}

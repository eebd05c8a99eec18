//! The scalar math the kernels share, written so that LLVM vectorises it, and the switch that compiles a kernel
//! loop for AVX2 + FMA when the CPU has them (the default x86-64 target only assumes SSE2).

/// Evaluates an expression compiled with AVX2 and FMA enabled when the running CPU supports them, else as
/// compiled: `vectorized!(loop_or_call)`.
///
/// The expression, and the `#[inline(always)]` math it calls, is inlined into a function carrying those target
/// features, so its loops vectorise 8 lanes wide. That inlining is LLVM's choice, and it declined for some
/// kernels, leaving their loops out of line in SSE2 (RMSNorm's and the quantized product's, found with `nm`: a
/// five-byte `avx2_fma` that jumps to the closure). Two things make it reliable: the crate is one codegen unit
/// in release builds (Cargo.toml), so the closure is visible where it is called; and this is a macro rather than
/// a function taking a closure, so the AVX2 closure has a single call site (the fallback evaluates its own copy
/// of the expression), which LLVM inlines whatever its size.
macro_rules! vectorized {
    ($body:expr) => {{
        #[cfg(target_arch = "x86_64")]
        {
            if $crate::cpu::simd::has_avx2_fma() {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2_fma<R>(f: impl FnOnce() -> R) -> R {
                    f()
                }
                // SAFETY: the CPU supports both features, checked just above.
                unsafe { avx2_fma(|| $body) }
            } else {
                $body
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            $body
        }
    }};
}
pub(crate) use vectorized;

/// Whether the running CPU has AVX2 and FMA (`is_x86_feature_detected!` caches the answer).
#[inline]
pub(crate) fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `e^x` for f32 within 2 ulp on `[-87, 88]` (Cephes' `expf`: `x = n ln 2 + r` with `|r| <= ln 2 / 2`, a
/// degree-7 polynomial in `r`, then `2^n` put in the exponent bits). Inputs below -87 give about `e^-87`
/// (1.6e-38; the kernels divide by `1 + e^x`, where that is 1), above 88 about `e^88`. Branch-free, so a loop
/// over it vectorises; libm's `expf`, which burn-flex calls per element, does not.
#[inline(always)]
pub(super) fn exp(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in a part exact in f32 and the rest, so `x - n ln 2` keeps its low bits.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 * 2^23: adding and subtracting it rounds to the nearest integer in the current rounding mode.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let n = (x * LOG2_E + ROUND) - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let p = p * r * r + r + 1.0;
    // n is in [-126, 127]: a normal power of two.
    let scale = f32::from_bits(((n as i32 + 127) << 23) as u32);
    p * scale
}

/// `sigmoid(x) = 1 / (1 + e^-x)`.
#[inline(always)]
pub(super) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in units in the last place between two finite f32 of the same sign.
    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn exp_is_within_two_ulp_of_the_correctly_rounded_value() {
        let mut worst = 0;
        let mut x = -87.0f32;
        while x < 88.0 {
            // f64's exp rounded once to f32 is the correctly rounded reference (to within one rare tie).
            let reference = (x as f64).exp() as f32;
            worst = worst.max(ulps(exp(x), reference));
            x += 0.000_731;
        }
        assert!(worst <= 2, "worst error {worst} ulp");
    }

    #[test]
    fn exp_saturates_instead_of_overflowing() {
        assert!(exp(-1000.0) > 0.0 && exp(-1000.0) < 1e-37);
        assert!(exp(1000.0).is_finite() && exp(1000.0) > 1e38);
        assert!(exp(f32::NAN).is_nan());
        assert!(sigmoid(-1000.0) < 1e-37);
        assert_eq!(sigmoid(1000.0), 1.0);
    }

    #[test]
    fn the_vectorized_path_computes_what_the_scalar_one_does() {
        let xs: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 0.173).collect();
        let scalar: Vec<f32> = xs.iter().map(|&x| exp(x)).collect();
        let vector = vectorized!(xs.iter().map(|&x| exp(x)).collect::<Vec<_>>());
        assert_eq!(scalar, vector);
    }
}

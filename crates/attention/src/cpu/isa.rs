//! Instruction-set tokens: zero-sized proofs that the running CPU has a set of x86 features, made only by their
//! `detect()`. A kernel that holds one may call functions compiled with those features (`#[target_feature]`),
//! so the choice of SIMD path is made at run time, once per call, never by build flags. The integer products
//! ([`super::ggml`]) take them; [`super::simd`] holds the AVX2 switch of the float kernels.

use std::arch::x86_64::*;

use ember_ggml::unpack::F16Reader;

use super::simd::has_avx2_fma;

/// Proof that the running CPU has AVX2, FMA and F16C (every AVX2 CPU made has F16C, but it is a separate
/// flag): only [`Avx2::detect`] makes one. Its methods are inlined into functions compiled with those
/// features (`typed_avx2`), where the intrinsics become single instructions.
#[derive(Clone, Copy, Debug)]
pub(in crate::cpu) struct Avx2(());

impl Avx2 {
    pub(in crate::cpu) fn detect() -> Option<Self> {
        (has_avx2_fma() && std::arch::is_x86_feature_detected!("f16c")).then_some(Self(()))
    }
}

impl F16Reader for Avx2 {
    #[inline(always)]
    fn f16(self, b: &[u8], at: usize) -> f32 {
        let h = u16::from_le_bytes([b[at], b[at + 1]]);
        // SAFETY: `self` proves F16C; `vcvtph2ps` widens exactly, as `f16_at` does.
        unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h)))) }
    }
}

/// Proof that the running CPU has AVX-512 F, BW, VL and VNNI besides AVX2, FMA and F16C: only
/// [`Vnni::detect`] makes one.
#[derive(Clone, Copy, Debug)]
pub(in crate::cpu) struct Vnni(pub(in crate::cpu) Avx2);

impl Vnni {
    pub(in crate::cpu) fn detect() -> Option<Self> {
        use std::arch::is_x86_feature_detected as has;
        let avx2 = Avx2::detect()?;
        (has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni"))
            .then_some(Self(avx2))
    }
}

/// Proof that the running CPU has AVX-VNNI besides AVX2, FMA and F16C: only [`AvxVnni::detect`] makes one.
#[derive(Clone, Copy, Debug)]
pub(in crate::cpu) struct AvxVnni(pub(in crate::cpu) Avx2);

impl AvxVnni {
    pub(in crate::cpu) fn detect() -> Option<Self> {
        let avx2 = Avx2::detect()?;
        std::arch::is_x86_feature_detected!("avxvnni").then_some(Self(avx2))
    }
}

/// Both VNNI forms widen f16 scales as [`Avx2`] does.
macro_rules! f16_through_avx2 {
    ($($token:ident),*) => {$(
        impl F16Reader for $token {
            #[inline(always)]
            fn f16(self, b: &[u8], at: usize) -> f32 {
                self.0.f16(b, at)
            }
        }
    )*};
}

f16_through_avx2!(Vnni, AvxVnni);

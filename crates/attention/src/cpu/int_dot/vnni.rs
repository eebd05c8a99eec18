//! AVX-512 VNNI for the integer-dot kernels: the decode path's [`Dot`] with `vpdpbusd` on 256-bit registers
//! (one instruction for AVX2's `maddubs` + `madd`, and no 16-bit intermediate), and the proof of the features
//! the prompt path's tiles ([`crate::cpu::int_gemm`]) are compiled with.

use std::arch::x86_64::*;

use super::avx2::{Avx2, Weight, apply_maps};
use super::{Dot, F16Reader, IntChunk, Q8Chunk, Unpack};

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

impl F16Reader for Vnni {
    #[inline(always)]
    fn f16(self, b: &[u8], at: usize) -> f32 {
        self.0.f16(b, at)
    }
}

/// Every step but the multiply-add is AVX2's: the same registers, loads and sums.
impl Dot for Vnni {
    type Acc = __m256;
    type Weight = Weight;

    #[inline(always)]
    fn signed<U: Unpack>(self) -> bool {
        self.0.signed::<U>()
    }

    #[inline(always)]
    fn prepare_of<U: Unpack>(self, w: &IntChunk) -> Weight {
        self.0.prepare_of::<U>(w)
    }

    #[inline(always)]
    fn load<U: Unpack>(self, b: &[u8]) -> Weight {
        self.0.load::<U>(b)
    }

    #[inline(always)]
    fn zero(self) -> __m256 {
        self.0.zero()
    }

    #[inline(always)]
    fn prepare<const SIGNED: bool>(self, w: &IntChunk) -> Weight {
        self.0.prepare::<SIGNED>(w)
    }

    #[inline(always)]
    fn madd<const SIGNED: bool, const MIN: bool>(
        self,
        acc: __m256,
        w: &Weight,
        x: &Q8Chunk,
    ) -> __m256 {
        // SAFETY: `self` proves AVX2, FMA, AVX-512 VL and VNNI; the load reads the 32 bytes of `x.q`.
        unsafe {
            let q = _mm256_loadu_si256(x.q.as_ptr().cast());
            let x_bytes = if SIGNED {
                _mm256_sign_epi8(q, w.signs)
            } else {
                q
            };
            // Lanes 0..4 sum the first half's products four at a time, 4..8 the second's: AVX2's layout.
            let sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), w.bytes, x_bytes);
            apply_maps::<MIN>(acc, sums, w, x)
        }
    }

    #[inline(always)]
    fn sum(self, acc: [__m256; 2]) -> f32 {
        self.0.sum(acc)
    }
}

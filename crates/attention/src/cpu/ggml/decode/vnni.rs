//! VNNI for the integer-dot kernels: the decode path's [`Dot`] with `vpdpbusd` on 256-bit registers (one
//! instruction for AVX2's `maddubs` + `madd`, and no 16-bit intermediate), in its AVX-512 form (AVX-512 VL +
//! VNNI, whose token also proves the features the prompt path's tiles, [`crate::cpu::ggml::prompt`], are compiled
//! with) and its VEX form (AVX-VNNI, on CPUs with VNNI but no AVX-512).

use std::arch::x86_64::*;

use super::avx2::{Weight, apply_maps};
use super::{Dot, IntChunk, Q8Chunk, Unpack};
use crate::cpu::isa::{AvxVnni, Vnni};

/// The [`Dot`] of a VNNI token, whose `vpdpbusd` is `$dpbusd`: every step but the multiply-add is AVX2's, the
/// same registers, loads and sums.
macro_rules! vnni_dot {
    ($token:ident, $dpbusd:ident) => {
        impl Dot for $token {
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
                // SAFETY: `self` proves AVX2, FMA and this form of VNNI; the load reads the 32 bytes of `x.q`.
                unsafe {
                    let q = _mm256_loadu_si256(x.q.as_ptr().cast());
                    let x_bytes = if SIGNED {
                        _mm256_sign_epi8(q, w.signs)
                    } else {
                        q
                    };
                    // Lanes 0..4 sum the first half's products four at a time, 4..8 the second's: AVX2's layout.
                    let sums = $dpbusd(_mm256_setzero_si256(), w.bytes, x_bytes);
                    apply_maps::<MIN>(acc, sums, w, x)
                }
            }

            #[inline(always)]
            fn sum(self, acc: [__m256; 2]) -> f32 {
                self.0.sum(acc)
            }
        }
    };
}

vnni_dot!(Vnni, _mm256_dpbusd_epi32);
vnni_dot!(AvxVnni, _mm256_dpbusd_avx_epi32);

//! The decode path's [`super::Dot`] on AVX2 + FMA + F16C ([`Avx2`]).

use std::arch::x86_64::*;

use super::{Dot, F16Reader, IntChunk, Q8Chunk, Unpack};
use crate::cpu::isa::Avx2;
use ember_ggml::GgmlType;
use ember_ggml::legacy::IQ4_LEVELS;

/// A weight chunk in registers: the bytes `maddubs` multiplies (their magnitudes, for signed types, whose
/// signs go to the activations), the signs, each half's scale in its four lanes of the sums, and the two
/// minimums in lanes 0 and 1 (the lanes the activations' two half sums are broadcast to; every lane is summed
/// at the end).
#[derive(Clone, Copy, Debug)]
pub(in crate::cpu) struct Weight {
    pub(super) bytes: __m256i,
    pub(super) signs: __m256i,
    pub(super) scale: __m256,
    pub(super) min: __m256,
}

impl Weight {
    /// Its four registers as lanes, for tests that compare two ways of making one.
    #[cfg(test)]
    pub(in crate::cpu) fn lanes(&self) -> [[u32; 8]; 4] {
        // SAFETY: each field is 32 bytes of plain data.
        unsafe {
            [
                std::mem::transmute::<__m256i, [u32; 8]>(self.bytes),
                std::mem::transmute::<__m256i, [u32; 8]>(self.signs),
                std::mem::transmute::<__m256, [u32; 8]>(self.scale),
                std::mem::transmute::<__m256, [u32; 8]>(self.min),
            ]
        }
    }
}

/// The 32 nibbles of a legacy block's 16 bytes `qs`, in element order: the low nibbles, then the high.
#[inline(always)]
unsafe fn nibbles(qs: &[u8]) -> __m256i {
    // SAFETY (for the caller): AVX2; the load reads `qs[..16]`, which the slice index checks.
    unsafe {
        let bytes = _mm_loadu_si128(qs[..16].as_ptr().cast());
        let low = _mm_set1_epi8(0x0F);
        _mm256_set_m128i(
            _mm_and_si128(_mm_srli_epi16(bytes, 4), low),
            _mm_and_si128(bytes, low),
        )
    }
}

/// `0x10` in byte `i` where bit `i` of the little-endian `qh[..4]` is set: the fifth bits of Q5_0/Q5_1.
#[inline(always)]
unsafe fn fifth_bits(qh: &[u8]) -> __m256i {
    // SAFETY (for the caller): AVX2.
    unsafe {
        let word = i32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
        // Byte `i` takes byte `i / 8` of the word (`pshufb` picks within each 128-bit lane, and every lane
        // holds the whole word), then keeps only bit `i % 8`.
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(word),
            _mm256_setr_epi8(
                0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3,
                3, 3, 3, 3,
            ),
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }
}

/// `acc + sums * w.scale * x.d`, plus `w.min * x.sums` with `MIN`: the step after the integer products, whose
/// `sums` hold the first half's in lanes 0..4 and the second's in 4..8 (one scale each).
#[inline(always)]
pub(super) unsafe fn apply_maps<const MIN: bool>(
    acc: __m256,
    sums: __m256i,
    w: &Weight,
    x: &Q8Chunk,
) -> __m256 {
    // SAFETY (for the caller): AVX2 and FMA; the loads read `x.d` and the 8 bytes of `x.sums` (unaligned).
    unsafe {
        let sums = _mm256_cvtepi32_ps(sums);
        let scale = _mm256_mul_ps(w.scale, _mm256_broadcast_ss(&x.d));
        let acc = _mm256_fmadd_ps(sums, scale, acc);
        if MIN {
            // Both half sums in every pair of lanes: one 8-byte broadcast (`sums` need not be 8-aligned).
            let pair = std::ptr::read_unaligned(x.sums.as_ptr().cast::<i64>());
            let halves = _mm256_castsi256_ps(_mm256_set1_epi64x(pair));
            _mm256_fmadd_ps(w.min, halves, acc)
        } else {
            acc
        }
    }
}

/// An unsigned chunk `w = d * q + min`.
#[inline(always)]
unsafe fn unsigned(q: __m256i, d: f32, min: f32) -> Weight {
    // SAFETY (for the caller): AVX.
    unsafe {
        Weight {
            bytes: q,
            signs: q,
            scale: _mm256_set1_ps(d),
            min: _mm256_setr_ps(min, min, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
        }
    }
}

/// A signed chunk `w = d * q`.
#[inline(always)]
unsafe fn signed(q: __m256i, d: f32) -> Weight {
    // SAFETY (for the caller): AVX2.
    unsafe {
        Weight {
            bytes: _mm256_sign_epi8(q, q),
            signs: q,
            scale: _mm256_set1_ps(d),
            min: _mm256_setzero_ps(),
        }
    }
}

impl Dot for Avx2 {
    type Acc = __m256;
    type Weight = Weight;

    /// The types whose minimum is an integer offset times the scale take it into their integers, signed, as
    /// ggml's kernels do: Q4_0 `q - 8` and Q5_0 `q - 16` as loaded, Q3_K `q - 4` and Q6_K `q - 32` as
    /// prepared. No minimum term then, so a row's multiply-add is two instructions shorter.
    #[inline(always)]
    fn signed<U: Unpack>(self) -> bool {
        U::SIGNED || U::OFFSET != 0
    }

    #[inline(always)]
    fn prepare_of<U: Unpack>(self, w: &IntChunk) -> Weight {
        if U::SIGNED {
            return self.prepare::<true>(w);
        }
        match U::OFFSET {
            0 => self.prepare::<false>(w),
            offset => {
                // SAFETY: `self` proves AVX2; the load reads exactly the 32 bytes of `w.q`.
                unsafe {
                    let q = _mm256_loadu_si256(w.q.as_ptr().cast());
                    let q = _mm256_sub_epi8(q, _mm256_set1_epi8(offset));
                    Weight {
                        bytes: _mm256_sign_epi8(q, q),
                        signs: q,
                        scale: _mm256_setr_m128(_mm_set1_ps(w.scale[0]), _mm_set1_ps(w.scale[1])),
                        min: _mm256_setzero_ps(),
                    }
                }
            }
        }
    }

    /// The legacy types' blocks straight into registers (their layouts as [`ember_ggml::unpack`] reads
    /// them); the same values as `prepare(unpack(b))`, without the round trip through memory.
    #[inline(always)]
    fn load<U: Unpack>(self, b: &[u8]) -> Weight {
        // SAFETY: `self` proves AVX2 and F16C; every load is of a checked subslice of `b`.
        unsafe {
            match U::TYPE {
                GgmlType::Q4_0 => signed(
                    _mm256_sub_epi8(nibbles(&b[2..18]), _mm256_set1_epi8(U::OFFSET)),
                    self.f16(b, 0),
                ),
                GgmlType::Q4_1 => unsigned(nibbles(&b[4..20]), self.f16(b, 0), self.f16(b, 2)),
                GgmlType::Q5_0 => {
                    let q = _mm256_or_si256(nibbles(&b[6..22]), fifth_bits(&b[2..6]));
                    signed(
                        _mm256_sub_epi8(q, _mm256_set1_epi8(U::OFFSET)),
                        self.f16(b, 0),
                    )
                }
                GgmlType::Q5_1 => {
                    let q = _mm256_or_si256(nibbles(&b[8..24]), fifth_bits(&b[4..8]));
                    unsigned(q, self.f16(b, 0), self.f16(b, 2))
                }
                GgmlType::Q8_0 => {
                    signed(_mm256_loadu_si256(b[2..34].as_ptr().cast()), self.f16(b, 0))
                }
                GgmlType::IQ4_NL => {
                    let table = _mm_loadu_si128(IQ4_LEVELS.as_ptr().cast());
                    let levels =
                        _mm256_shuffle_epi8(_mm256_set_m128i(table, table), nibbles(&b[2..18]));
                    signed(levels, self.f16(b, 0))
                }
                _ => super::through_memory::<Self, U>(self, b),
            }
        }
    }

    #[inline(always)]
    fn zero(self) -> __m256 {
        // SAFETY: `self` proves AVX (implied by AVX2).
        unsafe { _mm256_setzero_ps() }
    }

    #[inline(always)]
    fn prepare<const SIGNED: bool>(self, w: &IntChunk) -> Weight {
        // SAFETY: `self` proves AVX2; the load reads exactly the 32 bytes of `w.q`.
        unsafe {
            let q = _mm256_loadu_si256(w.q.as_ptr().cast());
            Weight {
                bytes: if SIGNED { _mm256_sign_epi8(q, q) } else { q },
                signs: q,
                scale: _mm256_setr_m128(_mm_set1_ps(w.scale[0]), _mm_set1_ps(w.scale[1])),
                min: _mm256_setr_ps(w.min[0], w.min[1], 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
            }
        }
    }

    #[inline(always)]
    fn madd<const SIGNED: bool, const MIN: bool>(
        self,
        acc: __m256,
        w: &Weight,
        x: &Q8Chunk,
    ) -> __m256 {
        // SAFETY: `self` proves AVX2 and FMA; the loads read the 32 bytes of `x.q`, `x.d` and the 8 bytes of
        // `x.sums` (unaligned).
        unsafe {
            let q = _mm256_loadu_si256(x.q.as_ptr().cast());
            // `maddubs` multiplies unsigned by signed bytes; signed weights give their sign to the activation
            // (|w| <= 128 and |x| <= 127 keep every pair sum within i16).
            let pairs = if SIGNED {
                _mm256_maddubs_epi16(w.bytes, _mm256_sign_epi8(q, w.signs))
            } else {
                _mm256_maddubs_epi16(w.bytes, q)
            };
            apply_maps::<MIN>(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)), w, x)
        }
    }

    #[inline(always)]
    fn sum(self, acc: [__m256; 2]) -> f32 {
        // SAFETY: `self` proves AVX.
        unsafe {
            let acc = _mm256_add_ps(acc[0], acc[1]);
            let s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
        }
    }
}

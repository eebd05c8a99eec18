//! Activations as 8-bit integers: each 32 consecutive values of a row share one f32 scale, as ggml's Q8_0 blocks
//! do. One format for every weight type (ggml pairs K-quants with 256-element Q8_K blocks instead): the finer
//! scale only makes the rounding smaller, and a weight chunk of any type meets exactly one activation chunk.

use ember_ggml::unpack::CHUNK_LEN;

/// 32 activations `x[i] ≈ d * q[i]`, `qsums[h] = Σ q` over each 16-element half, and `sums[h] = d * qsums[h]`:
/// the factor a weight chunk's per-half minimum multiplies (the integer one, the offset an integer weight
/// carries).
#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(32))]
pub(super) struct Q8Chunk {
    pub(super) q: [i8; CHUNK_LEN],
    pub(super) d: f32,
    pub(super) sums: [f32; 2],
    pub(super) qsums: [i32; 2],
}

/// Quantizes each 32 consecutive values of `x` into `out` (one chunk each): `d = max |x| / 127` and
/// `q = round(x / d)` (ties to even), so every value moves by at most `d / 2` and `|q| <= 127` (never -128, which
/// the signed product's sign transfer could not negate). An all-zero chunk gets `d = 0`.
#[inline(always)]
pub(super) fn quantize(x: &[f32], out: &mut [Q8Chunk]) {
    for (x, chunk) in x.chunks_exact(CHUNK_LEN).zip(out) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let inverse = if d > 0.0 { 1.0 / d } else { 0.0 };
        for (q, &v) in chunk.q.iter_mut().zip(x) {
            // `as` saturates (and maps NaN to 0); the clamp keeps a product rounded just past 127 off -128.
            *q = (v * inverse).round_ties_even().clamp(-127.0, 127.0) as i8;
        }
        let (low, high) = chunk.q.split_at(CHUNK_LEN / 2);
        let sum = |q: &[i8]| q.iter().map(|&q| i32::from(q)).sum::<i32>();
        chunk.d = d;
        chunk.qsums = [sum(low), sum(high)];
        chunk.sums = chunk.qsums.map(|s| d * s as f32);
    }
}

/// [`quantize`] of one chunk (`x[..32]`) in AVX2, to be inlined into code compiled with it: the same chunk,
/// bit for bit (NaNs count as zero here too). The portable loop's `f32::max` fold (NaN-ignoring, in order)
/// stays scalar, about five cycles a value; this is a few instructions per eight.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn quantize_chunk(_: crate::cpu::isa::Avx2, x: &[f32]) -> Q8Chunk {
    use std::arch::x86_64::*;
    let x = &x[..CHUNK_LEN];
    // SAFETY: the `Avx2` token proves AVX2 and FMA; the loads read `x[..32]`, the stores the chunk's fields.
    unsafe {
        let ordered = |v: __m256| _mm256_and_ps(v, _mm256_cmp_ps::<_CMP_ORD_Q>(v, v));
        let v: [__m256; 4] = std::array::from_fn(|k| ordered(_mm256_loadu_ps(x[8 * k..].as_ptr())));
        let magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
        let abs = |v: __m256| _mm256_and_ps(v, magnitude);
        let m = _mm256_max_ps(
            _mm256_max_ps(abs(v[0]), abs(v[1])),
            _mm256_max_ps(abs(v[2]), abs(v[3])),
        );
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m)));
        let d = amax / 127.0;
        let inverse = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        let limit = _mm256_set1_ps(127.0);
        let q: [__m256i; 4] = std::array::from_fn(|k| {
            // An infinite value times a zero inverse is NaN: zero, as the portable `as` makes it.
            let scaled = ordered(_mm256_mul_ps(v[k], inverse));
            let rounded =
                _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(scaled);
            let clamped = _mm256_max_ps(
                _mm256_min_ps(rounded, limit),
                _mm256_sub_ps(_mm256_setzero_ps(), limit),
            );
            _mm256_cvtps_epi32(clamped)
        });
        // i32 -> i16 -> i8 packs within 128-bit lanes; the permute puts the eight groups of four back in order.
        let words = _mm256_packs_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        let bytes = _mm256_permutevar8x32_epi32(words, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        let mut chunk = Q8Chunk::default();
        _mm256_storeu_si256(chunk.q.as_mut_ptr().cast(), bytes);
        let half = |a: __m256i, b: __m256i| {
            let s = _mm256_add_epi32(a, b);
            let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
            let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
            _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<1>(s)))
        };
        chunk.d = d;
        chunk.qsums = [half(q[0], q[1]), half(q[2], q[3])];
        chunk.sums = chunk.qsums.map(|s| d * s as f32);
        chunk
    }
}

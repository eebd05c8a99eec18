//! Activations as 8-bit integers: each 32 consecutive values of a row share one f32 scale, as ggml's Q8_0 blocks
//! do. One format for every weight type (ggml pairs K-quants with 256-element Q8_K blocks instead): the finer
//! scale only makes the rounding smaller, and a weight chunk of any type meets exactly one activation chunk.

use crate::ggml::unpack::CHUNK_LEN;

/// 32 activations `x[i] ≈ d * q[i]`, and `sums[h] = d * Σ q` over each 16-element half: the factor a weight
/// chunk's per-half minimum multiplies.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(32))]
pub(super) struct Q8Chunk {
    pub(super) q: [i8; CHUNK_LEN],
    pub(super) d: f32,
    pub(super) sums: [f32; 2],
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
        let sum = |q: &[i8]| q.iter().map(|&q| i32::from(q)).sum::<i32>() as f32;
        chunk.d = d;
        chunk.sums = [d * sum(low), d * sum(high)];
    }
}

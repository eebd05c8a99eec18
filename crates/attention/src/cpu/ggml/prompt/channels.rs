//! A tile's output channels unpacked as it multiplies them: [`IntChunk`]s of small integers on the unsigned
//! side of `vpdpbusd`.

use super::super::decode::prefetch_ahead;
use super::TILE_CHANNELS;
use crate::cpu::isa::{Avx2, Vnni};
use ember_ggml::GgmlMatrix;
use ember_ggml::unpack::{CHUNK_LEN, IntChunk, Unpack};

/// [`unpack_channels`] compiled for AVX2 and F16C: the scales widened by `vcvtph2ps`, the preparation's byte
/// loops vectorised. Once per channel and product, it had cost as much as the products of 64 rows in SSE2.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn unpack_avx2<U: Unpack>(
    vnni: Vnni,
    weight: GgmlMatrix<'_>,
    channels: std::ops::Range<usize>,
    out: &mut Vec<IntChunk>,
) {
    unpack_channels::<U>(vnni.0, weight, channels, out)
}

/// Unpacks output channels `channels` of `weight` into `out` (`cols / 32` chunks each), the signed types'
/// integers shifted by 128 onto the unsigned side. The tile applies a chunk's minimum only for the types
/// whose minimum is a float of its own (`super::offset` is 0): the others' sums start at `-offset * Σ x`.
#[inline(always)]
fn unpack_channels<U: Unpack>(
    avx2: Avx2,
    weight: GgmlMatrix<'_>,
    channels: std::ops::Range<usize>,
    out: &mut Vec<IntChunk>,
) {
    let [_, cols] = weight.shape();
    let per_row = cols / CHUNK_LEN;
    out.resize(channels.len() * per_row, IntChunk::default());
    // The most chunks a block holds: a K-quant super-block's eight. Unpacked here and then stored shifted: a
    // shift in place, after the store, had cost 8-row Q8_0 products about 10%.
    let mut chunks = [IntChunk::default(); 8];
    for (o, dst) in channels.zip(out.chunks_exact_mut(per_row)) {
        let row = weight.row(o);
        // The next tile's channels, while this one's are unpacked and multiplied: with few rows (a decode
        // batch) unpacking is where the weights stream in from memory, and it had waited on its loads.
        prefetch_ahead(row, TILE_CHANNELS * row.len());
        for (block, dst) in row
            .chunks_exact(U::BLOCK_BYTES)
            .zip(dst.chunks_exact_mut(U::CHUNKS))
        {
            U::unpack(avx2, block, &mut chunks[..U::CHUNKS]);
            for (chunk, dst) in chunks.iter().zip(dst) {
                *dst = unsigned::<U>(avx2, chunk);
            }
        }
    }
}

/// `chunk` with a signed type's integers shifted by 128 (`q ^ 0x80`), onto `vpdpbusd`'s unsigned side.
#[inline(always)]
fn unsigned<U: Unpack>(_: Avx2, chunk: &IntChunk) -> IntChunk {
    use std::arch::x86_64::*;
    let mut shifted = *chunk;
    if U::SIGNED {
        // SAFETY: the `Avx2` token proves the features; the load and store are of the 32 bytes of `q`.
        unsafe {
            let q = _mm256_loadu_si256(chunk.q.as_ptr().cast());
            let q = _mm256_xor_si256(q, _mm256_set1_epi8(i8::MIN));
            _mm256_storeu_si256(shifted.q.as_mut_ptr().cast(), q);
        }
    }
    shifted
}

//! The prompt path of ggml-packed weights in integer arithmetic, on CPUs with AVX-512 VNNI: the activations are
//! quantized once to the decode path's 8-bit chunks ([`super::q8`]), each weight block is unpacked once into
//! small integers ([`crate::ggml::unpack`]), and `vpdpbusd` multiplies them 64 bytes at a time into 32-bit
//! sums, which one f32 multiply-add per 32 (or 16) weights scales, as llama.cpp's tiled integer products do.
//!
//! Why it pays here and not on AVX2: the f32 path (dequantize a tile, gemm) runs near the FMA units' peak, 16
//! multiply-adds per cycle and core; `maddubs` + `madd` + sign transfer do 32 per three instructions, and the
//! per-chunk scaling takes the rest of the gain. `vpdpbusd` does 64 in one, so even with the scaling an integer
//! product has about three times the f32 peak (docs/BENCHMARKS.md measures it).
//!
//! The layout makes both operands cheap to load: sixteen rows are one vector, interleaved four bytes at a time
//! (the four bytes each `vpdpbusd` lane sums), so a row block of one chunk is eight 64-byte vectors; a weight's
//! four bytes are broadcast from its unpacked chunk. A tile is [`TILE_ROWS`] row blocks by [`TILE_CHANNELS`]
//! output channels, its sums held in registers for a whole row: each weight broadcast meets `TILE_ROWS * 16`
//! rows, each row vector `TILE_CHANNELS` channels. Output lanes are rows, so a result is stored row by row.
//! Up to eight rows (a decode batch) are paired instead: each row takes two lanes, its even and odd groups of
//! four, against a 64-bit broadcast of the weights, and the two lanes are added at the end, so no lane idles.
//!
//! Signs: `vpdpbusd` multiplies unsigned by signed bytes. Signed weights (Q8_0, the IQ4 grids, and the types
//! whose offset moves into the integers: Q4_0, Q5_0, Q3_K, Q6_K) take the signed side and the activations the
//! unsigned one, shifted by 128 (`q ^ 0x80`); the shift's `128 Σ w` is subtracted by starting the sums at
//! `-128 Σ w`, so the integer sums are exact. The other types (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K) are unsigned with a
//! float minimum: weights unsigned, activations as quantized, and the minimum times the chunk's activation sum
//! added per chunk, as the decode path does.
//!
//! Error: the decode path's ([`super::int_dot`]): the same activation chunks, the same exact integer sums,
//! the per-chunk terms added in another order.

use std::cell::Cell;

use rayon::prelude::*;

use super::int_dot::{Avx2, Vnni, prefetch_ahead, run_split};
use super::kernel_threads;
use super::linear::OutPtr;
use super::q8::quantize_chunk;
use crate::ggml::GgmlMatrix;
use crate::ggml::unpack::{CHUNK_LEN, IntChunk, Unpack, with_unpacker};

/// Rows in one vector of 32-bit lanes.
const LANES: usize = 16;

/// Four-byte groups of a chunk: the `vpdpbusd` steps that cover it.
const QUADS: usize = CHUNK_LEN / 4;

/// Row blocks of a tile: with [`TILE_CHANNELS`], sixteen vectors of sums (eight integer, eight f32) and the
/// operands fit AVX-512's 32 registers.
const TILE_ROWS: usize = 2;

/// Output channels of a tile.
const TILE_CHANNELS: usize = 4;

/// One chunk of sixteen rows: `q[j][i]` holds bytes `4 j..4 j + 4` of row `i`'s chunk (little-endian), `d` and
/// `sums` each row's scale and half sums ([`super::q8::Q8Chunk`]).
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct RowChunks {
    q: [[u32; LANES]; QUADS],
    d: [f32; LANES],
    sums: [[f32; LANES]; 2],
}

impl Default for RowChunks {
    fn default() -> Self {
        Self {
            q: [[0; LANES]; QUADS],
            d: [0.0; LANES],
            sums: [[0.0; LANES]; 2],
        }
    }
}

/// One output channel's chunk as the tile multiplies it: the integers, the map per half, and (signed types)
/// each half's `-128 Σ q`, where its sums start.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(32))]
struct ChannelChunk {
    q: [u8; CHUNK_LEN],
    scale: [f32; 2],
    min: [f32; 2],
    start: [i32; 2],
}

thread_local! {
    /// The calling thread's packed activations, kept to be reused.
    static ROWS: Cell<Vec<RowChunks>> = const { Cell::new(Vec::new()) };
    /// A pool thread's unpacked channels of one tile.
    static CHANNELS: Cell<Vec<ChannelChunk>> = const { Cell::new(Vec::new()) };
}

/// `x` `[rows, cols]` times `weight` transposed plus `bias`, into `dst` `[rows, out]`, when the CPU has AVX-512
/// VNNI; `false` (nothing written) otherwise.
pub(super) fn many_rows(
    x: &[f32],
    rows: usize,
    weight: GgmlMatrix<'_>,
    bias: Option<&[f32]>,
    dst: &mut [f32],
) -> bool {
    let Some(vnni) = Vnni::detect() else {
        return false;
    };
    with_unpacker!(
        weight.ty(),
        |U| product::<U>(vnni, x, rows, weight, bias, dst),
        return false
    );
    true
}

/// Whether `U`'s chunks take the signed side of the product: signed integers, or an integer offset moved into
/// them.
const fn signed<U: Unpack>() -> bool {
    U::SIGNED || U::OFFSET != 0
}

fn product<U: Unpack>(
    vnni: Vnni,
    x: &[f32],
    rows: usize,
    weight: GgmlMatrix<'_>,
    bias: Option<&[f32]>,
    dst: &mut [f32],
) {
    let [out, cols] = weight.shape();
    let per_row = cols / CHUNK_LEN;
    let paired = rows <= rows_per_block(true);
    let blocks = rows.div_ceil(rows_per_block(paired));
    let threads = kernel_threads();
    let mut packed = ROWS.take();
    // Not cleared: every lane of a real row is written below, and the lanes past the last row (whatever an
    // earlier product left there) only reach results that are never stored.
    packed.resize(blocks * per_row, RowChunks::default());
    let pack = |(b, block): (usize, &mut [RowChunks])| {
        // SAFETY: `vnni` proves AVX2, FMA and F16C.
        unsafe { pack_avx2(vnni, x, rows, cols, b, signed::<U>(), paired, block) }
    };
    if threads == 1 || blocks == 1 {
        packed.chunks_mut(per_row).enumerate().for_each(pack);
    } else {
        packed.par_chunks_mut(per_row).enumerate().for_each(pack);
    }
    let shared = OutPtr(dst.as_mut_ptr());
    let packed_rows = &packed[..];
    run_split(out, |channels| {
        let mut unpacked = CHANNELS.take();
        for first in channels.clone().step_by(TILE_CHANNELS) {
            let n = TILE_CHANNELS.min(channels.end - first);
            // SAFETY: `vnni` proves AVX2, FMA and F16C.
            unsafe { unpack_avx2::<U>(vnni, weight, first..first + n, &mut unpacked) };
            let tile = Tile {
                rows: packed_rows,
                per_row,
                channels: &unpacked[..n * per_row],
                first,
                bias,
                out,
                total_rows: rows,
                dst: shared,
            };
            // SAFETY: `vnni` proves the features `tiles` is compiled with.
            unsafe {
                if paired {
                    tiles::<U, true>(vnni, &tile, n)
                } else {
                    tiles::<U, false>(vnni, &tile, n)
                }
            };
        }
        CHANNELS.set(unpacked);
    });
    ROWS.set(packed);
}

/// Quantizes row block `b` of `x` into `block` (`cols / 32` chunks), shifting the integers by 128 (`q ^ 0x80`,
/// as unsigned bytes) for the signed weight types. A block is sixteen rows, one a lane; `paired`, eight rows,
/// two lanes each: lanes `2 i` and `2 i + 1` take row `i`'s even and odd groups of four (a 64-bit broadcast
/// of the weights meets both), each with the row's scale, the half sums in the even lane alone.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn pack_avx2(
    vnni: Vnni,
    x: &[f32],
    rows: usize,
    cols: usize,
    b: usize,
    shift: bool,
    paired: bool,
    block: &mut [RowChunks],
) {
    let mask = if shift { 0x8080_8080 } else { 0 };
    let per_block = rows_per_block(paired);
    for i in 0..per_block.min(rows - b * per_block) {
        let r = b * per_block + i;
        let row = &x[r * cols..(r + 1) * cols];
        for (values, chunks) in row.chunks_exact(CHUNK_LEN).zip(block.iter_mut()) {
            let q8 = quantize_chunk(vnni.0, values);
            for (j, quad) in q8.q.chunks_exact(4).enumerate() {
                let word = u32::from_le_bytes([
                    quad[0] as u8,
                    quad[1] as u8,
                    quad[2] as u8,
                    quad[3] as u8,
                ]) ^ mask;
                if paired {
                    chunks.q[j / 2][2 * i + j % 2] = word;
                } else {
                    chunks.q[j][i] = word;
                }
            }
            if paired {
                chunks.d[2 * i..2 * i + 2].fill(q8.d);
                for (sums, &sum) in chunks.sums.iter_mut().zip(&q8.sums) {
                    sums[2 * i..2 * i + 2].copy_from_slice(&[sum, 0.0]);
                }
            } else {
                chunks.d[i] = q8.d;
                chunks.sums[0][i] = q8.sums[0];
                chunks.sums[1][i] = q8.sums[1];
            }
        }
    }
}

/// Rows in one row block: a lane each, or two lanes each when `paired` (a decode batch of up to eight rows,
/// which would leave half of every vector empty).
const fn rows_per_block(paired: bool) -> usize {
    if paired { LANES / 2 } else { LANES }
}

/// [`unpack_channels`] compiled for AVX2 and F16C: the scales widened by `vcvtph2ps`, the preparation's byte
/// loops vectorised. Once per channel and product, it had cost as much as the products of 64 rows in SSE2.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack_avx2<U: Unpack>(
    vnni: Vnni,
    weight: GgmlMatrix<'_>,
    channels: std::ops::Range<usize>,
    out: &mut Vec<ChannelChunk>,
) {
    unpack_channels::<U>(vnni.0, weight, channels, out)
}

/// Unpacks output channels `channels` of `weight` into `out` (`cols / 32` chunks each), in the form
/// [`signed`] says.
#[inline(always)]
fn unpack_channels<U: Unpack>(
    avx2: Avx2,
    weight: GgmlMatrix<'_>,
    channels: std::ops::Range<usize>,
    out: &mut Vec<ChannelChunk>,
) {
    let [_, cols] = weight.shape();
    let per_row = cols / CHUNK_LEN;
    out.resize(channels.len() * per_row, ChannelChunk::default());
    // The most chunks a block holds: a K-quant super-block's eight.
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
                *dst = prepared::<U>(avx2, chunk);
            }
        }
    }
}

/// `chunk` as the tile multiplies it: signed integers (the offset moved in, the minimum then zero) with their
/// sums' start, or unsigned ones with the minimum. In AVX2 intrinsics because the scalar byte sums had cost
/// more than the unpacking itself.
#[inline(always)]
fn prepared<U: Unpack>(_: Avx2, chunk: &IntChunk) -> ChannelChunk {
    use std::arch::x86_64::*;
    let mut prepared = ChannelChunk {
        q: chunk.q,
        scale: chunk.scale,
        min: chunk.min,
        start: [0; 2],
    };
    if !signed::<U>() {
        return prepared;
    }
    prepared.min = [0.0; 2];
    // SAFETY: the `Avx2` token proves the features; the load and store are of the 32 bytes of `q`.
    unsafe {
        let mut q = _mm256_loadu_si256(chunk.q.as_ptr().cast());
        if U::OFFSET != 0 {
            q = _mm256_sub_epi8(q, _mm256_set1_epi8(U::OFFSET));
            _mm256_storeu_si256(prepared.q.as_mut_ptr().cast(), q);
        }
        // Signed bytes times 1, in pairs, then in fours: lanes 0..4 sum the first half, 4..8 the second.
        let sums = _mm256_madd_epi16(
            _mm256_maddubs_epi16(_mm256_set1_epi8(1), q),
            _mm256_set1_epi16(1),
        );
        let halves = [
            _mm256_castsi256_si128(sums),
            _mm256_extracti128_si256::<1>(sums),
        ];
        for (start, half) in prepared.start.iter_mut().zip(halves) {
            let pairs = _mm_hadd_epi32(half, half);
            *start = -128 * _mm_cvtsi128_si32(_mm_hadd_epi32(pairs, pairs));
        }
    }
    prepared
}

/// The inputs of one tile column: the packed rows, `n` unpacked channels starting at output `first`, and
/// where their `[rows, out]` results go.
struct Tile<'a> {
    rows: &'a [RowChunks],
    per_row: usize,
    channels: &'a [ChannelChunk],
    first: usize,
    bias: Option<&'a [f32]>,
    out: usize,
    total_rows: usize,
    dst: OutPtr,
}

/// Every row block of `tile` against its `n` channels, in tiles of [`TILE_ROWS`] blocks; `P`: the blocks are
/// paired (one, of up to eight rows).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tiles<U: Unpack, const P: bool>(vnni: Vnni, tile: &Tile<'_>, n: usize) {
    let blocks = tile.rows.len() / tile.per_row;
    let mut b = 0;
    while b < blocks {
        let m = TILE_ROWS.min(blocks - b);
        // SAFETY (all arms): the features are this function's.
        unsafe {
            match (m, n) {
                (2, 4) if !P => avx512::tile::<2, 4, U, false>(vnni, tile, b),
                (2, 3) if !P => avx512::tile::<2, 3, U, false>(vnni, tile, b),
                (2, 2) if !P => avx512::tile::<2, 2, U, false>(vnni, tile, b),
                (2, 1) if !P => avx512::tile::<2, 1, U, false>(vnni, tile, b),
                (_, 4) => avx512::tile::<1, 4, U, P>(vnni, tile, b),
                (_, 3) => avx512::tile::<1, 3, U, P>(vnni, tile, b),
                (_, 2) => avx512::tile::<1, 2, U, P>(vnni, tile, b),
                _ => avx512::tile::<1, 1, U, P>(vnni, tile, b),
            }
        }
        b += if P { 1 } else { m };
    }
}

mod avx512 {
    use std::arch::x86_64::*;

    use super::{LANES, QUADS, Tile, Vnni, rows_per_block, signed};
    use crate::ggml::unpack::Unpack;

    /// Row blocks `b..b + M` (paired when `P`) against the tile's `N` channels, written to `dst` with the bias.
    #[inline(always)]
    pub(super) unsafe fn tile<const M: usize, const N: usize, U: Unpack, const P: bool>(
        _: Vnni,
        tile: &Tile<'_>,
        b: usize,
    ) {
        let per_row = tile.per_row;
        let rows: [&[super::RowChunks]; M] =
            std::array::from_fn(|m| &tile.rows[(b + m) * per_row..(b + m + 1) * per_row]);
        let channels: [&[super::ChannelChunk]; N] =
            std::array::from_fn(|n| &tile.channels[n * per_row..(n + 1) * per_row]);
        // SAFETY: the caller has the features; every load is of a field of an element of the slices above,
        // indexed by `c < per_row` (their length) and `j < QUADS`.
        unsafe {
            // Vector steps per chunk: a group of four a lane, or two groups when paired.
            let steps = if P { QUADS / 2 } else { QUADS };
            let mut acc = [[_mm512_setzero_ps(); N]; M];
            for c in 0..per_row {
                if U::HALF_MAPS {
                    for h in 0..2 {
                        let sums = sums::<M, N, U, P>(
                            &rows,
                            &channels,
                            c,
                            h * steps / 2..(h + 1) * steps / 2,
                            h,
                        );
                        scale::<M, N, U>(&mut acc, sums, &rows, &channels, c, h);
                    }
                } else {
                    let sums = sums::<M, N, U, P>(&rows, &channels, c, 0..steps, 2);
                    scale::<M, N, U>(&mut acc, sums, &rows, &channels, c, 2);
                }
            }
            let mut lanes = [0f32; LANES];
            let per_block = rows_per_block(P);
            for (m, acc) in acc.iter().enumerate() {
                for (n, acc) in acc.iter().enumerate() {
                    _mm512_storeu_ps(lanes.as_mut_ptr(), *acc);
                    let o = tile.first + n;
                    let bias = tile.bias.map_or(0.0, |bias| bias[o]);
                    let first_row = (b + m) * per_block;
                    for i in 0..per_block.min(tile.total_rows.saturating_sub(first_row)) {
                        let v = if P {
                            lanes[2 * i] + lanes[2 * i + 1]
                        } else {
                            lanes[i]
                        };
                        // SAFETY: `dst` is `[rows, out]`, `first_row + i < rows` and `o < out`; each channel
                        // belongs to one task and each row to one tile of it, so no two writes meet.
                        *tile.dst.get().add((first_row + i) * tile.out + o) = v + bias;
                    }
                }
            }
        }
    }

    /// The integer sums of vector steps `steps` of chunk `c` (groups of four, or pairs of them when `P`): `h` is
    /// the half (0, 1) or 2 for the whole chunk, whose start the signed types' sums take (paired: the even
    /// lanes alone, as a row's two lanes are added at the end).
    #[inline(always)]
    unsafe fn sums<const M: usize, const N: usize, U: Unpack, const P: bool>(
        rows: &[&[super::RowChunks]; M],
        channels: &[&[super::ChannelChunk]; N],
        c: usize,
        steps: std::ops::Range<usize>,
        h: usize,
    ) -> [[__m512i; N]; M] {
        // SAFETY (for the caller): AVX-512 F/BW/VNNI; `c` within every slice.
        unsafe {
            let start: [__m512i; N] = std::array::from_fn(|n| {
                let start = &channels[n][c].start;
                let start = if h == 2 {
                    start[0] + start[1]
                } else {
                    start[h]
                };
                if !signed::<U>() {
                    _mm512_setzero_si512()
                } else if P {
                    _mm512_set1_epi64(i64::from(start as u32))
                } else {
                    _mm512_set1_epi32(start)
                }
            });
            let mut sums = [start; M];
            for j in steps {
                let x: [__m512i; M] =
                    std::array::from_fn(|m| _mm512_load_si512(rows[m][c].q[j].as_ptr().cast()));
                for n in 0..N {
                    let w = if P {
                        _mm512_set1_epi64(std::ptr::read_unaligned(
                            channels[n][c].q.as_ptr().add(8 * j).cast::<i64>(),
                        ))
                    } else {
                        _mm512_set1_epi32(std::ptr::read_unaligned(
                            channels[n][c].q.as_ptr().add(4 * j).cast::<i32>(),
                        ))
                    };
                    for m in 0..M {
                        // `vpdpbusd` takes its first operand unsigned: the activations (shifted by 128) for
                        // the signed types, the weights otherwise.
                        sums[m][n] = if signed::<U>() {
                            _mm512_dpbusd_epi32(sums[m][n], x[m], w)
                        } else {
                            _mm512_dpbusd_epi32(sums[m][n], w, x[m])
                        };
                    }
                }
            }
            sums
        }
    }

    /// `acc += sums * scale * d (+ min * activation sums)` for half `h` of chunk `c` (2: the whole chunk).
    #[inline(always)]
    unsafe fn scale<const M: usize, const N: usize, U: Unpack>(
        acc: &mut [[__m512; N]; M],
        sums: [[__m512i; N]; M],
        rows: &[&[super::RowChunks]; M],
        channels: &[&[super::ChannelChunk]; N],
        c: usize,
        h: usize,
    ) {
        // SAFETY (for the caller): AVX-512 F; `c` within every slice.
        unsafe {
            let half = h.min(1);
            let d: [__m512; M] = std::array::from_fn(|m| _mm512_load_ps(rows[m][c].d.as_ptr()));
            let x_sums: [__m512; M] = std::array::from_fn(|m| {
                let sums = &rows[m][c].sums;
                if h == 2 {
                    _mm512_add_ps(
                        _mm512_load_ps(sums[0].as_ptr()),
                        _mm512_load_ps(sums[1].as_ptr()),
                    )
                } else {
                    _mm512_load_ps(sums[h].as_ptr())
                }
            });
            for n in 0..N {
                let w = &channels[n][c];
                let scale = _mm512_set1_ps(w.scale[half]);
                let min = _mm512_set1_ps(w.min[half]);
                for m in 0..M {
                    let value = _mm512_cvtepi32_ps(sums[m][n]);
                    acc[m][n] = _mm512_fmadd_ps(value, _mm512_mul_ps(scale, d[m]), acc[m][n]);
                    if !signed::<U>() {
                        acc[m][n] = _mm512_fmadd_ps(min, x_sums[m], acc[m][n]);
                    }
                }
            }
        }
    }
}

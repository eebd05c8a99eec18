//! The `vpdpbusd` register tiles: row blocks by output channels, their sums kept in registers for a whole row.

use std::arch::x86_64::*;

use super::{LANES, QUADS, RowChunks, TILE_ROWS, Tile, Vnni, offset, rows_per_block};
use ember_ggml::unpack::{IntChunk, Unpack};

/// Every row block of `tile` against its `n` channels, in tiles of [`TILE_ROWS`] blocks; `P`: the blocks are
/// paired (one, of up to eight rows).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn tiles<U: Unpack, const P: bool>(vnni: Vnni, tile: &Tile<'_>, n: usize) {
    let blocks = tile.packed.rows.len() / tile.packed.per_row;
    let mut b = 0;
    while b < blocks {
        let m = TILE_ROWS.min(blocks - b);
        // SAFETY (all arms): the features are this function's.
        unsafe {
            match (m, n) {
                (2, 4) if !P => register_tile::<2, 4, U, false>(vnni, tile, b),
                (2, 3) if !P => register_tile::<2, 3, U, false>(vnni, tile, b),
                (2, 2) if !P => register_tile::<2, 2, U, false>(vnni, tile, b),
                (2, 1) if !P => register_tile::<2, 1, U, false>(vnni, tile, b),
                (_, 4) => register_tile::<1, 4, U, P>(vnni, tile, b),
                (_, 3) => register_tile::<1, 3, U, P>(vnni, tile, b),
                (_, 2) => register_tile::<1, 2, U, P>(vnni, tile, b),
                _ => register_tile::<1, 1, U, P>(vnni, tile, b),
            }
        }
        b += if P { 1 } else { m };
    }
}

/// Row blocks `b..b + M` (paired when `P`) against the tile's `N` channels, written to `dst` with the bias.
#[inline(always)]
unsafe fn register_tile<const M: usize, const N: usize, U: Unpack, const P: bool>(
    _: Vnni,
    tile: &Tile<'_>,
    b: usize,
) {
    let per_row = tile.packed.per_row;
    let rows: [&[RowChunks]; M] =
        std::array::from_fn(|m| &tile.packed.rows[(b + m) * per_row..(b + m + 1) * per_row]);
    let channels: [&[IntChunk]; N] =
        std::array::from_fn(|n| &tile.channels[n * per_row..(n + 1) * per_row]);
    // SAFETY: the caller has the features; every load is of a field of an element of the slices above, indexed
    // by `c < per_row` (their length) and `j < QUADS`.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); N]; M];
        for c in 0..per_row {
            if U::HALF_MAPS {
                for h in 0..2 {
                    let sums = sums::<M, N, U, P>(&rows, &channels, c, h);
                    scale::<M, N, U>(&mut acc, sums, &rows, &channels, c, h);
                }
            } else {
                let sums = sums::<M, N, U, P>(&rows, &channels, c, 2);
                scale::<M, N, U>(&mut acc, sums, &rows, &channels, c, 2);
            }
        }
        let mut lanes = [0f32; LANES];
        let per_block = rows_per_block(P);
        for (m, acc) in acc.iter().enumerate() {
            for (n, acc) in acc.iter().enumerate() {
                _mm512_storeu_ps(lanes.as_mut_ptr(), *acc);
                let o = tile.first + n;
                let bias = tile.columns.bias.map_or(0.0, |bias| bias[o]);
                let first_row = (b + m) * per_block;
                for i in 0..per_block.min(tile.packed.total_rows.saturating_sub(first_row)) {
                    let v = if P {
                        lanes[2 * i] + lanes[2 * i + 1]
                    } else {
                        lanes[i]
                    };
                    // SAFETY: `dst` is `[rows, out]`, `first_row + i < rows` and `o < out`; each channel
                    // belongs to one task and each row to one tile of it, so no two writes meet.
                    *tile
                        .columns
                        .dst
                        .get()
                        .add((first_row + i) * tile.columns.out + o) = v + bias;
                }
            }
        }
    }
}

/// The integer sums of half `h` of chunk `c` (2: the whole chunk), started at `-offset * Σ x` for the types
/// with an integer offset (paired: in the even lanes alone, as a row's two lanes are added at the end).
#[inline(always)]
unsafe fn sums<const M: usize, const N: usize, U: Unpack, const P: bool>(
    rows: &[&[RowChunks]; M],
    channels: &[&[IntChunk]; N],
    c: usize,
    h: usize,
) -> [[__m512i; N]; M] {
    // SAFETY (for the caller): AVX-512 F/BW/VNNI; `c` within every slice.
    unsafe {
        let start: [__m512i; M] = std::array::from_fn(|m| {
            if offset::<U>() == 0 {
                return _mm512_setzero_si512();
            }
            let qsums = &rows[m][c].qsums;
            let load = |h: usize| _mm512_load_si512(qsums[h].as_ptr().cast());
            let sum = if h == 2 {
                _mm512_add_epi32(load(0), load(1))
            } else {
                load(h)
            };
            let shift = _mm_cvtsi32_si128(offset::<U>().trailing_zeros() as i32);
            _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_sll_epi32(sum, shift))
        });
        // Two chains of sums a row block and channel, the even steps' and the odd ones', added at the end:
        // one chain of eight `vpdpbusd` (five cycles each) had bounded a paired tile, whose single row block
        // leaves too few chains to fill both ports.
        let mut sums = [[[_mm512_setzero_si512(); N]; M]; 2];
        for m in 0..M {
            sums[0][m] = [start[m]; N];
        }
        // Vector steps per chunk: a group of four a lane, or two groups when paired.
        let steps = if P { QUADS / 2 } else { QUADS };
        let steps = match h {
            0 => 0..steps / 2,
            1 => steps / 2..steps,
            _ => 0..steps,
        };
        for j in steps {
            let x: [__m512i; M] =
                std::array::from_fn(|m| _mm512_load_si512(rows[m][c].q[j].as_ptr().cast()));
            let sums = &mut sums[j % 2];
            for n in 0..N {
                let q = channels[n][c].q.as_ptr();
                let w = if P {
                    _mm512_set1_epi64(std::ptr::read_unaligned(q.add(8 * j).cast::<i64>()))
                } else {
                    _mm512_set1_epi32(std::ptr::read_unaligned(q.add(4 * j).cast::<i32>()))
                };
                for m in 0..M {
                    // Weights unsigned (`vpdpbusd`'s first operand), activations signed.
                    sums[m][n] = _mm512_dpbusd_epi32(sums[m][n], w, x[m]);
                }
            }
        }
        let [even, odd] = sums;
        std::array::from_fn(|m| std::array::from_fn(|n| _mm512_add_epi32(even[m][n], odd[m][n])))
    }
}

/// `acc += sums * scale * d (+ min * activation sums)` for half `h` of chunk `c` (2: the whole chunk).
#[inline(always)]
unsafe fn scale<const M: usize, const N: usize, U: Unpack>(
    acc: &mut [[__m512; N]; M],
    sums: [[__m512i; N]; M],
    rows: &[&[RowChunks]; M],
    channels: &[&[IntChunk]; N],
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
                if offset::<U>() == 0 {
                    acc[m][n] = _mm512_fmadd_ps(min, x_sums[m], acc[m][n]);
                }
            }
        }
    }
}

//! The prompt path of ggml-packed weights in integer arithmetic, on CPUs with AVX-512 VNNI: the activations are
//! quantized once to the decode path's 8-bit chunks ([`super::q8`]), each weight block is unpacked once into
//! small integers ([`ember_ggml::unpack`]), and `vpdpbusd` multiplies them 64 bytes at a time into 32-bit
//! sums, which one f32 multiply-add per 32 (or 16) weights scales, as llama.cpp's tiled integer products do.
//!
//! Why it pays here and not on AVX2: the f32 path (dequantize a tile, gemm) runs near the FMA units' peak, 16
//! multiply-adds per cycle and core; `maddubs` + `madd` + sign transfer do 32 per three instructions, and the
//! per-chunk scaling takes the rest of the gain. `vpdpbusd` does 64 in one, so even with the scaling an integer
//! product has about three times the f32 peak (docs/BENCHMARKS.md measures it).
//!
//! The layout makes both operands cheap to load: sixteen rows are one vector, interleaved four bytes at a time
//! (the four bytes each `vpdpbusd` lane sums), so a row block of one chunk is eight 64-byte vectors; a weight's
//! four bytes are broadcast from its unpacked chunk ([`channels`]). A tile is [`TILE_ROWS`] row blocks by
//! [`TILE_CHANNELS`] output channels, its sums held in registers for a whole row: each weight broadcast meets
//! `TILE_ROWS * 16` rows, each row vector `TILE_CHANNELS` channels. Output lanes are rows, so a result is
//! stored row by row. Up to eight rows (a decode batch) are paired instead: each row takes two lanes, its even
//! and odd groups of four, against a 64-bit broadcast of the weights, and the two lanes are added at the end,
//! so no lane idles.
//!
//! Signs: `vpdpbusd` multiplies unsigned by signed bytes. The weights always take the unsigned side and the
//! activations the signed one, as quantized. The signed weight types (Q8_0, the IQ4 grids) are shifted by
//! 128 (`q ^ 0x80`) and the types with an integer offset (Q4_0's 8, Q5_0's 16, Q3_K's 4, Q6_K's 32) keep
//! their unsigned integers; either way the sums start at `-offset * Σ x` (the activation chunk's integer sum,
//! once per row and chunk, not per channel), so the integer sums are exact. The other types (Q4_1, Q5_1,
//! Q2_K, Q4_K, Q5_K) have a float minimum, which multiplies the chunk's activation sum per chunk, as the
//! decode path does.
//!
//! Error: the decode path's ([`super::decode`]): the same activation chunks, the same exact integer sums,
//! the per-chunk terms added in another order.

mod channels;
mod tile;

use std::cell::Cell;

use rayon::prelude::*;

use super::decode::run_split;
use super::q8::{Q8Chunk, quantize_chunk};
use crate::cpu::isa::Vnni;
use crate::cpu::kernel_threads;
use crate::cpu::linear::OutPtr;
use ember_ggml::GgmlMatrix;
use ember_ggml::unpack::{CHUNK_LEN, IntChunk, Unpack};
use ember_ggml::with_unpacker;

/// Rows in one vector of 32-bit lanes.
const LANES: usize = 16;

/// Four-byte groups of a chunk: the `vpdpbusd` steps that cover it.
const QUADS: usize = CHUNK_LEN / 4;

/// Row blocks of a tile: with [`TILE_CHANNELS`], sixteen vectors of sums (eight integer, eight f32) and the
/// operands fit AVX-512's 32 registers.
const TILE_ROWS: usize = 2;

/// Output channels of a tile.
const TILE_CHANNELS: usize = 4;

/// One chunk of sixteen rows: `q[j][i]` holds bytes `4 j..4 j + 4` of row `i`'s chunk (little-endian), `d`,
/// `sums` and `qsums` each row's scale and half sums ([`Q8Chunk`]); paired, eight rows' chunks
/// ([`RowChunks::set_pair`]).
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct RowChunks {
    q: [[u32; LANES]; QUADS],
    d: [f32; LANES],
    sums: [[f32; LANES]; 2],
    qsums: [[i32; LANES]; 2],
}

impl Default for RowChunks {
    fn default() -> Self {
        Self {
            q: [[0; LANES]; QUADS],
            d: [0.0; LANES],
            sums: [[0.0; LANES]; 2],
            qsums: [[0; LANES]; 2],
        }
    }
}

impl RowChunks {
    /// Puts `chunk` in lane `i`.
    #[inline(always)]
    fn set_lane(&mut self, i: usize, chunk: &Q8Chunk) {
        for (j, quad) in chunk.q.chunks_exact(4).enumerate() {
            self.q[j][i] = word(quad);
        }
        self.d[i] = chunk.d;
        for h in 0..2 {
            self.sums[h][i] = chunk.sums[h];
            self.qsums[h][i] = chunk.qsums[h];
        }
    }

    /// Puts `chunk` in lanes `2 i` (its even groups of four) and `2 i + 1` (the odd ones), each with the scale,
    /// the half sums in the even lane alone (the two lanes are added at the end).
    #[inline(always)]
    fn set_pair(&mut self, i: usize, chunk: &Q8Chunk) {
        for (j, quad) in chunk.q.chunks_exact(4).enumerate() {
            self.q[j / 2][2 * i + j % 2] = word(quad);
        }
        self.d[2 * i..2 * i + 2].fill(chunk.d);
        for h in 0..2 {
            self.sums[h][2 * i..2 * i + 2].copy_from_slice(&[chunk.sums[h], 0.0]);
            self.qsums[h][2 * i..2 * i + 2].copy_from_slice(&[chunk.qsums[h], 0]);
        }
    }
}

/// Four activations as one little-endian word.
#[inline(always)]
fn word(quad: &[i8]) -> u32 {
    u32::from_le_bytes([quad[0] as u8, quad[1] as u8, quad[2] as u8, quad[3] as u8])
}

thread_local! {
    /// The calling thread's packed activations, kept to be reused.
    static ROWS: Cell<Vec<RowChunks>> = const { Cell::new(Vec::new()) };
    /// A pool thread's unpacked channels of one tile.
    static CHANNELS: Cell<Vec<IntChunk>> = const { Cell::new(Vec::new()) };
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
    many_products(x, rows, &mut [Product { weight, bias, dst }])
}

/// One of the products of [`many_products`]: `weight` `[out, cols]` transposed plus `bias` into `dst`
/// `[rows, out]`.
pub(super) struct Product<'a> {
    pub(super) weight: GgmlMatrix<'a>,
    pub(super) bias: Option<&'a [f32]>,
    pub(super) dst: &'a mut [f32],
}

/// [`many_rows`] of several weights with one input (a layer's query, key and value projections): `x` is
/// quantized once, and the products' output channels are split across the threads together, one hand-off
/// for all of them. `false` (nothing written) without AVX-512 VNNI, or where a weight is not block-quantized
/// or does not take `cols` inputs.
pub(super) fn many_products(x: &[f32], rows: usize, products: &mut [Product<'_>]) -> bool {
    let Some(vnni) = Vnni::detect() else {
        return false;
    };
    let Some(cols) = products.first().map(|p| p.weight.shape()[1]) else {
        return true;
    };
    let fits = |p: &Product<'_>| {
        let [out, c] = p.weight.shape();
        c == cols
            && p.dst.len() >= rows * out
            && p.bias.is_none_or(|b| b.len() == out)
            && with_unpacker!(p.weight.ty(), |U| U::BLOCK_BYTES > 0, false)
    };
    if !products.iter().all(fits) {
        return false;
    }
    let paired = rows <= rows_per_block(true);
    let per_row = cols / CHUNK_LEN;
    let mut packed = ROWS.take();
    pack(vnni, x, rows, cols, paired, &mut packed);
    let columns: Vec<Columns<'_>> = products
        .iter_mut()
        .map(|p| Columns {
            weight: p.weight,
            out: p.weight.shape()[0],
            bias: p.bias,
            dst: OutPtr(p.dst.as_mut_ptr()),
        })
        .collect();
    let total = columns.iter().map(|c| c.out).sum();
    let rows_packed = Packed {
        rows: &packed,
        per_row,
        paired,
        total_rows: rows,
    };
    // The products' channels end to end: a task's range is cut at each product's boundaries.
    run_split(total, |range| {
        let mut start = 0;
        for c in &columns {
            let (from, to) = (range.start.max(start), range.end.min(start + c.out));
            if from < to {
                with_unpacker!(
                    c.weight.ty(),
                    |U| multiply::<U>(vnni, &rows_packed, c, from - start..to - start),
                    ()
                );
            }
            start += c.out;
        }
    });
    ROWS.set(packed);
    true
}

/// The integer offset `U`'s unpacked weights carry, which the sums start by subtracting: 128 for the signed
/// types (shifted to unsigned), the type's own offset, or 0 where the minimum is a float of its own.
const fn offset<U: Unpack>() -> i32 {
    let offset = if U::SIGNED { 128 } else { U::OFFSET as i32 };
    // The tile multiplies by it with a shift.
    assert!(offset >= 0 && (offset == 0 || offset.count_ones() == 1));
    offset
}

/// Packed activations shared by the pack tasks; each writes its own entries.
#[derive(Clone, Copy)]
struct RowsPtr(*mut RowChunks);

// SAFETY: the tasks of one pack write disjoint entries, which nothing reads until the pack ends.
unsafe impl Send for RowsPtr {}
unsafe impl Sync for RowsPtr {}

impl RowsPtr {
    /// Entries `range` of the packed rows.
    ///
    /// # Safety
    /// `range` lies within the buffer, and no other task touches it while the slice lives.
    unsafe fn entries<'a>(self, range: std::ops::Range<usize>) -> &'a mut [RowChunks] {
        // SAFETY: the caller's.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(range.start), range.len()) }
    }
}

/// Quantizes `x` `[rows, cols]` into `packed`, in row blocks of sixteen rows, or one paired block of up to
/// eight.
fn pack(
    vnni: Vnni,
    x: &[f32],
    rows: usize,
    cols: usize,
    paired: bool,
    packed: &mut Vec<RowChunks>,
) {
    let per_row = cols / CHUNK_LEN;
    let blocks = rows.div_ceil(rows_per_block(paired));
    // Not cleared: every lane of a real row is written below, and the lanes past the last row (whatever an
    // earlier product left there) only reach results that are never stored.
    packed.resize(blocks * per_row, RowChunks::default());
    if blocks == 1 {
        // One block (a decode batch): split its chunks, which a serial pack had left the other thread waiting
        // on.
        let shared = RowsPtr(packed.as_mut_ptr());
        run_split(per_row, |range| {
            // SAFETY: `range` lies within the block's `per_row` chunks, and no two tasks share one.
            let entries = unsafe { shared.entries(range.clone()) };
            // SAFETY: `vnni` proves AVX2, FMA and F16C.
            unsafe { pack_avx2(vnni, x, rows, cols, 0, paired, range.start, entries) }
        });
    } else {
        let pack = |(b, block): (usize, &mut [RowChunks])| {
            // SAFETY: `vnni` proves AVX2, FMA and F16C.
            unsafe { pack_avx2(vnni, x, rows, cols, b, paired, 0, block) }
        };
        if kernel_threads() == 1 {
            packed.chunks_mut(per_row).enumerate().for_each(pack);
        } else {
            packed.par_chunks_mut(per_row).enumerate().for_each(pack);
        }
    }
}

/// The packed activations of a product.
struct Packed<'a> {
    rows: &'a [RowChunks],
    per_row: usize,
    paired: bool,
    total_rows: usize,
}

/// One weight (`[out, cols]`) of a product with where its results go (`[rows, out]`).
struct Columns<'a> {
    weight: GgmlMatrix<'a>,
    out: usize,
    bias: Option<&'a [f32]>,
    dst: OutPtr,
}

/// Output channels `channels` of `columns` against every packed row, a tile of [`TILE_CHANNELS`] at a time.
fn multiply<U: Unpack>(
    vnni: Vnni,
    packed: &Packed<'_>,
    columns: &Columns<'_>,
    channels: std::ops::Range<usize>,
) {
    let mut unpacked = CHANNELS.take();
    for first in channels.clone().step_by(TILE_CHANNELS) {
        let n = TILE_CHANNELS.min(channels.end - first);
        // SAFETY: `vnni` proves AVX2, FMA and F16C.
        unsafe {
            channels::unpack_avx2::<U>(vnni, columns.weight, first..first + n, &mut unpacked)
        };
        let tile = Tile {
            packed,
            columns,
            channels: &unpacked[..n * packed.per_row],
            first,
        };
        // SAFETY: `vnni` proves the features `tiles` is compiled with.
        unsafe {
            if packed.paired {
                tile::tiles::<U, true>(vnni, &tile, n)
            } else {
                tile::tiles::<U, false>(vnni, &tile, n)
            }
        };
    }
    CHANNELS.set(unpacked);
}

/// Quantizes chunks `first..first + out.len()` of row block `b` of `x` into `out`: sixteen rows, one a lane, or
/// `paired`, eight rows, two lanes each ([`RowChunks::set_pair`]).
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn pack_avx2(
    vnni: Vnni,
    x: &[f32],
    rows: usize,
    cols: usize,
    b: usize,
    paired: bool,
    first: usize,
    out: &mut [RowChunks],
) {
    let per_block = rows_per_block(paired);
    for i in 0..per_block.min(rows - b * per_block) {
        let r = b * per_block + i;
        let row = &x[r * cols..(r + 1) * cols];
        for (c, entry) in (first..).zip(out.iter_mut()) {
            let chunk = quantize_chunk(vnni.0, &row[c * CHUNK_LEN..(c + 1) * CHUNK_LEN]);
            if paired {
                entry.set_pair(i, &chunk);
            } else {
                entry.set_lane(i, &chunk);
            }
        }
    }
}

/// Rows in one row block: a lane each, or two lanes each when `paired` (a decode batch of up to eight rows,
/// which would leave half of every vector empty).
const fn rows_per_block(paired: bool) -> usize {
    if paired { LANES / 2 } else { LANES }
}

/// The inputs of one tile column: the packed rows, `n` unpacked channels of `columns` starting at its output
/// `first`.
struct Tile<'a> {
    packed: &'a Packed<'a>,
    columns: &'a Columns<'a>,
    channels: &'a [IntChunk],
    first: usize,
}

//! The exact products with ggml blocks ([`GgmlProducts::Exact`](crate::GgmlProducts::Exact)): f32
//! activations times the dequantized weights, exact up to f32 rounding; the oracle the integer paths
//! ([`super::decode`], [`super::prompt`]) are tested against.
//!
//! A decode step (up to [`MAX_ROWS`] rows) is memory-bound: each thread takes a range of output channels and,
//! per channel, expands one block at a time into a stack buffer and multiplies it with the matching columns of
//! every row, so the weight is read once, packed, and nothing but the output is allocated. More rows (a prompt)
//! are compute-bound: tiles of output channels are dequantized into one reused buffer and multiplied with gemm,
//! as the INT8/INT4 kernel does.

use rayon::prelude::*;

use crate::cpu::kernel_threads;
use crate::cpu::linear::{Operand, OutPtr, product_strided};
use crate::cpu::quantized::{CHANNELS_PER_TASK, MAX_ROWS, TILE, TILE_ELEMENTS};
use crate::cpu::simd::vectorized;
use ember_ggml::{GgmlMatrix, MAX_BLOCK_LEN, with_block_fn};

/// Up to [`MAX_ROWS`] rows (a decode step): output channels split across the pool in tasks of [`CHANNELS_PER_TASK`], each channel
/// expanded block by block into a stack buffer and dotted with every row.
pub(super) fn few_rows(
    x: &[f32],
    rows: usize,
    weight: GgmlMatrix<'_>,
    bias: Option<&[f32]>,
    dst: &mut [f32],
) {
    let [out, _] = weight.shape();
    let tasks = out.div_ceil(CHANNELS_PER_TASK);
    let shared = OutPtr(dst.as_mut_ptr());
    let task = |t: usize| {
        let channels = t * CHANNELS_PER_TASK..((t + 1) * CHANNELS_PER_TASK).min(out);
        for o in channels {
            let mut sums = [0f32; MAX_ROWS];
            with_block_fn!(
                weight.ty(),
                |expand| vectorized!(channel(expand, weight.row(o), x, rows, weight, &mut sums)),
                ()
            );
            for (r, &sum) in sums[..rows].iter().enumerate() {
                let value = sum + bias.map_or(0.0, |b| b[o]);
                // SAFETY: `dst` is `[rows, out]`; `r < rows` and `o < out`, and each channel `o` belongs to
                // exactly one task, so no two writes touch the same element and nothing reads `dst` meanwhile.
                unsafe { *shared.get().add(r * out + o) = value };
            }
        }
    };
    if kernel_threads() == 1 || tasks == 1 {
        (0..tasks).for_each(task);
    } else {
        (0..tasks).into_par_iter().for_each(task);
    }
}

/// Lanes of the partial sums: two AVX2 registers of f32, so consecutive multiply-adds are independent. Every
/// block length (32, 256) is a multiple.
const LANES: usize = 16;

/// One channel's dot product with each of `rows` rows of `x`, into `sums[..rows]`: its blocks (`row`) are
/// expanded one at a time with `expand` into a stack buffer that stays in cache while every row reads it.
#[inline(always)]
fn channel(
    expand: impl Fn(&[u8], &mut [f32]),
    row: &[u8],
    x: &[f32],
    rows: usize,
    weight: GgmlMatrix<'_>,
    sums: &mut [f32; MAX_ROWS],
) {
    let [_, cols] = weight.shape();
    let (block_len, block_bytes) = weight.block_geometry();
    let mut buffer = [0f32; MAX_BLOCK_LEN];
    let values = &mut buffer[..block_len];
    let mut lanes = [[0f32; LANES]; MAX_ROWS];
    for (b, block) in row.chunks_exact(block_bytes).enumerate() {
        expand(block, values);
        let start = b * block_len;
        for (r, lanes) in lanes[..rows].iter_mut().enumerate() {
            let x = &x[r * cols + start..r * cols + start + block_len];
            for (w, x) in values.chunks_exact(LANES).zip(x.chunks_exact(LANES)) {
                for l in 0..LANES {
                    lanes[l] += w[l] * x[l];
                }
            }
        }
    }
    for (sum, lanes) in sums[..rows].iter_mut().zip(&lanes) {
        *sum = lanes.iter().sum();
    }
}

/// More rows (a prompt): tiles of output channels dequantized (split across threads by channel) into one reused f32
/// buffer and multiplied with gemm straight into their columns of `dst` `[rows, out]`.
pub(super) fn many_rows(
    x: &[f32],
    rows: usize,
    weight: GgmlMatrix<'_>,
    bias: Option<&[f32]>,
    dst: &mut [f32],
) {
    let [out, cols] = weight.shape();
    let tile = (TILE_ELEMENTS / cols).clamp(1, out);
    // Taken out of the cell rather than borrowed: a call made while this one waits for the pool (a worker
    // thread stealing work) finds it empty and allocates its own.
    let mut buffer = TILE.take();
    if buffer.len() < tile * cols {
        buffer.resize(tile * cols, 0.0);
    }
    if let Some(bias) = bias {
        for row in dst.chunks_exact_mut(out) {
            row.copy_from_slice(bias);
        }
    }
    for first in (0..out).step_by(tile) {
        let n = tile.min(out - first);
        // Every element of the tile is written before it is read: whole channels are dequantized.
        let values = &mut buffer[..n * cols];
        let dequantize = |(i, values): (usize, &mut [f32])| {
            vectorized!(weight.dequantize_rows(first + i, values))
        };
        if kernel_threads() == 1 || n <= CHANNELS_PER_TASK {
            values.chunks_mut(cols).enumerate().for_each(dequantize);
        } else {
            values
                .par_chunks_mut(cols)
                .with_min_len(CHANNELS_PER_TASK)
                .enumerate()
                .for_each(dequantize);
        }
        // SAFETY: `x` is `[rows, cols]` and `values` `[n, cols]`, both row-major and only read during the
        // product; the tile read as `[cols, n]` is its transpose. The output rows are `out` apart, starting at
        // column `first`.
        unsafe {
            product_strided(
                (rows, n, cols),
                Operand::row_major(x, cols),
                Operand::row_major(values, cols).transposed(),
                &mut dst[first..],
                out,
                bias.is_some(),
            );
        }
    }
    TILE.set(buffer);
}

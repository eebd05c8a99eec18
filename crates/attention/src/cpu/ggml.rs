//! Products with a weight kept as ggml blocks ([`GgmlMatrix`]), on burn-flex.
//!
//! A decode step (up to [`MAX_ROWS`] rows) is memory-bound: each thread takes a range of output channels and,
//! per channel, expands one block at a time into a stack buffer and multiplies it with the matching columns of
//! every row, so the weight is read once, packed, and nothing but the output is allocated. More rows (a prompt)
//! are compute-bound: tiles of output channels are dequantized into one reused buffer and multiplied with gemm,
//! as the INT8/INT4 kernel does.
//!
//! By default the integer paths take over where they are faster: a decode step's ([`super::int_dot`]:
//! activations quantized to 8-bit chunks, integer dot products with the blocks, as llama.cpp's `vec_dot`
//! kernels do) and, on CPUs with AVX-512 VNNI, from [`INTEGER_TILE_ROWS`] rows on, register tiles of `vpdpbusd`
//! ([`super::int_gemm`], as llama.cpp's tiled products do). The float paths here are the exact ones
//! [`super::set_exact_ggml_products`] selects.

use burn::backend::flex::FlexTensor;
use burn::tensor::Shape;
use rayon::prelude::*;

use super::linear::{Operand, OutPtr, product_strided};
use super::quantized::{CHANNELS_PER_TASK, MAX_ROWS, TILE, TILE_ELEMENTS};
use super::simd::vectorized;
use super::{f32_slice, kernel_threads, zeroed};
use crate::ggml::{GgmlMatrix, MAX_BLOCK_LEN, with_block_fn};

/// `x` `[rows, cols]` times `weight` `[out, cols]` transposed, plus `bias` `[out]`, as `[rows, out]`; `None` for
/// inputs this kernel does not take (not 2-D, not contiguous f32, widths that do not match), which the caller
/// computes another way.
pub(crate) fn ggml_dense(
    x: &FlexTensor,
    weight: GgmlMatrix<'_>,
    bias: Option<&FlexTensor>,
) -> Option<FlexTensor> {
    let xs = x.layout().shape();
    let [out, cols] = weight.shape();
    if xs.num_dims() != 2 || xs[1] != cols || xs[0] == 0 {
        return None;
    }
    let rows = xs[0];
    let x = f32_slice(x)?;
    let bias = match bias {
        Some(b) if b.layout().shape().num_elements() != out => return None,
        Some(b) => Some(f32_slice(b)?),
        None => None,
    };
    let mut result = zeroed(Shape::from(vec![rows, out]));
    let dst = &mut result.storage_mut::<f32>()[..rows * out];
    let exact = super::exact_ggml_products();
    let tiled =
        !exact && rows >= INTEGER_TILE_ROWS && integer_many_rows(x, rows, weight, bias, dst);
    if tiled {
        // Written by the integer tiles.
    } else if rows > MAX_ROWS {
        many_rows(x, rows, weight, bias, dst);
    } else if exact {
        few_rows(x, rows, weight, bias, dst);
    } else {
        super::int_dot::few_rows(x, rows, weight, bias, dst);
    }
    Some(result)
}

/// [`ggml_dense`] of several weights with one input (a layer's query, key and value projections), `None`
/// unless the integer tiles take them all ([`super::int_gemm::many_rows_fused`]: AVX-512 VNNI, at least
/// [`INTEGER_TILE_ROWS`] rows, the default products); the caller then runs [`ggml_dense`] per weight.
pub(crate) fn ggml_dense_many(
    x: &FlexTensor,
    weights: &[(GgmlMatrix<'_>, Option<&FlexTensor>)],
) -> Option<Vec<FlexTensor>> {
    let xs = x.layout().shape();
    let [_, cols] = weights.first()?.0.shape();
    if xs.num_dims() != 2
        || xs[1] != cols
        || xs[0] < INTEGER_TILE_ROWS
        || super::exact_ggml_products()
    {
        return None;
    }
    // Checked before the outputs are allocated: without the tiles (AVX2 CPUs) every call declines.
    if !integer_tiles_available() {
        return None;
    }
    let rows = xs[0];
    let x = f32_slice(x)?;
    // Widths and bias lengths are checked by the tiles, which write nothing when one does not fit.
    let biases = weights
        .iter()
        .map(|(_, bias)| bias.map(f32_slice).map_or(Some(None), |b| b.map(Some)))
        .collect::<Option<Vec<_>>>()?;
    let mut results: Vec<FlexTensor> = weights
        .iter()
        .map(|(w, _)| zeroed(Shape::from(vec![rows, w.shape()[0]])))
        .collect();
    let fused = fused_products(x, rows, weights, &biases, &mut results);
    fused.then_some(results)
}

/// The integer tiles of [`ggml_dense_many`] into `results`; whether they ran (nothing is written otherwise).
fn fused_products(
    x: &[f32],
    rows: usize,
    weights: &[(GgmlMatrix<'_>, Option<&FlexTensor>)],
    biases: &[Option<&[f32]>],
    results: &mut [FlexTensor],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let mut products: Vec<super::int_gemm::Product<'_>> = weights
            .iter()
            .zip(biases)
            .zip(results.iter_mut())
            .map(|(((weight, _), &bias), result)| {
                let out = weight.shape()[0];
                super::int_gemm::Product {
                    weight: *weight,
                    bias,
                    dst: &mut result.storage_mut::<f32>()[..rows * out],
                }
            })
            .collect();
        super::int_gemm::many_rows_fused(x, rows, &mut products)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (x, rows, weights, biases, results);
        false
    }
}

/// Rows from which the integer tiles ([`super::int_gemm`], where the CPU has AVX-512 VNNI) beat the decode
/// kernel, measured on batched decode steps of SmolLM2 at 2 threads (`ember bench --batch B`, docs/BENCHMARKS.md).
/// Since the tiles take every weight type on the unsigned side of `vpdpbusd` (no per-chunk sums of the signed
/// types) and keep two chains of sums, they win from 3 rows (step time at 4 rows: Q4_1 -26%, Q4_K_M -21%,
/// Q8_0 -15%, Q6_K -12%; at 3 rows Q4_1 -19%, Q4_K_M -14%, Q8_0 and Q6_K even); at 2 rows the decode kernel
/// wins by 10-20%, each weight block's unpacking serving too few rows.
const INTEGER_TILE_ROWS: usize = 3;

/// Whether the CPU has the integer tiles ([`super::int_gemm`]).
fn integer_tiles_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::int_dot::Vnni::detect().is_some()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The integer prompt path where the CPU has it ([`super::int_gemm`]); `false` (nothing written) elsewhere.
fn integer_many_rows(
    x: &[f32],
    rows: usize,
    weight: GgmlMatrix<'_>,
    bias: Option<&[f32]>,
    dst: &mut [f32],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::int_gemm::many_rows(x, rows, weight, bias, dst)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (x, rows, weight, bias, dst);
        false
    }
}

/// The decode path: output channels split across the pool in tasks of [`CHANNELS_PER_TASK`], each channel
/// expanded block by block into a stack buffer and dotted with every row.
fn few_rows(x: &[f32], rows: usize, weight: GgmlMatrix<'_>, bias: Option<&[f32]>, dst: &mut [f32]) {
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

/// The prompt path: tiles of output channels dequantized (split across threads by channel) into one reused f32
/// buffer and multiplied with gemm straight into their columns of `dst` `[rows, out]`.
fn many_rows(
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

//! A linear layer whose weight is stored as packed INT8/INT4 codes.
//!
//! Decoding is memory-bound: each step reads every weight once to multiply it with one row. The portable path
//! unpacks a tile of codes into an f32 tensor, writes it out and multiplies it, so it moves more bytes than the
//! f32 weight itself (a quantized model decoded 2.5-4x slower than f32 on CPU). Here, for up to [`MAX_ROWS`]
//! rows, each thread streams its share of the output channels' codes straight from the packed bytes into
//! vectorised multiply-adds, reading one byte (INT8) or half a byte (INT4) per weight. More rows (a prompt) are
//! compute-bound: tiles of output channels are dequantized in one vectorised pass each and multiplied with gemm,
//! as a dense layer is.

use std::cell::Cell;

use burn::backend::flex::FlexTensor;
use burn::tensor::{DType, Shape};
use rayon::prelude::*;

use super::linear::{Operand, product_strided};
use super::simd::vectorized;
use super::{f32_slice, kernel_threads, zeroed};
use crate::ops::CodeLayout;

/// Rows above this are multiplied tile by tile with gemm: a prompt's many rows make the product compute-bound,
/// where dequantizing a tile once wins over re-reading the codes per row.
pub(crate) const MAX_ROWS: usize = 16;

/// f32 elements of one dequantized tile on the many-row path (4 MiB): the f32 weight never exists whole.
pub(super) const TILE_ELEMENTS: usize = 1 << 20;

/// Output channels per parallel task: a few hundred KiB of codes at typical widths, enough to amortise the
/// hand-off, small enough to balance the threads.
pub(super) const CHANNELS_PER_TASK: usize = 64;

/// `x` `[rows, in]` times the quantized weight `[out, in]` transposed, plus `bias` `[out]`, as `[rows, out]`.
///
/// `codes` is `[out, row_bytes]` `u8` (INT4: column `2i` in byte `i`'s low nibble, `2i + 1` in its high one);
/// `scales` and `mins` are `[out, groups, 1]` f32. `None` for anything else (`i32` words, non-contiguous
/// tensors), which the caller computes with tensor ops.
pub(crate) fn quantized_dense(
    x: &FlexTensor,
    codes: &FlexTensor,
    scales: &FlexTensor,
    mins: Option<&FlexTensor>,
    bias: Option<&FlexTensor>,
    layout: CodeLayout,
) -> Option<FlexTensor> {
    let (xs, cs) = (x.layout().shape(), codes.layout().shape());
    if xs.num_dims() != 2 || cs.num_dims() != 2 || codes.dtype() != DType::U8 {
        return None;
    }
    let (rows, inputs, out, row_bytes) = (xs[0], xs[1], cs[0], cs[1]);
    let per_byte = match layout.bits {
        8 => 1,
        4 => 2,
        _ => return None,
    };
    let group_len = layout.group_len;
    // Groups must start on a byte (INT4 groups are a multiple of 8 elements), and rows hold whole groups.
    if rows == 0
        || inputs != layout.in_features
        || group_len == 0
        || !group_len.is_multiple_of(per_byte)
    {
        return None;
    }
    let groups = inputs.div_ceil(group_len);
    if row_bytes != groups * group_len / per_byte {
        return None;
    }
    let codes = codes.as_slice::<u8>()?;
    let scales = f32_slice(scales)?;
    let mins = match mins {
        Some(m) => Some(f32_slice(m)?),
        None => None,
    };
    if scales.len() != out * groups || mins.is_some_and(|m| m.len() != out * groups) {
        return None;
    }
    let bias = match bias {
        Some(b) if b.layout().shape().num_elements() != out => return None,
        Some(b) => Some(f32_slice(b)?),
        None => None,
    };
    let x = f32_slice(x)?;
    let weights = Weights {
        codes,
        scales,
        mins,
    };
    let plan = Plan {
        rows,
        inputs,
        row_bytes,
        groups,
        group_len,
        group_bytes: group_len / per_byte,
        zero: if mins.is_some() {
            0.0
        } else {
            layout.zero_code?
        },
    };
    if rows > MAX_ROWS {
        return Some(many_rows(x, out, per_byte, &weights, &plan, bias));
    }
    let inputs = Inputs::new(x, per_byte, mins.is_some(), &plan);

    // Channel-major scratch `[out, rows]`, so each task writes one contiguous range.
    let mut by_channel = vec![0f32; out * rows];
    let task = |(chunk, dst): (usize, &mut [f32])| {
        let first = chunk * CHANNELS_PER_TASK;
        if per_byte == 1 {
            vectorized!(plan.channels::<1>(&inputs, &weights, first, dst))
        } else {
            vectorized!(plan.channels::<2>(&inputs, &weights, first, dst))
        }
    };
    let chunks = by_channel.chunks_mut(CHANNELS_PER_TASK * rows).enumerate();
    if kernel_threads() == 1 || out <= CHANNELS_PER_TASK {
        chunks.for_each(task);
    } else {
        by_channel
            .par_chunks_mut(CHANNELS_PER_TASK * rows)
            .enumerate()
            .for_each(task);
    }

    let mut result = zeroed(Shape::from(vec![rows, out]));
    let dst = &mut result.storage_mut::<f32>()[..rows * out];
    for (o, values) in by_channel.chunks_exact(rows).enumerate() {
        for (r, &v) in values.iter().enumerate() {
            dst[r * out + o] = v + bias.map_or(0.0, |b| b[o]);
        }
    }
    Some(result)
}

thread_local! {
    /// The many-row path's dequantized tile, kept between calls: a prompt runs every projection of every layer
    /// through it, and a fresh zero-filled buffer each time wrote about 14 MB per SmolLM2 layer for nothing.
    pub(super) static TILE: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// `x` `[rows, inputs]` times the quantized weight, for many rows: tiles of output channels are dequantized
/// (split across threads by channel) into one reused f32 buffer and multiplied with gemm straight into their
/// columns of the output.
fn many_rows(
    x: &[f32],
    out: usize,
    per_byte: usize,
    weights: &Weights<'_>,
    plan: &Plan,
    bias: Option<&[f32]>,
) -> FlexTensor {
    let (rows, inputs) = (plan.rows, plan.inputs);
    let tile = (TILE_ELEMENTS / inputs).clamp(1, out);
    // Taken out of the cell rather than borrowed: a call made while this one waits for the pool (a worker
    // thread stealing work) finds it empty and allocates its own.
    let mut buffer = TILE.take();
    if buffer.len() < tile * inputs {
        buffer.resize(tile * inputs, 0.0);
    }
    let mut result = zeroed(Shape::from(vec![rows, out]));
    let dst = &mut result.storage_mut::<f32>()[..rows * out];
    if let Some(bias) = bias {
        for row in dst.chunks_exact_mut(out) {
            row.copy_from_slice(bias);
        }
    }
    for first in (0..out).step_by(tile) {
        let n = tile.min(out - first);
        // Every element of the tile is written before it is read: the dequantization covers whole channels.
        let weight = &mut buffer[..n * inputs];
        let dequantize = |(i, row): (usize, &mut [f32])| {
            let channel = weights.channel(first + i, plan);
            if per_byte == 1 {
                vectorized!(plan.dequantize::<1>(channel, row))
            } else {
                vectorized!(plan.dequantize::<2>(channel, row))
            }
        };
        if kernel_threads() == 1 || n <= CHANNELS_PER_TASK {
            weight.chunks_mut(inputs).enumerate().for_each(dequantize);
        } else {
            weight
                .par_chunks_mut(inputs)
                .with_min_len(CHANNELS_PER_TASK)
                .enumerate()
                .for_each(dequantize);
        }
        // SAFETY: `x` is `[rows, inputs]` and `weight` `[n, inputs]`, both row-major and only read during the
        // product; the weight read as `[inputs, n]` is its transpose. The output rows are `out` apart, starting
        // at column `first`.
        unsafe {
            product_strided(
                (rows, n, inputs),
                Operand::row_major(x, inputs),
                Operand::row_major(weight, inputs).transposed(),
                &mut dst[first..],
                out,
                bias.is_some(),
            );
        }
    }
    TILE.set(buffer);
    result
}

/// The input rows in the form the inner loops read, zero-padded to whole groups (so the padding codes multiply
/// zeros): for INT4 split into even and odd columns (the low and high nibbles' partners), and, for asymmetric
/// schemes, each row's sum over every group (the minimums multiply it).
struct Inputs {
    /// INT8: `[rows, row_bytes]`; INT4: the even columns `[rows, row_bytes]`.
    first: Vec<f32>,
    /// INT4: the odd columns `[rows, row_bytes]`; INT8: empty.
    second: Vec<f32>,
    /// `[rows, groups]`; empty for symmetric schemes.
    group_sums: Vec<f32>,
}

impl Inputs {
    fn new(x: &[f32], per_byte: usize, asymmetric: bool, plan: &Plan) -> Self {
        let (rows, inputs, row_bytes) = (plan.rows, plan.inputs, plan.row_bytes);
        let group_sums = if asymmetric {
            x.chunks_exact(inputs)
                .flat_map(|row| row.chunks(plan.group_len).map(|g| g.iter().sum::<f32>()))
                .collect()
        } else {
            Vec::new()
        };
        let mut first = vec![0f32; rows * row_bytes];
        if per_byte == 1 {
            for (dst, row) in first
                .chunks_exact_mut(row_bytes)
                .zip(x.chunks_exact(inputs))
            {
                dst[..inputs].copy_from_slice(row);
            }
            return Self {
                first,
                second: Vec::new(),
                group_sums,
            };
        }
        let mut second = vec![0f32; rows * row_bytes];
        for (r, row) in x.chunks_exact(inputs).enumerate() {
            for (i, pair) in row.chunks(2).enumerate() {
                first[r * row_bytes + i] = pair[0];
                if let Some(&odd) = pair.get(1) {
                    second[r * row_bytes + i] = odd;
                }
            }
        }
        Self {
            first,
            second,
            group_sums,
        }
    }
}

/// Codes `[out, row_bytes]`, scales and (asymmetric) minimums `[out, groups]`: of every output channel, or
/// (from [`Weights::channel`]) of one.
#[derive(Clone, Copy)]
struct Weights<'a> {
    codes: &'a [u8],
    scales: &'a [f32],
    mins: Option<&'a [f32]>,
}

impl<'a> Weights<'a> {
    /// Output channel `o`'s codes `[row_bytes]`, scales and minimums `[groups]`.
    #[inline(always)]
    fn channel(&self, o: usize, plan: &Plan) -> Weights<'a> {
        let (row_bytes, groups) = (plan.row_bytes, plan.groups);
        Weights {
            codes: &self.codes[o * row_bytes..(o + 1) * row_bytes],
            scales: &self.scales[o * groups..(o + 1) * groups],
            mins: self.mins.map(|m| &m[o * groups..(o + 1) * groups]),
        }
    }
}

/// Sizes shared by every channel of one product.
struct Plan {
    rows: usize,
    /// Input features (columns of `x`).
    inputs: usize,
    row_bytes: usize,
    groups: usize,
    group_len: usize,
    group_bytes: usize,
    /// The code that stands for zero (symmetric); 0 when asymmetric, where `w = c s + m`.
    zero: f32,
}

impl Plan {
    /// Dequantizes one channel into `dst` `[in_features]` with the f32 operations of the portable path
    /// (`(c - zero) * scale`, or `c * scale + min`), so the values are bit-identical to it.
    #[inline(always)]
    fn dequantize<const PER_BYTE: usize>(&self, channel: Weights<'_>, dst: &mut [f32]) {
        for (g, dst) in dst.chunks_mut(self.group_len).enumerate() {
            let group = &channel.codes[g * self.group_bytes..(g + 1) * self.group_bytes];
            let scale = channel.scales[g];
            let value = |c: u8| match channel.mins {
                Some(mins) => f32::from(c) * scale + mins[g],
                None => (f32::from(c) - self.zero) * scale,
            };
            if PER_BYTE == 1 {
                for (w, &c) in dst.iter_mut().zip(group) {
                    *w = value(c);
                }
            } else {
                for (pair, &c) in dst.chunks_mut(2).zip(group) {
                    pair[0] = value(c & 0x0f);
                    if let Some(w) = pair.get_mut(1) {
                        *w = value(c >> 4);
                    }
                }
            }
        }
    }

    /// Writes the outputs of channels `first..` for every row into `dst` `[channels, rows]`; `PER_BYTE` codes
    /// share a byte.
    #[inline(always)]
    fn channels<const PER_BYTE: usize>(
        &self,
        inputs: &Inputs,
        weights: &Weights<'_>,
        first: usize,
        dst: &mut [f32],
    ) {
        for (i, dst) in dst.chunks_exact_mut(self.rows).enumerate() {
            let channel = weights.channel(first + i, self);
            // Rows in blocks of up to four: each pass of codes is decoded once per block and multiplied into every
            // row of it (with a batch of decode rows, a continuously batched server's, decoding the codes again per
            // row made the cost grow with the rows where the bytes read do not). Four rows' accumulators and the
            // decoded codes fit the sixteen AVX2 registers.
            // The rows past the last block of four go one by one: blocks of two and three compiled to code slower
            // per row than single rows (measured: 620 us per row for two against 210 alone and 150 in fours, on a
            // 1536 x 576 INT4 weight).
            for (block, dst) in dst.chunks_mut(4).enumerate() {
                let row = block * 4;
                if dst.len() == 4 {
                    self.row_block::<PER_BYTE, 4>(inputs, channel, row, dst);
                } else {
                    for (r, dst) in dst.chunks_mut(1).enumerate() {
                        self.row_block::<PER_BYTE, 1>(inputs, channel, row + r, dst);
                    }
                }
            }
        }
    }

    /// Writes one channel's output for rows `row..row + R` into `dst` `[R]`. Per row the operations are those of
    /// a single row, in the same order, so a row's result does not depend on the batch it is in.
    #[inline(always)]
    fn row_block<const PER_BYTE: usize, const R: usize>(
        &self,
        inputs: &Inputs,
        channel: Weights<'_>,
        row: usize,
        dst: &mut [f32],
    ) {
        let Weights {
            codes,
            scales,
            mins,
        } = channel;
        // Scaled group sums stay in lanes until the end of the row: one horizontal sum per row, not per group (a
        // group of 32 INT4 codes is a single pass of the lanes).
        let mut lanes = [[0f32; LANES]; R];
        let mut rest = [0f32; R];
        let base: [usize; R] = std::array::from_fn(|r| (row + r) * self.row_bytes);
        for g in 0..self.groups {
            let start = g * self.group_bytes;
            let group = &codes[start..start + self.group_bytes];
            let scale = scales[g];
            let mut acc = [[0f32; LANES]; R];
            let whole = group.len() / LANES * LANES;
            for pass in (0..whole).step_by(LANES) {
                let c = &group[pass..pass + LANES];
                if PER_BYTE == 1 {
                    let mut w = [0f32; LANES];
                    for l in 0..LANES {
                        w[l] = f32::from(c[l]) - self.zero;
                    }
                    for r in 0..R {
                        let x = &inputs.first[base[r] + start + pass..][..LANES];
                        for l in 0..LANES {
                            acc[r][l] += w[l] * x[l];
                        }
                    }
                } else {
                    let (mut lo, mut hi) = ([0f32; LANES], [0f32; LANES]);
                    for l in 0..LANES {
                        lo[l] = f32::from(c[l] & 0x0f) - self.zero;
                        hi[l] = f32::from(c[l] >> 4) - self.zero;
                    }
                    for r in 0..R {
                        let at = base[r] + start + pass;
                        let (e, o) = (&inputs.first[at..][..LANES], &inputs.second[at..][..LANES]);
                        for l in 0..LANES {
                            acc[r][l] += lo[l] * e[l] + hi[l] * o[l];
                        }
                    }
                }
            }
            for r in 0..R {
                for l in 0..LANES {
                    lanes[r][l] += acc[r][l] * scale;
                }
                let at = base[r] + start;
                let mut tail = 0f32;
                for (i, &c) in group.iter().enumerate().skip(whole) {
                    tail += if PER_BYTE == 1 {
                        (f32::from(c) - self.zero) * inputs.first[at + i]
                    } else {
                        let lo = f32::from(c & 0x0f) - self.zero;
                        let hi = f32::from(c >> 4) - self.zero;
                        lo * inputs.first[at + i] + hi * inputs.second[at + i]
                    };
                }
                rest[r] += tail * scale;
                if let Some(mins) = mins {
                    rest[r] += mins[g] * inputs.group_sums[(row + r) * self.groups + g];
                }
            }
        }
        for (r, dst) in dst.iter_mut().enumerate() {
            *dst = lanes[r].iter().sum::<f32>() + rest[r];
        }
    }
}

/// Lanes of the partial sums: two AVX2 registers of f32, so consecutive multiply-adds are independent.
const LANES: usize = 16;

//! The decode path of ggml-packed weights in integer arithmetic, as llama.cpp's `vec_dot_*_q8` kernels do: each
//! activation row is quantized once to 8-bit chunks ([`super::q8`]), each weight block is unpacked once into
//! small integers ([`ember_ggml::unpack`]), and their products are summed exactly in 32-bit integers, 32
//! weights per AVX2 `maddubs` + `madd`, before one f32 multiply-add per 16-element half applies both scales.
//!
//! Error: the weights are used exactly (up to f32 rounding of their per-half map); each activation moves by at
//! most half its chunk's scale, so an output moves by at most `Σ_i |w_i| * d_i / 2` (`d_i = max |x| / 127` of
//! the chunk holding column `i`), about 0.4% of `Σ |w x|` at worst and far less on average.
//!
//! Each output channel's blocks are unpacked once per group of up to [`GROUP`] rows, and each unpacked chunk is
//! loaded into registers once (bytes, per-half scales, minimums) for every row of the group, so a row costs its
//! products and vector multiply-adds only: no scalar arithmetic and no loop-carried scalar sums (a profile of
//! batched decode had shown those as the kernel's hottest instructions). The one-chunk (legacy) types go from
//! their bytes straight into registers on AVX2 ([`Dot::load`]); the K-quants unpack a super-block through a
//! small buffer. Even and odd chunks add into separate accumulators, so one row's multiply-adds are two
//! dependency chains, not one (a single chain bounded single-stream decode at two FMA latencies per chunk).
//!
//! A row's result goes through the same operations in the same order whatever the group, so it is bit-identical
//! alone and in a batch. Channels are split across the pool as the float decode path splits them, and nothing is
//! allocated per call once a thread's activation buffer has grown.

use std::cell::Cell;
use std::ops::Range;

use rayon::prelude::*;

use super::q8::{Q8Chunk, quantize};
#[cfg(target_arch = "x86_64")]
use crate::cpu::isa::{Avx2, AvxVnni, Vnni};
use crate::cpu::kernel_threads;
use crate::cpu::linear::OutPtr;
use crate::cpu::quantized::CHANNELS_PER_TASK;
use crate::cpu::simd::vectorized;
use ember_ggml::GgmlMatrix;
use ember_ggml::unpack::{CHUNK_LEN, F16Reader, IntChunk, SoftF16, Unpack};
use ember_ggml::with_unpacker;

/// Rows sharing one unpacking of a weight block: four f32x8 accumulators leave AVX2's sixteen registers room
/// for the weights and the products.
const GROUP: usize = 4;

/// Chunks unpacked at a time: one K-quant super-block or eight legacy blocks, so the loads of a chunk never wait
/// on the stores that just wrote it.
const SPAN: usize = 8;

thread_local! {
    /// The quantized activations of the calling thread's last product, kept to be reused.
    static ACTIVATIONS: Cell<Vec<Q8Chunk>> = const { Cell::new(Vec::new()) };
}

/// A multiply-add of 32 integer weights with 32 activations, per instruction set, which also widens the blocks'
/// f16 scales as it best can.
pub(super) trait Dot: F16Reader {
    /// Partial sums of one output.
    type Acc: Copy;
    /// One unpacked weight chunk as the instruction set holds it, prepared once for every row it meets.
    type Weight: Copy;
    fn zero(self) -> Self::Acc;
    fn prepare<const SIGNED: bool>(self, w: &IntChunk) -> Self::Weight;
    /// Whether this instruction set's chunks of `U` hold signed integers (then `madd::<true, false>`): the
    /// signed types, and types whose integer offset [`Dot::load`] folds into the integers.
    #[inline(always)]
    fn signed<U: Unpack>(self) -> bool {
        U::SIGNED
    }
    /// The chunk of one block of a one-chunk type `U`: `prepare(unpack(b))`, or, for instruction sets with their
    /// own load of the type, the same weights straight from the bytes into registers (integers and scale equal;
    /// an integer offset such as Q4_0's 8 may move from the minimum into the integers, see [`Dot::signed`]).
    #[inline(always)]
    fn load<U: Unpack>(self, b: &[u8]) -> Self::Weight {
        through_memory::<Self, U>(self, b)
    }
    /// An unpacked chunk of `U` prepared as [`Dot::signed`] says.
    #[inline(always)]
    fn prepare_of<U: Unpack>(self, w: &IntChunk) -> Self::Weight {
        if U::SIGNED {
            self.prepare::<true>(w)
        } else {
            self.prepare::<false>(w)
        }
    }
    /// `acc + Σ_h w.scale[h] * x.d * Σ_{i in half h} w[i] * x[i]`, plus `Σ_h w.min[h] * x.sums[h]` with `MIN`;
    /// `w` unsigned bytes, or `i8` when `SIGNED`.
    fn madd<const SIGNED: bool, const MIN: bool>(
        self,
        acc: Self::Acc,
        w: &Self::Weight,
        x: &Q8Chunk,
    ) -> Self::Acc;
    /// The total of both accumulators of an output (even and odd chunks).
    fn sum(self, acc: [Self::Acc; 2]) -> f32;
}

/// A one-chunk block of `U` unpacked into a buffer and prepared: [`Dot::load`] for types without a load of
/// their own.
#[inline(always)]
fn through_memory<D: Dot, U: Unpack>(dot: D, b: &[u8]) -> D::Weight {
    let mut chunk = [IntChunk::default()];
    U::unpack(dot, b, &mut chunk);
    dot.prepare_of::<U>(&chunk[0])
}

/// Plain Rust, for CPUs without AVX2 (and the oracle the AVX2 path is tested against).
#[derive(Clone, Copy, Debug)]
pub(super) struct Portable;

impl F16Reader for Portable {
    #[inline(always)]
    fn f16(self, b: &[u8], at: usize) -> f32 {
        SoftF16.f16(b, at)
    }
}

impl Dot for Portable {
    type Acc = [f32; 2];
    type Weight = IntChunk;

    #[inline(always)]
    fn zero(self) -> [f32; 2] {
        [0.0; 2]
    }

    #[inline(always)]
    fn prepare<const SIGNED: bool>(self, w: &IntChunk) -> IntChunk {
        *w
    }

    #[inline(always)]
    fn madd<const SIGNED: bool, const MIN: bool>(
        self,
        acc: [f32; 2],
        w: &IntChunk,
        x: &Q8Chunk,
    ) -> [f32; 2] {
        let mut out = acc;
        for (h, out) in out.iter_mut().enumerate() {
            let half = 16 * h..16 * h + 16;
            let sum: i32 = w.q[half.clone()]
                .iter()
                .zip(&x.q[half])
                .map(|(&w, &x)| {
                    let w = if SIGNED {
                        i32::from(w as i8)
                    } else {
                        i32::from(w)
                    };
                    w * i32::from(x)
                })
                .sum();
            *out += w.scale[h] * x.d * sum as f32;
            if MIN {
                *out += w.min[h] * x.sums[h];
            }
        }
        out
    }

    #[inline(always)]
    fn sum(self, acc: [[f32; 2]; 2]) -> f32 {
        (acc[0][0] + acc[1][0]) + (acc[0][1] + acc[1][1])
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2;

#[cfg(target_arch = "x86_64")]
mod vnni;

/// One product: the weight, the quantized rows `[rows, cols / 32]`, the bias and where `[rows, out]` goes.
struct Plan<'a> {
    weight: GgmlMatrix<'a>,
    activations: &'a [Q8Chunk],
    rows: usize,
    bias: Option<&'a [f32]>,
    dst: OutPtr,
}

/// `x` `[rows, cols]` (at most a decode batch) times `weight` transposed plus `bias`, into `dst` `[rows, out]`.
pub(super) fn few_rows(
    x: &[f32],
    rows: usize,
    weight: GgmlMatrix<'_>,
    bias: Option<&[f32]>,
    dst: &mut [f32],
) {
    product(x, rows, weight, bias, dst, run);
}

/// [`few_rows`] on the portable path whatever the CPU: the native paths' oracle.
#[cfg(test)]
pub(super) fn few_rows_portable(
    x: &[f32],
    rows: usize,
    weight: GgmlMatrix<'_>,
    bias: Option<&[f32]>,
    dst: &mut [f32],
) {
    few_rows_with(Portable, x, rows, weight, bias, dst)
}

/// [`few_rows`] with the instruction set `dot` (outside functions compiled for it, its intrinsics are calls:
/// slow, the same results).
#[cfg(test)]
pub(super) fn few_rows_with<D: Dot + Sync>(
    dot: D,
    x: &[f32],
    rows: usize,
    weight: GgmlMatrix<'_>,
    bias: Option<&[f32]>,
    dst: &mut [f32],
) {
    product(x, rows, weight, bias, dst, |plan, channels| {
        channels_with(dot, plan, channels)
    });
}

/// Quantizes `x` and runs `channels` over the output channels in parallel tasks.
fn product(
    x: &[f32],
    rows: usize,
    weight: GgmlMatrix<'_>,
    bias: Option<&[f32]>,
    dst: &mut [f32],
    channels: impl Fn(&Plan<'_>, Range<usize>) + Sync,
) {
    let [out, cols] = weight.shape();
    // Taken out of the cell rather than borrowed, as the tile buffer is: a product run while this one waits for
    // the pool finds it empty and allocates its own.
    let mut activations = ACTIVATIONS.take();
    let chunks = rows * cols / CHUNK_LEN;
    if activations.len() < chunks {
        activations.resize(chunks, Q8Chunk::default());
    }
    vectorized!(quantize(&x[..rows * cols], &mut activations[..chunks]));
    let plan = Plan {
        weight,
        activations: &activations[..chunks],
        rows,
        bias,
        dst: OutPtr(dst.as_mut_ptr()),
    };
    run_split(out, |channel_range| channels(&plan, channel_range));
    ACTIVATIONS.set(activations);
}

/// Runs `task` over `out` output channels in the equal parts [`split`] makes, on the spinning pool (a product
/// as small as a decode step's is over before rayon's threads wake), or on rayon where the pool is busy.
pub(super) fn run_split(out: usize, task: impl Fn(Range<usize>) + Sync) {
    let threads = kernel_threads();
    let (tasks, per_task) = split(out, threads);
    let task = |t: usize| task(t * per_task..((t + 1) * per_task).min(out));
    if threads == 1 || tasks == 1 {
        (0..tasks).for_each(task);
    } else if threads < rayon::current_num_threads() || !crate::cpu::spin_pool::run(tasks, &task) {
        // The spinning workers are one per pool thread: a caller capped below the pool (`with_kernel_threads`)
        // keeps to rayon rather than wake them all.
        (0..tasks).into_par_iter().for_each(task);
    }
}

/// `(tasks, channels per task)` for `out` channels on `threads` threads: about [`CHANNELS_PER_TASK`] channels a
/// task, in a multiple of `threads` equal tasks. Tasks of a fixed size left one thread idle at the end of a
/// decode step's small products (576 channels in 9 tasks run 5 against 4 on two threads, 192 in 3 run 2 against
/// 1).
pub(super) fn split(out: usize, threads: usize) -> (usize, usize) {
    let threads = threads.max(1);
    let tasks = out.div_ceil(CHANNELS_PER_TASK).div_ceil(threads) * threads;
    let per_task = out.div_ceil(tasks).max(1);
    (out.div_ceil(per_task), per_task)
}

/// Output channels `channels` of `plan`, on the best instruction set the CPU has.
fn run(plan: &Plan<'_>, channels: Range<usize>) {
    with_unpacker!(plan.weight.ty(), |U| run_typed::<U>(plan, channels), ())
}

/// [`run`] for one block type: each type gets its own AVX2 function, small enough for LLVM to inline the
/// unpacker and the intrinsics into it (one function for all twelve types exhausted its inlining budget and
/// left the unpackers as calls).
#[inline(always)]
fn run_typed<U: Unpack>(plan: &Plan<'_>, channels: Range<usize>) {
    for_each_group(plan.rows, |rows, size| match size {
        1 => run_group::<U, 1>(plan, rows, channels.clone()),
        2 => run_group::<U, 2>(plan, rows, channels.clone()),
        3 => run_group::<U, 3>(plan, rows, channels.clone()),
        _ => run_group::<U, GROUP>(plan, rows, channels.clone()),
    })
}

/// Calls `f(rows, size)` for the groups a product's `rows` are split into: whole groups of [`GROUP`], then one
/// group of the one to three rows left. The rest in one group too: one row at a time had unpacked each block
/// once per row, so 7 rows cost four passes over the weights and ran slower than 8 (docs/BENCHMARKS.md).
#[inline(always)]
fn for_each_group(rows: usize, mut f: impl FnMut(Range<usize>, usize)) {
    let whole = rows / GROUP * GROUP;
    if whole > 0 {
        f(0..whole, GROUP);
    }
    if rows > whole {
        f(whole..rows, rows - whole);
    }
}

/// Rows `rows` (whole groups of `R`) of output channels `channels`, on the best instruction set the CPU has.
/// Each group size is its own function: one function holding every size had grown past LLVM's inlining
/// budget and left a single row's unpacking as calls (10% off a decode step).
#[inline(always)]
fn run_group<U: Unpack, const R: usize>(
    plan: &Plan<'_>,
    rows: Range<usize>,
    channels: Range<usize>,
) {
    #[cfg(target_arch = "x86_64")]
    if let Some(vnni) = Vnni::detect() {
        // SAFETY: `vnni` proves the CPU has the features `typed_vnni` is compiled with.
        return unsafe { typed_vnni::<U, R>(vnni, plan, rows, channels) };
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(vnni) = AvxVnni::detect() {
        // SAFETY: `vnni` proves the CPU has the features `typed_avx_vnni` is compiled with.
        return unsafe { typed_avx_vnni::<U, R>(vnni, plan, rows, channels) };
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(avx2) = Avx2::detect() {
        // SAFETY: `avx2` proves the CPU has the features `typed_avx2` is compiled with.
        return unsafe { typed_avx2::<U, R>(avx2, plan, rows, channels) };
    }
    type_channels::<Portable, U, R>(Portable, plan, rows, channels)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn typed_vnni<U: Unpack, const R: usize>(
    vnni: Vnni,
    plan: &Plan<'_>,
    rows: Range<usize>,
    channels: Range<usize>,
) {
    type_channels::<Vnni, U, R>(vnni, plan, rows, channels)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn typed_avx_vnni<U: Unpack, const R: usize>(
    vnni: AvxVnni,
    plan: &Plan<'_>,
    rows: Range<usize>,
    channels: Range<usize>,
) {
    type_channels::<AvxVnni, U, R>(vnni, plan, rows, channels)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn typed_avx2<U: Unpack, const R: usize>(
    avx2: Avx2,
    plan: &Plan<'_>,
    rows: Range<usize>,
    channels: Range<usize>,
) {
    type_channels::<Avx2, U, R>(avx2, plan, rows, channels)
}

/// Output channels `channels` of `plan` with `dot`, for tests that choose the instruction set.
#[cfg(test)]
fn channels_with<D: Dot>(dot: D, plan: &Plan<'_>, channels: Range<usize>) {
    with_unpacker!(
        plan.weight.ty(),
        |U| for_each_group(plan.rows, |rows, size| match size {
            1 => type_channels::<D, U, 1>(dot, plan, rows, channels.clone()),
            2 => type_channels::<D, U, 2>(dot, plan, rows, channels.clone()),
            3 => type_channels::<D, U, 3>(dot, plan, rows, channels.clone()),
            _ => type_channels::<D, U, GROUP>(dot, plan, rows, channels.clone()),
        }),
        ()
    )
}

/// Rows `rows` of output channels `channels`, `R` rows sharing each unpacking.
#[inline(always)]
fn type_channels<D: Dot, U: Unpack, const R: usize>(
    dot: D,
    plan: &Plan<'_>,
    rows: Range<usize>,
    channels: Range<usize>,
) {
    let [out, _] = plan.weight.shape();
    for o in channels {
        let row = plan.weight.row(o);
        let bias = plan.bias.map_or(0.0, |b| b[o]);
        for first in rows.clone().step_by(R) {
            let sums = group::<D, U, R>(dot, plan, row, first);
            for (r, &sum) in (first..).zip(&sums) {
                // SAFETY: `dst` is `[rows, out]`; `r < rows` and `o < out`, and each channel `o` belongs to
                // exactly one task, so no two writes touch the same element and nothing reads `dst` meanwhile.
                unsafe { *plan.dst.get().add(r * out + o) = sum + bias };
            }
        }
    }
}

/// Adds `w` times chunk `chunk` of each of the `R` rows in `rows` (`per_row` chunks a row) into accumulator `k`
/// of that row. A function rather than the closure's body: a closure called from three places stopped being
/// inlined, and outside `typed_avx2` its intrinsics compiled to calls (a 12x slower decode).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn madd_rows<D: Dot, const R: usize>(
    dot: D,
    signed: bool,
    acc: &mut [[D::Acc; 2]; R],
    k: usize,
    w: &D::Weight,
    rows: &[Q8Chunk],
    per_row: usize,
    chunk: usize,
) {
    for (r, acc) in acc.iter_mut().enumerate() {
        let a = &rows[r * per_row + chunk];
        // `signed` is a constant: one arm survives, and signed chunks have no minimum.
        acc[k] = if signed {
            dot.madd::<true, false>(acc[k], w, a)
        } else {
            dot.madd::<false, true>(acc[k], w, a)
        };
    }
}

/// How far ahead of the block being multiplied its stream of weight bytes is fetched into the cache. The weights
/// of a decode step come from memory, not the cache (a model is larger than the last level); the hardware
/// prefetcher alone left the LM head's Q8_0 loop waiting on its loads.
const PREFETCH_BYTES: usize = 3072;

/// Asks for the cache lines `ahead` bytes past each 64 bytes of `block` (hints only: the addresses may lie past
/// the weights, where a prefetch does nothing).
#[inline(always)]
pub(super) fn prefetch_ahead(block: &[u8], ahead: usize) {
    #[cfg(target_arch = "x86_64")]
    for at in (0..block.len()).step_by(64) {
        let line = block.as_ptr().wrapping_add(ahead + at);
        // SAFETY: `_mm_prefetch` is SSE (every x86-64 CPU) and never faults, whatever the address.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line.cast())
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (block, ahead);
}

/// One channel's blocks `row` dotted with rows `first..first + R`.
#[inline(always)]
fn group<D: Dot, U: Unpack, const R: usize>(
    dot: D,
    plan: &Plan<'_>,
    row: &[u8],
    first: usize,
) -> [f32; R] {
    let [_, cols] = plan.weight.shape();
    let (per_block, block_bytes) = (U::CHUNKS, U::BLOCK_BYTES);
    let per_row = cols / CHUNK_LEN;
    let rows = &plan.activations[first * per_row..(first + R) * per_row];
    // `acc[r][k]`: row `r`'s even (`k = 0`) and odd chunks.
    let mut acc = [[dot.zero(); 2]; R];
    let signed = dot.signed::<U>();
    let madd = |acc: &mut [[D::Acc; 2]; R], k: usize, w: &D::Weight, chunk: usize| {
        madd_rows(dot, signed, acc, k, w, rows, per_row, chunk)
    };
    if per_block == 1 {
        // One chunk per block: each goes from its bytes to registers (`Dot::load`). Pairs of exactly two
        // blocks, so the block boundaries are constants (`chunks` had spent a dozen scalar instructions per
        // pair computing them).
        let pairs = row.chunks_exact(2 * block_bytes);
        let last = pairs.remainder();
        for (c, pair) in pairs.enumerate() {
            prefetch_ahead(pair, PREFETCH_BYTES);
            let (even, odd) = pair.split_at(block_bytes);
            madd(&mut acc, 0, &dot.load::<U>(even), 2 * c);
            madd(&mut acc, 1, &dot.load::<U>(odd), 2 * c + 1);
        }
        if !last.is_empty() {
            madd(&mut acc, 0, &dot.load::<U>(last), per_row - 1);
        }
    } else {
        let mut chunks = [IntChunk::default(); SPAN];
        for (s, span) in row.chunks(SPAN / per_block * block_bytes).enumerate() {
            prefetch_ahead(span, PREFETCH_BYTES);
            let n = span.len() / block_bytes * per_block;
            for (block, chunks) in span
                .chunks_exact(block_bytes)
                .zip(chunks.chunks_exact_mut(per_block))
            {
                U::unpack(dot, block, chunks);
            }
            // `SPAN` is even, so a chunk's parity within its span is its parity within the row.
            for (c, pair) in chunks[..n].chunks(2).enumerate() {
                for (k, w) in pair.iter().enumerate() {
                    let w = dot.prepare_of::<U>(w);
                    madd(&mut acc, k, &w, s * SPAN + 2 * c + k);
                }
            }
        }
    }
    let mut sums = [0f32; R];
    for (sum, acc) in sums.iter_mut().zip(acc) {
        *sum = dot.sum(acc);
    }
    sums
}

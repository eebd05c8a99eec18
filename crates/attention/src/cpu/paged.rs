//! [`crate::paged_attention`] on burn-flex: one task per batch row (or, with fewer rows than twice the threads,
//! per row and query head), reading key and value rows straight from the pool's storage.
//!
//! Per query, the arithmetic is the flash kernel's for a few rows ([`super::strided_gemm`]'s plain loops) in the
//! same order: scores `scale * (q · k)` in eight lanes, `exp(s - max)` summed in eight lanes, the weighted
//! values accumulated key by key, then divided by the sum. So a decode step gives bit for bit what the flash
//! kernel gives over the gathered copy, and a row's output does not depend on the rows batched with it.

use std::cell::Cell;

use burn::backend::flex::FlexTensor;
use burn::tensor::Shape;

use super::flash::{Heads, HeadsOut, exp_shifted_sum};
use super::simd::vectorized;
use super::strided_gemm::dot;
use super::{f32_slice, heads_view, kernel_threads, zeroed};
use crate::paged::{PagedConfig, PagedRows};

/// Multiply-adds from which a call's tasks go to the spinning pool rather than run on the calling thread.
const PARALLEL_MIN_OPS: usize = 1 << 15;

thread_local! {
    /// A task's scores and output rows, kept to be reused.
    static SCRATCH: Cell<(Vec<f32>, Vec<f32>)> = const { Cell::new((Vec::new(), Vec::new())) };
}

/// The shape of one call.
#[derive(Clone, Copy)]
struct Dims {
    batch: usize,
    q_heads: usize,
    kv_heads: usize,
    q_len: usize,
    head_dim: usize,
    v_dim: usize,
}

/// Output `[batch, q_heads, q_len, v_dim]` (position-major in memory, as the flash kernel's), or `None` for
/// inputs this kernel does not take.
pub(crate) fn paged_attention(
    q: &FlexTensor,
    keys: &FlexTensor,
    values: &FlexTensor,
    rows: PagedRows<'_>,
    config: PagedConfig,
) -> Option<FlexTensor> {
    let d = dims(q, keys, values, &rows)?;
    let qh = Heads::of(q, [d.batch, d.q_heads, d.q_len, d.head_dim])?;
    let (k, v) = (f32_slice(keys)?, f32_slice(values)?);
    let slots = keys.layout().shape()[0];
    if k.len() != slots * d.kv_heads * d.head_dim || v.len() != slots * d.kv_heads * d.v_dim {
        return None;
    }
    if (0..d.batch).any(|b| rows.row(b).is_none_or(|r| r.len() < d.q_len))
        || rows.slots.iter().any(|&s| s >= slots)
    {
        return None;
    }
    let ops = rows.slots.len() * d.q_heads * d.q_len * (d.head_dim + d.v_dim);
    let mut out = zeroed(Shape::from(vec![d.batch, d.q_len, d.q_heads, d.v_dim]));
    let out_rows = HeadsOut::new(&mut out);
    let group = d.q_heads / d.kv_heads;
    let scale = config.scale as f32;
    let threads = kernel_threads();
    // A task per row and query head while there are few rows (one client's step still splits across the
    // threads); with enough rows a task takes a whole row, whose key and value rows are then read front to
    // back, each position's heads one contiguous run.
    let heads_per_task = if d.batch >= 2 * threads { d.q_heads } else { 1 };
    let per_row = d.q_heads / heads_per_task;
    let task = |t: usize| {
        let b = t / per_row;
        let first = t % per_row * heads_per_task;
        // Checked above: every row exists and holds at least `q_len` positions in range.
        let Some(row) = rows.row(b) else { return };
        let (mut scores, mut acc) = SCRATCH.take();
        let queries: Vec<(&[f32], usize)> = (first..first + heads_per_task)
            .map(|h| qh.head(b * d.q_heads + h))
            .collect();
        let task = Task {
            d: &d,
            first,
            group,
            row,
            k,
            v,
            scale,
            window: config.window,
        };
        vectorized!(task.attend(&queries, &mut scores, &mut acc));
        for (r, rows) in acc.chunks_exact(d.q_len * d.v_dim).enumerate() {
            // SAFETY: the heads of this task's row belong to it alone.
            unsafe { out_rows.write(b * d.q_heads + first + r, 0, rows) };
        }
        SCRATCH.set((scores, acc));
    };
    let count = d.batch * per_row;
    let spun = threads > 1
        && ops >= PARALLEL_MIN_OPS
        && threads == rayon::current_num_threads()
        && super::spin_pool::run(count, &task);
    if !spun {
        (0..count).for_each(task);
    }
    Some(heads_view(out))
}

/// The call's shape, or `None` when the operands disagree.
fn dims(
    q: &FlexTensor,
    keys: &FlexTensor,
    values: &FlexTensor,
    rows: &PagedRows<'_>,
) -> Option<Dims> {
    let (qs, ks, vs) = (
        q.layout().shape(),
        keys.layout().shape(),
        values.layout().shape(),
    );
    if qs.num_dims() != 4 || ks.num_dims() != 3 || vs.num_dims() != 3 {
        return None;
    }
    let d = Dims {
        batch: qs[0],
        q_heads: qs[1],
        kv_heads: ks[1],
        q_len: qs[2],
        head_dim: qs[3],
        v_dim: vs[2],
    };
    let fits = rows.batch() == d.batch
        && d.batch > 0
        && d.q_len > 0
        && d.kv_heads > 0
        && d.q_heads.is_multiple_of(d.kv_heads)
        && ks[2] == d.head_dim
        && vs[0] == ks[0]
        && vs[1] == d.kv_heads;
    fits.then_some(d)
}

/// One task: query heads `first..` of one row over that row's positions.
struct Task<'a> {
    d: &'a Dims,
    first: usize,
    /// Query heads per KV head.
    group: usize,
    row: &'a [usize],
    k: &'a [f32],
    v: &'a [f32],
    scale: f32,
    window: Option<usize>,
}

/// Output columns a decode query accumulates in registers at a time: four AVX2 vectors.
const TILE: usize = 32;

impl Task<'_> {
    /// Keys `lo..hi` of the row that query `i` (of the last `q_len` positions) sees.
    #[inline(always)]
    fn visible(&self, i: usize) -> (usize, usize) {
        let hi = self.row.len() - self.d.q_len + i + 1;
        (self.window.map_or(0, |w| hi.saturating_sub(w)), hi)
    }

    /// KV head `kv`'s key (`of = k`, `width = head_dim`) or value row at position `p`.
    #[inline(always)]
    fn at<'s>(&self, of: &'s [f32], width: usize, p: usize, kv: usize) -> &'s [f32] {
        let start = (self.row[p] * self.d.kv_heads + kv) * width;
        &of[start..start + width]
    }

    /// Writes into `acc` (`[query head][q_len][v_dim]`) every query's output; `queries[r]` is the task's query
    /// head `r` (its rows and row stride), `scores` scratch.
    #[inline(always)]
    fn attend(&self, queries: &[(&[f32], usize)], scores: &mut Vec<f32>, acc: &mut Vec<f32>) {
        let Dims {
            q_len,
            head_dim,
            v_dim,
            ..
        } = *self.d;
        let len = self.row.len();
        let n = queries.len() * q_len;
        scores.clear();
        scores.resize(n * len, 0.0);
        acc.clear();
        acc.resize(n * v_dim, 0.0);
        for (r, &(q, stride)) in queries.iter().enumerate() {
            let kv = (self.first + r) / self.group;
            for i in 0..q_len {
                let qi = r * q_len + i;
                let (lo, hi) = self.visible(i);
                let q = &q[i * stride..i * stride + head_dim];
                let scores = &mut scores[qi * len + lo..qi * len + hi];
                self.scores(q, lo, kv, scores);
                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let sum = exp_shifted_sum(scores, max);
                let out = &mut acc[qi * v_dim..(qi + 1) * v_dim];
                self.weighted_values(scores, lo, kv, out);
                let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
                out.iter_mut().for_each(|x| *x *= inv);
            }
        }
    }

    /// `scores[p - lo] = scale * (q · k_p)` for the keys of KV head `kv` at positions `lo..`, as the flash
    /// kernel's [`dot`] computes each.
    #[inline(always)]
    fn scores(&self, q: &[f32], lo: usize, kv: usize, scores: &mut [f32]) {
        let head_dim = self.d.head_dim;
        let key = |j: usize| self.at(self.k, head_dim, lo + j, kv);
        #[cfg(target_arch = "x86_64")]
        if super::simd::has_avx2_fma() {
            // SAFETY: the CPU has AVX2 and FMA, checked just above.
            return unsafe { avx2::scores(q, key, self.scale, scores) };
        }
        for (j, score) in scores.iter_mut().enumerate() {
            *score = self.scale * dot(q, key(j));
        }
    }

    /// `out += Σ_p weights[p - lo] v_p` over positions `lo..` of KV head `kv`, key by key (the flash kernel's
    /// order per element), [`TILE`] columns at a time held in registers across the positions.
    #[inline(always)]
    fn weighted_values(&self, weights: &[f32], lo: usize, kv: usize, out: &mut [f32]) {
        let v_dim = self.d.v_dim;
        let value = |j: usize| self.at(self.v, v_dim, lo + j, kv);
        #[cfg(target_arch = "x86_64")]
        if super::simd::has_avx2_fma() {
            // SAFETY: the CPU has AVX2 and FMA, checked just above.
            return unsafe { avx2::weighted_values(weights, value, out) };
        }
        let mut tiles = out.chunks_exact_mut(TILE);
        for (t, tile_out) in (&mut tiles).enumerate() {
            let mut tile = [0f32; TILE];
            for (j, &w) in weights.iter().enumerate() {
                let value = &value(j)[t * TILE..(t + 1) * TILE];
                for (o, &x) in tile.iter_mut().zip(value) {
                    *o += w * x;
                }
            }
            tile_out.copy_from_slice(&tile);
        }
        let rest = tiles.into_remainder();
        let from = v_dim - rest.len();
        for (j, &w) in weights.iter().enumerate() {
            for (o, &x) in rest.iter_mut().zip(&value(j)[from..]) {
                *o += w * x;
            }
        }
    }
}

/// The two loops in AVX2 intrinsics, computing exactly what the portable ones do (the same multiplies and adds,
/// no fused multiply-add, in the same order): scores eight keys at a time, so each chunk of the query meets
/// eight independent sums and the eight sums are reduced together, where one key at a time had waited on its
/// own chain and reduction; values eight vectors at a time, a 64-wide head's whole output held in registers.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::super::strided_gemm::{dot, dot_tail};

    /// Lane `t`: the eight lanes of `acc[t]` added as [`super::super::strided_gemm::lane_sum`] adds them.
    #[inline(always)]
    unsafe fn lane_sums(acc: [__m256; 8]) -> __m256 {
        // SAFETY (for the caller): AVX.
        unsafe {
            // Per 128-bit half: ((l0 + l1) + (l2 + l3)) of each accumulator, then ((l4 + l5) + (l6 + l7)).
            let front = _mm256_hadd_ps(
                _mm256_hadd_ps(acc[0], acc[1]),
                _mm256_hadd_ps(acc[2], acc[3]),
            );
            let back = _mm256_hadd_ps(
                _mm256_hadd_ps(acc[4], acc[5]),
                _mm256_hadd_ps(acc[6], acc[7]),
            );
            _mm256_add_ps(
                _mm256_permute2f128_ps::<0x20>(front, back),
                _mm256_permute2f128_ps::<0x31>(front, back),
            )
        }
    }

    /// `scores[j] = scale * dot(q, key(j))`; every key is `q.len()` long.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn scores<'k>(
        q: &[f32],
        key: impl Fn(usize) -> &'k [f32],
        scale: f32,
        scores: &mut [f32],
    ) {
        let chunks = q.len() / 8;
        let tail = chunks * 8;
        for (g, out) in scores.chunks_exact_mut(8).enumerate() {
            let keys: [&[f32]; 8] = std::array::from_fn(|t| key(8 * g + t));
            // SAFETY: AVX2 by this function's features; every load is of 8 floats at `8 c < 8 chunks <= len`
            // of `q` and of each key, as long as `q`.
            unsafe {
                let mut acc = [_mm256_setzero_ps(); 8];
                for c in 0..chunks {
                    let x = _mm256_loadu_ps(q.as_ptr().add(8 * c));
                    for (acc, key) in acc.iter_mut().zip(&keys) {
                        let y = _mm256_loadu_ps(key.as_ptr().add(8 * c));
                        *acc = _mm256_add_ps(*acc, _mm256_mul_ps(x, y));
                    }
                }
                let mut sums = [0f32; 8];
                _mm256_storeu_ps(sums.as_mut_ptr(), lane_sums(acc));
                for ((out, sum), key) in out.iter_mut().zip(sums).zip(&keys) {
                    *out = scale * (sum + dot_tail(&q[tail..], &key[tail..]));
                }
            }
        }
        let done = scores.len() / 8 * 8;
        for (j, out) in scores.iter_mut().enumerate().skip(done) {
            *out = scale * dot(q, key(j));
        }
    }

    /// `out += Σ_j weights[j] value(j)`, position by position; every value row is `out.len()` long.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn weighted_values<'v>(
        weights: &[f32],
        value: impl Fn(usize) -> &'v [f32],
        out: &mut [f32],
    ) {
        let width = out.len();
        let mut from = 0;
        // SAFETY (both): AVX2 by this function's features; the columns `from..from + 8 R` lie within `out`
        // and every value row.
        while from + 64 <= width {
            unsafe { columns::<8>(weights, &value, from, out) };
            from += 64;
        }
        while from + 8 <= width {
            unsafe { columns::<1>(weights, &value, from, out) };
            from += 8;
        }
        for (j, &w) in weights.iter().enumerate() {
            for (o, &x) in out[from..].iter_mut().zip(&value(j)[from..]) {
                *o += w * x;
            }
        }
    }

    /// Columns `from..from + 8 R` of [`weighted_values`], held in `R` registers across the positions.
    #[inline(always)]
    unsafe fn columns<'v, const R: usize>(
        weights: &[f32],
        value: &impl Fn(usize) -> &'v [f32],
        from: usize,
        out: &mut [f32],
    ) {
        // SAFETY (for the caller): AVX; `from + 8 R` within `out` and every value row.
        unsafe {
            let mut acc: [__m256; R] =
                std::array::from_fn(|r| _mm256_loadu_ps(out.as_ptr().add(from + 8 * r)));
            for (j, &w) in weights.iter().enumerate() {
                let w = _mm256_set1_ps(w);
                let row = value(j).as_ptr().add(from);
                for (r, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm256_add_ps(*acc, _mm256_mul_ps(w, _mm256_loadu_ps(row.add(8 * r))));
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                _mm256_storeu_ps(out.as_mut_ptr().add(from + 8 * r), *acc);
            }
        }
    }
}

//! Flash attention on burn-flex in native code: per (batch, head) and block of query rows, the scores against the
//! visible keys are one gemm, the softmax one vectorised pass, and the weighted values one more gemm; the backward
//! pass recomputes the probabilities from the saved log-sum-exp (FlashAttention-2) with five gemms per block, one
//! task per KV head so that its grouped query heads accumulate `dk` and `dv` without sharing them.
//!
//! The tensor-op kernel ([`crate::flash`]) spends most of its time in burn-flex's per-op overhead at the sizes a
//! CPU trains and prefills at (strided tile copies, masks built as tensors, a graph of small ops per tile).

use burn::backend::flex::FlexTensor;
use burn::tensor::{DType, Shape};
use rayon::prelude::*;

use super::f32_slice;
use super::simd::{exp, vectorized};

/// Replaces each `x` of `row` by `exp(x - max)` and returns their sum (in 8 lanes, so both loops vectorise).
#[inline(always)]
fn exp_shifted_sum(row: &mut [f32], max: f32) -> f32 {
    for x in row.iter_mut() {
        *x = exp(*x - max);
    }
    let mut lanes = [0f32; 8];
    let mut chunks = row.chunks_exact(8);
    for chunk in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(chunk) {
            *l += x;
        }
    }
    lanes.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
}
use crate::MaskSpec;

/// Query rows per block: a block's scores (`ROWS x keys`) stay in cache for keys in the low thousands.
const ROWS: usize = 64;

/// Multiply-adds below which a call stays on the calling thread.
const PARALLEL_MIN_OPS: usize = 1 << 18;

/// The shape of one call, from q `[batch, q_heads, q_len, head_dim]` and v `[batch, kv_heads, kv_len, v_dim]`.
#[derive(Clone, Copy)]
struct Dims {
    batch: usize,
    q_heads: usize,
    kv_heads: usize,
    q_len: usize,
    kv_len: usize,
    head_dim: usize,
    v_dim: usize,
}

impl Dims {
    fn of(q: &FlexTensor, k: &FlexTensor, v: &FlexTensor) -> Option<Self> {
        let (qs, ks, vs) = (q.layout().shape(), k.layout().shape(), v.layout().shape());
        if qs.num_dims() != 4 || ks.num_dims() != 4 || vs.num_dims() != 4 {
            return None;
        }
        let dims = Dims {
            batch: qs[0],
            q_heads: qs[1],
            kv_heads: ks[1],
            q_len: qs[2],
            kv_len: ks[2],
            head_dim: qs[3],
            v_dim: vs[3],
        };
        let consistent = ks[0] == dims.batch
            && vs[0] == dims.batch
            && vs[1] == dims.kv_heads
            && vs[2] == dims.kv_len
            && ks[3] == dims.head_dim
            && dims.kv_heads > 0
            && dims.q_heads.is_multiple_of(dims.kv_heads)
            && dims.q_len > 0
            && dims.kv_len > 0;
        consistent.then_some(dims)
    }

    fn group(&self) -> usize {
        self.q_heads / self.kv_heads
    }

    fn ops(&self) -> usize {
        self.batch * self.q_heads * self.q_len * self.kv_len * (self.head_dim + self.v_dim)
    }
}

/// Visible keys `lo..hi` of the query at absolute position `pos` (empty when every key is hidden).
fn visible(mask: &MaskSpec, pos: usize, kv_len: usize) -> (usize, usize) {
    let hi = if mask.causal {
        (pos + 1).min(kv_len)
    } else {
        kv_len
    };
    let lo = mask.window.map_or(0, |w| (pos + 1).saturating_sub(w));
    (lo.min(hi), hi)
}

/// A block of query rows and the keys any of them sees.
struct RowBlock {
    /// First row of the block.
    first: usize,
    /// Rows in the block (`ROWS`, fewer at the end).
    rows: usize,
    /// Each row's visible keys `lo..hi` (absolute key indices).
    span: Vec<(usize, usize)>,
    /// First key any row sees.
    lo: usize,
    /// Keys from `lo` to the last one any row sees (0 when no row sees a key).
    n: usize,
}

/// The query rows of one head in blocks of `ROWS`, each with its key range.
fn row_blocks<'a>(mask: &'a MaskSpec, d: &Dims) -> impl Iterator<Item = RowBlock> + 'a {
    let (q_len, kv_len) = (d.q_len, d.kv_len);
    (0..q_len).step_by(ROWS).map(move |first| {
        let rows = ROWS.min(q_len - first);
        let span: Vec<(usize, usize)> = (first..first + rows)
            .map(|i| visible(mask, mask.query_offset + i, kv_len))
            .collect();
        let lo = span.iter().map(|s| s.0).min().unwrap_or(0);
        let hi = span.iter().map(|s| s.1).max().unwrap_or(0).max(lo);
        RowBlock {
            first,
            rows,
            span,
            lo,
            n: hi - lo,
        }
    })
}

/// `dst[m x n] (+)= alpha * lhs[m x k] · rhs[k x n]`, single-threaded, every operand given by (row, column)
/// strides. With `accumulate`, `dst` is added to instead of overwritten.
#[allow(clippy::too_many_arguments)]
fn gemm(
    (m, n, k): (usize, usize, usize),
    dst: &mut [f32],
    (dst_rs, dst_cs): (usize, usize),
    lhs: &[f32],
    (lhs_rs, lhs_cs): (usize, usize),
    rhs: &[f32],
    (rhs_rs, rhs_cs): (usize, usize),
    alpha: f32,
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    let last = |rows: usize, cols: usize, rs: usize, cs: usize| (rows - 1) * rs + (cols - 1) * cs;
    assert!(dst.len() > last(m, n, dst_rs, dst_cs));
    if k > 0 {
        assert!(lhs.len() > last(m, k, lhs_rs, lhs_cs) && rhs.len() > last(k, n, rhs_rs, rhs_cs));
    }
    // SAFETY: the asserts above keep every element gemm touches inside the three slices; `dst` is borrowed
    // mutably, so it aliases neither operand.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            dst_cs as isize,
            dst_rs as isize,
            accumulate,
            lhs.as_ptr(),
            lhs_cs as isize,
            lhs_rs as isize,
            rhs.as_ptr(),
            rhs_cs as isize,
            rhs_rs as isize,
            1.0,
            alpha,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// Runs `task(i)` for every `i < count`, on the rayon pool when `parallel`.
fn run_tasks<F>(parallel: bool, count: usize, task: F)
where
    F: Fn(usize) + Sync + Send,
{
    if parallel {
        (0..count).into_par_iter().for_each(task);
    } else {
        (0..count).for_each(task);
    }
}

/// Disjoint mutable chunks of one buffer handed to parallel tasks by index.
struct Chunks {
    ptr: *mut f32,
    len: usize,
    chunk: usize,
}
// SAFETY: tasks only obtain chunk `i` through `get(i)`, each index exactly once per call.
unsafe impl Send for Chunks {}
unsafe impl Sync for Chunks {}

impl Chunks {
    fn new(data: &mut [f32], chunk: usize) -> Self {
        Chunks {
            ptr: data.as_mut_ptr(),
            len: data.len(),
            chunk,
        }
    }

    /// Chunk `i`.
    ///
    /// # Safety
    /// No two live references to the same chunk: each task calls this with its own index.
    #[allow(clippy::mut_from_ref)]
    unsafe fn get(&self, i: usize) -> &mut [f32] {
        assert!((i + 1) * self.chunk <= self.len);
        // SAFETY: in bounds (asserted); exclusive by the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(i * self.chunk), self.chunk) }
    }
}

/// Forward pass: `(output [batch, q_heads, q_len, v_dim], lse [batch, q_heads, q_len])`, or `None` for inputs this
/// kernel does not take (not f32, a key-padding mask, inconsistent shapes). Same conventions as
/// [`crate::flash_forward`]: rows with no visible key output 0 with a log-sum-exp of `f32::MIN`.
pub(crate) fn flash_forward(
    q: &FlexTensor,
    k: &FlexTensor,
    v: &FlexTensor,
    mask: &MaskSpec,
    scale: f64,
) -> Option<(FlexTensor, FlexTensor)> {
    let d = Dims::of(q, k, v)?;
    let (q, k, v) = (q.to_contiguous(), k.to_contiguous(), v.to_contiguous());
    let (qd, kd, vd) = (f32_slice(&q)?, f32_slice(&k)?, f32_slice(&v)?);
    let mut out = FlexTensor::empty(
        Shape::from(vec![d.batch, d.q_heads, d.q_len, d.v_dim]),
        DType::F32,
    );
    let mut lse = FlexTensor::empty(Shape::from(vec![d.batch, d.q_heads, d.q_len]), DType::F32);
    let out_chunks = Chunks::new(out.storage_mut::<f32>(), d.q_len * d.v_dim);
    let lse_chunks = Chunks::new(lse.storage_mut::<f32>(), d.q_len);
    let scale = scale as f32;
    run_tasks(d.ops() >= PARALLEL_MIN_OPS, d.batch * d.q_heads, |bh| {
        // SAFETY: task `bh` alone takes chunk `bh` of each output.
        let (out, lse) = unsafe { (out_chunks.get(bh), lse_chunks.get(bh)) };
        let kv = bh / d.q_heads * d.kv_heads + bh % d.q_heads / d.group();
        let q = head_rows(qd, bh, d.q_len * d.head_dim);
        let k = head_rows(kd, kv, d.kv_len * d.head_dim);
        let v = head_rows(vd, kv, d.kv_len * d.v_dim);
        let mut scores = Vec::new();
        for RowBlock {
            first,
            rows,
            span,
            lo,
            n,
        } in row_blocks(mask, &d)
        {
            if n == 0 {
                // No row of the block sees a key: zero output (already zero-filled), lowest log-sum-exp.
                lse[first..first + rows].fill(f32::MIN);
                continue;
            }
            scores.clear();
            scores.resize(rows * n, 0.0);
            // scores = scale * q[rows] · k[lo..hi]ᵀ
            gemm(
                (rows, n, d.head_dim),
                &mut scores,
                (n, 1),
                &q[first * d.head_dim..],
                (d.head_dim, 1),
                &k[lo * d.head_dim..],
                (1, d.head_dim),
                scale,
                false,
            );
            // Each row: exp(s - max) over its visible keys (0 elsewhere), its sum and log-sum-exp.
            let mut sums = vec![0f32; rows];
            for (r, row) in scores.chunks_exact_mut(n).enumerate() {
                let (a, b) = (span[r].0 - lo, span[r].1 - lo);
                if a >= b {
                    row.fill(0.0);
                    lse[first + r] = f32::MIN;
                    continue;
                }
                let max = row[a..b].iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let sum = vectorized(|| exp_shifted_sum(&mut row[a..b], max));
                row[..a].fill(0.0);
                row[b..].fill(0.0);
                sums[r] = sum;
                lse[first + r] = max + sum.ln();
            }
            // out[rows] = probabilities · v[lo..hi], then each row divided by its sum.
            let out_rows = &mut out[first * d.v_dim..(first + rows) * d.v_dim];
            gemm(
                (rows, d.v_dim, n),
                out_rows,
                (d.v_dim, 1),
                &scores,
                (n, 1),
                &v[lo * d.v_dim..],
                (d.v_dim, 1),
                1.0,
                false,
            );
            for (row, &sum) in out_rows.chunks_exact_mut(d.v_dim).zip(&sums) {
                let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
                row.iter_mut().for_each(|x| *x *= inv);
            }
        }
    });
    Some((out, lse))
}

/// The `size` elements of head `head` in a buffer of consecutive heads.
fn head_rows(x: &[f32], head: usize, size: usize) -> &[f32] {
    &x[head * size..(head + 1) * size]
}

/// Backward pass: `(dq, dk, dv)` from the forward's inputs, `output`, `lse` and `grad_output`, or `None` for inputs
/// this kernel does not take. With `P = exp(S - lse)` over the visible keys: `dV = Pᵀ dO`, `dP = dO Vᵀ`,
/// `dS = P ∘ (dP - rowsum(dO ∘ O))`, `dQ = scale · dS K`, `dK = scale · dSᵀ Q`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn flash_backward(
    q: &FlexTensor,
    k: &FlexTensor,
    v: &FlexTensor,
    output: &FlexTensor,
    lse: &FlexTensor,
    grad_output: &FlexTensor,
    mask: &MaskSpec,
    scale: f64,
) -> Option<(FlexTensor, FlexTensor, FlexTensor)> {
    let d = Dims::of(q, k, v)?;
    let [q, k, v, o, lse, dout] = [q, k, v, output, lse, grad_output].map(|t| t.to_contiguous());
    let (qd, kd, vd) = (f32_slice(&q)?, f32_slice(&k)?, f32_slice(&v)?);
    let (od, lsed, dod) = (f32_slice(&o)?, f32_slice(&lse)?, f32_slice(&dout)?);
    let rows_total = d.batch * d.q_heads * d.q_len;
    if od.len() != rows_total * d.v_dim || dod.len() != od.len() || lsed.len() != rows_total {
        return None;
    }
    let (group, scale) = (d.group(), scale as f32);
    let shape = |heads, len, width| Shape::from(vec![d.batch, heads, len, width]);
    let mut dq = FlexTensor::empty(shape(d.q_heads, d.q_len, d.head_dim), DType::F32);
    let mut dk = FlexTensor::empty(shape(d.kv_heads, d.kv_len, d.head_dim), DType::F32);
    let mut dv = FlexTensor::empty(shape(d.kv_heads, d.kv_len, d.v_dim), DType::F32);
    // One task per (batch, KV head): it owns that head's dk, dv and the dq rows of its `group` query heads.
    let dq_chunks = Chunks::new(dq.storage_mut::<f32>(), group * d.q_len * d.head_dim);
    let dk_chunks = Chunks::new(dk.storage_mut::<f32>(), d.kv_len * d.head_dim);
    let dv_chunks = Chunks::new(dv.storage_mut::<f32>(), d.kv_len * d.v_dim);
    run_tasks(d.ops() >= PARALLEL_MIN_OPS, d.batch * d.kv_heads, |bkv| {
        // SAFETY: task `bkv` alone takes chunk `bkv` of each gradient.
        let (dq, dk, dv) = unsafe { (dq_chunks.get(bkv), dk_chunks.get(bkv), dv_chunks.get(bkv)) };
        let k = head_rows(kd, bkv, d.kv_len * d.head_dim);
        let v = head_rows(vd, bkv, d.kv_len * d.v_dim);
        let (mut probs, mut grad_probs) = (Vec::new(), Vec::new());
        for g in 0..group {
            // Query head `bkv * group + g` of the flattened [batch, q_heads] order.
            let head = bkv * group + g;
            let (q, o, dout) = (
                head_rows(qd, head, d.q_len * d.head_dim),
                head_rows(od, head, d.q_len * d.v_dim),
                head_rows(dod, head, d.q_len * d.v_dim),
            );
            let lse = head_rows(lsed, head, d.q_len);
            let dq = &mut dq[g * d.q_len * d.head_dim..(g + 1) * d.q_len * d.head_dim];
            for RowBlock {
                first,
                rows,
                span,
                lo,
                n,
            } in row_blocks(mask, &d)
            {
                if n == 0 {
                    continue;
                }
                let (q_blk, o_blk, do_blk) = (
                    &q[first * d.head_dim..(first + rows) * d.head_dim],
                    &o[first * d.v_dim..(first + rows) * d.v_dim],
                    &dout[first * d.v_dim..(first + rows) * d.v_dim],
                );
                probs.clear();
                probs.resize(rows * n, 0.0);
                grad_probs.clear();
                grad_probs.resize(rows * n, 0.0);
                // P = exp(scale * q kᵀ - lse) on the visible keys, 0 elsewhere.
                gemm(
                    (rows, n, d.head_dim),
                    &mut probs,
                    (n, 1),
                    q_blk,
                    (d.head_dim, 1),
                    &k[lo * d.head_dim..],
                    (1, d.head_dim),
                    scale,
                    false,
                );
                // dP = dO vᵀ
                gemm(
                    (rows, n, d.v_dim),
                    &mut grad_probs,
                    (n, 1),
                    do_blk,
                    (d.v_dim, 1),
                    &v[lo * d.v_dim..],
                    (1, d.v_dim),
                    1.0,
                    false,
                );
                for r in 0..rows {
                    let (a, b) = (span[r].0.max(lo) - lo, span[r].1.max(lo) - lo);
                    let p = &mut probs[r * n..(r + 1) * n];
                    let dp = &mut grad_probs[r * n..(r + 1) * n];
                    if a >= b {
                        p.fill(0.0);
                        dp.fill(0.0);
                        continue;
                    }
                    let l = lse[first + r];
                    let delta: f32 = do_blk[r * d.v_dim..(r + 1) * d.v_dim]
                        .iter()
                        .zip(&o_blk[r * d.v_dim..(r + 1) * d.v_dim])
                        .map(|(x, y)| x * y)
                        .sum();
                    vectorized(|| {
                        for (x, g) in p[a..b].iter_mut().zip(&mut dp[a..b]) {
                            *x = exp(*x - l);
                            // dS = P (dP - delta), kept in `grad_probs`.
                            *g = *x * (*g - delta);
                        }
                    });
                    p[..a].fill(0.0);
                    p[b..].fill(0.0);
                    dp[..a].fill(0.0);
                    dp[b..].fill(0.0);
                }
                // dV[lo..hi] += Pᵀ dO
                gemm(
                    (n, d.v_dim, rows),
                    &mut dv[lo * d.v_dim..],
                    (d.v_dim, 1),
                    &probs,
                    (1, n),
                    do_blk,
                    (d.v_dim, 1),
                    1.0,
                    true,
                );
                // dQ[rows] = scale * dS k[lo..hi]   (each query row is in exactly one block)
                gemm(
                    (rows, d.head_dim, n),
                    &mut dq[first * d.head_dim..(first + rows) * d.head_dim],
                    (d.head_dim, 1),
                    &grad_probs,
                    (n, 1),
                    &k[lo * d.head_dim..],
                    (d.head_dim, 1),
                    scale,
                    false,
                );
                // dK[lo..hi] += scale * dSᵀ q[rows]
                gemm(
                    (n, d.head_dim, rows),
                    &mut dk[lo * d.head_dim..],
                    (d.head_dim, 1),
                    &grad_probs,
                    (1, n),
                    q_blk,
                    (d.head_dim, 1),
                    scale,
                    true,
                );
            }
        }
    });
    Some((dq, dk, dv))
}

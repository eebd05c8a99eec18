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

use super::key_padding::KeyPadding;
use super::simd::{exp, vectorized};
use super::strided_gemm::{gemm, gemm_fresh};
use super::{f32_slice, kernel_threads, zeroed};
use crate::MaskSpec;

/// Replaces each `x` of `row` by `exp(x - max)` and returns their sum (in 8 lanes, so both loops vectorise).
#[inline(always)]
pub(super) fn exp_shifted_sum(row: &mut [f32], max: f32) -> f32 {
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

/// The query rows of one head in blocks of `ROWS`, each with its key range; the first `lead` keys (the head's
/// leading padding) are outside every range.
fn row_blocks<'a>(
    mask: &'a MaskSpec,
    d: &Dims,
    lead: usize,
) -> impl Iterator<Item = RowBlock> + 'a {
    let (q_len, kv_len) = (d.q_len, d.kv_len);
    (0..q_len).step_by(ROWS).map(move |first| {
        let rows = ROWS.min(q_len - first);
        let span: Vec<(usize, usize)> = (first..first + rows)
            .map(|i| {
                let (lo, hi) = visible(mask, mask.query_offset + i, kv_len);
                (lo.max(lead).min(hi), hi)
            })
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

/// Runs `task(i)` for every `i < count`, on the rayon pool when `parallel`.
fn run_tasks<F>(parallel: bool, count: usize, task: F)
where
    F: Fn(usize) + Sync + Send,
{
    if parallel && kernel_threads() > 1 {
        (0..count).into_par_iter().for_each(task);
    } else {
        (0..count).for_each(task);
    }
}

/// Query rows up to which a forward call is a decode step's, whose heads go to the spinning decode pool.
const DECODE_ROWS: usize = 16;

/// Work (as [`Dims::ops`] counts it) above which a decode step's heads are split across the decode pool: its
/// hand-off costs about a microsecond, against rayon's wake-up of sleeping threads for every call.
const DECODE_PARALLEL_MIN_OPS: usize = 1 << 16;

/// [`run_tasks`] for a forward call: a decode step's heads on the spinning pool the integer products use (the
/// pool's threads are awake between a step's products, where rayon's sleep; at a 512-token context the heads
/// on rayon were a seventh of a decode step, on one thread's worth of wake-ups), anything else as
/// [`run_tasks`] does.
fn run_forward_tasks<F>(d: &Dims, count: usize, task: F)
where
    F: Fn(usize) + Sync + Send,
{
    let threads = kernel_threads();
    if d.q_len <= DECODE_ROWS
        && d.ops() >= DECODE_PARALLEL_MIN_OPS
        && threads > 1
        && threads == rayon::current_num_threads()
        && super::spin_pool::run(count, &task)
    {
        return;
    }
    run_tasks(d.ops() >= PARALLEL_MIN_OPS, count, task);
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

/// A read-only `[batch, heads, len, width]` f32 tensor with unit stride along `width` and any other strides:
/// the heads as the projections left them (a transposed view), or a slice of a KV cache, read in place.
pub(super) struct Heads<'a> {
    data: &'a [f32],
    start: usize,
    /// Strides of batch, head and row.
    strides: [usize; 3],
    heads: usize,
    len: usize,
    width: usize,
}

impl<'a> Heads<'a> {
    /// `t` viewed as `[batch, heads, len, width]`, or `None` when it has another shape or layout.
    pub(super) fn of(t: &'a FlexTensor, [batch, heads, len, width]: [usize; 4]) -> Option<Self> {
        let (shape, st) = (t.layout().shape(), t.layout().strides());
        if t.dtype() != DType::F32
            || shape.num_dims() != 4
            || [shape[0], shape[1], shape[2], shape[3]] != [batch, heads, len, width]
            || st[3] != 1
            || st.iter().any(|&s| s < 0)
        {
            return None;
        }
        Some(Heads {
            data: t.storage(),
            start: t.layout().start_offset(),
            strides: [st[0], st[1], st[2]].map(|s| s as usize),
            heads,
            len,
            width,
        })
    }

    /// Head `bh` of the flattened `[batch, heads]` order: the memory from its first row to the end of its last,
    /// and the row stride.
    pub(super) fn head(&self, bh: usize) -> (&'a [f32], usize) {
        let base =
            self.start + bh / self.heads * self.strides[0] + bh % self.heads * self.strides[1];
        let end = base + (self.len - 1) * self.strides[2] + self.width;
        (&self.data[base..end], self.strides[2])
    }
}

/// An output written head by head into position-major memory, `[batch, len, heads, width]`.
pub(super) struct HeadsOut {
    ptr: *mut f32,
    total: usize,
    heads: usize,
    len: usize,
    width: usize,
}
// SAFETY: tasks write through `write` only, each to rows of heads no other task writes during the call.
unsafe impl Send for HeadsOut {}
unsafe impl Sync for HeadsOut {}

impl HeadsOut {
    /// `t` must be a fresh contiguous `[batch, len, heads, width]` tensor.
    pub(super) fn new(t: &mut FlexTensor) -> Self {
        let s = t.layout().shape().clone();
        let data = t.storage_mut::<f32>();
        HeadsOut {
            ptr: data.as_mut_ptr(),
            total: data.len(),
            heads: s[2],
            len: s[1],
            width: s[3],
        }
    }

    /// Copies `rows` (consecutive rows of `width`) into rows `first..` of head `bh`.
    ///
    /// # Safety
    /// No other thread reads or writes these rows of this head during the call.
    pub(super) unsafe fn write(&self, bh: usize, first: usize, rows: &[f32]) {
        let (b, h) = (bh / self.heads, bh % self.heads);
        for (i, row) in rows.chunks_exact(self.width).enumerate() {
            let at = ((b * self.len + first + i) * self.heads + h) * self.width;
            assert!(first + i < self.len && at + self.width <= self.total);
            // SAFETY: in bounds (asserted); exclusive by the caller's contract; `row` is caller memory.
            unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), self.ptr.add(at), self.width) };
        }
    }
}

/// A fresh position-major buffer for `heads` heads of `len` rows of `width`.
fn position_major(d: &Dims, len: usize, heads: usize, width: usize) -> FlexTensor {
    zeroed(Shape::from(vec![d.batch, len, heads, width]))
}

/// The padding mask `t` of a call with dims `d`: `Some(None)` without one, `None` when this kernel cannot read it.
fn padding_of(t: Option<&FlexTensor>, d: &Dims) -> Option<Option<KeyPadding>> {
    match t {
        None => Some(None),
        Some(t) => KeyPadding::of(t, d.batch, d.kv_len).map(Some),
    }
}

/// Forward pass: `(output [batch, q_heads, q_len, v_dim], lse [batch, q_heads, q_len])`, or `None` for inputs this
/// kernel does not take (not f32, inconsistent shapes, a padding mask that is not `[batch, kv_len]` bool). Same
/// conventions as [`crate::flash_forward`]: rows with no visible key output 0 with a log-sum-exp of `f32::MIN`.
/// The output is position-major in memory (see [`super::heads_view`]).
pub(crate) fn flash_forward(
    q: &FlexTensor,
    k: &FlexTensor,
    v: &FlexTensor,
    key_padding: Option<&FlexTensor>,
    mask: &MaskSpec,
    scale: f64,
) -> Option<(FlexTensor, FlexTensor)> {
    let d = Dims::of(q, k, v)?;
    let qh = Heads::of(q, [d.batch, d.q_heads, d.q_len, d.head_dim])?;
    let kh = Heads::of(k, [d.batch, d.kv_heads, d.kv_len, d.head_dim])?;
    let vh = Heads::of(v, [d.batch, d.kv_heads, d.kv_len, d.v_dim])?;
    let padding = padding_of(key_padding, &d)?;
    let mut out = position_major(&d, d.q_len, d.q_heads, d.v_dim);
    let mut lse = zeroed(Shape::from(vec![d.batch, d.q_heads, d.q_len]));
    let out_rows = HeadsOut::new(&mut out);
    let lse_chunks = Chunks::new(lse.storage_mut::<f32>(), d.q_len);
    let scale = scale as f32;
    run_forward_tasks(&d, d.batch * d.q_heads, |bh| {
        // SAFETY: task `bh` alone takes chunk `bh` of the log-sum-exp.
        let lse = unsafe { lse_chunks.get(bh) };
        let b = bh / d.q_heads;
        let kv = b * d.kv_heads + bh % d.q_heads / d.group();
        let ((q, q_rs), (k, k_rs), (v, v_rs)) = (qh.head(bh), kh.head(kv), vh.head(kv));
        let (mut scores, mut block) = (Vec::new(), Vec::new());
        let lead = padding.as_ref().map_or(0, |p| p.lead(b));
        for RowBlock {
            first,
            rows,
            span,
            lo,
            n,
        } in row_blocks(mask, &d, lead)
        {
            if n == 0 {
                // No row of the block sees a key: zero output (already zero-filled), lowest log-sum-exp.
                lse[first..first + rows].fill(f32::MIN);
                continue;
            }
            // scores = scale * q[rows] · k[lo..hi]ᵀ
            gemm_fresh(
                (rows, n, d.head_dim),
                &mut scores,
                &q[first * q_rs..],
                (q_rs, 1),
                &k[lo * k_rs..],
                (1, k_rs),
                scale,
            );
            // Each row: exp(s - max) over its visible keys (0 elsewhere), its sum and log-sum-exp.
            let mut sums = vec![0f32; rows];
            for (r, row) in scores.chunks_exact_mut(n).enumerate() {
                let (a, z) = (span[r].0.max(lo) - lo, span[r].1.max(lo) - lo);
                let z = z.max(a);
                for j in padding.iter().flat_map(|pad| pad.padded(b, lo + a, z - a)) {
                    row[a + j] = f32::NEG_INFINITY;
                }
                let max = row[a..z].iter().copied().fold(f32::NEG_INFINITY, f32::max);
                if max == f32::NEG_INFINITY {
                    // No visible key, or only padding: zero output, lowest log-sum-exp.
                    row.fill(0.0);
                    lse[first + r] = f32::MIN;
                    continue;
                }
                let mut sum = vectorized!(exp_shifted_sum(&mut row[a..z], max));
                // `exp` clamps its argument, so a hidden key's weight is tiny, not zero: make it zero.
                for j in padding.iter().flat_map(|pad| pad.padded(b, lo + a, z - a)) {
                    sum -= row[a + j];
                    row[a + j] = 0.0;
                }
                row[..a].fill(0.0);
                row[z..].fill(0.0);
                sums[r] = sum;
                lse[first + r] = max + sum.ln();
            }
            // out[rows] = probabilities · v[lo..hi], then each row divided by its sum.
            gemm_fresh(
                (rows, d.v_dim, n),
                &mut block,
                &scores,
                (n, 1),
                &v[lo * v_rs..],
                (v_rs, 1),
                1.0,
            );
            for (row, &sum) in block.chunks_exact_mut(d.v_dim).zip(&sums) {
                let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
                row.iter_mut().for_each(|x| *x *= inv);
            }
            // SAFETY: rows `first..first + rows` of head `bh` belong to this task alone.
            unsafe { out_rows.write(bh, first, &block) };
        }
    });
    Some((super::heads_view(out), lse))
}

/// The `size` elements of head `head` in a buffer of consecutive heads.
fn head_rows(x: &[f32], head: usize, size: usize) -> &[f32] {
    &x[head * size..(head + 1) * size]
}

/// Backward pass: `(dq, dk, dv)` from the forward's inputs, `output`, `lse` and `grad_output`, or `None` for inputs
/// this kernel does not take. With `P = exp(S - lse)` over the visible keys: `dV = Pᵀ dO`, `dP = dO Vᵀ`,
/// `dS = P ∘ (dP - rowsum(dO ∘ O))`, `dQ = scale · dS K`, `dK = scale · dSᵀ Q`. The gradients are
/// position-major in memory, like the forward's output.
#[allow(clippy::too_many_arguments)]
pub(crate) fn flash_backward(
    q: &FlexTensor,
    k: &FlexTensor,
    v: &FlexTensor,
    key_padding: Option<&FlexTensor>,
    output: &FlexTensor,
    lse: &FlexTensor,
    grad_output: &FlexTensor,
    mask: &MaskSpec,
    scale: f64,
) -> Option<(FlexTensor, FlexTensor, FlexTensor)> {
    let d = Dims::of(q, k, v)?;
    let padding = padding_of(key_padding, &d)?;
    let qh = Heads::of(q, [d.batch, d.q_heads, d.q_len, d.head_dim])?;
    let kh = Heads::of(k, [d.batch, d.kv_heads, d.kv_len, d.head_dim])?;
    let vh = Heads::of(v, [d.batch, d.kv_heads, d.kv_len, d.v_dim])?;
    let oh = Heads::of(output, [d.batch, d.q_heads, d.q_len, d.v_dim])?;
    let doh = Heads::of(grad_output, [d.batch, d.q_heads, d.q_len, d.v_dim])?;
    let lse = lse.to_contiguous();
    let lsed = f32_slice(&lse)?;
    if lsed.len() != d.batch * d.q_heads * d.q_len {
        return None;
    }
    let (group, scale) = (d.group(), scale as f32);
    let mut dq = position_major(&d, d.q_len, d.q_heads, d.head_dim);
    let mut dk = position_major(&d, d.kv_len, d.kv_heads, d.head_dim);
    let mut dv = position_major(&d, d.kv_len, d.kv_heads, d.v_dim);
    let (dq_rows, dk_rows, dv_rows) = (
        HeadsOut::new(&mut dq),
        HeadsOut::new(&mut dk),
        HeadsOut::new(&mut dv),
    );
    // One task per (batch, KV head): it owns that head's dk, dv and the dq rows of its `group` query heads.
    run_tasks(d.ops() >= PARALLEL_MIN_OPS, d.batch * d.kv_heads, |bkv| {
        let b = bkv / d.kv_heads;
        let lead = padding.as_ref().map_or(0, |p| p.lead(b));
        let ((k, k_rs), (v, v_rs)) = (kh.head(bkv), vh.head(bkv));
        let mut dk_acc = vec![0f32; d.kv_len * d.head_dim];
        let mut dv_acc = vec![0f32; d.kv_len * d.v_dim];
        let (mut probs, mut grad_probs, mut dq_blk) = (Vec::new(), Vec::new(), Vec::new());
        for g in 0..group {
            // Query head `bkv * group + g` of the flattened [batch, q_heads] order.
            let head = bkv * group + g;
            let ((q, q_rs), (o, o_rs), (dout, do_rs)) =
                (qh.head(head), oh.head(head), doh.head(head));
            let lse = head_rows(lsed, head, d.q_len);
            for RowBlock {
                first,
                rows,
                span,
                lo,
                n,
            } in row_blocks(mask, &d, lead)
            {
                if n == 0 {
                    continue;
                }
                let (q_blk, o_blk, do_blk) = (
                    &q[first * q_rs..],
                    &o[first * o_rs..],
                    &dout[first * do_rs..],
                );
                // P = exp(scale * q kᵀ - lse) on the visible keys, 0 elsewhere.
                gemm_fresh(
                    (rows, n, d.head_dim),
                    &mut probs,
                    q_blk,
                    (q_rs, 1),
                    &k[lo * k_rs..],
                    (1, k_rs),
                    scale,
                );
                // dP = dO vᵀ
                gemm_fresh(
                    (rows, n, d.v_dim),
                    &mut grad_probs,
                    do_blk,
                    (do_rs, 1),
                    &v[lo * v_rs..],
                    (1, v_rs),
                    1.0,
                );
                for r in 0..rows {
                    let (a, z) = (span[r].0.max(lo) - lo, span[r].1.max(lo) - lo);
                    let p = &mut probs[r * n..(r + 1) * n];
                    let dp = &mut grad_probs[r * n..(r + 1) * n];
                    if a >= z {
                        p.fill(0.0);
                        dp.fill(0.0);
                        continue;
                    }
                    let l = lse[first + r];
                    let delta: f32 = do_blk[r * do_rs..r * do_rs + d.v_dim]
                        .iter()
                        .zip(&o_blk[r * o_rs..r * o_rs + d.v_dim])
                        .map(|(x, y)| x * y)
                        .sum();
                    vectorized!({
                        for (x, g) in p[a..z].iter_mut().zip(&mut dp[a..z]) {
                            *x = exp(*x - l);
                            // dS = P (dP - delta), kept in `grad_probs`.
                            *g = *x * (*g - delta);
                        }
                    });
                    // Padded keys have no probability and pass no gradient.
                    for j in padding.iter().flat_map(|pad| pad.padded(b, lo + a, z - a)) {
                        p[a + j] = 0.0;
                        dp[a + j] = 0.0;
                    }
                    p[..a].fill(0.0);
                    p[z..].fill(0.0);
                    dp[..a].fill(0.0);
                    dp[z..].fill(0.0);
                }
                // dV[lo..hi] += Pᵀ dO
                gemm(
                    (n, d.v_dim, rows),
                    &mut dv_acc[lo * d.v_dim..],
                    (d.v_dim, 1),
                    &probs,
                    (1, n),
                    do_blk,
                    (do_rs, 1),
                    1.0,
                    true,
                );
                // dQ[rows] = scale * dS k[lo..hi]   (each query row is in exactly one block)
                gemm_fresh(
                    (rows, d.head_dim, n),
                    &mut dq_blk,
                    &grad_probs,
                    (n, 1),
                    &k[lo * k_rs..],
                    (k_rs, 1),
                    scale,
                );
                // SAFETY: the dq rows of query head `head` belong to this task alone.
                unsafe { dq_rows.write(head, first, &dq_blk) };
                // dK[lo..hi] += scale * dSᵀ q[rows]
                gemm(
                    (n, d.head_dim, rows),
                    &mut dk_acc[lo * d.head_dim..],
                    (d.head_dim, 1),
                    &grad_probs,
                    (1, n),
                    q_blk,
                    (q_rs, 1),
                    scale,
                    true,
                );
            }
        }
        // SAFETY: KV head `bkv`'s dk and dv rows belong to this task alone.
        unsafe {
            dk_rows.write(bkv, 0, &dk_acc);
            dv_rows.write(bkv, 0, &dv_acc);
        }
    });
    Some((
        super::heads_view(dq),
        super::heads_view(dk),
        super::heads_view(dv),
    ))
}

//! Mean cross-entropy over rows of logits and its gradient `softmax - onehot`, without materialising the
//! log-probabilities: two vectorised passes over each row forward, one backward. A row whose target is
//! [`IGNORE_TARGET`] takes no loss and no gradient.

use burn::backend::flex::FlexTensor;
use burn::tensor::{DType, Shape};
use rayon::prelude::*;

use super::simd::{exp, vectorized};
use super::{PARALLEL_MIN, f32_slice, for_each_chunk, kernel_threads, zeroed};
use crate::IGNORE_TARGET;

/// Target ids as `usize` (`None` for an ignored row), or `None` overall if a dtype is unexpected or an id is
/// neither in `0..vocab` nor [`IGNORE_TARGET`].
fn target_ids(targets: &FlexTensor, vocab: usize) -> Option<Vec<Option<usize>>> {
    let ids: Vec<i64> = match targets.dtype() {
        DType::I64 => targets.as_slice::<i64>()?.to_vec(),
        DType::I32 => targets
            .as_slice::<i32>()?
            .iter()
            .map(|&t| t as i64)
            .collect(),
        _ => return None,
    };
    ids.into_iter()
        .map(|t| match t {
            IGNORE_TARGET => Some(None),
            t => usize::try_from(t).ok().filter(|&t| t < vocab).map(Some),
        })
        .collect()
}

/// Rows that take a loss: the mean's denominator (at least 1, so a batch of ignored rows has loss 0).
fn counted(ids: &[Option<usize>]) -> usize {
    ids.iter().filter(|t| t.is_some()).count().max(1)
}

/// Lanes of the row reductions: a reduction kept in 8 independent accumulators vectorises, where one running
/// f32 value (a strict order of additions) keeps the loop scalar.
const LANES: usize = 8;

/// `log(sum(exp(row)))`, shifted by the row's maximum so no term overflows.
#[inline(always)]
fn log_sum_exp(row: &[f32]) -> f32 {
    let (chunks, rest) = row.split_at(row.len() / LANES * LANES);
    let mut lanes = [f32::NEG_INFINITY; LANES];
    for chunk in chunks.chunks_exact(LANES) {
        for (m, &x) in lanes.iter_mut().zip(chunk) {
            *m = m.max(x);
        }
    }
    let max = rest
        .iter()
        .chain(&lanes)
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    let mut sums = [0f32; LANES];
    for chunk in chunks.chunks_exact(LANES) {
        for (s, &x) in sums.iter_mut().zip(chunk) {
            *s += exp(x - max);
        }
    }
    let sum = sums.iter().sum::<f32>() + rest.iter().map(|&x| exp(x - max)).sum::<f32>();
    max + sum.ln()
}

/// `(mean loss [1], log-sum-exp per row [rows])` of `logits` `[rows, vocab]` (f32, contiguous) against
/// `targets` `[rows]`, or `None` for inputs this kernel does not handle.
pub(crate) fn cross_entropy(
    logits: &FlexTensor,
    targets: &FlexTensor,
) -> Option<(FlexTensor, FlexTensor)> {
    let shape = logits.layout().shape();
    if shape.num_dims() != 2 || targets.layout().shape().num_elements() != shape[0] {
        return None;
    }
    let (rows, vocab) = (shape[0], shape[1]);
    let x = f32_slice(logits)?;
    let ids = target_ids(targets, vocab)?;
    let mut lse = zeroed(Shape::from(vec![rows]));
    let lse_out = &mut lse.storage_mut::<f32>()[..rows];
    let row_lse = |(r, out): (usize, &mut f32)| {
        *out = vectorized!(log_sum_exp(&x[r * vocab..(r + 1) * vocab]));
    };
    if rows * vocab < PARALLEL_MIN || kernel_threads() == 1 {
        lse_out.iter_mut().enumerate().for_each(row_lse);
    } else {
        lse_out.par_iter_mut().enumerate().for_each(row_lse);
    }
    // The mean in f64: a sum over thousands of rows in f32 would carry its rounding into the loss.
    let total: f64 = lse_out
        .iter()
        .zip(&ids)
        .enumerate()
        .filter_map(|(r, (&l, &t))| Some(f64::from(l - x[r * vocab + t?])))
        .sum();
    let loss = FlexTensor::from_data(burn::tensor::TensorData::new(
        vec![(total / counted(&ids) as f64) as f32],
        [1],
    ));
    Some((loss, lse))
}

/// The gradient of [`cross_entropy`]'s mean loss with respect to `logits`, scaled by `grad` (`[1]`):
/// `(softmax(row) - onehot(target)) * grad / counted rows`, from the forward's log-sum-exp; zero for ignored
/// rows.
pub(crate) fn cross_entropy_backward(
    logits: &FlexTensor,
    targets: &FlexTensor,
    lse: &FlexTensor,
    grad: &FlexTensor,
) -> Option<FlexTensor> {
    let shape = logits.layout().shape().clone();
    if shape.num_dims() != 2 {
        return None;
    }
    let (rows, vocab) = (shape[0], shape[1]);
    let (x, lse) = (f32_slice(logits)?, f32_slice(lse)?);
    let g = *f32_slice(grad)?.first()?;
    let ids = target_ids(targets, vocab)?;
    if lse.len() != rows || ids.len() != rows {
        return None;
    }
    let scale = g / counted(&ids) as f32;
    let mut out = zeroed(shape);
    for_each_chunk(
        &mut out.storage_mut::<f32>()[..rows * vocab],
        vocab,
        |part, start| {
            vectorized!({
                for (i, o) in part.chunks_exact_mut(vocab).enumerate() {
                    let r = start / vocab + i;
                    // An ignored row keeps the zeros it was allocated with.
                    let Some(target) = ids[r] else { continue };
                    let (row, l) = (&x[r * vocab..(r + 1) * vocab], lse[r]);
                    for (o, &v) in o.iter_mut().zip(row) {
                        *o = exp(v - l) * scale;
                    }
                    o[target] -= scale;
                }
            })
        },
    );
    Some(out)
}

//! RMSNorm `x / sqrt(mean(x²) + eps) * w` over the last dimension and its gradients, one pass over the rows
//! each way (burn-flex runs the square, mean, add, square root, division and scaling as six single-threaded
//! passes, and autodiff keeps an intermediate for each).

use burn::backend::flex::FlexTensor;
use rayon::prelude::*;

use super::simd::vectorized;
use super::{CHUNK, PARALLEL_MIN, f32_slice, for_each_chunk, kernel_threads, zeroed};

/// `1 / sqrt(mean(row²) + eps)`, the sum of squares in 8 lanes.
#[inline(always)]
fn inv_rms(row: &[f32], eps: f32) -> f32 {
    let mut lanes = [0f32; 8];
    let mut chunks = row.chunks_exact(8);
    for chunk in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(chunk) {
            *l += x * x;
        }
    }
    let tail: f32 = chunks.remainder().iter().map(|x| x * x).sum();
    let mean = (lanes.iter().sum::<f32>() + tail) / row.len() as f32;
    1.0 / (mean + eps).sqrt()
}

/// The rows of `x` (contiguous f32, normalised over its last dimension of `weight.len()`) and the weight, or
/// `None` for other inputs.
fn operands<'a>(
    x: &'a FlexTensor,
    weight: &'a FlexTensor,
) -> Option<(&'a [f32], &'a [f32], usize)> {
    let (xs, ws) = (x.layout().shape(), weight.layout().shape());
    let dim = *xs.as_slice().last()?;
    if ws.num_elements() != dim || dim == 0 {
        return None;
    }
    Some((f32_slice(x)?, f32_slice(weight)?, dim))
}

/// RMSNorm of contiguous f32 `x` over its last dimension, scaled by `weight`; `None` for other inputs.
pub(crate) fn rms_norm(x: &FlexTensor, weight: &FlexTensor, eps: f64) -> Option<FlexTensor> {
    let (xd, w, dim) = operands(x, weight)?;
    let eps = eps as f32;
    let mut out = zeroed(x.layout().shape().clone());
    for_each_chunk(
        &mut out.storage_mut::<f32>()[..xd.len()],
        dim,
        |o, start| {
            let xd = &xd[start..start + o.len()];
            vectorized!({
                for (o, x) in o.chunks_exact_mut(dim).zip(xd.chunks_exact(dim)) {
                    let inv = inv_rms(x, eps);
                    for ((o, &x), &w) in o.iter_mut().zip(x).zip(w) {
                        *o = x * inv * w;
                    }
                }
            })
        },
    );
    Some(out)
}

/// `(dx, dweight)` of [`rms_norm`] from the gradient `grad` of its output: with `r = 1 / rms(x)` and
/// `x̂ = x r`, `dweight = Σ_rows grad ∘ x̂` and `dx = r (g - x̂ mean(g ∘ x̂))` where `g = grad ∘ weight`.
pub(crate) fn rms_norm_backward(
    x: &FlexTensor,
    weight: &FlexTensor,
    eps: f64,
    grad: &FlexTensor,
) -> Option<(FlexTensor, FlexTensor)> {
    let (xd, w, dim) = operands(x, weight)?;
    if grad.layout().shape() != x.layout().shape() {
        return None;
    }
    let gd = f32_slice(grad)?;
    let eps = eps as f32;
    let mut dx = zeroed(x.layout().shape().clone());
    // Each task: its rows of dx, and its rows' share of dweight.
    let rows_of = |dx: &mut [f32], start: usize| -> Vec<f32> {
        let mut dw = vec![0f32; dim];
        let (xd, gd) = (&xd[start..start + dx.len()], &gd[start..start + dx.len()]);
        vectorized!({
            for ((dx, x), g) in dx
                .chunks_exact_mut(dim)
                .zip(xd.chunks_exact(dim))
                .zip(gd.chunks_exact(dim))
            {
                let r = inv_rms(x, eps);
                let mut dot = 0f32;
                for i in 0..dim {
                    let xhat = x[i] * r;
                    dw[i] += g[i] * xhat;
                    dot += g[i] * w[i] * xhat;
                }
                let mean = dot / dim as f32;
                for i in 0..dim {
                    dx[i] = r * (g[i] * w[i] - x[i] * r * mean);
                }
            }
        });
        dw
    };
    let all = &mut dx.storage_mut::<f32>()[..xd.len()];
    let dw = if all.len() < PARALLEL_MIN || kernel_threads() == 1 {
        rows_of(all, 0)
    } else {
        let chunk = CHUNK.div_ceil(dim).max(1) * dim;
        let partials: Vec<Vec<f32>> = all
            .par_chunks_mut(chunk)
            .enumerate()
            .map(|(i, part)| rows_of(part, i * chunk))
            .collect();
        // Summed in chunk order (rayon's own reduction tree depends on work stealing), so a run reproduces
        // its gradients bit for bit.
        let mut dw = vec![0f32; dim];
        for part in &partials {
            dw.iter_mut().zip(part).for_each(|(a, b)| *a += b);
        }
        dw
    };
    let dweight = FlexTensor::from_data(burn::tensor::TensorData::new(
        dw,
        weight.layout().shape().clone(),
    ));
    Some((dx, dweight))
}

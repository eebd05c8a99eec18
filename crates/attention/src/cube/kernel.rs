//! The CubeCL source of the flash forward: one unit per query row, online softmax over the visible keys.

use cubecl::prelude::*;

/// Rows handled per launch are independent, so the kernel is an elementwise launch over
/// `batch * q_heads * q_len` units.
#[cube(launch)]
// `if flag { if runtime_condition { .. } }` keeps the outer branch on a `#[comptime]` flag, resolved when the
// kernel is expanded; collapsing it into one `&&` would turn it into a runtime branch.
#[allow(clippy::too_many_arguments, clippy::collapsible_if)]
pub(crate) fn flash_forward_kernel<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    padding: &Tensor<F>,
    output: &mut Tensor<F>,
    lse: &mut Tensor<F>,
    scale: f32,
    query_offset: usize,
    window: usize,
    #[comptime] head_dim: usize,
    #[comptime] v_dim: usize,
    #[comptime] causal: bool,
    #[comptime] has_window: bool,
    #[comptime] has_padding: bool,
) {
    let q_heads = q.shape(1);
    let q_len = q.shape(2);
    let kv_heads = k.shape(1);
    let kv_len = k.shape(2);
    if ABSOLUTE_POS >= q.shape(0) * q_heads * q_len {
        terminate!();
    }
    let row = ABSOLUTE_POS % q_len;
    let head = (ABSOLUTE_POS / q_len) % q_heads;
    let batch = ABSOLUTE_POS / (q_len * q_heads);
    let kv_head = head / (q_heads / kv_heads);
    let position = query_offset + row;

    // Keys `start..end` are the ones the positional rules allow.
    let mut end = kv_len;
    if causal {
        end = min(kv_len, position + 1);
    }
    let mut start = 0;
    if has_window {
        if position + 1 > window {
            start = position + 1 - window;
        }
    }

    let scale = F::cast_from(scale);
    let q_base = batch * q.stride(0) + head * q.stride(1) + row * q.stride(2);
    let mut query = Array::<F>::new(head_dim);
    for d in 0..head_dim {
        query[d] = q[q_base + d * q.stride(3)] * scale;
    }
    let mut acc = Array::<F>::new(v_dim);
    for d in 0..v_dim {
        acc[d] = F::new(0.0);
    }
    // The lowest finite value, so a row that sees no key keeps a finite maximum and exp() gives 0.
    let mut max = F::min_value();
    let mut sum = F::new(0.0);
    let k_head = batch * k.stride(0) + kv_head * k.stride(1);
    let v_head = batch * v.stride(0) + kv_head * v.stride(1);
    for key in start..end {
        let mut visible = true;
        if has_padding {
            visible = padding[batch * padding.stride(0) + key * padding.stride(1)] == F::new(0.0);
        }
        if visible {
            let k_base = k_head + key * k.stride(2);
            let mut score = F::new(0.0);
            for d in 0..head_dim {
                score += query[d] * k[k_base + d * k.stride(3)];
            }
            let new_max = F::max(max, score);
            let rescale = F::exp(max - new_max);
            let weight = F::exp(score - new_max);
            sum = sum * rescale + weight;
            let v_base = v_head + key * v.stride(2);
            for d in 0..v_dim {
                acc[d] = acc[d] * rescale + weight * v[v_base + d * v.stride(3)];
            }
            max = new_max;
        }
    }
    // A row that sees a key has sum >= 1 (the running maximum's own term is exp(0)); one that sees none has sum 0
    // and acc 0, and dividing by 1 gives it output 0 in every float type (f32::MIN_POSITIVE, the guard this once
    // was, is 0 in f16, so such rows came out 0/0 = NaN there).
    let denominator = F::max(sum, F::new(1.0));
    let out_base = batch * output.stride(0) + head * output.stride(1) + row * output.stride(2);
    for d in 0..v_dim {
        output[out_base + d * output.stride(3)] = acc[d] / denominator;
    }
    lse[batch * lse.stride(0) + head * lse.stride(1) + row * lse.stride(2)] =
        max + F::ln(denominator);
}

//! SwiGLU's gate `silu(gate) * up` and its gradients, each one vectorised pass over the activations.

use burn::backend::flex::FlexTensor;

use super::simd::{sigmoid, vectorized};
use super::{f32_slice, for_each_chunk, for_each_chunk_pair, zeroed};

/// `silu(gate) * up` for contiguous f32 tensors of one shape, written into `up` when nothing else holds it;
/// `Err(up)` for other inputs.
pub(crate) fn swiglu(gate: &FlexTensor, up: FlexTensor) -> Result<FlexTensor, FlexTensor> {
    let Some(g) = f32_slice(gate) else {
        return Err(up);
    };
    if gate.layout().shape() != up.layout().shape() || f32_slice(&up).is_none() {
        return Err(up);
    }
    let n = g.len();
    let (mut out, source) = if up.is_unique() && up.layout().contiguous_offsets() == Some((0, n)) {
        (up, None)
    } else {
        (zeroed(up.layout().shape().clone()), Some(up))
    };
    let u = source.as_ref().and_then(f32_slice);
    let o = &mut out.storage_mut::<f32>()[..n];
    for_each_chunk(o, 1, |o, start| {
        let g = &g[start..start + o.len()];
        vectorized!(match u {
            Some(u) => {
                let u = &u[start..start + o.len()];
                for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
                    *o = g * sigmoid(g) * u;
                }
            }
            None => {
                for (o, &g) in o.iter_mut().zip(g) {
                    *o *= g * sigmoid(g);
                }
            }
        })
    });
    Ok(out)
}

/// `(d_gate, d_up)` of [`swiglu`] from the gradient of its output: with `s = sigmoid(gate)`,
/// `d_up = grad * gate * s` and `d_gate = grad * up * s * (1 + gate * (1 - s))`.
pub(crate) fn swiglu_backward(
    gate: &FlexTensor,
    up: &FlexTensor,
    grad: &FlexTensor,
) -> Option<(FlexTensor, FlexTensor)> {
    let shape = gate.layout().shape();
    if up.layout().shape() != shape || grad.layout().shape() != shape {
        return None;
    }
    let (g, u, dy) = (f32_slice(gate)?, f32_slice(up)?, f32_slice(grad)?);
    let n = g.len();
    let mut d_gate = zeroed(shape.clone());
    let mut d_up = zeroed(shape.clone());
    let (dg_all, du_all) = (
        &mut d_gate.storage_mut::<f32>()[..n],
        &mut d_up.storage_mut::<f32>()[..n],
    );
    for_each_chunk_pair(dg_all, du_all, |dg, du, start| {
        let range = start..start + dg.len();
        let (g, u, dy) = (&g[range.clone()], &u[range.clone()], &dy[range]);
        vectorized!({
            for i in 0..dg.len() {
                let s = sigmoid(g[i]);
                du[i] = dy[i] * (g[i] * s);
                dg[i] = dy[i] * u[i] * (s * (1.0 + g[i] * (1.0 - s)));
            }
        })
    });
    Some((d_gate, d_up))
}

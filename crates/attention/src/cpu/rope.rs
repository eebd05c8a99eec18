//! RoPE in one pass: reads `x` through its strides (the heads are usually a transposed view of the projection)
//! and writes the rotated rows position-major, `[batch, seq, heads, head_dim]` in memory, returned as the
//! `[batch, heads, seq, head_dim]` view of it: the layout the projection produced, so neither the attention
//! kernel nor the gradient flowing back into the projection needs a transposing copy.

use burn::backend::flex::FlexTensor;
use burn::tensor::{DType, Shape};

use super::simd::vectorized;
use super::{f32_slice, for_each_chunk, zeroed};
use crate::rope::{RopeConfig, RopeLayout};

/// `x * cos + rotate(x) * sin` for `x` `[batch, heads, seq, head_dim]` (any strides, unit stride along
/// `head_dim`) and tables `[batch | 1, 1, seq, head_dim]`, where `rotate` maps each pair `(a, b)` to `(-b, a)`.
/// Computes exactly what the portable version computes (the same products and sum, never fused).
pub(crate) fn rope_rotate(
    x: &FlexTensor,
    cos: &FlexTensor,
    sin: &FlexTensor,
    config: &RopeConfig,
) -> Option<FlexTensor> {
    if x.dtype() != DType::F32 || x.layout().shape().num_dims() != 4 {
        return None;
    }
    let shape = x.layout().shape().clone();
    let [batch, heads, seq, head_dim] = [shape[0], shape[1], shape[2], shape[3]];
    let strides = x.layout().strides();
    let table_rows = cos.layout().shape()[0];
    let table_shape_ok = |t: &FlexTensor| {
        let s = t.layout().shape();
        s.num_dims() == 4 && s[0] == table_rows && s[1] == 1 && s[2] == seq && s[3] == head_dim
    };
    if strides[3] != 1
        || strides.iter().any(|&s| s < 0)
        || !(table_rows == 1 || table_rows == batch)
        || !table_shape_ok(cos)
        || !table_shape_ok(sin)
        || config.rotary_dim > head_dim
    {
        return None;
    }
    let (cos, sin) = (cos.to_contiguous(), sin.to_contiguous());
    let (cos, sin) = (f32_slice(&cos)?, f32_slice(&sin)?);
    let src: &[f32] = x.storage();
    let (start, [sb, sh, st]) = (
        x.layout().start_offset(),
        [strides[0], strides[1], strides[2]].map(|s| s as usize),
    );

    let n = batch * heads * seq * head_dim;
    let mut out = zeroed(Shape::from(vec![batch, seq, heads, head_dim]));
    let (layout, rotary) = (config.layout, config.rotary_dim);
    for_each_chunk(
        &mut out.storage_mut::<f32>()[..n],
        head_dim,
        |rows, first| {
            vectorized!({
                for (i, o) in rows.chunks_exact_mut(head_dim).enumerate() {
                    // Output rows are in (batch, position, head) order.
                    let row = first / head_dim + i;
                    let (b, t, h) = (row / (seq * heads), row / heads % seq, row % heads);
                    let at = start + b * sb + h * sh + t * st;
                    let x = &src[at..at + head_dim];
                    let table = (if table_rows == 1 { 0 } else { b } * seq + t) * head_dim;
                    let c = &cos[table..table + head_dim];
                    let s = &sin[table..table + head_dim];
                    rotate_row(o, x, c, s, layout, rotary);
                }
            })
        },
    );
    Some(super::heads_view(out))
}

/// One row: rotated pairs in the first `rotary` dimensions, the rest scaled by `cos` (1 there).
#[inline(always)]
fn rotate_row(o: &mut [f32], x: &[f32], c: &[f32], s: &[f32], layout: RopeLayout, rotary: usize) {
    let half = rotary / 2;
    match layout {
        RopeLayout::RotateHalf => {
            for j in 0..half {
                let (a, b) = (x[j], x[j + half]);
                o[j] = a * c[j] + -b * s[j];
                o[j + half] = b * c[j + half] + a * s[j + half];
            }
        }
        RopeLayout::Interleaved => {
            for k in 0..half {
                let (a, b) = (x[2 * k], x[2 * k + 1]);
                o[2 * k] = a * c[2 * k] + -b * s[2 * k];
                o[2 * k + 1] = b * c[2 * k + 1] + a * s[2 * k + 1];
            }
        }
    }
    for j in rotary..o.len() {
        o[j] = x[j] * c[j];
    }
}

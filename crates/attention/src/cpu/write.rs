//! Writing a block of a tensor in place, for the KV caches' appends ([`crate::EmberBackend::write_block`]), and
//! rows of it, for the paged pool's ([`crate::EmberBackend::write_rows`]); reading rows out of one, for its
//! gathers ([`crate::EmberBackend::select_rows`]).

use std::ops::Range;

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{Bytes, DType, Shape};
use rayon::prelude::*;

use super::linear::OutPtr;
use super::{PARALLEL_MIN, kernel_threads};

/// Writes `value` into the block `ranges` of `dst` in place and returns `true`, or returns `false` (changing
/// nothing) when `dst` is not a uniquely owned, contiguous f32 tensor, `value` is not f32, or the shapes do not
/// match: the caller then copies the usual way.
pub(crate) fn write_block(
    dst: &mut FlexTensor,
    ranges: &[Range<usize>],
    value: &FlexTensor,
) -> bool {
    let shape = dst.layout().shape().clone();
    let dims = shape.num_dims();
    let value_shape = value.layout().shape();
    let fits = dims > 0
        && ranges.len() == dims
        && value_shape.num_dims() == dims
        && ranges
            .iter()
            .enumerate()
            .all(|(d, r)| r.start <= r.end && r.end <= shape[d] && r.len() == value_shape[d]);
    if !fits || !writable_in_place(dst, value) {
        return false;
    }
    if ranges.iter().any(|r| r.is_empty()) {
        return true;
    }
    // Contiguous with the whole buffer: its storage holds exactly the block's elements in row-major order.
    let value = value.to_contiguous();
    let src = value.storage::<f32>();
    let Some(dst) = dst.try_storage_mut::<f32>() else {
        return false;
    };
    let mut strides = vec![1usize; dims];
    for d in (0..dims - 1).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    // Copy one innermost run at a time, walking the outer indices like an odometer.
    let run = ranges[dims - 1].len();
    let mut index = vec![0usize; dims - 1];
    for piece in src.chunks_exact(run) {
        let at = ranges[dims - 1].start
            + (0..dims - 1)
                .map(|d| (ranges[d].start + index[d]) * strides[d])
                .sum::<usize>();
        dst[at..at + run].copy_from_slice(piece);
        for d in (0..dims - 1).rev() {
            index[d] += 1;
            if index[d] < ranges[d].len() {
                break;
            }
            index[d] = 0;
        }
    }
    true
}

/// Writes row `i` of `value` over row `rows[i]` of `dst` (along the first dimension) in place and returns
/// `true`, or returns `false` (changing nothing) when `dst` is not a uniquely owned, contiguous f32 tensor,
/// `value` is not f32, or the shapes or rows do not fit: the caller then writes the usual way.
pub(crate) fn write_rows(dst: &mut FlexTensor, rows: &[usize], value: &FlexTensor) -> bool {
    let shape = dst.layout().shape().clone();
    let value_shape = value.layout().shape();
    let fits = shape.num_dims() > 0
        && value_shape.num_dims() == shape.num_dims()
        && value_shape[0] == rows.len()
        && (1..shape.num_dims()).all(|d| value_shape[d] == shape[d])
        && rows.iter().all(|&r| r < shape[0]);
    if !fits || !writable_in_place(dst, value) {
        return false;
    }
    let value = value.to_contiguous();
    let src = value.storage::<f32>();
    let row = shape.num_elements() / shape[0].max(1);
    let Some(dst) = dst.try_storage_mut::<f32>() else {
        return false;
    };
    for (&r, piece) in rows.iter().zip(src.chunks_exact(row.max(1))) {
        dst[r * row..(r + 1) * row].copy_from_slice(piece);
    }
    true
}

/// Whether `dst` is an f32 tensor laid out as its whole buffer (contiguous from offset 0) and `value` f32: what
/// the in-place writes need besides `dst`'s buffer being uniquely owned, which taking it mutably checks.
fn writable_in_place(dst: &FlexTensor, value: &FlexTensor) -> bool {
    dst.dtype() == DType::F32
        && value.dtype() == DType::F32
        && dst.layout().is_contiguous()
        && dst.layout().start_offset() == 0
}

/// Rows `rows` of `tensor` (along its first dimension) as a new contiguous tensor, each copied once into an
/// output that is never zero-filled, the rows split across the kernel threads when there are many (a server's
/// gather of every row's keys and values, a step's largest serial copy otherwise); `None` for a tensor that is not
/// f32 or a row out of range, which the caller selects the usual way (and reports).
pub(crate) fn select_rows(tensor: &FlexTensor, rows: &[usize]) -> Option<FlexTensor> {
    if tensor.dtype() != DType::F32 {
        return None;
    }
    let shape = tensor.layout().shape();
    if shape.num_dims() == 0 || rows.iter().any(|&r| r >= shape[0]) {
        return None;
    }
    let contiguous = tensor.to_contiguous();
    let data = contiguous.storage::<f32>();
    let row = shape.num_elements() / shape[0].max(1);
    let total = rows.len() * row;
    let mut out: Vec<f32> = Vec::with_capacity(total);
    let dst = OutPtr(out.as_mut_ptr());
    let copy = |part: Range<usize>| {
        for (i, &r) in rows[part.clone()].iter().enumerate() {
            let src = &data[r * row..(r + 1) * row];
            // SAFETY: `out` has capacity for `rows.len()` rows; row `part.start + i` is written by this part
            // alone, and nothing reads `out` until every part has run.
            unsafe {
                let at = dst.get().add((part.start + i) * row);
                std::ptr::copy_nonoverlapping(src.as_ptr(), at, row);
            }
        }
    };
    let threads = kernel_threads();
    if total < PARALLEL_MIN || threads == 1 || rows.len() < threads {
        copy(0..rows.len());
    } else {
        let per_task = rows.len().div_ceil(threads);
        let task = |t: usize| copy(t * per_task..((t + 1) * per_task).min(rows.len()));
        let tasks = rows.len().div_ceil(per_task);
        if threads < rayon::current_num_threads() || !super::spin_pool::run(tasks, &task) {
            (0..tasks).into_par_iter().for_each(task);
        }
    }
    // SAFETY: every one of the `total` elements was written above.
    unsafe { out.set_len(total) };
    let mut dims = shape.to_vec();
    dims[0] = rows.len();
    Some(FlexTensor::new(
        Bytes::from_elems(out),
        Layout::contiguous(Shape::from(dims)),
        DType::F32,
    ))
}

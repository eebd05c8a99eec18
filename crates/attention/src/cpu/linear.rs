//! A linear layer `x · Wᵀ + b` and its gradients as gemm calls on the tensors' own memory.
//!
//! burn-flex runs these as generic matmuls: the weight's transpose is a strided view whose gradient comes back
//! transposed (so every optimizer step copies it), each output is allocated zero-filled and copied again to
//! meet its alignment rule, the left operand is packed on the calling thread before the workers start, and a
//! product below 192³ multiply-adds or of a single row (a decode step: gemm multiplies one row as a
//! matrix-vector product on the calling thread whatever parallelism it is given) runs on one core. Here every
//! product is split by output column into one block per thread, each a single-threaded gemm that packs its
//! own operands, and each gradient is written directly in its parameter's layout.

use burn::backend::flex::FlexTensor;
use burn::tensor::Shape;
use rayon::prelude::*;

use super::{f32_slice, kernel_threads, zeroed};

/// Products below this many multiply-adds stay on the calling thread: a hand-off to the pool costs about as
/// much.
const MIN_SPLIT_OPS: usize = 1 << 16;

/// Output columns per block are a multiple of this (gemm's register tile is 8-16 columns wide).
const COLUMN_ALIGN: usize = 16;

/// A read-only f32 matrix: element `(i, j)` at `ptr + i * row_stride + j * col_stride`.
#[derive(Clone, Copy)]
pub(super) struct Operand {
    ptr: *const f32,
    row_stride: isize,
    col_stride: isize,
}

/// A pointer into the output that the column blocks share; each block writes only its own columns.
#[derive(Clone, Copy)]
pub(super) struct OutPtr(pub(super) *mut f32);

// SAFETY: the blocks of one product read their operands (not written meanwhile) and write disjoint columns of
// the output, which nothing else reads while they run.
unsafe impl Send for Operand {}
unsafe impl Sync for Operand {}
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl Operand {
    /// A row-major `[rows, cols]` slice.
    pub(super) fn row_major(data: &[f32], cols: usize) -> Self {
        Self {
            ptr: data.as_ptr(),
            row_stride: cols as isize,
            col_stride: 1,
        }
    }

    /// The transpose of this matrix (a view: strides swapped).
    pub(super) fn transposed(self) -> Self {
        Self {
            ptr: self.ptr,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
        }
    }

    /// The pointer (a method, so closures capture the whole `Send` wrapper, not its raw-pointer field).
    fn get(self) -> *const f32 {
        self.ptr
    }
}

impl OutPtr {
    pub(super) fn get(self) -> *mut f32 {
        self.0
    }
}

/// `dst` `[m, n]` (row-major) `= lhs [m, k] · rhs [k, n]`, plus what `dst` holds when `accumulate`.
///
/// # Safety
/// `lhs` and `rhs` must address valid `[m, k]` and `[k, n]` matrices that no one writes during the call.
unsafe fn product(
    dims: (usize, usize, usize),
    lhs: Operand,
    rhs: Operand,
    dst: &mut [f32],
    accumulate: bool,
) {
    let (m, n, _) = dims;
    assert_eq!(dst.len(), m * n, "product: the output is not [m, n]");
    // SAFETY: the caller's guarantee, and `dst` is exactly `[m, n]`.
    unsafe { product_strided(dims, lhs, rhs, dst, n, accumulate) }
}

/// [`product`] into `m` rows of `n` values that start `dst_stride` apart in `dst` (columns of a wider output).
///
/// # Safety
/// As for [`product`].
pub(super) unsafe fn product_strided(
    (m, n, k): (usize, usize, usize),
    lhs: Operand,
    rhs: Operand,
    dst: &mut [f32],
    dst_stride: usize,
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        dst_stride >= n && dst.len() >= (m - 1) * dst_stride + n,
        "product: the output does not hold [m, n] at this row stride"
    );
    let threads = kernel_threads();
    let blocks = if m * n * k < MIN_SPLIT_OPS {
        1
    } else {
        threads.min(n.div_ceil(COLUMN_ALIGN)).max(1)
    };
    let block = n.div_ceil(blocks).next_multiple_of(COLUMN_ALIGN);
    let out = OutPtr(dst.as_mut_ptr());
    let run = |b: usize| {
        let first = b * block;
        let cols = block.min(n - first);
        // SAFETY: the caller vouches for `lhs` and `rhs`; columns `first..first + cols` of `rhs` and of the
        // output (`m` rows `dst_stride` apart, checked above) are in bounds, and no other block writes these
        // output columns.
        unsafe {
            gemm::gemm(
                m,
                cols,
                k,
                out.get().add(first),
                1,
                dst_stride as isize,
                accumulate,
                lhs.get(),
                lhs.col_stride,
                lhs.row_stride,
                rhs.get().offset(first as isize * rhs.col_stride),
                rhs.col_stride,
                rhs.row_stride,
                1.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
    };
    let count = n.div_ceil(block);
    if count <= 1 {
        (0..count).for_each(run);
    } else {
        (0..count).into_par_iter().for_each(run);
    }
}

/// `x` `[rows, in]` times `weight` `[out, in]` transposed, plus `bias` `[out]`, as `[rows, out]`, for contiguous
/// f32 tensors; `None` otherwise.
pub(crate) fn dense(
    x: &FlexTensor,
    weight: &FlexTensor,
    bias: Option<&FlexTensor>,
) -> Option<FlexTensor> {
    let (xs, ws) = (x.layout().shape(), weight.layout().shape());
    if xs.num_dims() != 2 || ws.num_dims() != 2 || xs[1] != ws[1] {
        return None;
    }
    let (rows, inputs, out) = (xs[0], xs[1], ws[0]);
    let (xd, wd) = (f32_slice(x)?, f32_slice(weight)?);
    let bias = match bias {
        Some(b) if b.layout().shape().num_elements() != out => return None,
        Some(b) => Some(f32_slice(b)?),
        None => None,
    };
    let mut result = zeroed(Shape::from(vec![rows, out]));
    let dst = &mut result.storage_mut::<f32>()[..rows * out];
    if let Some(bias) = bias {
        for row in dst.chunks_exact_mut(out) {
            row.copy_from_slice(bias);
        }
    }
    // SAFETY: `xd` is `[rows, inputs]` and `wd` `[out, inputs]`, both row-major and only read; the weight read
    // as `[inputs, out]` is its transpose.
    unsafe {
        product(
            (rows, out, inputs),
            Operand::row_major(xd, inputs),
            Operand::row_major(wd, inputs).transposed(),
            dst,
            bias.is_some(),
        );
    }
    Some(result)
}

/// `(d_x, d_weight)` of [`dense`] from the gradient `grad` `[rows, out]` of its output: `d_x = grad · W`
/// `[rows, in]` and `d_weight = gradᵀ · x` `[out, in]`, the weight's own layout. `None` for other inputs.
pub(crate) fn dense_backward(
    x: &FlexTensor,
    weight: &FlexTensor,
    grad: &FlexTensor,
) -> Option<(FlexTensor, FlexTensor)> {
    let (xs, ws, gs) = (
        x.layout().shape(),
        weight.layout().shape(),
        grad.layout().shape(),
    );
    if xs.num_dims() != 2 || ws.num_dims() != 2 || gs.num_dims() != 2 {
        return None;
    }
    let (rows, inputs, out) = (xs[0], xs[1], ws[0]);
    if ws[1] != inputs || gs[0] != rows || gs[1] != out {
        return None;
    }
    let d_x = dense_input_grad(weight, grad)?;
    let (xd, gd) = (f32_slice(x)?, f32_slice(grad)?);
    let mut d_weight = zeroed(Shape::from(vec![out, inputs]));
    // SAFETY: `gd` is `[rows, out]` and `xd` `[rows, inputs]`, both row-major and only read; `gradᵀ` is a view
    // of `gd`.
    unsafe {
        product(
            (out, inputs, rows),
            Operand::row_major(gd, out).transposed(),
            Operand::row_major(xd, inputs),
            &mut d_weight.storage_mut::<f32>()[..out * inputs],
            false,
        );
    }
    Some((d_x, d_weight))
}

/// `d_x = grad · W` `[rows, in]` of [`dense`]: half of [`dense_backward`], and all of it for a weight that takes
/// no gradient. `None` for other inputs.
pub(crate) fn dense_input_grad(weight: &FlexTensor, grad: &FlexTensor) -> Option<FlexTensor> {
    let (ws, gs) = (weight.layout().shape(), grad.layout().shape());
    if ws.num_dims() != 2 || gs.num_dims() != 2 || gs[1] != ws[0] {
        return None;
    }
    let (rows, out, inputs) = (gs[0], ws[0], ws[1]);
    let (wd, gd) = (f32_slice(weight)?, f32_slice(grad)?);
    let mut d_x = zeroed(Shape::from(vec![rows, inputs]));
    // SAFETY: `gd` is `[rows, out]` and `wd` `[out, inputs]`, both row-major and only read.
    unsafe {
        product(
            (rows, inputs, out),
            Operand::row_major(gd, out),
            Operand::row_major(wd, inputs),
            &mut d_x.storage_mut::<f32>()[..rows * inputs],
            false,
        );
    }
    Some(d_x)
}

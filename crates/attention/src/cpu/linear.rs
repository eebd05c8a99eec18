//! `x · Wᵀ` for products burn-flex runs on one thread: it hands a matmul to gemm's thread pool only above
//! 192³ multiply-adds, and gemm multiplies a single row as a matrix-vector product on the calling thread
//! whatever it is asked, so a decode step (one row against every `[out, in]` weight, the LM head included) used
//! one core of many. Here the output columns are split into one block per thread, each a single-threaded gemm
//! on its rows of `W`.

use burn::backend::flex::FlexTensor;
use burn::tensor::{DType, Shape};
use rayon::prelude::*;

use super::f32_slice;

/// burn-flex's own threshold (`M * N * K`) above which it parallelises a matmul itself.
const FLEX_PARALLEL_OPS: usize = 192 * 192 * 192;

/// Weights below this many elements are not worth splitting: the hand-off costs more than the halved work.
const MIN_SPLIT_WEIGHT: usize = 1 << 16;

/// Output columns per block are a multiple of this (gemm's register tile is 8-16 columns wide).
const COLUMN_ALIGN: usize = 16;

/// A pointer into the output that the column blocks share; each block writes only its own columns.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: the blocks of one `linear` call write disjoint columns of the output and nothing reads it meanwhile.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The pointer (a method, so closures capture the whole `Send` wrapper, not its raw-pointer field).
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// `x` `[rows, in]` times `weight` `[out, in]` transposed, as `[rows, out]`, when the product is one burn-flex
/// would run single-threaded (one row, or below its threshold) and the pool has several threads; `None`
/// otherwise (burn-flex's matmul is right).
pub(crate) fn linear(x: &FlexTensor, weight: &FlexTensor) -> Option<FlexTensor> {
    let threads = rayon::current_num_threads();
    let (xs, ws) = (x.layout().shape(), weight.layout().shape());
    if threads < 2 || xs.num_dims() != 2 || ws.num_dims() != 2 || xs[1] != ws[1] {
        return None;
    }
    let (rows, inputs, out) = (xs[0], xs[1], ws[0]);
    let single_threaded = rows == 1 || rows * out * inputs < FLEX_PARALLEL_OPS;
    if !single_threaded || out * inputs < MIN_SPLIT_WEIGHT {
        return None;
    }
    let (xd, wd) = (f32_slice(x)?, f32_slice(weight)?);
    let block = out.div_ceil(threads).next_multiple_of(COLUMN_ALIGN);
    let mut result = FlexTensor::empty(Shape::from(vec![rows, out]), DType::F32);
    let dst = OutPtr(result.storage_mut::<f32>().as_mut_ptr());
    (0..out.div_ceil(block)).into_par_iter().for_each(|b| {
        let first = b * block;
        let n = block.min(out - first);
        // SAFETY: `dst` has `rows * out` elements; this block writes columns `first..first + n` of each row
        // (row stride `out`), disjoint from every other block. `xd` is `[rows, inputs]` row-major and the weight
        // rows `first..first + n` are `[n, inputs]` row-major, read as the `[inputs, n]` right-hand side.
        unsafe {
            gemm::gemm(
                rows,
                n,
                inputs,
                dst.get().add(first),
                1,
                out as isize,
                false,
                xd.as_ptr(),
                1,
                inputs as isize,
                wd.as_ptr().add(first * inputs),
                inputs as isize,
                1,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
    });
    Some(result)
}

//! Native kernels for burn-flex, ember's CPU backend: element-wise work that burn-flex runs as several scalar,
//! single-threaded passes (its `exp` calls libm per element and no unary op is parallel) done here in one pass,
//! vectorised and split across the rayon pool; and the small matrix products it leaves on one thread.
//!
//! Each kernel takes and returns `FlexTensor`s and declines inputs it does not handle (a dtype other than f32, an
//! unexpected layout, a padding mask) with `None` (`Err(up)` for SwiGLU, which hands back the buffer it may write
//! into), so the caller falls back to the portable tensor-op version.

mod cross_entropy;
mod flash;
mod linear;
mod rope;
mod simd;
mod swiglu;

pub(crate) use cross_entropy::{cross_entropy, cross_entropy_backward};
pub(crate) use flash::{flash_backward, flash_forward};
pub(crate) use linear::linear;
pub(crate) use rope::rope_rotate;
pub(crate) use swiglu::{swiglu, swiglu_backward};

use burn::backend::flex::FlexTensor;
use burn::tensor::DType;
use rayon::prelude::*;

/// Elements below which a kernel stays on the calling thread: handing out work to the pool costs a few
/// microseconds, as much as this many elements of arithmetic.
const PARALLEL_MIN: usize = 1 << 15;

/// Elements per parallel task: large enough to amortise the hand-off, small enough to balance two to a few
/// dozen threads on a transformer's activations.
const CHUNK: usize = 1 << 13;

/// `f32` data of a contiguous tensor starting at offset 0, or `None`.
fn f32_slice(t: &FlexTensor) -> Option<&[f32]> {
    if t.dtype() != DType::F32 {
        return None;
    }
    t.as_slice::<f32>()
}

/// Runs `kernel(out_chunk, offset)` over `out` in chunks of whole `row`s, on the rayon pool when `out` is large.
fn for_each_chunk(out: &mut [f32], row: usize, kernel: impl Fn(&mut [f32], usize) + Sync + Send) {
    if out.len() < PARALLEL_MIN {
        kernel(out, 0);
        return;
    }
    let chunk = CHUNK.div_ceil(row).max(1) * row;
    out.par_chunks_mut(chunk)
        .enumerate()
        .for_each(|(i, part)| kernel(part, i * chunk));
}

/// [`for_each_chunk`] over two buffers of one length, chunked alike: `kernel(a_chunk, b_chunk, offset)`.
fn for_each_chunk_pair(
    a: &mut [f32],
    b: &mut [f32],
    kernel: impl Fn(&mut [f32], &mut [f32], usize) + Sync + Send,
) {
    if a.len() < PARALLEL_MIN {
        kernel(a, b, 0);
        return;
    }
    a.par_chunks_mut(CHUNK)
        .zip(b.par_chunks_mut(CHUNK))
        .enumerate()
        .for_each(|(i, (a, b))| kernel(a, b, i * CHUNK));
}

#[cfg(test)]
mod tests;

//! Native kernels for burn-flex, ember's CPU backend: element-wise work that burn-flex runs as several scalar,
//! single-threaded passes (its `exp` calls libm per element and no unary op is parallel) done here in one pass,
//! vectorised and split across the rayon pool; and the small matrix products it leaves on one thread.
//!
//! Each kernel takes and returns `FlexTensor`s and declines inputs it does not handle (a dtype other than f32, an
//! unexpected layout, a padding mask) with `None` (`Err(up)` for SwiGLU, which hands back the buffer it may write
//! into), so the caller falls back to the portable tensor-op version.

mod backend;
mod cross_entropy;
mod flash;
mod ggml;
#[cfg(target_arch = "x86_64")]
mod isa;
mod key_padding;
mod linear;
mod norm;
mod paged;
pub(crate) mod quantized;
mod rope;
mod simd;
mod spin_pool;
mod strided_gemm;
mod swiglu;
mod write;

pub(crate) use cross_entropy::{cross_entropy, cross_entropy_backward};
pub(crate) use flash::{flash_backward, flash_forward};
pub(crate) use ggml::{ggml_dense, ggml_dense_many, integer_tiles_available};
pub(crate) use linear::{dense, dense_backward, dense_input_grad};
pub(crate) use norm::{rms_norm, rms_norm_backward};
pub(crate) use paged::paged_attention;
pub(crate) use quantized::quantized_dense;
pub(crate) use rope::rope_rotate;
pub(crate) use swiglu::{swiglu, swiglu_backward};
pub(crate) use write::{select_rows, write_block, write_rows};

use std::cell::Cell;

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{Bytes, DType, Shape};
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

thread_local! {
    /// The most threads the kernels called from this thread may use; `None`: the whole rayon pool.
    static KERNEL_THREADS: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Runs `f` with the CPU kernels it calls from this thread limited to `threads` threads (1: on this thread
/// alone), then restores the previous limit.
///
/// Data-parallel replicas that are threads of one CPU each take their share of the cores this way: handing
/// every product of every replica to the one shared pool makes them queue behind each other and costs a
/// hand-off per operation (measured on two cores: one kernel thread per replica trains 20-37% more tokens/s,
/// see docs/BENCHMARKS.md).
pub fn with_kernel_threads<R>(threads: usize, f: impl FnOnce() -> R) -> R {
    /// Puts the previous limit back even when `f` unwinds.
    struct Restore(Option<usize>);
    impl Drop for Restore {
        fn drop(&mut self) {
            KERNEL_THREADS.with(|limit| limit.set(self.0));
        }
    }
    let _restore = Restore(KERNEL_THREADS.with(|limit| limit.replace(Some(threads.max(1)))));
    f()
}

/// Threads the CPU kernels called from this thread may split their work across: the rayon pool's (what
/// `--threads` sets), capped by [`with_kernel_threads`].
pub fn kernel_threads() -> usize {
    let pool = rayon::current_num_threads();
    KERNEL_THREADS.with(|limit| limit.get().map_or(pool, |cap| cap.min(pool)))
}

/// A zero-filled f32 tensor of `shape`. `FlexTensor::empty` allocates bytes and copies them once more to
/// align them for any dtype: a second pass over every output that an f32 buffer does not need.
fn zeroed(shape: Shape) -> FlexTensor {
    let data = Bytes::from_elems(vec![0.0f32; shape.num_elements()]);
    FlexTensor::new(data, Layout::contiguous(shape), DType::F32)
}

/// The `[batch, heads, len, width]` view of a contiguous `[batch, len, heads, width]` tensor: how the
/// attention kernels return heads, in the memory order of the projections they come from and go back to.
fn heads_view(t: FlexTensor) -> FlexTensor {
    let s = t.layout().shape();
    let [batch, len, heads, width] = [s[0], s[1], s[2], s[3]];
    let strides = [len * heads * width, width, heads * width, 1].map(|x| x as isize);
    let layout = Layout::new(
        Shape::from(vec![batch, heads, len, width]),
        strides.to_vec(),
        0,
    );
    FlexTensor::from_arc(t.data_arc(), layout, DType::F32)
}

/// Elements from which a kernel below [`PARALLEL_MIN`] is split across the spinning decode workers
/// ([`spin_pool`]), whose hand-off costs a fraction of rayon's: a batch-8 decode step's SwiGLU (8 x 1536) had
/// run on the calling thread while the other spun, 3% of the step (`perf record`, SmolLM2 Q4_1).
const SPIN_MIN: usize = 1 << 13;

/// Runs `kernel(out_chunk, offset)` over `out` in chunks of whole `row`s, on the rayon pool when `out` is large
/// and on the spinning workers when it is middling.
fn for_each_chunk(out: &mut [f32], row: usize, kernel: impl Fn(&mut [f32], usize) + Sync + Send) {
    let threads = kernel_threads();
    if out.len() < SPIN_MIN || threads == 1 {
        kernel(out, 0);
        return;
    }
    if out.len() < PARALLEL_MIN {
        let len = out.len();
        let chunk = len.div_ceil(threads).div_ceil(row).max(1) * row;
        let shared = linear::OutPtr(out.as_mut_ptr());
        let task = |t: usize| {
            let start = t * chunk;
            let end = (start + chunk).min(len);
            // SAFETY: tasks take disjoint ranges `start..end` of `out`, which nothing else touches until
            // `spin_pool::run` returns.
            let part =
                unsafe { std::slice::from_raw_parts_mut(shared.get().add(start), end - start) };
            kernel(part, start);
        };
        // As `ggml::decode::run_split`: a caller capped below the pool keeps off the workers.
        if threads >= rayon::current_num_threads() && spin_pool::run(len.div_ceil(chunk), &task) {
            return;
        }
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
    if a.len() < PARALLEL_MIN || kernel_threads() == 1 {
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

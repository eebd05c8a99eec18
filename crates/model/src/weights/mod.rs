//! Where parameter values come from: a checkpoint ([`CheckpointSource`]) or a seeded initialiser
//! ([`RandomInit`]). The model is built by one code path that asks a [`WeightSource`] for each canonical tensor.

mod checkpoint;
mod init;
mod source;

pub use checkpoint::{Checkpoint, INDEX_FILE, SINGLE_FILE};
/// ember's checks of a safetensors header before the `safetensors` crate's (a tensor named twice), for every
/// crate that reads safetensors files.
pub use ember_optimization::quant::header::check_safetensors_header;
pub use init::RandomInit;
pub use source::CheckpointSource;
pub(crate) use source::transpose;

use crate::error::Result;
use crate::tensors::TensorSpec;

/// Supplies parameter values by canonical name.
pub trait WeightSource {
    /// The values of `tensor`, row-major in its canonical shape (`[out, in]` for linear weights).
    fn take(&mut self, tensor: &TensorSpec) -> Result<Vec<f32>>;

    /// The matrix `tensor` as stored packed, for sources that hold it so (ember's quantized checkpoints, GGUF
    /// block-quantized tensors), or `None` to have it read as f32 with [`take`](Self::take). Asked first for
    /// every linear weight and the embedding.
    fn take_quantized(
        &mut self,
        tensor: &TensorSpec,
    ) -> Result<Option<ember_optimization::PackedWeight>> {
        let _ = tensor;
        Ok(None)
    }
}

/// Progress of a load: called after each tensor with `(done, total, canonical name)`.
pub type Progress<'a> = &'a mut dyn FnMut(usize, usize, &str);

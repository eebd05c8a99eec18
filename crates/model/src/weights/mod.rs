//! Where parameter values come from: a checkpoint ([`CheckpointSource`]) or a seeded initialiser
//! ([`RandomInit`]). The model is built by one code path that asks a [`WeightSource`] for each canonical tensor.

mod checkpoint;
mod init;
mod source;

pub use checkpoint::{Checkpoint, INDEX_FILE, SINGLE_FILE};
pub use init::RandomInit;
pub use source::CheckpointSource;
pub(crate) use source::transpose;

use crate::error::Result;
use crate::tensors::TensorSpec;

/// Supplies parameter values by canonical name.
pub trait WeightSource {
    /// The values of `tensor`, row-major in its canonical shape (`[out, in]` for linear weights).
    fn take(&mut self, tensor: &TensorSpec) -> Result<Vec<f32>>;
}

/// Progress of a load: called after each tensor with `(done, total, canonical name)`.
pub type Progress<'a> = &'a mut dyn FnMut(usize, usize, &str);

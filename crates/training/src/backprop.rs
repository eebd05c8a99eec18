//! One micro-batch's forward and backward pass, shared by the single-device loop and every data-parallel replica.

use burn::module::AutodiffModule;
use burn::tensor::ElementConversion;
use burn::tensor::backend::AutodiffBackend;

use crate::loss::inputs_and_targets;
use crate::model_io::{BoxError, TrainableModel};
use crate::params::Gradients;

/// How a micro-batch's gradients are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backprop {
    /// Tokens per sequence: every row holds `block_size + 1` ids.
    pub block_size: usize,
    /// Recompute each block's activations during the backward pass instead of keeping them from the forward
    /// pass ([`TrainableModel::checkpointed_gradients`]): less memory, about one more forward pass of time.
    pub checkpoint_activations: bool,
}

/// The loss of the micro-batch `rows` times `weight`, and that product's gradients.
pub(crate) fn micro_batch_gradients<AB, M>(
    model: &M,
    rows: &[u32],
    weight: f64,
    backprop: Backprop,
    device: &AB::Device,
) -> Result<(f64, Gradients<AB::InnerBackend>), BoxError>
where
    AB: AutodiffBackend,
    M: AutodiffModule<AB> + TrainableModel<AB>,
{
    let (inputs, targets) = inputs_and_targets::<AB>(rows, backprop.block_size, device);
    if backprop.checkpoint_activations {
        return model.checkpointed_gradients(inputs, targets, weight);
    }
    let loss = model.loss(inputs, targets)?.mul_scalar(weight);
    let value = loss.clone().into_scalar().elem::<f64>();
    Ok((value, Gradients::from_backward(model, loss.backward())))
}

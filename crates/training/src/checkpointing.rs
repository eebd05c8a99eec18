//! Activation checkpointing per block (`training.checkpoint_activations`): the forward pass runs once without
//! recording a graph, keeping only each block's input; the backward pass then re-runs one block at a time while
//! recording and backpropagates through it alone, so at most one block's activations (attention probabilities,
//! MLP intermediates, norms' statistics) are alive at once instead of every block's. The cost is one more forward
//! pass of the blocks.
//!
//! Each piece is its own small graph: the head's (final norm, LM head, loss) from the last block's output as a leaf;
//! each block's from its stored input as a leaf, seeded with the gradient of its output through
//! `sum(output * upstream)`, whose gradient with respect to the output is `upstream` exactly; and the
//! embeddings' last. The parameters' gradients of the pieces add up to the whole graph's (a tied embedding gets its
//! share from the head's piece and from the embeddings').
//!
//! Only burn's public autodiff is used. The alternative, a custom autodiff node that recomputes a block inside the
//! outer graph, would need changes to burn 0.21: its backward pass holds the graph's lock throughout, and a block
//! recomputed inside it would register its ops in that same graph, where its parameters' nodes live.

use burn::module::{AutodiffModule, Module};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Int, Tensor};
use ember_model::{EmberBackend, Transformer};

use crate::model_io::BoxError;
use crate::params::Gradients;

/// [`crate::TrainableModel::checkpointed_gradients`] for ember-model's transformer: equal to backpropagating
/// `cross_entropy(model.forward(tokens), targets) * weight` whole, up to floating-point summation order.
///
/// Dropout would draw new masks when a block is recomputed, so a model whose LoRA adapters have dropout is an
/// error rather than a subtly wrong gradient.
pub(crate) fn checkpointed_gradients<AB>(
    model: &Transformer<AB>,
    tokens: Tensor<AB, 2, Int>,
    targets: Tensor<AB, 2, Int>,
    weight: f64,
) -> Result<(f64, Gradients<AB::InnerBackend>), BoxError>
where
    AB: AutodiffBackend + EmberBackend,
    Transformer<AB>: AutodiffModule<AB>,
{
    if model.lora_adapters()?.iter().any(|(_, a)| a.dropout > 0.0) {
        return Err(
            "training.checkpoint_activations needs training.lora.dropout 0: recomputing a block \
                    would draw new dropout masks"
                .into(),
        );
    }
    let device = tokens.device();
    let live = model.segments(&device)?;
    // Tracked only when the embeddings train; its graph holds nothing but the ids (and the position rows).
    let embedded = live.embed(tokens)?;

    // The forward pass without a graph: with every parameter detached, no operation records its inputs.
    let detached = model.clone().no_grad();
    let pass = detached.segments(&device)?;
    let mut inputs = Vec::with_capacity(pass.blocks());
    let mut x = embedded.clone().detach();
    for layer in 0..pass.blocks() {
        inputs.push(x.clone());
        x = pass.block(layer, x)?;
    }

    let top = x.require_grad();
    let loss = ember_attention::cross_entropy(live.head(top.clone()), targets).mul_scalar(weight);
    let value = loss.clone().into_scalar().elem::<f64>();
    let mut grads = loss.backward();
    let mut upstream = top.grad_remove(&mut grads);
    let mut total = Gradients::from_backward(model, grads);

    for layer in (0..live.blocks()).rev() {
        let (Some(input), Some(gradient)) = (inputs.pop(), upstream.take()) else {
            break;
        };
        // Every block's input is a leaf that wants its gradient, so every output is tracked (the first block's
        // input gradient is then unused when the embeddings are frozen: one block's input product, 1/n of the
        // backward pass, for one code path).
        let input = input.require_grad();
        let output = live.block(layer, input.clone())?;
        let mut grads = (output * Tensor::from_inner(gradient)).sum().backward();
        upstream = input.grad_remove(&mut grads);
        total.accumulate(Gradients::from_backward(model, grads));
    }
    if let Some(gradient) = upstream.filter(|_| live.embeds_trainably()) {
        let grads = (embedded * Tensor::from_inner(gradient)).sum().backward();
        total.accumulate(Gradients::from_backward(model, grads));
    }
    Ok((value, total))
}

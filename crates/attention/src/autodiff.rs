//! ember's kernels on `Autodiff<B>`, each one graph node whose backward step calls the inner backend: flash
//! attention ([`EmberBackend::flash_attention_backward`]), RoPE (a rotation: its gradient is the rotation
//! by the opposite angles), the linear layer ([`EmberBackend::dense_backward`]), RMSNorm
//! ([`EmberBackend::rms_norm_backward`]), SwiGLU
//! ([`EmberBackend::swiglu_backward`]) and the cross-entropy loss ([`EmberBackend::cross_entropy_backward`]).

use burn::backend::Autodiff;
use burn::backend::autodiff::{
    NodeId,
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
};
use burn::tensor::ops::FloatTensorOps;
use burn::tensor::ops::{BoolTensor, FloatTensor, IntTensor};
use burn::tensor::{Shape, TensorMetadata};

use crate::EmberBackend;
use crate::flash::FlashConfig;
use crate::rope::RopeConfig;

/// The backward step of flash attention: parents are (q, k, v).
#[derive(Debug)]
struct FlashAttentionBackward;

/// What the backward step keeps: checkpointed q, k, v, the padding mask, the output and log-sum-exp
/// (O(T) per head: no score tile survives the forward pass).
type FlashState<B> = (
    NodeId,
    NodeId,
    NodeId,
    Option<BoolTensor<B>>,
    FloatTensor<B>,
    FloatTensor<B>,
    FlashConfig,
);

impl<B: EmberBackend> Backward<B, 3> for FlashAttentionBackward {
    type State = FlashState<B>;

    fn backward(
        self,
        ops: Ops<Self::State, 3>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let [node_q, node_k, node_v] = ops.parents;
        let grad_output = grads.consume::<B>(&ops.node);
        let (q_id, k_id, v_id, key_padding, output, lse, config) = ops.state;
        let q: FloatTensor<B> = checkpointer.retrieve_node_output(q_id);
        let k: FloatTensor<B> = checkpointer.retrieve_node_output(k_id);
        let v: FloatTensor<B> = checkpointer.retrieve_node_output(v_id);
        let (dq, dk, dv) =
            B::flash_attention_backward(q, k, v, key_padding, output, lse, grad_output, config);
        for (node, grad) in [(node_q, dq), (node_k, dk), (node_v, dv)] {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

impl<B: EmberBackend, C: CheckpointStrategy> EmberBackend for Autodiff<B, C> {
    fn flash_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        key_padding: Option<BoolTensor<Self>>,
        config: FlashConfig,
    ) -> FloatTensor<Self> {
        match FlashAttentionBackward
            .prepare::<C>([q.node.clone(), k.node.clone(), v.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let q_id = prep.checkpoint(&q);
                let k_id = prep.checkpoint(&k);
                let v_id = prep.checkpoint(&v);
                let (output, lse) = B::flash_attention_forward(
                    q.primitive,
                    k.primitive,
                    v.primitive,
                    key_padding.clone(),
                    config,
                );
                prep.finish(
                    (q_id, k_id, v_id, key_padding, output.clone(), lse, config),
                    output,
                )
            }
            OpsKind::UnTracked(prep) => prep.finish(B::flash_attention(
                q.primitive,
                k.primitive,
                v.primitive,
                key_padding,
                config,
            )),
        }
    }

    fn rope_rotate(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        rotation: FloatTensor<Self>,
        config: &RopeConfig,
    ) -> FloatTensor<Self> {
        let (cos, sin, rotation) = (cos.primitive, sin.primitive, rotation.primitive);
        match RopeBackward
            .prepare::<C>([x.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let out = B::rope_rotate(
                    x.primitive,
                    cos.clone(),
                    sin.clone(),
                    rotation.clone(),
                    config,
                );
                prep.finish((cos, sin, rotation, config.clone()), out)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::rope_rotate(x.primitive, cos, sin, rotation, config))
            }
        }
    }

    fn dense(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        let product = pair_node::<B, C>(x, weight, PairKernel::Dense, |x, w| B::dense(x, w, None));
        // The bias joins through the tracked broadcast add, whose backward sums over the rows.
        match bias {
            Some(bias) => {
                let row = Shape::new([1, bias.primitive.shape().num_elements()]);
                Self::float_add(product, Self::float_reshape(bias, row))
            }
            None => product,
        }
    }

    fn cross_entropy(logits: FloatTensor<Self>, targets: IntTensor<Self>) -> FloatTensor<Self> {
        match CrossEntropyBackward
            .prepare::<C>([logits.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let logits_id = prep.checkpoint(&logits);
                let (loss, lse) = B::cross_entropy_forward(logits.primitive, targets.clone());
                prep.finish((logits_id, targets, lse), loss)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::cross_entropy(logits.primitive, targets)),
        }
    }

    fn rms_norm(x: FloatTensor<Self>, weight: FloatTensor<Self>, eps: f64) -> FloatTensor<Self> {
        pair_node::<B, C>(x, weight, PairKernel::RmsNorm { eps }, |x, w| {
            B::rms_norm(x, w, eps)
        })
    }

    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        pair_node::<B, C>(gate, up, PairKernel::Swiglu, B::swiglu)
    }
}

/// The backward step of RoPE: the parent is `x`; the tables and rotation are constants.
#[derive(Debug)]
struct RopeBackward;

impl<B: EmberBackend> Backward<B, 1> for RopeBackward {
    /// cos, sin, rotation, config.
    type State = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, RopeConfig);

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let [node_x] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let (cos, sin, rotation, config) = ops.state;
        // y = x cos + (x R) sin with R^T = -R and sin equal on both dimensions of a pair, so
        // dx = g cos + (g sin) R^T = g cos + (g R)(-sin): the same rotation by the opposite angles.
        if let Some(node) = node_x {
            let dx = B::rope_rotate(grad, cos, B::float_neg(sin), rotation, &config);
            grads.register::<B>(node.id, dx);
        }
    }
}

/// A kernel of two inputs whose backward step returns the gradients of both from the two inputs alone.
#[derive(Debug, Clone, Copy)]
enum PairKernel {
    /// [`EmberBackend::swiglu`]: inputs (gate, up).
    Swiglu,
    /// [`EmberBackend::dense`] without its bias: inputs (x, weight). Its gradients come back in the inputs' own
    /// layouts (burn's matmul of the transposed weight returns the weight's gradient transposed).
    Dense,
    /// [`EmberBackend::rms_norm`]: inputs (x, weight).
    RmsNorm { eps: f64 },
}

impl PairKernel {
    fn backward<B: EmberBackend>(
        self,
        a: FloatTensor<B>,
        b: FloatTensor<B>,
        grad: FloatTensor<B>,
    ) -> (FloatTensor<B>, FloatTensor<B>) {
        match self {
            PairKernel::Swiglu => B::swiglu_backward(a, b, grad),
            PairKernel::Dense => B::dense_backward(a, b, grad),
            PairKernel::RmsNorm { eps } => B::rms_norm_backward(a, b, eps, grad),
        }
    }
}

/// The backward step of a [`PairKernel`]: parents are its two inputs.
#[derive(Debug)]
struct PairBackward;

impl<B: EmberBackend> Backward<B, 2> for PairBackward {
    /// The checkpointed inputs and the kernel.
    type State = (NodeId, NodeId, PairKernel);

    fn backward(
        self,
        ops: Ops<Self::State, 2>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let [node_a, node_b] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let (a_id, b_id, kernel) = ops.state;
        let a: FloatTensor<B> = checkpointer.retrieve_node_output(a_id);
        let b: FloatTensor<B> = checkpointer.retrieve_node_output(b_id);
        if let (PairKernel::Dense, Some(node), None) = (kernel, &node_a, &node_b) {
            // A frozen weight: its gradient would be computed only to be dropped.
            grads.register::<B>(node.id, B::dense_input_grad(b, grad));
            return;
        }
        let (d_a, d_b) = kernel.backward::<B>(a, b, grad);
        for (node, grad) in [(node_a, d_a), (node_b, d_b)] {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

/// `forward(a, b)` on the inner backend, recorded as one graph node whose backward step is `kernel`'s.
fn pair_node<B: EmberBackend, C: CheckpointStrategy>(
    a: FloatTensor<Autodiff<B, C>>,
    b: FloatTensor<Autodiff<B, C>>,
    kernel: PairKernel,
    forward: impl FnOnce(FloatTensor<B>, FloatTensor<B>) -> FloatTensor<B>,
) -> FloatTensor<Autodiff<B, C>> {
    match PairBackward
        .prepare::<C>([a.node.clone(), b.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(mut prep) => {
            let a_id = prep.checkpoint(&a);
            let b_id = prep.checkpoint(&b);
            prep.finish((a_id, b_id, kernel), forward(a.primitive, b.primitive))
        }
        OpsKind::UnTracked(prep) => prep.finish(forward(a.primitive, b.primitive)),
    }
}

/// The backward step of the cross-entropy loss: the parent is the logits.
#[derive(Debug)]
struct CrossEntropyBackward;

impl<B: EmberBackend> Backward<B, 1> for CrossEntropyBackward {
    /// Checkpointed logits, the targets and each row's log-sum-exp.
    type State = (NodeId, IntTensor<B>, FloatTensor<B>);

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let [node_logits] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let (logits_id, targets, lse) = ops.state;
        let logits: FloatTensor<B> = checkpointer.retrieve_node_output(logits_id);
        if let Some(node) = node_logits {
            let d_logits = B::cross_entropy_backward(logits, targets, lse, grad);
            grads.register::<B>(node.id, d_logits);
        }
    }
}

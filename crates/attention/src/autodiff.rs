//! ember's kernels on `Autodiff<B>`, each one graph node whose backward step calls the inner backend: flash
//! attention ([`AttentionBackend::flash_attention_backward`]), RoPE (a rotation: its gradient is the rotation
//! by the opposite angles), the linear layer ([`KernelBackend::dense_backward`]), RMSNorm
//! ([`KernelBackend::rms_norm_backward`]), SwiGLU
//! ([`KernelBackend::swiglu_backward`]) and the cross-entropy loss ([`KernelBackend::cross_entropy_backward`]).

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

use crate::flash::FlashConfig;
use crate::rope::RopeConfig;
use crate::{AttentionBackend, KernelBackend};

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

impl<B: AttentionBackend> Backward<B, 3> for FlashAttentionBackward {
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

impl<B: AttentionBackend, C: CheckpointStrategy> AttentionBackend for Autodiff<B, C> {
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
}

/// The backward step of RoPE: the parent is `x`; the tables and rotation are constants.
#[derive(Debug)]
struct RopeBackward;

impl<B: AttentionBackend> Backward<B, 1> for RopeBackward {
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

/// The backward step of SwiGLU: parents are (gate, up).
#[derive(Debug)]
struct SwigluBackward;

impl<B: KernelBackend> Backward<B, 2> for SwigluBackward {
    /// Checkpointed gate and up.
    type State = (NodeId, NodeId);

    fn backward(
        self,
        ops: Ops<Self::State, 2>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let [node_gate, node_up] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let (gate_id, up_id) = ops.state;
        let gate: FloatTensor<B> = checkpointer.retrieve_node_output(gate_id);
        let up: FloatTensor<B> = checkpointer.retrieve_node_output(up_id);
        let (d_gate, d_up) = B::swiglu_backward(gate, up, grad);
        for (node, grad) in [(node_gate, d_gate), (node_up, d_up)] {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

/// The backward step of a linear layer's product `x · Wᵀ`: parents are (x, weight). Its gradients are
/// written in the parameters' own layouts (burn's matmul of the transposed weight returns the weight's gradient
/// transposed).
#[derive(Debug)]
struct DenseBackward;

impl<B: KernelBackend> Backward<B, 2> for DenseBackward {
    /// Checkpointed x and weight.
    type State = (NodeId, NodeId);

    fn backward(
        self,
        ops: Ops<Self::State, 2>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let [node_x, node_weight] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let (x_id, weight_id) = ops.state;
        let x: FloatTensor<B> = checkpointer.retrieve_node_output(x_id);
        let weight: FloatTensor<B> = checkpointer.retrieve_node_output(weight_id);
        let (d_x, d_weight) = B::dense_backward(x, weight, grad);
        for (node, grad) in [(node_x, d_x), (node_weight, d_weight)] {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

/// The backward step of RMSNorm: parents are (x, weight).
#[derive(Debug)]
struct RmsNormBackward;

impl<B: KernelBackend> Backward<B, 2> for RmsNormBackward {
    /// Checkpointed x and weight, and epsilon.
    type State = (NodeId, NodeId, f64);

    fn backward(
        self,
        ops: Ops<Self::State, 2>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let [node_x, node_weight] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let (x_id, weight_id, eps) = ops.state;
        let x: FloatTensor<B> = checkpointer.retrieve_node_output(x_id);
        let weight: FloatTensor<B> = checkpointer.retrieve_node_output(weight_id);
        let (d_x, d_weight) = B::rms_norm_backward(x, weight, eps, grad);
        for (node, grad) in [(node_x, d_x), (node_weight, d_weight)] {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

/// The backward step of the cross-entropy loss: the parent is the logits.
#[derive(Debug)]
struct CrossEntropyBackward;

impl<B: KernelBackend> Backward<B, 1> for CrossEntropyBackward {
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

impl<B: KernelBackend, C: CheckpointStrategy> KernelBackend for Autodiff<B, C> {
    fn dense(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        match DenseBackward
            .prepare::<C>([x.node.clone(), weight.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let x_id = prep.checkpoint(&x);
                let weight_id = prep.checkpoint(&weight);
                let product = prep.finish(
                    (x_id, weight_id),
                    B::dense(x.primitive, weight.primitive, None),
                );
                // The bias joins through the tracked broadcast add, whose backward sums over the rows.
                match bias {
                    Some(bias) => {
                        let row = Shape::new([1, bias.primitive.shape().num_elements()]);
                        Self::float_add(product, Self::float_reshape(bias, row))
                    }
                    None => product,
                }
            }
            OpsKind::UnTracked(prep) => prep.finish(B::dense(
                x.primitive,
                weight.primitive,
                bias.map(|b| b.primitive),
            )),
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
        match RmsNormBackward
            .prepare::<C>([x.node.clone(), weight.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let x_id = prep.checkpoint(&x);
                let weight_id = prep.checkpoint(&weight);
                let out = B::rms_norm(x.primitive, weight.primitive, eps);
                prep.finish((x_id, weight_id, eps), out)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(B::rms_norm(x.primitive, weight.primitive, eps))
            }
        }
    }

    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        match SwigluBackward
            .prepare::<C>([gate.node.clone(), up.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let gate_id = prep.checkpoint(&gate);
                let up_id = prep.checkpoint(&up);
                prep.finish((gate_id, up_id), B::swiglu(gate.primitive, up.primitive))
            }
            OpsKind::UnTracked(prep) => prep.finish(B::swiglu(gate.primitive, up.primitive)),
        }
    }
}

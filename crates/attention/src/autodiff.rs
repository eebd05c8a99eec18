//! Flash attention on `Autodiff<B>`: one graph node whose backward step is the inner backend's
//! [`AttentionBackend::flash_attention_backward`].

use burn::backend::Autodiff;
use burn::backend::autodiff::{
    NodeId,
    checkpoint::{base::Checkpointer, strategy::CheckpointStrategy},
    grads::Gradients,
    ops::{Backward, Ops, OpsKind},
};
use burn::tensor::ops::{BoolTensor, FloatTensor};

use crate::AttentionBackend;
use crate::flash::FlashConfig;

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
}

//! The backend extension trait that lets a backend own the flash kernel, forward and backward.

use burn::tensor::{
    Tensor, TensorPrimitive,
    backend::Backend,
    ops::{BoolTensor, FloatTensor},
};

use crate::flash::{FlashConfig, flash_backward, flash_forward};

/// A burn backend that can run ember's flash attention.
///
/// Every method has a portable default written in tensor ops ([`crate::flash`]); a backend overrides them
/// with a native kernel, and `Autodiff<B>` overrides [`flash_attention`](Self::flash_attention) to record a
/// single backward step that calls [`flash_attention_backward`](Self::flash_attention_backward), so autodiff
/// never stores the per-tile intermediates and training memory stays O(T).
///
/// Shapes: q `[batch, q_heads, q_len, head_dim]`, k `[batch, kv_heads, kv_len, head_dim]`,
/// v `[batch, kv_heads, kv_len, v_dim]`, `key_padding` `[batch, kv_len]` (`true` = padding).
pub trait AttentionBackend: Backend {
    /// Attention output `[batch, q_heads, q_len, v_dim]`, differentiable on autodiff backends.
    fn flash_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        key_padding: Option<BoolTensor<Self>>,
        config: FlashConfig,
    ) -> FloatTensor<Self> {
        Self::flash_attention_forward(q, k, v, key_padding, config).0
    }

    /// Output `[batch, q_heads, q_len, v_dim]` and per-row log-sum-exp of the scaled, masked scores
    /// `[batch, q_heads, q_len]`.
    fn flash_attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        key_padding: Option<BoolTensor<Self>>,
        config: FlashConfig,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (output, lse) = flash_forward::<Self>(
            float(q),
            float(k),
            float(v),
            key_padding.map(Tensor::from_primitive),
            &config,
        );
        (
            output.into_primitive().tensor(),
            lse.into_primitive().tensor(),
        )
    }

    /// Gradients `(dq, dk, dv)` from the forward's inputs, `output`, `lse` and `grad_output`
    /// (`[batch, q_heads, q_len, v_dim]`), recomputing score tiles instead of storing them.
    #[allow(clippy::too_many_arguments)]
    fn flash_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        key_padding: Option<BoolTensor<Self>>,
        output: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        grad_output: FloatTensor<Self>,
        config: FlashConfig,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (dq, dk, dv) = flash_backward::<Self>(
            float(q),
            float(k),
            float(v),
            key_padding.map(Tensor::from_primitive),
            float(output),
            float(lse),
            float(grad_output),
            &config,
        );
        (
            dq.into_primitive().tensor(),
            dk.into_primitive().tensor(),
            dv.into_primitive().tensor(),
        )
    }
}

/// Wraps a float primitive as a tensor of rank `D`.
fn float<B: Backend, const D: usize>(primitive: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(primitive))
}

impl AttentionBackend for burn::backend::Flex {}

#[cfg(feature = "ndarray")]
impl AttentionBackend for burn::backend::NdArray {}

// wgpu and CUDA (`Fusion<CubeBackend<..>>`) run the forward as ember's CubeCL kernel: see `crate::cube`.

//! The backend extension trait that lets a backend own the flash kernel (forward and backward) and RoPE.

use burn::tensor::{
    Tensor, TensorPrimitive,
    backend::Backend,
    ops::{BoolTensor, FloatTensor},
};

use crate::KernelBackend;
use crate::flash::{FlashConfig, flash_backward, flash_forward};
use crate::rope::RopeConfig;

/// A burn backend that can run ember's flash attention.
///
/// Every method has a portable default written in tensor ops (`src/flash.rs`); a backend overrides them
/// with a native kernel, and `Autodiff<B>` overrides [`flash_attention`](Self::flash_attention) to record a
/// single backward step that calls [`flash_attention_backward`](Self::flash_attention_backward), so autodiff
/// never stores the per-tile intermediates and training memory stays O(T).
///
/// Shapes: q `[batch, q_heads, q_len, head_dim]`, k `[batch, kv_heads, kv_len, head_dim]`,
/// v `[batch, kv_heads, kv_len, v_dim]`, `key_padding` `[batch, kv_len]` (`true` = padding).
///
/// It extends [`KernelBackend`], so the one bound `B: AttentionBackend` carried by models, training and
/// inference code reaches every ember kernel.
pub trait AttentionBackend: KernelBackend {
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
        portable_flash_forward::<Self>(q, k, v, key_padding, config)
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
        portable_flash_backward::<Self>(q, k, v, key_padding, output, lse, grad_output, config)
    }

    /// Rotates `x` `[batch, heads, seq, head_dim]` by RoPE angles whose full-width cos/sin are
    /// `[batch | 1, 1, seq, head_dim]`: `x * cos + (x @ rotation) * sin`, where the `[head_dim, head_dim]`
    /// `rotation` maps each pair `(a, b)` of `config`'s layout to `(-b, a)`. For a pair that is
    /// `(a cos - b sin, b cos + a sin)`, bit for bit. Returns a contiguous tensor.
    ///
    /// The default runs on contiguous data: the rows are one small matmul, and the tables broadcast along whole
    /// rows, where slicing the two halves apart would make every multiply and its gradient walk strided views.
    /// burn-flex reads `x` through its strides and writes the result in one pass.
    fn rope_rotate(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        rotation: FloatTensor<Self>,
        config: &RopeConfig,
    ) -> FloatTensor<Self> {
        let _ = config;
        portable_rope_rotate::<Self>(x, cos, sin, rotation)
    }
}

/// [`AttentionBackend::flash_attention_forward`] in burn tensor ops ([`crate::flash`]).
fn portable_flash_forward<B: Backend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    key_padding: Option<BoolTensor<B>>,
    config: FlashConfig,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let (output, lse) = flash_forward::<B>(
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

/// [`AttentionBackend::flash_attention_backward`] in burn tensor ops ([`crate::flash`]).
#[allow(clippy::too_many_arguments)]
fn portable_flash_backward<B: Backend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    key_padding: Option<BoolTensor<B>>,
    output: FloatTensor<B>,
    lse: FloatTensor<B>,
    grad_output: FloatTensor<B>,
    config: FlashConfig,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let (dq, dk, dv) = flash_backward::<B>(
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

/// [`AttentionBackend::rope_rotate`] in burn tensor ops.
pub(crate) fn portable_rope_rotate<B: Backend>(
    x: FloatTensor<B>,
    cos: FloatTensor<B>,
    sin: FloatTensor<B>,
    rotation: FloatTensor<B>,
) -> FloatTensor<B> {
    let x: Tensor<B, 4> = float(x);
    let [batch, heads, seq, head_dim] = x.dims();
    let dtype = x.dtype();
    // Rows of `seq * head_dim`: a table shared by every batch row and head is then one contiguous row that
    // burn-flex broadcasts with its SIMD path (a `[seq, head_dim]` table over `[batch, heads]` is not).
    let span = seq * head_dim;
    let table = |t: FloatTensor<B>| {
        let t: Tensor<B, 4> = float(t);
        let rows = t.dims()[0];
        t.cast(dtype).reshape([rows, 1, span])
    };
    let (cos, sin) = (table(cos), table(sin));
    let rotation: Tensor<B, 2> = float(rotation);
    let rows = x.reshape([batch * heads * seq, head_dim]);
    let turned = rows
        .clone()
        .matmul(rotation.cast(dtype))
        .reshape([batch, heads, span]);
    let rotated = rows.reshape([batch, heads, span]) * cos + turned * sin;
    rotated
        .reshape([batch, heads, seq, head_dim])
        .into_primitive()
        .tensor()
}

/// Wraps a float primitive as a tensor of rank `D`.
fn float<B: Backend, const D: usize>(primitive: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(primitive))
}

/// burn-flex runs flash attention natively (`src/cpu/`) unless a key-padding mask is given (left-padded
/// batches), and RoPE in one pass.
impl AttentionBackend for burn::backend::Flex {
    fn flash_attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        key_padding: Option<BoolTensor<Self>>,
        config: FlashConfig,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        key_padding
            .is_none()
            .then(|| crate::cpu::flash_forward(&q, &k, &v, &config.mask, config.scale))
            .flatten()
            .unwrap_or_else(|| portable_flash_forward::<Self>(q, k, v, key_padding, config))
    }

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
        let native = key_padding.is_none().then(|| {
            crate::cpu::flash_backward(
                &q,
                &k,
                &v,
                &output,
                &lse,
                &grad_output,
                &config.mask,
                config.scale,
            )
        });
        native.flatten().unwrap_or_else(|| {
            portable_flash_backward::<Self>(q, k, v, key_padding, output, lse, grad_output, config)
        })
    }

    fn rope_rotate(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
        rotation: FloatTensor<Self>,
        config: &RopeConfig,
    ) -> FloatTensor<Self> {
        crate::cpu::rope_rotate(&x, &cos, &sin, config)
            .unwrap_or_else(|| portable_rope_rotate::<Self>(x, cos, sin, rotation))
    }
}

#[cfg(feature = "ndarray")]
impl AttentionBackend for burn::backend::NdArray {}

// wgpu and CUDA (`Fusion<CubeBackend<..>>`) run the forward as ember's CubeCL kernel: see `crate::cube`.

//! The portable default of every [`EmberBackend`](crate::EmberBackend) kernel, in burn tensor ops: what a
//! backend without a native kernel runs, and the oracle the native kernels are tested against.

use burn::tensor::{
    Int, Shape, Tensor, TensorMetadata, TensorPrimitive,
    backend::Backend,
    ops::{BoolTensor, FloatTensor, IntTensor},
};

use crate::flash::{FlashConfig, flash_backward, flash_forward};

/// [`EmberBackend::dense`] in burn tensor ops: burn's `linear` on the transposed view of the weight.
pub(crate) fn portable_linear<B: Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
) -> FloatTensor<B> {
    let x: Tensor<B, 2> = Tensor::from_primitive(TensorPrimitive::Float(x));
    let weight: Tensor<B, 2> = Tensor::from_primitive(TensorPrimitive::Float(weight));
    let bias = bias.map(|b| Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(b)));
    burn::tensor::module::linear(x, weight.transpose(), bias)
        .into_primitive()
        .tensor()
}

/// [`EmberBackend::dense_backward`] in burn tensor ops.
pub(crate) fn portable_dense_backward<B: Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    grad: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let d_x = B::float_matmul(grad.clone(), weight);
    let d_weight = B::float_matmul(B::float_transpose(grad), x);
    (d_x, d_weight)
}

/// `weight` `[dim]` shaped to broadcast against a tensor of `rank` dimensions.
fn broadcast_row<B: Backend>(weight: FloatTensor<B>, rank: usize) -> FloatTensor<B> {
    let mut dims = vec![1; rank];
    dims[rank - 1] = weight.shape().num_elements();
    B::float_reshape(weight, Shape::from(dims))
}

/// [`EmberBackend::rms_norm`] in burn tensor ops (the ops `Norm` recorded before the kernel existed).
pub(crate) fn portable_rms_norm<B: Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    eps: f64,
) -> FloatTensor<B> {
    let rank = x.shape().num_dims();
    let mean_square = B::float_mean_dim(B::float_mul(x.clone(), x.clone()), rank - 1);
    let rms = B::float_sqrt(B::float_add_scalar(mean_square, eps.into()));
    B::float_mul(B::float_div(x, rms), broadcast_row::<B>(weight, rank))
}

/// [`EmberBackend::rms_norm_backward`] in burn tensor ops.
pub(crate) fn portable_rms_norm_backward<B: Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    eps: f64,
    grad: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let shape = x.shape();
    let (rank, dim) = (shape.num_dims(), shape[shape.num_dims() - 1]);
    let rows = shape.num_elements() / dim.max(1);
    let mean_square = B::float_mean_dim(B::float_mul(x.clone(), x.clone()), rank - 1);
    let r = B::float_recip(B::float_sqrt(B::float_add_scalar(mean_square, eps.into())));
    let x_hat = B::float_mul(x, r.clone());
    let weight_shape = weight.shape();
    let d_weight = B::float_sum_dim(
        B::float_reshape(
            B::float_mul(grad.clone(), x_hat.clone()),
            Shape::from(vec![rows, dim]),
        ),
        0,
    );
    let g = B::float_mul(grad, broadcast_row::<B>(weight, rank));
    let mean = B::float_mean_dim(B::float_mul(g.clone(), x_hat.clone()), rank - 1);
    let d_x = B::float_mul(r, B::float_sub(g, B::float_mul(x_hat, mean)));
    (d_x, B::float_reshape(d_weight, weight_shape))
}

/// [`EmberBackend::swiglu`] in burn tensor ops.
pub(crate) fn portable_swiglu<B: Backend>(
    gate: FloatTensor<B>,
    up: FloatTensor<B>,
) -> FloatTensor<B> {
    let silu = B::float_mul(gate.clone(), B::sigmoid(gate));
    B::float_mul(silu, up)
}

/// [`EmberBackend::swiglu_backward`] in burn tensor ops.
pub(crate) fn portable_swiglu_backward<B: Backend>(
    gate: FloatTensor<B>,
    up: FloatTensor<B>,
    grad: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let s = B::sigmoid(gate.clone());
    let d_up = B::float_mul(grad.clone(), B::float_mul(gate.clone(), s.clone()));
    let one_minus_s = B::float_add_scalar(B::float_neg(s.clone()), 1.0.into());
    let slope = B::float_add_scalar(B::float_mul(gate, one_minus_s), 1.0.into());
    let d_gate = B::float_mul(B::float_mul(grad, up), B::float_mul(s, slope));
    (d_gate, d_up)
}

/// `(targets with ignored rows pointed at id 0, 1.0 for counted rows and 0.0 for ignored ones, the number of
/// counted rows (at least 1) as a [1] tensor)`: a row whose target is [`crate::IGNORE_TARGET`] takes no loss.
fn ignored_rows<B: Backend>(
    targets: Tensor<B, 1, Int>,
) -> (Tensor<B, 1, Int>, Tensor<B, 1>, Tensor<B, 1>) {
    let ignored = targets.clone().equal_elem(crate::IGNORE_TARGET);
    let counted = ignored.clone().bool_not().float();
    let count = counted.clone().sum().clamp_min(1.0);
    (targets.mask_fill(ignored, 0), counted, count)
}

/// [`EmberBackend::cross_entropy_forward`] in burn tensor ops.
pub(crate) fn portable_cross_entropy<B: Backend>(
    logits: FloatTensor<B>,
    targets: IntTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let logits: Tensor<B, 2> = Tensor::from_primitive(TensorPrimitive::Float(logits));
    let targets: Tensor<B, 1, Int> = Tensor::from_primitive(targets);
    let rows = logits.dims()[0];
    let (safe, counted, count) = ignored_rows(targets);
    let max = logits.clone().max_dim(1).detach();
    let lse = (logits.clone() - max.clone()).exp().sum_dim(1).log() + max;
    let picked = logits.gather(1, safe.reshape([rows, 1]));
    let loss = ((lse.clone() - picked) * counted.reshape([rows, 1]))
        .sum()
        .div(count);
    (
        loss.into_primitive().tensor(),
        lse.reshape([rows]).into_primitive().tensor(),
    )
}

/// [`EmberBackend::cross_entropy_backward`] in burn tensor ops.
pub(crate) fn portable_cross_entropy_backward<B: Backend>(
    logits: FloatTensor<B>,
    targets: IntTensor<B>,
    lse: FloatTensor<B>,
    grad: FloatTensor<B>,
) -> FloatTensor<B> {
    let logits: Tensor<B, 2> = Tensor::from_primitive(TensorPrimitive::Float(logits));
    let targets: Tensor<B, 1, Int> = Tensor::from_primitive(targets);
    let lse: Tensor<B, 1> = Tensor::from_primitive(TensorPrimitive::Float(lse));
    let grad: Tensor<B, 1> = Tensor::from_primitive(TensorPrimitive::Float(grad));
    let [rows, vocab] = logits.dims();
    let (safe, counted, count) = ignored_rows(targets);
    let softmax = (logits - lse.reshape([rows, 1])).exp();
    let onehot = safe.one_hot::<2>(vocab).float();
    let scale = counted.reshape([rows, 1]) * grad.div(count).reshape([1, 1]);
    ((softmax - onehot) * scale).into_primitive().tensor()
}

/// [`EmberBackend::flash_attention_forward`] in burn tensor ops ([`crate::flash`]).
pub(crate) fn portable_flash_forward<B: Backend>(
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

/// [`EmberBackend::flash_attention_backward`] in burn tensor ops ([`crate::flash`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn portable_flash_backward<B: Backend>(
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

/// [`EmberBackend::rope_rotate`] in burn tensor ops.
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
pub(crate) fn float<B: Backend, const D: usize>(primitive: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(primitive))
}

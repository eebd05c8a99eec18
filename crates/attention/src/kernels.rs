//! [`KernelBackend`]: ember's kernels outside attention, the linear layer, RMSNorm, SwiGLU's gate and the
//! cross-entropy loss, each a single backend operation.

use burn::backend::Flex;
use burn::tensor::{
    Int, Shape, Tensor, TensorMetadata, TensorPrimitive,
    backend::Backend,
    ops::{FloatTensor, IntTensor},
};

/// A burn backend that can run a linear layer, RMSNorm, SwiGLU's gate `silu(gate) * up` and the mean
/// cross-entropy of logits against targets, and their gradients, as single operations.
///
/// The defaults are burn tensor ops (what `linear`, `activation::silu(gate) * up` and `log_softmax` + `gather`
/// record);
/// burn-flex runs each direction as one vectorised, multi-threaded pass (`src/cpu/`), and `Autodiff<B>`
/// records one graph node per call whose backward step is the `*_backward` method, so training keeps only the
/// inputs (and, for the loss, one log-sum-exp per row) instead of every intermediate.
pub trait KernelBackend: Backend {
    /// `silu(gate) * up` element-wise; `gate` and `up` have the same shape.
    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        portable_swiglu::<Self>(gate, up)
    }

    /// `(d_gate, d_up)` of [`swiglu`](Self::swiglu) from the gradient of its output: with `s = sigmoid(gate)`,
    /// `d_up = grad * gate * s` and `d_gate = grad * up * s * (1 + gate * (1 - s))`.
    fn swiglu_backward(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        portable_swiglu_backward::<Self>(gate, up, grad)
    }

    /// `x` `[rows, in]` times `weight` `[out, in]` transposed, plus `bias` `[out]`: a linear layer in PyTorch's
    /// weight layout, differentiable on autodiff backends.
    fn dense(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        portable_linear::<Self>(x, weight, bias)
    }

    /// `(d_x, d_weight)` of [`dense`](Self::dense) (without its bias) from the gradient `grad` `[rows, out]` of
    /// its output: `d_x = grad · W` `[rows, in]` and `d_weight = gradᵀ · x` `[out, in]`.
    fn dense_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        portable_dense_backward::<Self>(x, weight, grad)
    }

    /// RMSNorm of `x` over its last dimension, `x / sqrt(mean(x²) + eps) * weight`, with `weight` `[dim]`.
    fn rms_norm(x: FloatTensor<Self>, weight: FloatTensor<Self>, eps: f64) -> FloatTensor<Self> {
        portable_rms_norm::<Self>(x, weight, eps)
    }

    /// `(d_x, d_weight)` of [`rms_norm`](Self::rms_norm) from the gradient `grad` of its output: with
    /// `r = 1 / sqrt(mean(x²) + eps)` per row and `x̂ = x r`, `d_weight = Σ_rows grad ∘ x̂` and
    /// `d_x = r (g - x̂ mean(g ∘ x̂))` where `g = grad ∘ weight`.
    fn rms_norm_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        eps: f64,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        portable_rms_norm_backward::<Self>(x, weight, eps, grad)
    }

    /// Mean cross-entropy (nats) `[1]` of `logits` `[rows, vocab]` against `targets` `[rows]`,
    /// differentiable on autodiff backends.
    fn cross_entropy(logits: FloatTensor<Self>, targets: IntTensor<Self>) -> FloatTensor<Self> {
        Self::cross_entropy_forward(logits, targets).0
    }

    /// The mean loss `[1]` and each row's log-sum-exp `[rows]` (what the backward step needs).
    fn cross_entropy_forward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        portable_cross_entropy::<Self>(logits, targets)
    }

    /// The gradient with respect to `logits` of the mean loss times `grad` (`[1]`):
    /// `(softmax(row) - onehot(target)) * grad / rows`, with the softmax recomputed from `lse`.
    fn cross_entropy_backward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        lse: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        portable_cross_entropy_backward::<Self>(logits, targets, lse, grad)
    }

    /// `x` `[rows, in]` times a quantized weight `[out, in]` transposed, plus `bias` `[out]`, read straight from
    /// its packed codes, or `None` where the backend has no such kernel for these inputs: the caller then
    /// dequantizes the weight with tensor ops. Not differentiable (quantized weights are for inference).
    ///
    /// `codes` is `[out, row_bytes]` `u8`, `scales` and `mins` (asymmetric schemes) `[out, groups, 1]`; the
    /// weight is `(c - zero) * scale` or `c * scale + min` ([`CodeLayout`]). burn-flex streams up to 16 rows (a
    /// decode step) from the codes and multiplies more with gemm, a dequantized tile at a time; the default
    /// declines.
    fn quantized_dense(
        x: FloatTensor<Self>,
        codes: IntTensor<Self>,
        scales: FloatTensor<Self>,
        mins: Option<FloatTensor<Self>>,
        bias: Option<FloatTensor<Self>>,
        layout: CodeLayout,
    ) -> Option<FloatTensor<Self>> {
        let _ = (x, codes, scales, mins, bias, layout);
        None
    }
}

/// How a quantized weight's codes are packed, for [`KernelBackend::quantized_dense`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CodeLayout {
    /// Bits per code, 4 or 8. Two 4-bit codes share a byte: column `2i` in byte `i`'s low nibble, `2i + 1` in
    /// its high nibble.
    pub bits: usize,
    /// Input features (columns) of the weight.
    pub in_features: usize,
    /// Consecutive columns of a row that share a scale (and minimum). Rows are stored padded to whole groups
    /// (`in_features.div_ceil(group_len) * group_len * bits / 8` bytes); the padding codes are not weights.
    pub group_len: usize,
    /// Symmetric schemes: the code that stands for zero, `w = (c - zero) * scale`. `None` for asymmetric ones,
    /// `w = c * scale + min`.
    pub zero_code: Option<f32>,
}

/// SwiGLU's gate `silu(gate) * up` on tensors, through the backend's [`KernelBackend::swiglu`].
pub fn swiglu<B: KernelBackend, const D: usize>(
    gate: Tensor<B, D>,
    up: Tensor<B, D>,
) -> Tensor<B, D> {
    assert_eq!(gate.dims(), up.dims(), "swiglu: gate and up shapes differ");
    let out = B::swiglu(gate.into_primitive().tensor(), up.into_primitive().tensor());
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// RMSNorm of `x` over its last dimension, `x / sqrt(mean(x²) + eps) * weight`, through the backend's
/// [`KernelBackend::rms_norm`].
pub fn rms_norm<B: KernelBackend, const D: usize>(
    x: Tensor<B, D>,
    weight: Tensor<B, 1>,
    eps: f64,
) -> Tensor<B, D> {
    assert_eq!(
        x.dims()[D - 1],
        weight.dims()[0],
        "rms_norm: the weight does not match the last dimension"
    );
    let out = B::rms_norm(
        x.into_primitive().tensor(),
        weight.into_primitive().tensor(),
        eps,
    );
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// Mean next-token cross-entropy (nats per token) `[1]` of `logits` `[batch, seq, vocab]` against `targets`
/// `[batch, seq]`, through the backend's [`KernelBackend::cross_entropy`].
pub fn cross_entropy<B: KernelBackend>(
    logits: Tensor<B, 3>,
    targets: Tensor<B, 2, Int>,
) -> Tensor<B, 1> {
    let [batch, seq, vocab] = logits.dims();
    assert_eq!(
        targets.dims(),
        [batch, seq],
        "cross_entropy: targets do not match the logits"
    );
    let logits = logits
        .reshape([batch * seq, vocab])
        .into_primitive()
        .tensor();
    let targets = targets.reshape([batch * seq]).into_primitive();
    Tensor::from_primitive(TensorPrimitive::Float(B::cross_entropy(logits, targets)))
}

/// A linear layer `x · Wᵀ + b` on tensors (`x` `[rows, in]`, `W` `[out, in]`), through the backend's
/// [`KernelBackend::dense`].
pub fn linear<B: KernelBackend>(
    x: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
) -> Tensor<B, 2> {
    let float = |t: Tensor<B, 2>| t.into_primitive().tensor();
    let out = <B as KernelBackend>::dense(
        float(x),
        float(weight),
        bias.map(|b| b.into_primitive().tensor()),
    );
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// [`KernelBackend::dense`] in burn tensor ops: burn's `linear` on the transposed view of the weight.
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

/// [`KernelBackend::dense_backward`] in burn tensor ops.
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

/// [`KernelBackend::rms_norm`] in burn tensor ops (the ops `Norm` recorded before the kernel existed).
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

/// [`KernelBackend::rms_norm_backward`] in burn tensor ops.
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

/// [`KernelBackend::swiglu`] in burn tensor ops.
pub(crate) fn portable_swiglu<B: Backend>(
    gate: FloatTensor<B>,
    up: FloatTensor<B>,
) -> FloatTensor<B> {
    let silu = B::float_mul(gate.clone(), B::sigmoid(gate));
    B::float_mul(silu, up)
}

/// [`KernelBackend::swiglu_backward`] in burn tensor ops.
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

/// [`KernelBackend::cross_entropy_forward`] in burn tensor ops.
pub(crate) fn portable_cross_entropy<B: Backend>(
    logits: FloatTensor<B>,
    targets: IntTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let logits: Tensor<B, 2> = Tensor::from_primitive(TensorPrimitive::Float(logits));
    let targets: Tensor<B, 1, Int> = Tensor::from_primitive(targets);
    let rows = logits.dims()[0];
    let max = logits.clone().max_dim(1).detach();
    let lse = (logits.clone() - max.clone()).exp().sum_dim(1).log() + max;
    let picked = logits.gather(1, targets.reshape([rows, 1]));
    let loss = (lse.clone() - picked).mean();
    (
        loss.into_primitive().tensor(),
        lse.reshape([rows]).into_primitive().tensor(),
    )
}

/// [`KernelBackend::cross_entropy_backward`] in burn tensor ops.
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
    let softmax = (logits - lse.reshape([rows, 1])).exp();
    let onehot = targets.one_hot::<2>(vocab).float();
    let scale = grad.div_scalar(rows.max(1) as f64).reshape([1, 1]);
    ((softmax - onehot) * scale).into_primitive().tensor()
}

impl KernelBackend for Flex {
    fn dense(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: Option<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        crate::cpu::dense(&x, &weight, bias.as_ref())
            .unwrap_or_else(|| portable_linear::<Self>(x, weight, bias))
    }

    fn dense_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        crate::cpu::dense_backward(&x, &weight, &grad)
            .unwrap_or_else(|| portable_dense_backward::<Self>(x, weight, grad))
    }

    fn rms_norm(x: FloatTensor<Self>, weight: FloatTensor<Self>, eps: f64) -> FloatTensor<Self> {
        crate::cpu::rms_norm(&x, &weight, eps)
            .unwrap_or_else(|| portable_rms_norm::<Self>(x, weight, eps))
    }

    fn rms_norm_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        eps: f64,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        crate::cpu::rms_norm_backward(&x, &weight, eps, &grad)
            .unwrap_or_else(|| portable_rms_norm_backward::<Self>(x, weight, eps, grad))
    }

    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        crate::cpu::swiglu(&gate, up).unwrap_or_else(|up| portable_swiglu::<Self>(gate, up))
    }

    fn swiglu_backward(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        crate::cpu::swiglu_backward(&gate, &up, &grad)
            .unwrap_or_else(|| portable_swiglu_backward::<Self>(gate, up, grad))
    }

    fn cross_entropy_forward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        crate::cpu::cross_entropy(&logits, &targets)
            .unwrap_or_else(|| portable_cross_entropy::<Self>(logits, targets))
    }

    fn cross_entropy_backward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        lse: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        crate::cpu::cross_entropy_backward(&logits, &targets, &lse, &grad)
            .unwrap_or_else(|| portable_cross_entropy_backward::<Self>(logits, targets, lse, grad))
    }

    fn quantized_dense(
        x: FloatTensor<Self>,
        codes: IntTensor<Self>,
        scales: FloatTensor<Self>,
        mins: Option<FloatTensor<Self>>,
        bias: Option<FloatTensor<Self>>,
        layout: CodeLayout,
    ) -> Option<FloatTensor<Self>> {
        crate::cpu::quantized_dense(&x, &codes, &scales, mins.as_ref(), bias.as_ref(), layout)
    }
}

#[cfg(feature = "ndarray")]
impl KernelBackend for burn::backend::NdArray {}

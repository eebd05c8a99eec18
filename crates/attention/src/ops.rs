//! ember's kernels outside attention as tensor functions (the linear layer, RMSNorm, SwiGLU's gate, the
//! cross-entropy loss and the KV caches' in-place block write), each one [`EmberBackend`] operation, and the
//! packing of quantized codes.

use std::ops::Range;

use burn::tensor::{Int, Tensor, TensorPrimitive};

use crate::EmberBackend;

/// How a quantized weight's codes are packed, for [`EmberBackend::quantized_dense`].
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

/// SwiGLU's gate `silu(gate) * up` on tensors, through the backend's [`EmberBackend::swiglu`].
pub fn swiglu<B: EmberBackend, const D: usize>(
    gate: Tensor<B, D>,
    up: Tensor<B, D>,
) -> Tensor<B, D> {
    assert_eq!(gate.dims(), up.dims(), "swiglu: gate and up shapes differ");
    let out = B::swiglu(gate.into_primitive().tensor(), up.into_primitive().tensor());
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// RMSNorm of `x` over its last dimension, `x / sqrt(mean(x²) + eps) * weight`, through the backend's
/// [`EmberBackend::rms_norm`].
pub fn rms_norm<B: EmberBackend, const D: usize>(
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

/// The target id of a position that takes no loss (a prompt or padding token in chat fine-tuning): PyTorch's
/// `ignore_index` default, so label tensors mean the same in both.
pub const IGNORE_TARGET: i64 = -100;

/// Mean next-token cross-entropy (nats per token) `[1]` of `logits` `[batch, seq, vocab]` against `targets`
/// `[batch, seq]`, through the backend's [`EmberBackend::cross_entropy`]. Positions whose target is
/// [`IGNORE_TARGET`] are left out of the loss and the mean (a batch of only those has loss 0).
pub fn cross_entropy<B: EmberBackend>(
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
/// [`EmberBackend::dense`].
pub fn linear<B: EmberBackend>(
    x: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
) -> Tensor<B, 2> {
    let float = |t: Tensor<B, 2>| t.into_primitive().tensor();
    let out = <B as EmberBackend>::dense(
        float(x),
        float(weight),
        bias.map(|b| b.into_primitive().tensor()),
    );
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// `tensor` with the block `ranges` replaced by `value` (`slice_assign`), in place where the backend can, through
/// [`EmberBackend::write_block`]: what the KV caches append with. Keep `tensor` uniquely owned (move it out of
/// its holder first) so the write needs no copy.
///
/// # Panics
/// If `value`'s shape is not the block's, as `slice_assign` does.
pub fn write_block<B: EmberBackend, const D: usize>(
    tensor: Tensor<B, D>,
    ranges: [Range<usize>; D],
    value: Tensor<B, D>,
) -> Tensor<B, D> {
    let block: Vec<usize> = ranges.iter().map(|r| r.len()).collect();
    assert_eq!(
        value.dims()[..],
        block[..],
        "write_block: the value does not match the block"
    );
    let out = B::write_block(
        tensor.into_primitive().tensor(),
        &ranges,
        value.into_primitive().tensor(),
    );
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// Rows `rows` of `tensor` along its first dimension, in that order (`select(0, rows)`), through
/// [`EmberBackend::select_rows`]: what the paged KV pool gathers a step's keys and values with.
///
/// # Panics
/// If a row is out of range, as `select` does.
pub fn select_rows<B: EmberBackend, const D: usize>(
    tensor: Tensor<B, D>,
    rows: &[usize],
) -> Tensor<B, D> {
    let out = B::select_rows(tensor.into_primitive().tensor(), rows);
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// `tensor` with row `rows[i]` along its first dimension replaced by row `i` of `value`, in place where the
/// backend can, through [`EmberBackend::write_rows`]: the paged KV pool writes a decode step's new keys and
/// values of every sequence, each to its own slot, with one call. Keep `tensor` uniquely owned (move it out of
/// its holder first) so the write needs no copy.
///
/// # Panics
/// If `value` does not have one row per entry of `rows` of `tensor`'s row shape, or a row is out of range.
pub fn write_rows<B: EmberBackend, const D: usize>(
    tensor: Tensor<B, D>,
    rows: &[usize],
    value: Tensor<B, D>,
) -> Tensor<B, D> {
    let (dims, value_dims) = (tensor.dims(), value.dims());
    assert!(
        value_dims[0] == rows.len() && value_dims[1..] == dims[1..],
        "write_rows: {} rows of {:?} expected, the value is {value_dims:?}",
        rows.len(),
        &dims[1..]
    );
    if let Some(&row) = rows.iter().find(|&&r| r >= dims[0]) {
        panic!(
            "write_rows: row {row} out of range, the tensor has {}",
            dims[0]
        );
    }
    let out = B::write_rows(
        tensor.into_primitive().tensor(),
        rows,
        value.into_primitive().tensor(),
    );
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

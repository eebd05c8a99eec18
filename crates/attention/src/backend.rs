//! [`EmberBackend`]: the one backend trait of ember's kernels. Models, training and inference carry the bound
//! `B: EmberBackend`; it reaches every kernel whether or not a function attends.
//!
//! Every method has a portable default in burn tensor ops (`src/portable.rs`, what wgpu, CUDA and ndarray run
//! outside the flash forward); burn-flex overrides them with the native kernels of `src/cpu/`
//! (`src/cpu/backend.rs`), wgpu and CUDA run the flash forward as a CubeCL kernel (`src/cube/`), and
//! `Autodiff<B>` records one graph node per call whose backward step is the inner backend's `*_backward` method
//! (`src/autodiff.rs`), so training keeps only each call's inputs instead of every intermediate.
//!
//! One trait here rather than a kernels crate beside this one: every consumer needs both halves (the model
//! attends and projects; ember-optimization's packed layers and paged pool need the dense kernels and the
//! `KvCache` trait), and a split would put each backend's impl (the orphan rule ties it to the trait's crate)
//! and the autodiff wrappers in two crates for no caller that wants one half.

use std::ops::Range;

use burn::tensor::{
    Slice, TensorMetadata,
    backend::Backend,
    ops::{BoolTensor, FloatTensor, IntTensor},
};

use crate::GgmlProducts;
use crate::flash::FlashConfig;
use crate::ops::CodeLayout;
use crate::paged::{PagedConfig, PagedRows};
use crate::portable::*;
use crate::rope::RopeConfig;
use ember_ggml::GgmlMatrix;

/// A burn backend that runs ember's kernels: flash attention (forward and backward) and RoPE's rotation, the
/// linear layer, RMSNorm, SwiGLU's gate `silu(gate) * up`, the mean cross-entropy of logits against targets, and
/// products with quantized weights, each a single operation.
///
/// Flash attention shapes: q `[batch, q_heads, q_len, head_dim]`, k `[batch, kv_heads, kv_len, head_dim]`,
/// v `[batch, kv_heads, kv_len, v_dim]`, `key_padding` `[batch, kv_len]` (`true` = padding). `Autodiff<B>`
/// overrides [`flash_attention`](Self::flash_attention) to record a single backward step that calls
/// [`flash_attention_backward`](Self::flash_attention_backward), so autodiff never stores the per-tile
/// intermediates and training memory stays O(T).
pub trait EmberBackend: Backend {
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

    /// `d_x = grad · W` `[rows, in]` alone: [`dense_backward`](Self::dense_backward) for a frozen weight (a LoRA
    /// base), whose gradient nothing reads and whose product is half the backward step's work.
    fn dense_input_grad(weight: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_matmul(grad, weight)
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

    /// Mean cross-entropy (nats) `[1]` of `logits` `[rows, vocab]` against `targets` `[rows]` over the rows
    /// whose target is not [`IGNORE_TARGET`](crate::IGNORE_TARGET), differentiable on autodiff backends.
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
    /// `(softmax(row) - onehot(target)) * grad / counted rows`, with the softmax recomputed from `lse`; zero on
    /// ignored rows.
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

    /// `x` `[rows, in]` times a weight kept as ggml blocks ([`GgmlMatrix`] `[out, in]`) transposed, plus `bias`
    /// `[out]`, in the arithmetic `products` chooses, or `None` where the backend has no such kernel for these
    /// inputs: the caller then dequantizes tiles of the weight and multiplies them densely (which is
    /// [`GgmlProducts::Exact`]). Not differentiable.
    ///
    /// The blocks are host memory (burn-flex's device memory is the host's). burn-flex takes integer dot
    /// products for decode steps and, on CPUs with AVX-512 VNNI, integer tiles for more rows; the exact
    /// products dequantize blocks into vectorised f32 dot products (decode) or tiles for gemm (prompts). The
    /// default declines.
    fn ggml_dense(
        x: FloatTensor<Self>,
        weight: GgmlMatrix<'_>,
        bias: Option<FloatTensor<Self>>,
        products: GgmlProducts,
    ) -> Option<FloatTensor<Self>> {
        let _ = (x, weight, bias, products);
        None
    }

    /// [`ggml_dense`](Self::ggml_dense) of several weights `[out_i, in]` (each with its bias) with one input,
    /// one result each, or `None` where the backend has no kernel taking them together: the caller then runs
    /// `ggml_dense` per weight. burn-flex takes a layer's query, key and value projections (and an MLP's gate
    /// and up) together where the CPU has the integer tiles: the input is quantized once and all the products'
    /// channels are split across the threads in one hand-off. The default declines.
    fn ggml_dense_many(
        x: FloatTensor<Self>,
        weights: &[(GgmlMatrix<'_>, Option<FloatTensor<Self>>)],
        products: GgmlProducts,
    ) -> Option<Vec<FloatTensor<Self>>> {
        let _ = (x, weights, products);
        None
    }

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

    /// `tensor` with the block `ranges` (one per dimension) replaced by `value`, as `slice_assign`, written in
    /// place where the backend can. The KV caches append through it: burn-flex 0.21's `slice_assign` copies the
    /// whole destination on every call (it clones the buffer's handle before writing, so the write always finds
    /// it shared), which made every append copy the whole cache of its layer.
    fn write_block(
        tensor: FloatTensor<Self>,
        ranges: &[Range<usize>],
        value: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let slices: Vec<Slice> = ranges.iter().cloned().map(Slice::from).collect();
        Self::float_slice_assign(tensor, &slices, value)
    }

    /// Rows `rows` of `tensor` along its first dimension, in that order, as `select(0, rows)`. The paged KV
    /// pool gathers every step's keys and values through it: burn-flex 0.21's `select` zero-fills its output
    /// before copying the rows in, a fifth of a server's time at 8 clients.
    fn select_rows(tensor: FloatTensor<Self>, rows: &[usize]) -> FloatTensor<Self> {
        portable_select_rows::<Self>(tensor, rows)
    }

    /// `tensor` with row `rows[i]` along its first dimension replaced by row `i` of `value` (checked by the
    /// caller: one row per entry, each in range), in place where the backend can. burn-flex copies the rows
    /// straight into a uniquely owned tensor; the default writes each run of consecutive rows with
    /// [`write_block`](Self::write_block).
    fn write_rows(
        tensor: FloatTensor<Self>,
        rows: &[usize],
        value: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        portable_write_rows::<Self>(tensor, rows, value)
    }

    /// Attention of `q` `[batch, q_heads, q_len, head_dim]` over each row's positions of the paged store `keys`
    /// `[slots, kv_heads, head_dim]` / `values` `[slots, kv_heads, v_dim]`, read in place through `rows` (see
    /// [`crate::paged_attention`]), or `None` where the backend has no such kernel: the caller then gathers the
    /// rows and attends over the copy. burn-flex runs it natively; the default declines.
    fn paged_attention(
        q: FloatTensor<Self>,
        keys: FloatTensor<Self>,
        values: FloatTensor<Self>,
        rows: PagedRows<'_>,
        config: PagedConfig,
    ) -> Option<FloatTensor<Self>> {
        let _ = (q, keys, values, rows, config);
        None
    }
}

/// [`EmberBackend::select_rows`] through the backend's `select`.
pub(crate) fn portable_select_rows<B: Backend>(
    tensor: FloatTensor<B>,
    rows: &[usize],
) -> FloatTensor<B> {
    let device = B::float_device(&tensor);
    let index: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
    let index = B::int_from_data(burn::tensor::TensorData::new(index, [rows.len()]), &device);
    B::float_select(tensor, 0, index)
}

/// [`EmberBackend::write_rows`] as one [`EmberBackend::write_block`] per run of consecutive rows.
pub(crate) fn portable_write_rows<B: EmberBackend>(
    mut tensor: FloatTensor<B>,
    rows: &[usize],
    value: FloatTensor<B>,
) -> FloatTensor<B> {
    let shape = tensor.shape();
    let inner: Vec<Range<usize>> = shape.iter().skip(1).map(|&d| 0..d).collect();
    let mut i = 0;
    while i < rows.len() {
        let mut run = 1;
        while i + run < rows.len() && rows[i + run] == rows[i] + run {
            run += 1;
        }
        let src: Vec<Range<usize>> = std::iter::once(i..i + run)
            .chain(inner.iter().cloned())
            .collect();
        let dst: Vec<Range<usize>> = std::iter::once(rows[i]..rows[i] + run)
            .chain(inner.iter().cloned())
            .collect();
        let slices: Vec<Slice> = src.into_iter().map(Slice::from).collect();
        let part = B::float_slice(value.clone(), &slices);
        tensor = B::write_block(tensor, &dst, part);
        i += run;
    }
    tensor
}

#[cfg(feature = "ndarray")]
impl EmberBackend for burn::backend::NdArray {}

// wgpu and CUDA (`Fusion<CubeBackend<..>>`) run the flash forward as ember's CubeCL kernel: see `crate::cube`.

//! burn-flex's [`EmberBackend`]: every kernel runs natively (`src/cpu/`) where it handles the inputs, else the
//! portable tensor-op version. Flash attention falls back for soft-capped scores (Gemma 2).

use std::ops::Range;

use burn::backend::Flex;
use burn::tensor::Slice;
use burn::tensor::ops::{BoolTensor, FloatTensor, FloatTensorOps, IntTensor};

use crate::EmberBackend;
use crate::flash::FlashConfig;
use ember_ggml::GgmlMatrix;

use crate::GgmlProducts;
use crate::ops::CodeLayout;
use crate::paged::{PagedConfig, PagedRows};
use crate::portable::*;
use crate::rope::RopeConfig;

impl EmberBackend for Flex {
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

    fn dense_input_grad(weight: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        crate::cpu::dense_input_grad(&weight, &grad)
            .unwrap_or_else(|| <Self as FloatTensorOps<Self>>::float_matmul(grad, weight))
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

    fn ggml_dense(
        x: FloatTensor<Self>,
        weight: GgmlMatrix<'_>,
        bias: Option<FloatTensor<Self>>,
        products: GgmlProducts,
    ) -> Option<FloatTensor<Self>> {
        crate::cpu::ggml_dense(&x, weight, bias.as_ref(), products)
    }

    fn ggml_dense_many(
        x: FloatTensor<Self>,
        weights: &[(GgmlMatrix<'_>, Option<FloatTensor<Self>>)],
        products: GgmlProducts,
    ) -> Option<Vec<FloatTensor<Self>>> {
        let weights: Vec<_> = weights.iter().map(|(w, b)| (*w, b.as_ref())).collect();
        crate::cpu::ggml_dense_many(&x, &weights, products)
    }

    fn flash_attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        key_padding: Option<BoolTensor<Self>>,
        config: FlashConfig,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        // The native kernel has no score cap: soft-capped calls (Gemma 2) take the portable kernel, which caps
        // each tile before masking.
        config
            .softcap
            .is_none()
            .then(|| {
                let padding = key_padding.as_ref();
                crate::cpu::flash_forward(&q, &k, &v, padding, &config.mask, config.scale)
            })
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
        // As in the forward pass: capped scores are differentiated by the portable kernel.
        let native = config.softcap.is_none().then(|| {
            crate::cpu::flash_backward(
                &q,
                &k,
                &v,
                key_padding.as_ref(),
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

    fn write_block(
        mut tensor: FloatTensor<Self>,
        ranges: &[Range<usize>],
        value: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        if crate::cpu::write_block(&mut tensor, ranges, &value) {
            return tensor;
        }
        let slices: Vec<Slice> = ranges.iter().cloned().map(Slice::from).collect();
        Self::float_slice_assign(tensor, &slices, value)
    }

    fn write_rows(
        mut tensor: FloatTensor<Self>,
        rows: &[usize],
        value: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        if crate::cpu::write_rows(&mut tensor, rows, &value) {
            return tensor;
        }
        crate::backend::portable_write_rows::<Self>(tensor, rows, value)
    }

    fn select_rows(tensor: FloatTensor<Self>, rows: &[usize]) -> FloatTensor<Self> {
        crate::cpu::select_rows(&tensor, rows)
            .unwrap_or_else(|| crate::backend::portable_select_rows::<Self>(tensor, rows))
    }

    fn paged_attention(
        q: FloatTensor<Self>,
        keys: FloatTensor<Self>,
        values: FloatTensor<Self>,
        rows: PagedRows<'_>,
        config: PagedConfig,
    ) -> Option<FloatTensor<Self>> {
        crate::cpu::paged_attention(&q, &keys, &values, rows, config)
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

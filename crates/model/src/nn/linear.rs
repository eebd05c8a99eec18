//! Linear layers in PyTorch's weight layout (so checkpoints load and save without transposing), dense or
//! quantized.

use burn::module::{Module, Param};
use burn::tensor::{Tensor, TensorData, backend::Backend};
use ember_attention::{EmberBackend, GgmlProducts};
use ember_optimization::{GgmlLinear, QuantScheme, QuantizedLinear};

use super::LoraAdapter;
use crate::error::{ModelError, Result};

/// `y = x · Wᵀ + b` with an f32 `W` `[out, in]`, plus a LoRA adapter's update when it has one.
#[derive(Module, Debug)]
pub struct DenseLinear<B: Backend> {
    /// `[out, in]`.
    pub weight: Param<Tensor<B, 2>>,
    /// `[out]`.
    pub bias: Option<Param<Tensor<B, 1>>>,
    /// A low-rank update trained while `weight` is frozen (see [`crate::lora`]).
    pub lora: Option<LoraAdapter<B>>,
}

impl<B: EmberBackend> DenseLinear<B> {
    /// Applies the layer to `x` `[..., in]`, giving `[..., out]`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let y = project(
            x.clone(),
            self.weight.val(),
            self.bias.as_ref().map(Param::val),
        );
        match &self.lora {
            Some(lora) => y + lora.forward(x),
            None => y,
        }
    }
}

impl<B: Backend> DenseLinear<B> {
    /// The weight with the adapter's update merged in (PEFT's `merge_and_unload`), or the weight itself.
    pub fn merged_weight(&self) -> Tensor<B, 2> {
        match &self.lora {
            Some(lora) => self.weight.val() + lora.delta_weight(),
            None => self.weight.val(),
        }
    }
}

/// `x · Wᵀ + b` for `x` `[..., in]` and a PyTorch-layout `W` `[out, in]`.
///
/// The leading dimensions are flattened into one matrix first: multiplying a rank-3 `x` by the rank-2 transposed
/// view makes backends broadcast the weight to rank 3, and burn-flex then copies the whole strided weight to a
/// contiguous buffer on every call (measured: 74% of a SmolLM2 decode step). A rank-2 product reads the view in
/// place. Weights are cast to `x`'s dtype, so bf16 activations meet f32 master weights in a bf16 product (mixed
/// precision) and the gradient flows back through the cast to the f32 weights. The product is the backend's
/// [`ember_attention::linear`] (on burn-flex, small products are split across threads by output column).
pub(crate) fn project<B: EmberBackend, const D: usize>(
    x: Tensor<B, D>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
) -> Tensor<B, D> {
    let mut dims = x.dims();
    let [out, inputs] = weight.dims();
    let rows = dims[..D - 1].iter().product::<usize>();
    let dtype = x.dtype();
    let weight = super::in_dtype(weight, dtype);
    let bias = bias.map(|b| super::in_dtype(b, dtype));
    let y = ember_attention::linear(x.reshape([rows, inputs]), weight, bias);
    dims[D - 1] = out;
    y.reshape(dims)
}

/// A linear layer of the model: dense (trainable) or with its weight quantized (inference only).
// The dense variant carries its optional LoRA adapter (two more parameters) and is the largest by ~440 bytes;
// burn's `Module` has no `Box` impl to move it behind, and a model holds a few hundred of these at most.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum Linear<B: Backend> {
    /// f32 weight.
    Dense(DenseLinear<B>),
    /// INT8/INT4 weight (ember's groups, or GGUF Q8_0/Q4_0/Q4_1 blocks mapped onto them), multiplied from its
    /// packed codes (see [`QuantizedLinear`]).
    Quantized(QuantizedLinear<B>),
    /// Weight kept as the ggml blocks of a GGUF file (see [`GgmlLinear`]).
    Ggml(GgmlLinear<B>),
}

impl<B: EmberBackend> Linear<B> {
    /// Applies the layer to `x` `[..., in]`, giving `[..., out]`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        match self {
            Linear::Dense(dense) => dense.forward(x),
            Linear::Quantized(quantized) => quantized.forward(x),
            Linear::Ggml(ggml) => ggml.forward(x),
        }
    }

    /// Applies each of `N` layers to the same `x` (a layer's query, key and value projections): in one
    /// product where all of them keep ggml blocks and the backend takes them together
    /// ([`GgmlLinear::forward_many`]), else one [`forward`](Self::forward) each. The results are the same
    /// either way: the kernel taking them together is bit-identical to one product per weight.
    pub fn forward_many<const N: usize, const D: usize>(
        layers: [&Self; N],
        x: Tensor<B, D>,
    ) -> [Tensor<B, D>; N] {
        let ggml: Option<Vec<&GgmlLinear<B>>> = layers
            .iter()
            .map(|l| match l {
                Linear::Ggml(ggml) => Some(ggml),
                _ => None,
            })
            .collect();
        if let Some(together) = ggml.and_then(|g| GgmlLinear::forward_many(&g, x.clone()))
            && let Ok(together) = <[Tensor<B, D>; N]>::try_from(together)
        {
            return together;
        }
        layers.map(|l| l.forward(x.clone()))
    }
}

impl<B: Backend> Linear<B> {
    /// Makes a layer that keeps ggml blocks multiply in `products`' arithmetic; other layers have no such
    /// setting and are left as they are.
    pub fn set_ggml_products(&mut self, products: GgmlProducts) {
        if let Linear::Ggml(ggml) = self {
            ggml.set_products(products);
        }
    }

    /// A dense layer from its parameters.
    pub fn dense(weight: Param<Tensor<B, 2>>, bias: Option<Param<Tensor<B, 1>>>) -> Self {
        Linear::Dense(DenseLinear {
            weight,
            bias,
            lora: None,
        })
    }

    /// The same layer with its weight quantized with `scheme` (the bias stays f32). Already quantized layers
    /// are returned unchanged.
    pub fn quantize(mut self, scheme: QuantScheme, name: &str) -> Result<Self> {
        self.quantize_in_place(scheme, name)?;
        Ok(self)
    }

    /// Quantizes the weight with `scheme` where it is dense (the bias stays f32); `name` labels errors. Packed
    /// weights of either kind stay as they are.
    pub fn quantize_in_place(&mut self, scheme: QuantScheme, name: &str) -> Result<()> {
        let Linear::Dense(dense) = self else {
            return Ok(());
        };
        // An adapted layer is quantized merged: the packed layer has no place for the adapter.
        let quantized = QuantizedLinear::quantize(
            dense.merged_weight(),
            dense.bias.as_ref().map(|b| b.val()),
            scheme,
        )
        .map_err(|e| ModelError::Quantization {
            tensor: name.to_string(),
            message: e.to_string(),
        })?;
        *self = Linear::Quantized(quantized);
        Ok(())
    }

    /// The value of parameter `param` (`weight`, dequantized if quantized, or `bias`), for saving.
    pub fn parameter(&self, param: &str) -> Option<TensorData> {
        match param {
            "weight" => Some(self.weight_data()),
            "bias" => self.bias_data(),
            _ => None,
        }
    }

    /// The weight `[out, in]` as f32 (dequantized if quantized, with a LoRA adapter merged in), e.g. to save it.
    pub fn weight_data(&self) -> TensorData {
        match self {
            Linear::Dense(dense) => dense.merged_weight().into_data(),
            Linear::Quantized(quantized) => quantized.dequantize().into_data(),
            Linear::Ggml(ggml) => ggml.dequantize().into_data(),
        }
    }

    /// The bias `[out]`, if any.
    pub fn bias_data(&self) -> Option<TensorData> {
        match self {
            Linear::Dense(dense) => dense.bias.as_ref().map(|b| b.val().into_data()),
            Linear::Quantized(quantized) => quantized.bias().map(|b| b.clone().into_data()),
            Linear::Ggml(ggml) => ggml.bias().map(|b| b.clone().into_data()),
        }
    }

    /// Bytes the weight and bias occupy on the device.
    pub fn memory_bytes(&self) -> usize {
        match self {
            Linear::Dense(dense) => {
                4 * (dense.weight.val().shape().num_elements()
                    + dense
                        .bias
                        .as_ref()
                        .map_or(0, |b| b.val().shape().num_elements()))
                    + dense.lora.as_ref().map_or(0, LoraAdapter::memory_bytes)
            }
            Linear::Quantized(quantized) => quantized.memory_bytes(),
            Linear::Ggml(ggml) => ggml.memory_bytes(),
        }
    }

    /// Whether the weight is quantized.
    pub fn is_quantized(&self) -> bool {
        matches!(self, Linear::Quantized(_) | Linear::Ggml(_))
    }
}

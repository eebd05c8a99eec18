//! The token embedding table, dense or quantized; for tied models it is also the LM head.

use burn::module::{Module, Param};
use burn::tensor::{Int, Tensor, TensorData, backend::Backend, module::embedding};
use ember_attention::{EmberBackend, GgmlProducts};
use ember_optimization::{GgmlLinear, QuantScheme, QuantizedLinear};

use crate::error::{ModelError, Result};

/// Token embeddings `[vocab, hidden]`.
#[derive(Module, Debug)]
pub enum Embedding<B: Backend> {
    /// f32 table (trainable).
    Dense(Param<Tensor<B, 2>>),
    /// Quantized table: a lookup dequantizes only the selected rows.
    Quantized(QuantizedLinear<B>),
    /// Table kept as the ggml blocks of a GGUF file: a lookup dequantizes only the selected rows.
    Ggml(GgmlLinear<B>),
}

impl<B: EmberBackend> Embedding<B> {
    /// `hidden` `[batch, seq, hidden]` times the transposed table: the logits of a tied LM head.
    pub fn project(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        match self {
            Embedding::Dense(table) => super::linear::project(hidden, table.val(), None),
            Embedding::Quantized(table) => table.forward(hidden),
            Embedding::Ggml(table) => table.forward(hidden),
        }
    }
}

impl<B: Backend> Embedding<B> {
    /// Makes a table kept as ggml blocks project (as a tied LM head) in `products`' arithmetic; lookups are
    /// exact either way.
    pub fn set_ggml_products(&mut self, products: GgmlProducts) {
        if let Embedding::Ggml(table) = self {
            table.set_products(products);
        }
    }

    /// Rows of `ids` `[batch, seq]`: `[batch, seq, hidden]`.
    pub fn lookup(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        match self {
            Embedding::Dense(table) => embedding(table.val(), ids),
            Embedding::Quantized(table) => table.embed(ids),
            Embedding::Ggml(table) => table.embed(ids),
        }
    }

    /// The table quantized with `scheme` (unchanged if already quantized).
    pub fn quantize(self, scheme: QuantScheme) -> Result<Self> {
        match self {
            Embedding::Dense(table) => QuantizedLinear::quantize(table.val(), None, scheme)
                .map(Embedding::Quantized)
                .map_err(|e| ModelError::Quantization {
                    tensor: crate::tensors::EMBED.to_string(),
                    message: e.to_string(),
                }),
            packed @ (Embedding::Quantized(_) | Embedding::Ggml(_)) => Ok(packed),
        }
    }

    /// A quantized copy of the table as a projection (for a tied LM head over a dense table; a ggml table is
    /// re-quantized from its dequantized values).
    pub fn quantized_head(&self, scheme: QuantScheme) -> Result<QuantizedLinear<B>> {
        let quantize = |table: Tensor<B, 2>| {
            QuantizedLinear::quantize(table, None, scheme).map_err(|e| ModelError::Quantization {
                tensor: crate::tensors::LM_HEAD.to_string(),
                message: e.to_string(),
            })
        };
        match self {
            Embedding::Dense(table) => quantize(table.val()),
            Embedding::Quantized(table) => Ok(table.clone()),
            Embedding::Ggml(table) => quantize(table.dequantize()),
        }
    }

    /// The table as f32 (dequantized if quantized), e.g. to save it.
    pub fn data(&self) -> TensorData {
        match self {
            Embedding::Dense(table) => table.val().into_data(),
            Embedding::Quantized(table) => table.dequantize().into_data(),
            Embedding::Ggml(table) => table.dequantize().into_data(),
        }
    }

    /// The device the table lives on.
    pub fn device(&self) -> B::Device {
        match self {
            Embedding::Dense(table) => table.val().device(),
            Embedding::Quantized(table) => table.device(),
            Embedding::Ggml(table) => table.device(),
        }
    }

    /// Bytes the table occupies on the device.
    pub fn memory_bytes(&self) -> usize {
        match self {
            Embedding::Dense(table) => 4 * table.val().shape().num_elements(),
            Embedding::Quantized(table) => table.memory_bytes(),
            Embedding::Ggml(table) => table.memory_bytes(),
        }
    }
}

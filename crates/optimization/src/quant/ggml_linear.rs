//! [`GgmlLinear`]: a linear layer whose weight stays in the ggml block format a GGUF file stored it in.

use std::sync::Arc;

use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData, TensorPrimitive};
use ember_attention::{EmberBackend, GgmlProducts};
use ember_ggml::GgmlType;

use crate::error::QuantError;
use crate::quant::ggml_weight::GgmlWeight;

/// Bound on the f32 elements of one dequantized tile of the exact path (4 MiB), as for [`crate::QuantizedLinear`]:
/// a 49k-row LM head never materialises whole.
const TILE_ELEMENTS: usize = 1 << 20;

/// A linear layer `y = x W^T + b` with `W: [out_features, in_features]` kept as ggml blocks
/// ([`GgmlWeight`]), so a GGUF model takes the memory its file does.
///
/// The blocks live in host memory, shared by clones: burn-flex's device memory is the host's, and its
/// [`EmberBackend::ggml_dense`] kernel reads them in place. On other backends [`forward`](Self::forward) takes
/// the exact path: tiles of output channels dequantized on the host, uploaded and multiplied densely (correct,
/// and slow on a GPU; a device-side dequantization is future work). The bias is an f32 device tensor. Meant
/// for inference: it carries no gradients.
#[derive(Module, Debug)]
pub struct GgmlLinear<B: Backend> {
    /// Bias, `[out_features]`.
    bias: Option<Tensor<B, 1>>,
    #[module(skip)]
    weight: Arc<GgmlWeight>,
    /// Where the exact path puts its tiles (the bias may be absent, so no tensor says it).
    #[module(skip)]
    device: B::Device,
    /// The arithmetic of [`forward`](Self::forward): the model's setting, carried by each of its packed layers.
    #[module(skip)]
    products: GgmlProducts,
}

impl<B: Backend> GgmlLinear<B> {
    /// A layer over `weight` with an optional bias `[out_features]` on `device`.
    pub fn new(
        weight: GgmlWeight,
        bias: Option<Tensor<B, 1>>,
        device: &B::Device,
    ) -> Result<Self, QuantError> {
        let [out_features, _] = weight.shape();
        if let Some(bias) = &bias
            && bias.dims() != [out_features]
        {
            return Err(QuantError::ShapeMismatch {
                what: "bias".into(),
                expected: vec![out_features],
                actual: bias.dims().to_vec(),
            });
        }
        Ok(Self {
            bias,
            weight: Arc::new(weight),
            device: device.clone(),
            products: GgmlProducts::default(),
        })
    }

    /// How [`forward`](Self::forward) multiplies (default: [`GgmlProducts::Integer`]).
    pub fn products(&self) -> GgmlProducts {
        self.products
    }

    /// Makes [`forward`](Self::forward) multiply in `products`' arithmetic.
    pub fn set_products(&mut self, products: GgmlProducts) {
        self.products = products;
    }

    /// The packed weight.
    pub fn weight(&self) -> &GgmlWeight {
        &self.weight
    }

    /// The block type.
    pub fn ty(&self) -> GgmlType {
        self.weight.ty()
    }

    /// `[out_features, in_features]`.
    pub fn shape(&self) -> [usize; 2] {
        self.weight.shape()
    }

    /// The f32 bias `[out_features]`, if any.
    pub fn bias(&self) -> Option<&Tensor<B, 1>> {
        self.bias.as_ref()
    }

    /// The device the layer computes on.
    pub fn device(&self) -> B::Device {
        self.device.clone()
    }

    /// Bytes held by the weight (its blocks, as in the file) and bias.
    pub fn memory_bytes(&self) -> usize {
        self.weight.storage_bytes() + 4 * self.bias.as_ref().map_or(0, |b| b.dims()[0])
    }

    /// Dequantizes the whole weight to `[out_features, in_features]` f32 (for inspection, saving and tests;
    /// [`forward`](Self::forward) never does this).
    pub fn dequantize(&self) -> Tensor<B, 2> {
        let shape = self.weight.shape();
        Tensor::from_data(
            TensorData::new(self.weight.dequantize(), shape),
            &self.device,
        )
    }

    /// Looks up rows of the weight as an embedding table `[vocab, dim]`: `ids` `[batch, seq]` gives
    /// `[batch, seq, dim]`, dequantizing only the selected rows.
    ///
    /// # Panics
    /// If an id is not a row of the table (callers check token ids against the vocabulary first).
    pub fn embed(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [batch, seq] = ids.dims();
        let [vocab, dim] = self.weight.shape();
        let ids = ids
            .into_data()
            .convert::<i64>()
            .into_vec::<i64>()
            .unwrap_or_else(|e| panic!("token ids read back from the device: {e:?}"));
        let mut values = Vec::with_capacity(batch * seq * dim);
        for id in ids {
            let row = usize::try_from(id)
                .ok()
                .filter(|&row| row < vocab)
                .unwrap_or_else(|| panic!("token id {id} outside the {vocab}-row table"));
            values.extend(self.weight.dequantize_rows(row, 1));
        }
        Tensor::from_data(TensorData::new(values, [batch, seq, dim]), &self.device)
    }

    /// The exact product, the oracle of the native kernels: `x` `[rows, in_features]` times tiles of output
    /// channels dequantized bit-exactly on the host, `[rows, out_features]`, plus the bias.
    pub fn forward_exact(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let [out_features, in_features] = self.weight.shape();
        let tile = (TILE_ELEMENTS / in_features).clamp(1, out_features);
        let tiles = (0..out_features)
            .step_by(tile)
            .map(|first| {
                let n = tile.min(out_features - first);
                let values = self.weight.dequantize_rows(first, n);
                let weight = Tensor::<B, 2>::from_data(
                    TensorData::new(values, [n, in_features]),
                    &x.device(),
                );
                x.clone().matmul(weight.transpose())
            })
            .collect::<Vec<_>>();
        let y = Tensor::cat(tiles, 1);
        match &self.bias {
            Some(bias) => y + bias.clone().unsqueeze_dim(0),
            None => y,
        }
    }
}

impl<B: EmberBackend> GgmlLinear<B> {
    /// Applies the layer to `x: [..., in_features]`, returning `[..., out_features]`: the backend's
    /// [`EmberBackend::ggml_dense`] in the layer's [`products`](Self::products) where it has one (burn-flex),
    /// else [`forward_exact`](Self::forward_exact).
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let dims = x.dims();
        let [out_features, in_features] = self.weight.shape();
        let rows = dims[..D - 1].iter().product::<usize>();
        let x = x.reshape([rows, in_features]);
        let native = B::ggml_dense(
            x.clone().into_primitive().tensor(),
            self.weight.matrix(),
            self.bias.clone().map(|b| b.into_primitive().tensor()),
            self.products,
        );
        let y = match native {
            Some(y) => Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(y)),
            None => self.forward_exact(x),
        };
        let mut out_dims = dims;
        out_dims[D - 1] = out_features;
        y.reshape(out_dims)
    }

    /// Applies each of `layers` to the same `x: [..., in_features]`, as [`forward`](Self::forward) does one at a
    /// time, through the backend's [`EmberBackend::ggml_dense_many`] (one quantization of `x`, one hand-off to
    /// the threads), or `None` where the backend declines or the layers' [`products`](Self::products) differ:
    /// the caller then runs them one by one.
    pub fn forward_many<const D: usize>(
        layers: &[&Self],
        x: Tensor<B, D>,
    ) -> Option<Vec<Tensor<B, D>>> {
        let dims = x.dims();
        let first = layers.first()?;
        let [_, in_features] = first.weight.shape();
        if layers.iter().any(|l| l.products != first.products) {
            return None;
        }
        let rows = dims[..D - 1].iter().product::<usize>();
        let x = x.reshape([rows, in_features]);
        let weights: Vec<_> = layers
            .iter()
            .map(|l| {
                let bias = l.bias.clone().map(|b| b.into_primitive().tensor());
                (l.weight.matrix(), bias)
            })
            .collect();
        let ys = B::ggml_dense_many(x.into_primitive().tensor(), &weights, first.products)?;
        let ys = layers
            .iter()
            .zip(ys)
            .map(|(layer, y)| {
                let mut out_dims = dims;
                out_dims[D - 1] = layer.weight.shape()[0];
                Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(y)).reshape(out_dims)
            })
            .collect();
        Some(ys)
    }
}

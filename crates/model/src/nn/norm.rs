//! LayerNorm and RMSNorm behind one module, chosen by the spec.

use burn::module::{Module, Param};
use burn::tensor::{DType, Tensor, TensorData, backend::Backend};
use ember_attention::EmberBackend;

use crate::spec::NormKind;

/// A normalisation over the last dimension.
#[derive(Module, Debug)]
pub struct Norm<B: Backend> {
    /// Scale `[dim]`.
    pub weight: Param<Tensor<B, 1>>,
    /// Shift `[dim]` (LayerNorm with bias only).
    pub bias: Option<Param<Tensor<B, 1>>>,
    /// LayerNorm or RMSNorm.
    #[module(skip)]
    pub kind: NormKind,
    /// Added to the variance (or mean square) before the square root.
    pub eps: f64,
    /// Scale by `1 + weight` (Gemma), so a stored zero is the identity scale.
    #[module(skip)]
    pub unit_offset: bool,
}

impl<B: EmberBackend> Norm<B> {
    /// Normalises `x` `[..., dim]` over its last dimension. Statistics are computed in f32 whatever `x`'s dtype
    /// (a bf16 mean of squares loses the small components), and the result is returned in `x`'s dtype.
    /// RMSNorm is one backend operation ([`ember_attention::rms_norm`]).
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let dtype = x.dtype();
        let x = super::in_dtype(x, DType::F32);
        let mut weight = super::in_dtype(self.weight.val(), DType::F32);
        if self.unit_offset {
            // In f32 like Gemma (`1.0 + weight.float()`): in bf16, 1 + w would round away w's small part.
            weight = weight.add_scalar(1.0);
        }
        let scaled = match self.kind {
            NormKind::LayerNorm => {
                let (var, mean) = x.clone().var_mean_bias(D - 1);
                (x - mean) / (var + self.eps).sqrt() * weight.unsqueeze()
            }
            NormKind::RmsNorm => ember_attention::rms_norm(x, weight, self.eps),
        };
        let shifted = match &self.bias {
            Some(bias) => scaled + super::in_dtype(bias.val(), DType::F32).unsqueeze(),
            None => scaled,
        };
        super::in_dtype(shifted, dtype)
    }
}

impl<B: Backend> Norm<B> {
    /// The value of parameter `param` (`weight` or `bias`), for saving.
    pub fn parameter(&self, param: &str) -> Option<TensorData> {
        match param {
            "weight" => Some(self.weight.val().into_data()),
            "bias" => self.bias.as_ref().map(|b| b.val().into_data()),
            _ => None,
        }
    }

    /// Bytes the scale and shift occupy on the device (f32).
    pub fn memory_bytes(&self) -> usize {
        let elements = self.weight.val().shape().num_elements()
            + self
                .bias
                .as_ref()
                .map_or(0, |b| b.val().shape().num_elements());
        4 * elements
    }
}

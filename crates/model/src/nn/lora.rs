//! A LoRA adapter (Hu et al., 2021) on one projection: `y = x·Wᵀ + b + scale · dropout(x)·Aᵀ·Bᵀ`, with `A`
//! `[rank, in]` and `B` `[out, rank]` in PEFT's orientation (`lora_A.weight`, `lora_B.weight`), so the tensors
//! move between ember and `peft` without a transpose.

use burn::module::{Module, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor, TensorData};
use ember_attention::EmberBackend;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::linear::project;

/// The trainable low-rank update of one frozen projection.
#[derive(Module, Debug)]
pub struct LoraAdapter<B: Backend> {
    /// `[rank, in]`: PEFT's `lora_A.weight`.
    pub a: Param<Tensor<B, 2>>,
    /// `[out, rank]`: PEFT's `lora_B.weight`.
    pub b: Param<Tensor<B, 2>>,
    /// `alpha / rank`, PEFT's `scaling` (rsLoRA's `alpha / sqrt(rank)` is not offered).
    #[module(skip)]
    pub scale: f64,
    /// Probability of zeroing an input feature of the adapter path while training (PEFT's `lora_dropout`).
    #[module(skip)]
    pub dropout: f64,
}

impl<B: Backend> LoraAdapter<B> {
    /// A fresh adapter as PEFT initialises one (`init_lora_weights=True`): `A` from
    /// `kaiming_uniform_(a=sqrt(5))`, which is uniform in `±1/sqrt(in)`, and `B` zero, so the adapted layer
    /// starts equal to the frozen one. The draw is ember's own (ChaCha8 from `seed`), the same on every backend.
    pub fn init(
        inputs: usize,
        outputs: usize,
        rank: usize,
        alpha: f64,
        dropout: f64,
        seed: u64,
        device: &B::Device,
    ) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let bound = 1.0 / (inputs as f64).sqrt();
        let a: Vec<f32> = (0..rank * inputs)
            .map(|_| ((rng.random::<f64>() * 2.0 - 1.0) * bound) as f32)
            .collect();
        Self::from_values(
            a,
            vec![0.0; outputs * rank],
            [inputs, outputs, rank],
            alpha,
            dropout,
            device,
        )
    }

    /// An adapter from given `A` `[rank, in]` and `B` `[out, rank]` values (row-major); both trainable.
    pub fn from_values(
        a: Vec<f32>,
        b: Vec<f32>,
        [inputs, outputs, rank]: [usize; 3],
        alpha: f64,
        dropout: f64,
        device: &B::Device,
    ) -> Self {
        let param = |values: Vec<f32>, shape: [usize; 2]| {
            Param::from_tensor(Tensor::from_data(TensorData::new(values, shape), device))
        };
        LoraAdapter {
            a: param(a, [rank, inputs]),
            b: param(b, [outputs, rank]),
            scale: alpha / rank as f64,
            dropout,
        }
    }

    /// The adapter's rank.
    pub fn rank(&self) -> usize {
        self.a.val().dims()[0]
    }

    /// `scale · B·A` `[out, in]`: what merging adds to the frozen weight.
    pub fn delta_weight(&self) -> Tensor<B, 2> {
        self.b.val().matmul(self.a.val()).mul_scalar(self.scale)
    }

    /// Bytes of the two matrices (f32).
    pub fn memory_bytes(&self) -> usize {
        4 * (self.a.val().shape().num_elements() + self.b.val().shape().num_elements())
    }
}

impl<B: EmberBackend> LoraAdapter<B> {
    /// The update `scale · dropout(x)·Aᵀ·Bᵀ` for `x` `[..., in]`, giving `[..., out]`. Dropout applies only
    /// while gradients are recorded (training), as `nn.Dropout` in train mode, scaling the kept features by
    /// `1 / (1 - p)`; its mask comes from the backend's generator, which the trainer seeds per step.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let x = if self.dropout > 0.0 && B::ad_enabled(&x.device()) {
            let keep = 1.0 - self.dropout;
            let mask = x.random_like(Distribution::Bernoulli(keep));
            x * mask.div_scalar(keep)
        } else {
            x
        };
        let low = project(x, self.a.val(), None);
        project(low, self.b.val(), None).mul_scalar(self.scale)
    }
}

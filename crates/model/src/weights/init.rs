//! Seeded initialisation for training from scratch: GPT-2 style, `N(0, 0.02²)` for embeddings and linear weights,
//! with the residual-stream output projections (`attn.o`, `mlp.down`) scaled by `1/sqrt(2·layers)`; norms start at
//! one, biases at zero. Values come from a ChaCha stream, so a seed gives the same model on every backend.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::WeightSource;
use crate::error::Result;
use crate::tensors::{TensorRole, TensorSpec};

/// Standard deviation of embeddings and linear weights (GPT-2, LLaMA's `initializer_range`).
pub const INIT_STD: f64 = 0.02;

/// A [`WeightSource`] drawing fresh weights from a seed.
pub struct RandomInit {
    rng: ChaCha8Rng,
    num_layers: usize,
    std: f64,
}

impl RandomInit {
    /// An initialiser for a model with `num_layers` blocks (which sets the residual scaling).
    pub fn new(seed: u64, num_layers: usize) -> Self {
        Self::with_std(seed, num_layers, INIT_STD)
    }

    /// As [`RandomInit::new`] with another base standard deviation (tests use wide weights so logits differ).
    pub fn with_std(seed: u64, num_layers: usize, std: f64) -> Self {
        RandomInit {
            rng: ChaCha8Rng::seed_from_u64(seed),
            num_layers,
            std,
        }
    }

    /// One standard normal sample (Box–Muller; the cosine branch only, keeping the stream simple).
    fn normal(&mut self) -> f64 {
        let u1: f64 = 1.0 - self.rng.random::<f64>();
        let u2: f64 = self.rng.random::<f64>();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

impl WeightSource for RandomInit {
    fn take(&mut self, tensor: &TensorSpec) -> Result<Vec<f32>> {
        let n = tensor.numel();
        Ok(match tensor.role {
            TensorRole::NormWeight => vec![1.0; n],
            TensorRole::NormBias | TensorRole::Bias => vec![0.0; n],
            TensorRole::Embedding | TensorRole::LinearWeight => {
                let residual_out = tensor.name.ends_with("attn.o.weight")
                    || tensor.name.ends_with("mlp.down.weight");
                let std = if residual_out {
                    self.std / (2.0 * self.num_layers as f64).sqrt()
                } else {
                    self.std
                };
                (0..n).map(|_| (self.normal() * std) as f32).collect()
            }
        })
    }
}

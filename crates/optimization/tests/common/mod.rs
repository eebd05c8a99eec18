//! Helpers shared by the integration tests.

#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Seeded weights shaped like a trained layer: Gaussian-ish bulk (sum of uniforms, std ~0.02)
/// with a few large outliers, the case that makes group-wise scales matter.
pub fn weights(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..len)
        .map(|i| {
            let bulk: f32 = (0..4).map(|_| rng.random_range(-0.035f32..0.035)).sum();
            if i % 97 == 13 { bulk * 20.0 } else { bulk }
        })
        .collect()
}

/// Seeded activations in `[-1, 1)`.
pub fn activations(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

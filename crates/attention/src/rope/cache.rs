//! [`RopeCache`]: RoPE tables built once per device and reused by every forward call.

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use burn::tensor::backend::Backend;

use crate::AttentionError;
use crate::rope::{Rope, RopeConfig, max_cached_positions};

/// The tables of one backend and device.
struct Entry<B: Backend> {
    device: B::Device,
    rope: Rope<B>,
}

/// A slot holding the [`Rope`] tables last built, shared by clones (a model and its copies).
///
/// The slot is typed at run time (`dyn Any`) so that the owner, e.g. a burn `Module` holding it as a skipped
/// field, stays free of the backend type: a model converted to another backend or moved to another device finds an
/// entry of the wrong type or device and rebuilds it, instead of applying tables from elsewhere.
#[derive(Clone, Default)]
pub struct RopeCache {
    slot: Arc<Mutex<Option<Box<dyn Any + Send>>>>,
    builds: Arc<AtomicUsize>,
}

impl std::fmt::Debug for RopeCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RopeCache")
            .field("builds", &self.builds())
            .finish_non_exhaustive()
    }
}

impl RopeCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// RoPE for `config` on `device` with tables for up to `positions` positions (fewer for dynamic NTK and
    /// LongRoPE, whose frequencies are static only up to `max_position_embeddings` / the original context, and at most 64 MiB of tables, so a
    /// context claiming billions of positions does not allocate for all of them; [`Rope`] builds rows past the
    /// cached ones on the fly).
    /// Reuses the cached tables when they were built for the same backend, device and config and cover as many
    /// positions.
    pub fn get<B: Backend>(
        &self,
        config: &RopeConfig,
        positions: usize,
        device: &B::Device,
    ) -> Result<Rope<B>, AttentionError> {
        let positions = match config.static_positions() {
            Some(fixed) => positions.min(fixed),
            None => positions,
        }
        // What `Rope::new` will cache: comparing against more would rebuild the tables on every call.
        .clamp(1, max_cached_positions(config.head_dim));
        // A panic while building leaves the slot as it was (the new entry is stored only once complete).
        let mut slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = slot.as_ref().and_then(|e| e.downcast_ref::<Entry<B>>())
            && entry.device == *device
            && entry.rope.config() == config
            && entry.rope.max_positions() >= positions
        {
            return Ok(entry.rope.clone());
        }
        let rope = Rope::new(config.clone(), positions, device)?;
        self.builds.fetch_add(1, Ordering::Relaxed);
        *slot = Some(Box::new(Entry {
            device: device.clone(),
            rope: rope.clone(),
        }));
        Ok(rope)
    }

    /// How many times tables were built (each miss: first use, another device, backend or config).
    pub fn builds(&self) -> usize {
        self.builds.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::tensor::{Distribution, Tensor};

    use super::*;
    use crate::rope::RopeScaling;

    fn values(t: Tensor<Flex, 4>) -> Vec<f32> {
        t.into_data().into_vec().unwrap()
    }

    #[test]
    fn tables_are_built_once_and_rebuilt_only_when_they_cannot_serve() {
        let cache = RopeCache::new();
        let device = Default::default();
        let config = RopeConfig::new(16);
        let x = Tensor::<Flex, 4>::random([1, 2, 5, 16], Distribution::Default, &device);
        let first = cache.get::<Flex>(&config, 64, &device).unwrap();
        let again = cache.get::<Flex>(&config, 32, &device).unwrap();
        assert_eq!(cache.builds(), 1, "a second call reuses the tables");
        assert_eq!(again.max_positions(), 64);
        let fresh = Rope::<Flex>::new(config.clone(), 64, &device).unwrap();
        assert_eq!(
            values(again.apply(x.clone(), 7)),
            values(fresh.apply(x.clone(), 7))
        );
        drop(first);
        // More positions, or another config, need new tables.
        cache.get::<Flex>(&config, 128, &device).unwrap();
        assert_eq!(cache.builds(), 2);
        let mut other = config.clone();
        other.theta = 500_000.0;
        cache.get::<Flex>(&other, 128, &device).unwrap();
        assert_eq!(cache.builds(), 3);
        // Clones share the slot (a model and its copies).
        cache.clone().get::<Flex>(&other, 100, &device).unwrap();
        assert_eq!(cache.builds(), 3);
    }

    #[test]
    fn dynamic_ntk_tables_stop_at_the_static_range() {
        let cache = RopeCache::new();
        let mut config = RopeConfig::new(8);
        config.scaling = RopeScaling::Dynamic {
            factor: 2.0,
            max_position_embeddings: 32,
        };
        let rope = cache
            .get::<Flex>(&config, 4096, &Default::default())
            .unwrap();
        assert_eq!(
            rope.max_positions(),
            32,
            "beyond 32 positions the frequencies depend on the length"
        );
    }
}

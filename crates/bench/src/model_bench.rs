//! The model bench: generation with ember's [`Transformer`] through ember-inference's [`TransformerLm`], the
//! model `ember generate` runs.

use ember_inference::sampling::SamplingConfig;
use ember_inference::{KvCacheKind, TransformerLm};
use ember_model::{EmberBackend, Transformer};

use crate::BenchError;
use crate::device_memory::DeviceMemoryProbe;
use crate::generation::bench_generation;
use crate::lm_workload::{LmWorkload, synthetic_prompt};
use crate::report::{ModelBench, ModelInfo, ModelSettings};
use crate::timing::Clock;

/// Measures generation of `model` (already on `device`, with its attention kernel chosen) for `settings`.
///
/// Every row gets the same synthetic prompt of `settings.prompt_len` ids spread over the vocabulary
/// ([`synthetic_prompt`]), and tokens are chosen greedily: the argmax over the vocabulary is part of every timed
/// step, as it is in `ember generate --temperature 0`. `name` labels the model in the report; `dtype` is the
/// precision the weights run in; `settings.kv_cache` names the cache ([`KvCacheKind`]'s text form);
/// `device_memory` reads the device's allocator on GPU backends.
pub fn bench_model<B: EmberBackend>(
    model: Transformer<B>,
    device: B::Device,
    name: String,
    dtype: String,
    settings: ModelSettings,
    clock: &dyn Clock,
    device_memory: &dyn DeviceMemoryProbe,
) -> Result<ModelBench, BenchError> {
    let kv_cache: KvCacheKind = settings
        .kv_cache
        .parse()
        .map_err(BenchError::InvalidSettings)?;
    let spec = model.spec().clone();
    let info = ModelInfo {
        name,
        architecture: spec.architecture.clone(),
        parameters: spec.parameter_count(),
        dtype,
        weight_bytes: model.weight_memory_bytes() as u64,
    };
    let lm = TransformerLm::new(model, device).with_kv_cache(kv_cache);
    let prompt = synthetic_prompt(settings.prompt_len, spec.vocab_size);
    let mut workload = LmWorkload::new(
        &lm,
        settings.batch,
        prompt,
        settings.gen_len,
        SamplingConfig::greedy(),
    )?;
    bench_generation(&mut workload, info, settings, clock, device_memory)
}

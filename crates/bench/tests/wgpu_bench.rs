//! The model bench on wgpu: the report carries the device allocator's memory, read through `cube_memory` as
//! `ember bench --backend wgpu` reads it, and it holds at least the weights. Runs on whatever adapter wgpu finds
//! (Mesa's software Vulkan on CPU-only machines, installed by scripts/test.sh).
#![cfg(feature = "wgpu")]

use burn::backend::Wgpu;
use burn::cubecl::wgpu::WgpuRuntime;
use ember_bench::{ModelSettings, MonotonicClock, bench_model, cube_memory};
use ember_model::weights::RandomInit;
use ember_model::{ModelSpec, Transformer};

#[test]
fn wgpu_model_bench_reports_device_memory() {
    let device = Default::default();
    let spec = ModelSpec::llama_style(96, 32, 2, 4, 2, 64, 48);
    let mut init = RandomInit::with_std(7, spec.num_layers, 0.3);
    let model = Transformer::<Wgpu>::from_source(&spec, &mut init, &device, None).unwrap();
    let settings = ModelSettings {
        batch: 1,
        prompt_len: 8,
        gen_len: 3,
        runs: 1,
        warmup: 0,
        attention: "flash".into(),
        quantize: None,
        kv_cache: "contiguous".into(),
    };
    let probe = || cube_memory::<WgpuRuntime>(&Default::default());
    let b = bench_model(
        model,
        device,
        "tiny".into(),
        "f32".into(),
        settings,
        &MonotonicClock::new(),
        &probe,
    )
    .unwrap();
    let memory = b.device_memory.expect("wgpu reports device memory");
    assert!(
        memory.reserved_bytes >= memory.in_use_bytes && memory.in_use_bytes >= b.model.weight_bytes,
        "{memory:?} against {} weight bytes",
        b.model.weight_bytes
    );
}

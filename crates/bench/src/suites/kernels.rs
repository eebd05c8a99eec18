//! Attention kernels across sequence lengths: forward, and forward + backward through autodiff.

use burn::backend::Autodiff;
use burn::tensor::{Distribution, Tensor};
use ember_attention::{AttentionKernel, AttentionOptions, EmberBackend, attention};

use crate::memory;
use crate::report::{KernelResult, KernelSettings, Pass};
use crate::timing::{Clock, Repetitions, millis, time_runs};
use crate::{BenchError, stats};

/// Default shapes: one sequence with SmolLM2-135M's attention (9 query heads, 3 KV heads, head_dim 64).
pub fn default_settings() -> KernelSettings {
    KernelSettings {
        batch: 1,
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
        seq_lens: vec![128, 256, 512, 1024],
        runs: 5,
        warmup: 1,
    }
}

fn check(settings: &KernelSettings) -> Result<(), BenchError> {
    let s = settings;
    if s.batch == 0 || s.heads == 0 || s.kv_heads == 0 || s.head_dim == 0 || s.seq_lens.contains(&0)
    {
        return Err(BenchError::InvalidSettings(
            "kernel shapes must all be at least 1".into(),
        ));
    }
    if !s.heads.is_multiple_of(s.kv_heads) {
        return Err(BenchError::InvalidSettings(format!(
            "{} query heads is not a multiple of {} KV heads",
            s.heads, s.kv_heads
        )));
    }
    Ok(())
}

/// Causal self-attention inputs q `[batch, heads, seq, head_dim]`, k/v `[batch, kv_heads, seq, head_dim]`.
fn inputs<B: EmberBackend>(
    s: &KernelSettings,
    seq: usize,
    device: &B::Device,
) -> [Tensor<B, 4>; 3] {
    let normal = Distribution::Normal(0.0, 1.0);
    [
        Tensor::random([s.batch, s.heads, seq, s.head_dim], normal, device),
        Tensor::random([s.batch, s.kv_heads, seq, s.head_dim], normal, device),
        Tensor::random([s.batch, s.kv_heads, seq, s.head_dim], normal, device),
    ]
}

fn sync<B: EmberBackend>(device: &B::Device) -> Result<(), BenchError> {
    B::sync(device).map_err(|e| BenchError::Workload(format!("backend sync failed: {e:?}")))
}

/// Times one (kernel, pass, sequence length) point and reads the peak memory it reached.
fn point<B: EmberBackend>(
    kernel: AttentionKernel,
    pass: Pass,
    seq: usize,
    s: &KernelSettings,
    device: &B::Device,
    clock: &dyn Clock,
) -> Result<KernelResult, BenchError> {
    let reps = Repetitions {
        warmup: s.warmup,
        runs: s.runs,
    };
    let scope = memory::reset_peak_rss();
    let times = match pass {
        Pass::Forward => {
            let [q, k, v] = inputs::<B>(s, seq, device);
            let options = AttentionOptions::causal();
            time_runs(clock, reps, || {
                let out = attention(kernel, q.clone(), k.clone(), v.clone(), &options);
                sync::<B>(device)?;
                Ok(out)
            })?
        }
        Pass::ForwardBackward => {
            let [q, k, v] = inputs::<Autodiff<B>>(s, seq, device).map(|t| t.require_grad());
            let options = AttentionOptions::causal();
            time_runs(clock, reps, || {
                let out = attention(kernel, q.clone(), k.clone(), v.clone(), &options);
                let grads = out.sum().backward();
                sync::<B>(device)?;
                Ok(grads)
            })?
        }
    };
    let ms: Vec<f64> = times.into_iter().map(millis).collect();
    let peak = memory::peak_rss_bytes()?.filter(|_| scope == memory::PeakScope::Phase);
    Ok(KernelResult {
        kernel: kernel.name().to_string(),
        seq_len: seq,
        pass,
        time_ms: stats::median(&ms)?,
        peak_bytes: peak,
    })
}

/// Runs every kernel of `kernels` for every pass of `passes` at every sequence length of `settings`, calling
/// `progress` after each point. Peak memory is reported only where it can be reset per point (Linux), since a
/// process-wide peak would carry the largest earlier point into every later one.
pub fn run_kernel_suite<B: EmberBackend>(
    settings: &KernelSettings,
    kernels: &[AttentionKernel],
    passes: &[Pass],
    device: &B::Device,
    clock: &dyn Clock,
    mut progress: impl FnMut(&KernelResult),
) -> Result<Vec<KernelResult>, BenchError> {
    check(settings)?;
    let mut results = Vec::new();
    for &seq in &settings.seq_lens {
        for &pass in passes {
            for &kernel in kernels {
                let r = point::<B>(kernel, pass, seq, settings, device, clock)?;
                progress(&r);
                results.push(r);
            }
        }
    }
    Ok(results)
}

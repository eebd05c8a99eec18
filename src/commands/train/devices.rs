//! Where a run computes and in what precision: both depend on the backend the job was dispatched to, so they are
//! resolved on it (and shared with `ember bench --suite train`, which must train as `ember train` does).

use burn::tensor::backend::{Device as _, DeviceId};
use ember_model::EmberBackend;

use crate::backend::{computes_bf16, is_cpu};
use crate::config::{Devices, Precision, TrainingConfig};

/// The model's device and the data-parallel replicas' devices (empty for one replica) from `training.devices`:
/// index `i` is device `i` of the kind the backend selected (CUDA ordinal, wgpu adapter); the CPU backends have
/// one device, which every replica shares (the replicas are threads; `auto` gives one per `--threads`).
pub(crate) fn replica_devices<B: EmberBackend>(
    training: &TrainingConfig,
    selected: B::Device,
) -> (B::Device, Vec<DeviceId>) {
    devices_of::<B>(
        &training.devices,
        training.batch_size,
        training.nodes.is_some(),
        selected,
    )
}

/// [`replica_devices`] of `devices` sharing a batch of `batch_size`; a multi-machine run (`multi_node`) always
/// goes through the data-parallel path, even with one replica here, to reach the other machines.
pub(super) fn devices_of<B: EmberBackend>(
    devices: &Devices,
    batch_size: usize,
    multi_node: bool,
    selected: B::Device,
) -> (B::Device, Vec<DeviceId>) {
    let cpu_threads = is_cpu::<B>().then(rayon::current_num_threads);
    let indices = devices.indices(batch_size, cpu_threads);
    if indices.len() <= 1 && !multi_node {
        return (selected, Vec::new());
    }
    let kind = selected.to_id().type_id;
    let ids: Vec<DeviceId> = indices
        .iter()
        .map(|&index_id| DeviceId {
            type_id: kind,
            index_id,
        })
        .collect();
    (B::Device::from_id(ids[0]), ids)
}

/// The precision a training run computes in on `B`: the config's `training.precision`, except that bf16 falls
/// back to f32 (with a note unless `quiet`) on backends that would only emulate it.
pub(crate) fn training_precision<B: EmberBackend>(configured: Precision, quiet: bool) -> Precision {
    if configured == Precision::Bf16 && !computes_bf16::<B>() {
        if !quiet {
            stderr!(
                "note: training.precision is bf16, which only the cuda backend computes natively; training in f32"
            );
        }
        return Precision::F32;
    }
    configured
}

//! Memory held by a device's allocator (the GPU backends' memory pools).
//!
//! The bench is generic over backends, so the caller passes a [`DeviceMemoryProbe`] for the backend it chose: for
//! wgpu and CUDA a closure over `cube_memory` (feature `cube`), which reads CubeCL's allocator. Backends that share
//! the host's memory (cpu) have no probe: their memory is the resident set size.

use serde::{Deserialize, Serialize};

/// One reading of a device allocator, or the largest of several.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceMemory {
    /// Bytes of live tensors (without allocation padding).
    pub in_use_bytes: u64,
    /// Bytes the allocator holds from the device, live or cached for reuse; its memory pools grow to cover
    /// the peak of what was in use and keep it, so this is the footprint another process would see.
    pub reserved_bytes: u64,
}

impl DeviceMemory {
    /// The larger of each figure.
    pub fn max(self, other: Self) -> Self {
        Self {
            in_use_bytes: self.in_use_bytes.max(other.in_use_bytes),
            reserved_bytes: self.reserved_bytes.max(other.reserved_bytes),
        }
    }

    /// The larger of each figure of two optional readings.
    pub fn max_of(a: Option<Self>, b: Option<Self>) -> Option<Self> {
        match (a, b) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Reads the memory of the device a bench runs on, once the work submitted so far has finished.
pub trait DeviceMemoryProbe {
    /// The current reading, or `None` where the backend does not report device memory.
    fn read(&self) -> Option<DeviceMemory>;
}

/// The probe of backends without device memory of their own.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoDeviceMemory;

impl DeviceMemoryProbe for NoDeviceMemory {
    fn read(&self) -> Option<DeviceMemory> {
        None
    }
}

impl<F: Fn() -> Option<DeviceMemory>> DeviceMemoryProbe for F {
    fn read(&self) -> Option<DeviceMemory> {
        self()
    }
}

/// The memory usage CubeCL's client reports for `device`: the same client (keyed by device) burn's backend
/// allocates through. `None` when the runtime does not report it.
#[cfg(feature = "cube")]
pub fn cube_memory<R: burn::cubecl::Runtime>(device: &R::Device) -> Option<DeviceMemory> {
    let usage = R::client(device).memory_usage().ok()?;
    Some(DeviceMemory {
        in_use_bytes: usage.bytes_in_use,
        reserved_bytes: usage.bytes_reserved,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_combine_figure_by_figure() {
        let a = DeviceMemory {
            in_use_bytes: 10,
            reserved_bytes: 50,
        };
        let b = DeviceMemory {
            in_use_bytes: 30,
            reserved_bytes: 40,
        };
        let both = DeviceMemory {
            in_use_bytes: 30,
            reserved_bytes: 50,
        };
        assert_eq!(DeviceMemory::max_of(Some(a), Some(b)), Some(both));
        assert_eq!(DeviceMemory::max_of(None, Some(b)), Some(b));
        assert_eq!(DeviceMemory::max_of(None, None), None);
    }
}

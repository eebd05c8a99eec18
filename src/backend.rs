//! Run-time backend selection.
//!
//! Library crates are generic over `B: EmberBackend`; the binary decides once, at start-up, which concrete backend to
//! use and dispatches into a monomorphised entry point ([`BackendJob::run`]). Selection is a pure function of what
//! is compiled in and what initialises on this machine ([`Probe`]), so it is tested with fake probes.

use std::fmt;
use std::sync::{Arc, Mutex};

use burn::tensor::backend::Backend;
use ember_attention::EmberBackend;

/// The backend a user asks for with `--backend` / `EMBER_BACKEND`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendRequest {
    /// The first compiled-in backend that initialises, in the order cuda, wgpu, cpu.
    #[default]
    Auto,
    /// NVIDIA GPUs through CUDA (feature `cuda`).
    Cuda,
    /// GPUs through wgpu: Vulkan, Metal, DX12; software Vulkan (lavapipe) on CPU-only machines (feature `wgpu`).
    Wgpu,
    /// burn-flex, burn's SIMD CPU backend (feature `flex`, on by default).
    Cpu,
    /// burn-ndarray, the portable CPU backend, kept for comparison (feature `ndarray`).
    Ndarray,
}

/// A concrete backend ember can run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// `burn::backend::Cuda`.
    Cuda,
    /// `burn::backend::Wgpu`.
    Wgpu,
    /// `burn::backend::Flex`.
    Flex,
    /// `burn::backend::NdArray`.
    NdArray,
}

impl BackendKind {
    /// The order `auto` tries backends in: fastest first.
    pub const AUTO_ORDER: [BackendKind; 3] =
        [BackendKind::Cuda, BackendKind::Wgpu, BackendKind::Flex];

    /// The cargo feature of the `ember` package that compiles this backend in.
    pub fn feature(self) -> &'static str {
        match self {
            BackendKind::Cuda => "cuda",
            BackendKind::Wgpu => "wgpu",
            BackendKind::Flex => "flex",
            BackendKind::NdArray => "ndarray",
        }
    }

    /// Whether this build of ember has the backend compiled in.
    pub fn compiled_in(self) -> bool {
        match self {
            BackendKind::Cuda => cfg!(feature = "cuda"),
            BackendKind::Wgpu => cfg!(feature = "wgpu"),
            BackendKind::Flex => cfg!(feature = "flex"),
            BackendKind::NdArray => cfg!(feature = "ndarray"),
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Cuda => "cuda",
            BackendKind::Wgpu => "wgpu",
            BackendKind::Flex => "cpu (flex)",
            BackendKind::NdArray => "ndarray",
        })
    }
}

/// Why a backend could not be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BackendError {
    /// The backend was asked for explicitly but this binary was built without it.
    #[error(
        "backend `{kind}` is not compiled into this ember binary; rebuild with `--features {feature}` \
         (e.g. `cargo run --release --features {feature} -- ...`)"
    )]
    NotCompiled {
        /// The backend asked for.
        kind: BackendKind,
        /// The cargo feature that enables it.
        feature: &'static str,
    },
    /// The backend is compiled in but did not initialise on this machine.
    #[error("backend `{kind}` failed to initialise on this machine: {reason}")]
    InitFailed {
        /// The backend asked for.
        kind: BackendKind,
        /// What went wrong (driver missing, no adapter, ...).
        reason: String,
    },
    /// `auto` found nothing usable.
    #[error("no usable backend: {0}")]
    NoneUsable(String),
}

/// What kind of device a backend initialised on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceClass {
    /// Real hardware: a GPU, or the host CPU for the CPU backends.
    Hardware,
    /// A GPU API emulated on the CPU (lavapipe, llvmpipe): correct but slower than the CPU backends.
    #[cfg_attr(not(feature = "wgpu"), allow(dead_code))]
    Software,
}

/// Answers the two questions selection needs. The real probe builds a tiny tensor on the device; tests use fakes.
pub trait Probe {
    /// Whether the backend is compiled in.
    fn compiled_in(&self, kind: BackendKind) -> bool;
    /// Tries to initialise the backend and run one small op on it.
    fn initialise(&self, kind: BackendKind) -> Result<DeviceClass, String>;
}

/// The outcome of [`select`]: the chosen backend and, for `auto`, why earlier candidates were skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// The backend to run on.
    pub kind: BackendKind,
    /// Candidates `auto` passed over, with the reason.
    pub skipped: Vec<(BackendKind, String)>,
}

impl Selection {
    /// One line for stderr: what was chosen, and why the others were not.
    pub fn describe(&self) -> String {
        let mut line = format!("ember: using backend {}", self.kind);
        if !self.skipped.is_empty() {
            let reasons: Vec<String> = self
                .skipped
                .iter()
                .map(|(k, why)| format!("{k}: {why}"))
                .collect();
            line.push_str(&format!(" (skipped {})", reasons.join("; ")));
        }
        line
    }
}

/// Picks the backend for `request`.
pub fn select(request: BackendRequest, probe: &dyn Probe) -> Result<Selection, BackendError> {
    let explicit = match request {
        BackendRequest::Auto => None,
        BackendRequest::Cuda => Some(BackendKind::Cuda),
        BackendRequest::Wgpu => Some(BackendKind::Wgpu),
        BackendRequest::Cpu => Some(BackendKind::Flex),
        BackendRequest::Ndarray => Some(BackendKind::NdArray),
    };
    if let Some(kind) = explicit {
        if !probe.compiled_in(kind) {
            return Err(BackendError::NotCompiled {
                kind,
                feature: kind.feature(),
            });
        }
        probe
            .initialise(kind)
            .map_err(|reason| BackendError::InitFailed { kind, reason })?;
        return Ok(Selection {
            kind,
            skipped: Vec::new(),
        });
    }
    let mut skipped = Vec::new();
    for kind in BackendKind::AUTO_ORDER {
        if !probe.compiled_in(kind) {
            skipped.push((
                kind,
                format!("not compiled in (feature `{}`)", kind.feature()),
            ));
            continue;
        }
        match probe.initialise(kind) {
            Ok(DeviceClass::Hardware) => return Ok(Selection { kind, skipped }),
            // A software-emulated GPU is only used when asked for by name: cpu is faster on the same cores.
            Ok(DeviceClass::Software) => skipped.push((
                kind,
                "only a software-emulated adapter (use --backend wgpu to force it)".into(),
            )),
            Err(reason) => skipped.push((kind, reason)),
        }
    }
    let reasons: Vec<String> = skipped
        .iter()
        .map(|(k, why)| format!("{k}: {why}"))
        .collect();
    Err(BackendError::NoneUsable(reasons.join("; ")))
}

/// The probe for this build: compiled-in features and a real one-op check on each device.
pub struct SystemProbe;

impl Probe for SystemProbe {
    fn compiled_in(&self, kind: BackendKind) -> bool {
        kind.compiled_in()
    }

    fn initialise(&self, kind: BackendKind) -> Result<DeviceClass, String> {
        match kind {
            BackendKind::Flex => {
                smoke::<burn::backend::Flex>(Default::default()).map(|()| DeviceClass::Hardware)
            }
            #[cfg(feature = "ndarray")]
            BackendKind::NdArray => {
                smoke::<burn::backend::NdArray>(Default::default()).map(|()| DeviceClass::Hardware)
            }
            #[cfg(feature = "wgpu")]
            BackendKind::Wgpu => wgpu_device_class(),
            #[cfg(feature = "cuda")]
            BackendKind::Cuda => {
                smoke::<burn::backend::Cuda>(Default::default()).map(|()| DeviceClass::Hardware)
            }
            #[allow(unreachable_patterns)]
            other => Err(format!("not compiled in (feature `{}`)", other.feature())),
        }
    }
}

/// Initialises wgpu's default device and reports whether its adapter is a real GPU.
#[cfg(feature = "wgpu")]
fn wgpu_device_class() -> Result<DeviceClass, String> {
    use burn::backend::wgpu::{RuntimeOptions, WgpuDevice, graphics::AutoGraphicsApi, init_setup};
    let device = WgpuDevice::DefaultDevice;
    let adapter_type = quietly(|| {
        let setup = init_setup::<AutoGraphicsApi>(&device, RuntimeOptions::default());
        // wgpu's `DeviceType::Cpu` marks software rasterisers such as lavapipe.
        format!("{:?}", setup.adapter.get_info().device_type)
    })?;
    smoke::<burn::backend::Wgpu>(device)?;
    Ok(if adapter_type == "Cpu" {
        DeviceClass::Software
    } else {
        DeviceClass::Hardware
    })
}

/// Runs `[1, 2, 3].sum()` on the device and checks the answer.
fn smoke<B: Backend>(device: B::Device) -> Result<(), String> {
    use burn::tensor::ElementConversion;
    let sum = quietly(move || {
        let t = burn::tensor::Tensor::<B, 1>::from_floats([1.0, 2.0, 3.0], &device);
        t.sum().into_scalar().elem::<f32>()
    })?;
    if (sum - 6.0).abs() < 1e-6 {
        Ok(())
    } else {
        Err(format!("smoke test computed 1+2+3 = {sum}"))
    }
}

/// Runs `f`, turning a panic into an error. GPU runtimes report a missing driver or adapter by panicking, so the
/// probe captures the message instead of letting the default hook print a backtrace hint.
///
/// The message is that of the first panic on any thread while `f` runs: CubeCL initialises a device on its own
/// thread, and the caller then only sees the closed channel (`RecvError`), not why the device failed.
///
/// The panic hook is process-wide, so probes take turns: two running at once (tests do) would otherwise restore
/// each other's hooks in the wrong order and one would lose its recorder.
fn quietly<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    static ONE_PROBE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _turn = ONE_PROBE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let first_panic = Arc::new(Mutex::new(None::<String>));
    let previous_hook = std::panic::take_hook();
    let record = Arc::clone(&first_panic);
    std::panic::set_hook(Box::new(move |info| {
        let mut first = record
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        first.get_or_insert_with(|| panic_message(info.payload()));
    }));
    // Unwind safety: nothing the closure touched is used again after a panic; the probe only reports failure.
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::panic::set_hook(previous_hook);
    outcome.map_err(|payload| {
        let first = first_panic
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        let message = first.unwrap_or_else(|| panic_message(payload.as_ref()));
        shorten(message.lines().next().unwrap_or_default())
    })
}

/// cudarc's "Unable to dynamically load the \"cuda\" shared library - searched for library names: [...]" lists
/// some forty names it tried; what is missing, and where it was looked for, is what a user needs.
fn shorten(reason: &str) -> String {
    match reason.split_once(" - searched for library names") {
        Some((missing, _)) => format!(
            "{missing} (is the NVIDIA driver installed, and its directory on LD_LIBRARY_PATH?)"
        ),
        None => reason.to_string(),
    }
}

/// The text of a panic's payload (`panic!` with a message carries a `String` or a `&str`).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "initialisation panicked".to_string())
}

/// Work that runs on whichever backend was selected, monomorphised once per backend.
pub trait BackendJob {
    /// What the job returns.
    type Output;
    /// Runs the job on backend `B` (training jobs wrap it in `burn::backend::Autodiff<B>`).
    fn run<B: EmberBackend>(self, device: B::Device) -> Self::Output;
}

/// Selects the backend for `request`, reports the choice on stderr (unless `quiet`), and runs `job` on it.
pub fn dispatch<J: BackendJob>(
    request: BackendRequest,
    quiet: bool,
    job: J,
) -> Result<J::Output, BackendError> {
    let selection = select(request, &SystemProbe)?;
    if !quiet {
        stderr!("{}", selection.describe());
    }
    Ok(run_on(selection.kind, job))
}

/// Whether `B` computes on the CPU (burn-flex or burn-ndarray): no device memory, threads instead of devices, f32
/// only for training.
pub fn is_cpu<B: burn::tensor::backend::Backend>() -> bool {
    use std::any::TypeId;
    let id = TypeId::of::<B>();
    #[cfg(feature = "ndarray")]
    if id == TypeId::of::<burn::backend::NdArray>() {
        return true;
    }
    id == TypeId::of::<burn::backend::Flex>()
}

/// Whether `B` computes in bf16 natively, so bf16 mixed-precision training pays off: CUDA. WebGPU shaders have no
/// bf16, and the CPU backends emulate it through f32 (slower than f32 itself).
// `B` is only compared against the CUDA backend, which a build without the `cuda` feature does not have.
#[cfg_attr(not(feature = "cuda"), allow(clippy::extra_unused_type_parameters))]
pub fn computes_bf16<B: burn::tensor::backend::Backend>() -> bool {
    #[cfg(feature = "cuda")]
    if std::any::TypeId::of::<B>() == std::any::TypeId::of::<burn::backend::Cuda>() {
        return true;
    }
    false
}

/// Runs `job` on the given (already selected) backend.
pub fn run_on<J: BackendJob>(kind: BackendKind, job: J) -> J::Output {
    match kind {
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => job.run::<burn::backend::Cuda>(Default::default()),
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => job.run::<burn::backend::Wgpu>(Default::default()),
        #[cfg(feature = "ndarray")]
        BackendKind::NdArray => job.run::<burn::backend::NdArray>(Default::default()),
        // Flex is always compiled (the workspace's reference backend); `select` refuses the others when absent.
        _ => job.run::<burn::backend::Flex>(Default::default()),
    }
}

#[cfg(test)]
mod tests;

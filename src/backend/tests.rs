//! Tests of backend selection (with fake probes) and of the probe's panic reporting.

use super::*;

/// A probe shaped like CubeCL's device start: the device thread panics with `reason`, and the caller's wait on
/// its channel fails.
fn probe_whose_device_thread_panics(reason: &str) -> Result<u32, String> {
    let reason = reason.to_string();
    quietly(move || {
        let (tx, rx) = std::sync::mpsc::channel::<u32>();
        let device = std::thread::spawn(move || {
            let _tx = tx;
            panic!("{reason}");
        });
        assert!(device.join().is_err());
        rx.recv().unwrap()
    })
}

/// CubeCL starts a device on its own thread; when that fails the caller only sees the channel close. The
/// probe's error must give the failing thread's reason (first line), not the caller's `RecvError`.
#[test]
fn a_probe_reports_why_the_device_thread_failed() {
    let err =
        probe_whose_device_thread_panics("CUDA driver library not found\nsearched: libcuda.so");
    assert_eq!(err.unwrap_err(), "CUDA driver library not found");
    assert_eq!(quietly(|| 7).unwrap(), 7);
    let no_driver = quietly(|| -> u32 {
        panic!(
            "Unable to dynamically load the \"cuda\" shared library - searched for library names: \
             [\"libcuda.so\", \"libcuda.so.1\"]. Ensure that `LD_LIBRARY_PATH` has the correct path."
        )
    });
    assert_eq!(
        no_driver.unwrap_err(),
        "Unable to dynamically load the \"cuda\" shared library (is the NVIDIA driver installed, and its \
         directory on LD_LIBRARY_PATH?)"
    );
    assert_eq!(
        quietly(|| -> u32 { panic!("only this") }).unwrap_err(),
        "only this"
    );
}

/// Tests (and any caller) may probe from several threads at once. Each probe must still report its own
/// device thread's reason: the hook of one must not be replaced or restored away by another's.
#[test]
fn probes_running_at_once_each_report_their_own_reason() {
    let probes: Vec<_> = (0..8)
        .map(|probe| {
            std::thread::spawn(move || {
                (0..25)
                    .map(|attempt| {
                        let reason = format!("device {probe} failed on attempt {attempt}");
                        let got = probe_whose_device_thread_panics(&reason);
                        (reason, got)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for probe in probes {
        for (expected, got) in probe.join().expect("a probe thread panicked") {
            assert_eq!(got.unwrap_err(), expected);
        }
    }
}

/// A probe with a fixed set of compiled-in backends and per-backend init results.
struct FakeProbe {
    compiled: Vec<BackendKind>,
    failing: Vec<(BackendKind, &'static str)>,
    software: Vec<BackendKind>,
}

impl Probe for FakeProbe {
    fn compiled_in(&self, kind: BackendKind) -> bool {
        self.compiled.contains(&kind)
    }
    fn initialise(&self, kind: BackendKind) -> Result<DeviceClass, String> {
        match self.failing.iter().find(|(k, _)| *k == kind) {
            Some((_, why)) => Err(why.to_string()),
            None if self.software.contains(&kind) => Ok(DeviceClass::Software),
            None => Ok(DeviceClass::Hardware),
        }
    }
}

fn all_compiled(failing: Vec<(BackendKind, &'static str)>) -> FakeProbe {
    FakeProbe {
        compiled: vec![
            BackendKind::Cuda,
            BackendKind::Wgpu,
            BackendKind::Flex,
            BackendKind::NdArray,
        ],
        failing,
        software: vec![],
    }
}

#[test]
fn auto_prefers_cuda_when_it_initialises() {
    let s = select(BackendRequest::Auto, &all_compiled(vec![])).unwrap();
    assert_eq!(s.kind, BackendKind::Cuda);
    assert!(s.skipped.is_empty());
}

#[test]
fn auto_falls_back_to_wgpu_then_cpu_with_reasons() {
    let probe = all_compiled(vec![(BackendKind::Cuda, "no CUDA driver")]);
    let s = select(BackendRequest::Auto, &probe).unwrap();
    assert_eq!(s.kind, BackendKind::Wgpu);
    assert_eq!(
        s.skipped,
        vec![(BackendKind::Cuda, "no CUDA driver".to_string())]
    );

    let probe = all_compiled(vec![
        (BackendKind::Cuda, "no CUDA driver"),
        (BackendKind::Wgpu, "no adapter"),
    ]);
    let s = select(BackendRequest::Auto, &probe).unwrap();
    assert_eq!(s.kind, BackendKind::Flex);
    assert_eq!(s.skipped.len(), 2);
    assert!(
        s.describe().contains("wgpu: no adapter"),
        "{}",
        s.describe()
    );
}

#[test]
fn auto_skips_backends_not_compiled_in_and_never_picks_ndarray() {
    let probe = FakeProbe {
        compiled: vec![BackendKind::Flex, BackendKind::NdArray],
        failing: vec![],
        software: vec![],
    };
    let s = select(BackendRequest::Auto, &probe).unwrap();
    assert_eq!(s.kind, BackendKind::Flex);
    assert!(s.skipped[0].1.contains("feature `cuda`"));
    assert!(s.skipped[1].1.contains("feature `wgpu`"));
}

#[test]
fn explicit_backend_not_compiled_in_names_the_feature() {
    let probe = FakeProbe {
        compiled: vec![BackendKind::Flex],
        failing: vec![],
        software: vec![],
    };
    let err = select(BackendRequest::Cuda, &probe).unwrap_err();
    assert_eq!(
        err,
        BackendError::NotCompiled {
            kind: BackendKind::Cuda,
            feature: "cuda"
        }
    );
    assert!(err.to_string().contains("--features cuda"), "{err}");
}

#[test]
fn explicit_backend_that_fails_to_initialise_is_an_error_not_a_fallback() {
    let probe = all_compiled(vec![(BackendKind::Wgpu, "no Vulkan adapter")]);
    let err = select(BackendRequest::Wgpu, &probe).unwrap_err();
    assert!(matches!(
        err,
        BackendError::InitFailed {
            kind: BackendKind::Wgpu,
            ..
        }
    ));
    assert!(err.to_string().contains("no Vulkan adapter"));
}

#[test]
fn auto_with_nothing_usable_lists_every_reason() {
    let probe = FakeProbe {
        compiled: vec![BackendKind::Flex],
        failing: vec![(BackendKind::Flex, "broken")],
        software: vec![],
    };
    let err = select(BackendRequest::Auto, &probe).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("cuda") && msg.contains("wgpu") && msg.contains("broken"),
        "{msg}"
    );
}

#[test]
fn auto_passes_over_a_software_gpu_but_an_explicit_request_takes_it() {
    let probe = FakeProbe {
        compiled: vec![BackendKind::Wgpu, BackendKind::Flex],
        failing: vec![],
        software: vec![BackendKind::Wgpu],
    };
    let s = select(BackendRequest::Auto, &probe).unwrap();
    assert_eq!(s.kind, BackendKind::Flex);
    assert!(s.skipped[1].1.contains("software"), "{:?}", s.skipped);
    assert_eq!(
        select(BackendRequest::Wgpu, &probe).unwrap().kind,
        BackendKind::Wgpu
    );
}

/// On a CPU-only machine (this project's CI) auto must land on the CPU backend, whatever else is compiled in.
#[test]
fn auto_picks_cpu_on_a_machine_without_a_gpu() {
    if std::path::Path::new("/dev/nvidia0").exists()
        || std::path::Path::new("/dev/dri/renderD128").exists()
    {
        eprintln!("skipping: this machine has a GPU device node, so auto may rightly choose it");
        return;
    }
    let s = select(BackendRequest::Auto, &SystemProbe).unwrap();
    assert_eq!(s.kind, BackendKind::Flex, "{}", s.describe());
}

#[test]
fn cpu_request_maps_to_flex_and_initialises_here() {
    let s = select(BackendRequest::Cpu, &SystemProbe).unwrap();
    assert_eq!(s.kind, BackendKind::Flex);
}

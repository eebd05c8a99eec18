//! A description of the machine a report was measured on, so that figures from different machines are never
//! mistaken for a regression.

use serde::{Deserialize, Serialize};

/// The machine and process configuration of a bench run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    /// CPU model name (`model name` in `/proc/cpuinfo`), or `unknown`.
    pub cpu: String,
    /// Physical cores (distinct `physical id` / `core id` pairs), when `/proc/cpuinfo` lists them.
    pub physical_cores: Option<usize>,
    /// Logical CPUs this process may run on (affinity and cgroup quota applied).
    pub logical_cpus: usize,
    /// Total memory in bytes (`MemTotal` in `/proc/meminfo`), when known.
    pub memory_bytes: Option<u64>,
    /// Operating system: the distribution's `PRETTY_NAME`, else Rust's OS name.
    pub os: String,
    /// Kernel release, when known.
    pub kernel: Option<String>,
    /// CPU architecture (`x86_64`, `aarch64`, ...).
    pub arch: String,
}

impl Machine {
    /// Describes the machine this process runs on. Never fails: what cannot be read is `unknown` or `None`.
    pub fn detect() -> Self {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        let cpuinfo = read("/proc/cpuinfo").unwrap_or_default();
        Self {
            cpu: cpu_model(&cpuinfo).unwrap_or_else(|| "unknown".into()),
            physical_cores: physical_cores(&cpuinfo),
            logical_cpus: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            memory_bytes: read("/proc/meminfo")
                .and_then(|m| crate::memory::parse_status_bytes(&m, "MemTotal")),
            os: read("/etc/os-release")
                .and_then(|r| os_pretty_name(&r))
                .unwrap_or_else(|| std::env::consts::OS.to_string()),
            kernel: read("/proc/sys/kernel/osrelease").map(|k| k.trim().to_string()),
            arch: std::env::consts::ARCH.to_string(),
        }
    }

    /// One line for tables: `AMD EPYC, 2 cores / 2 CPUs, 7.8 GiB, Debian GNU/Linux 12 (bookworm), x86_64`.
    pub fn summary(&self) -> String {
        let cores = match self.physical_cores {
            Some(c) => format!("{c} cores / {} CPUs", self.logical_cpus),
            None => format!("{} CPUs", self.logical_cpus),
        };
        let memory = self
            .memory_bytes
            .map(|b| format!(", {:.1} GiB", b as f64 / (1u64 << 30) as f64))
            .unwrap_or_default();
        format!("{}, {cores}{memory}, {}, {}", self.cpu, self.os, self.arch)
    }
}

/// The first `model name` in a `/proc/cpuinfo` text (x86), else the first `Hardware` / `CPU part` line (ARM).
pub fn cpu_model(cpuinfo: &str) -> Option<String> {
    ["model name", "Hardware", "CPU part"]
        .iter()
        .find_map(|key| {
            cpuinfo.lines().find_map(|line| {
                let (k, v) = line.split_once(':')?;
                (k.trim() == *key && !v.trim().is_empty()).then(|| v.trim().to_string())
            })
        })
}

/// Distinct (`physical id`, `core id`) pairs in a `/proc/cpuinfo` text; `None` when the file does not list them.
pub fn physical_cores(cpuinfo: &str) -> Option<usize> {
    let mut cores = std::collections::BTreeSet::new();
    for block in cpuinfo.split("\n\n") {
        let field = |key: &str| {
            block.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == key).then(|| v.trim().to_string())
            })
        };
        if let (Some(package), Some(core)) = (field("physical id"), field("core id")) {
            cores.insert((package, core));
        }
    }
    (!cores.is_empty()).then_some(cores.len())
}

/// `PRETTY_NAME` from an `/etc/os-release` text, without quotes.
pub fn os_pretty_name(os_release: &str) -> Option<String> {
    os_release
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim().trim_matches('"').to_string())
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two packages, two cores each, with hyper-threading: 8 logical CPUs on 4 physical cores.
    fn cpuinfo_2x2x2() -> String {
        let mut text = String::new();
        for cpu in 0..8 {
            let (package, core) = (cpu / 4, (cpu / 2) % 2);
            text.push_str(&format!(
                "processor\t: {cpu}\nmodel name\t: Intel(R) Xeon(R) Gold 6130\nphysical id\t: {package}\n\
                 core id\t\t: {core}\n\n"
            ));
        }
        text
    }

    #[test]
    fn physical_cores_count_distinct_package_core_pairs() {
        assert_eq!(physical_cores(&cpuinfo_2x2x2()), Some(4));
        assert_eq!(physical_cores("processor : 0\nBogoMIPS : 50\n"), None);
    }

    #[test]
    fn cpu_model_reads_x86_and_arm_layouts() {
        assert_eq!(
            cpu_model(&cpuinfo_2x2x2()).as_deref(),
            Some("Intel(R) Xeon(R) Gold 6130")
        );
        assert_eq!(
            cpu_model("processor : 0\nCPU part : 0xd0c\n").as_deref(),
            Some("0xd0c")
        );
        assert_eq!(cpu_model("processor : 0\n"), None);
    }

    #[test]
    fn os_pretty_name_strips_quotes() {
        let text = "NAME=\"Debian GNU/Linux\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n";
        assert_eq!(
            os_pretty_name(text).as_deref(),
            Some("Debian GNU/Linux 12 (bookworm)")
        );
        assert_eq!(os_pretty_name("NAME=x\n"), None);
    }

    #[test]
    fn detect_reports_at_least_one_cpu_and_the_build_arch() {
        let m = Machine::detect();
        assert!(m.logical_cpus >= 1);
        assert_eq!(m.arch, std::env::consts::ARCH);
        assert!(m.summary().contains(&m.cpu));
    }
}

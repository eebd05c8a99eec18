//! Top-level command-line definition: global flags and the subcommand list.

use clap::Parser;

use crate::backend::BackendRequest;
use crate::commands;

/// ember: train, run and benchmark decoder-only transformer language models.
#[derive(Parser, Debug)]
#[command(name = "ember", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    /// Compute backend [default: the config file's `backend:`, else auto]. `auto` picks the first compiled-in
    /// backend that initialises, in the order cuda, wgpu, cpu (software-emulated GPUs are passed over), and says on
    /// stderr which it chose.
    #[arg(long, global = true, value_enum, env = "EMBER_BACKEND")]
    pub backend: Option<BackendRequest>,

    /// Hide progress bars and informational messages (errors are still printed).
    #[arg(long, short, global = true)]
    pub quiet: bool,

    /// Number of CPU threads for the CPU backends and data work, 1..=1024 [default: all cores].
    #[arg(long, global = true, value_parser = crate::flags::threads)]
    pub threads: Option<usize>,

    /// What to do.
    #[command(subcommand)]
    pub command: commands::Command,
}

/// Settings every subcommand sees.
#[derive(Debug, Clone)]
pub struct Context {
    /// The backend asked for with `--backend` or `EMBER_BACKEND`, if any (it overrides a config file's `backend:`).
    pub backend: Option<BackendRequest>,
    /// Suppress progress bars and informational output.
    pub quiet: bool,
}

impl Context {
    /// The backend to use: the command line's, else the config file's, else `auto`.
    pub fn backend_or(&self, from_config: Option<BackendRequest>) -> BackendRequest {
        self.backend.or(from_config).unwrap_or_default()
    }

    /// Selects the backend (command line over `from_config` over auto) and runs `job` on it.
    pub fn dispatch<J: crate::backend::BackendJob>(
        &self,
        from_config: Option<BackendRequest>,
        job: J,
    ) -> anyhow::Result<J::Output> {
        Ok(crate::backend::dispatch(
            self.backend_or(from_config),
            self.quiet,
            job,
        )?)
    }
}

impl Cli {
    /// The settings shared by all subcommands.
    pub fn context(&self) -> Context {
        Context {
            backend: self.backend,
            quiet: self.quiet,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_flag_and_subcommand_has_help_text() {
        fn check(cmd: &clap::Command, path: &str) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                assert!(arg.get_help().is_some(), "{path} --{id} has no help text");
            }
            for sub in cmd.get_subcommands() {
                assert!(
                    sub.get_about().is_some(),
                    "{path} {} has no description",
                    sub.get_name()
                );
                check(sub, &format!("{path} {}", sub.get_name()));
            }
        }
        check(&Cli::command(), "ember");
    }

    #[test]
    fn backend_flag_parses_every_choice() {
        for (flag, want) in [
            ("auto", BackendRequest::Auto),
            ("cuda", BackendRequest::Cuda),
            ("wgpu", BackendRequest::Wgpu),
            ("cpu", BackendRequest::Cpu),
            ("ndarray", BackendRequest::Ndarray),
        ] {
            let cli =
                Cli::try_parse_from(["ember", "--backend", flag, "info", "--model", "m"]).unwrap();
            assert_eq!(cli.backend, Some(want));
        }
        assert!(
            Cli::try_parse_from(["ember", "--backend", "tpu", "info", "--model", "m"]).is_err()
        );
    }
}

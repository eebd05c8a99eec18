//! End-to-end checks of the command line itself: help texts, backend selection errors and config errors, run
//! against the built `ember` binary.

use std::process::{Command, Output};

fn ember(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(args)
        .env_remove("EMBER_BACKEND")
        .output()
        .expect("the ember binary runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The subcommands `ember --help` lists: clap's own list, read from the "Commands:" section (entries are indented
/// two spaces; wrapped descriptions further), so this test cannot miss a new subcommand.
fn subcommands() -> Vec<String> {
    let out = ember(&["--help"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let section = text
        .split("Commands:\n")
        .nth(1)
        .and_then(|rest| rest.split("\n\n").next())
        .unwrap_or_else(|| panic!("`ember --help` has no Commands section:\n{text}"));
    section
        .lines()
        .filter(|line| line.starts_with("  ") && !line.starts_with("   "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

#[test]
fn top_level_help_lists_the_subcommands_and_every_global_flag() {
    let subs = subcommands();
    // Guards the parsing above: these exist, so a list without them means the section was misread.
    for sub in ["train", "generate", "quantize", "orchestrator"] {
        assert!(subs.iter().any(|s| s == sub), "{sub} missing from {subs:?}");
    }
    let text = stdout(&ember(&["--help"]));
    for flag in ["--backend", "--quiet", "--threads"] {
        assert!(
            text.contains(flag),
            "`ember --help` does not mention {flag}:\n{text}"
        );
    }
}

#[test]
fn every_subcommand_has_help() {
    for sub in subcommands() {
        let out = ember(&[&sub, "--help"]);
        assert!(
            out.status.success(),
            "ember {sub} --help failed: {}",
            stderr(&out)
        );
        assert!(
            stdout(&out).contains("Usage: ember"),
            "ember {sub} --help printed no usage"
        );
    }
}

#[test]
fn a_backend_that_is_not_compiled_in_is_an_error_naming_the_feature() {
    if cfg!(feature = "cuda") {
        eprintln!("skipping: this build has the cuda feature");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let model = std::path::PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    )
    .join("crates/model/tests/fixtures/llama3");
    let output = dir.path().join("logits.safetensors");
    let args = [
        "--backend",
        "cuda",
        "logits",
        "--model",
        model.to_str().unwrap(),
        "--tokens",
        "1,2,3",
        "--output",
    ];
    let out = ember(&[&args[..], &[output.to_str().unwrap()]].concat());
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("--features cuda"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn an_unknown_backend_name_is_rejected_by_the_parser() {
    let out = ember(&["--backend", "tpu", "info", "--model", "x"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("possible values"), "{}", stderr(&out));
}

#[test]
fn a_config_with_an_unknown_key_names_the_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.yaml");
    std::fs::write(&config, "name: x\ntraining:\n  learning_rat: 0.1\n").unwrap();
    let out = ember(&["train", "--config", config.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("bad.yaml") && err.contains("learning_rat"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_missing_config_file_is_an_error_naming_it() {
    let out = ember(&["train", "--config", "/nonexistent/run.yaml"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("/nonexistent/run.yaml"),
        "{}",
        stderr(&out)
    );
}

//! End-to-end checks of the command line itself: help texts, backend selection errors and config errors, run
//! against the built `ember` binary.

mod common;

use std::process::Output;

use common::{ember, model_fixture, run, tokenizer_fixture};

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The subcommands `ember --help` lists: clap's own list, read from the "Commands:" section (entries are indented
/// two spaces; wrapped descriptions further), so this test cannot miss a new subcommand.
fn subcommands() -> Vec<String> {
    let out = run(&["--help"]);
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
    let text = stdout(&run(&["--help"]));
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
        let out = run(&[&sub, "--help"]);
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
    let model = model_fixture("llama3");
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
    let out = run(&[&args[..], &[output.to_str().unwrap()]].concat());
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("--features cuda"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn an_unknown_backend_name_is_rejected_by_the_parser() {
    let out = run(&["--backend", "tpu", "info", "--model", "x"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("possible values"), "{}", stderr(&out));
}

#[test]
fn a_config_with_an_unknown_key_names_the_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.yaml");
    std::fs::write(&config, "name: x\ntraining:\n  learning_rat: 0.1\n").unwrap();
    let out = run(&["train", "--config", config.to_str().unwrap()]);
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
    let out = run(&["train", "--config", "/nonexistent/run.yaml"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("/nonexistent/run.yaml"),
        "{}",
        stderr(&out)
    );
}

/// The values issue 25's fuzzing found accepted (or hanging, or panicking), through the real binary: each is a
/// usage error (exit 2) naming the flag, before anything runs. The full table of flags and values is
/// `flags::tests` (clap's parser in-process, much cheaper); these prove the binary uses it.
#[test]
fn out_of_range_flags_are_usage_errors_naming_the_flag() {
    let model = model_fixture("llama3");
    let m = model.to_str().unwrap();
    let generate = |flag: &str, value: &str| {
        run(&[
            "generate",
            "--model",
            m,
            "--tokens",
            "1",
            &format!("{flag}={value}"),
        ])
    };
    let cases = [
        (
            "--threads",
            run(&["--threads", "100000", "info", "--model", m]),
        ),
        ("--temperature", generate("--temperature", "NaN")),
        ("--temperature", generate("--temperature", "-1")),
        ("--top-p", generate("--top-p", "0")),
        ("--top-p", generate("--top-p", "2")),
        ("--min-p", generate("--min-p", "1")),
        (
            "--repetition-penalty",
            generate("--repetition-penalty", "0"),
        ),
        (
            "--frequency-penalty",
            generate("--frequency-penalty", "NaN"),
        ),
        (
            "--time-limit",
            run(&["train", "--config", "c.yaml", "--time-limit", "1e300"]),
        ),
    ];
    for (flag, out) in cases {
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{flag}: {err}");
        assert!(
            err.contains(flag) && err.contains("expected"),
            "{flag}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn logits_past_the_context_length_name_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_fixture("llama3");
    // The fixture's config.json has max_position_embeddings 64.
    let ids = vec!["1"; 65].join(",");
    let output = dir.path().join("logits.safetensors");
    let out = run(&[
        "--backend",
        "cpu",
        "logits",
        "--model",
        model.to_str().unwrap(),
        "--tokens",
        &ids,
        "--output",
        output.to_str().unwrap(),
    ]);
    let err = stderr(&out);
    assert!(
        !out.status.success(),
        "65 positions of a 64-token model were accepted"
    );
    assert!(
        err.contains("--tokens") && err.contains("context length of 64"),
        "{err}"
    );
    assert!(!output.exists(), "nothing is written");
}

/// `ember info --json | head`: the reader closes the pipe before ember writes. That used to panic in
/// `println!`; now ember stops quietly with success, like any filter.
#[test]
fn a_closed_stdout_ends_quietly() {
    let model = model_fixture("llama3");
    let m = model.to_str().unwrap();
    let tokenizer = tokenizer_fixture("llama3_style.tokenizer.json");
    let runs: [(&[&str], &[u8]); 3] = [
        (&["info", "--json", "--model", m], b""),
        (&["info", "--model", m], b""),
        (
            &["tokenize", "--tokenizer", tokenizer.to_str().unwrap()],
            b"hello world",
        ),
    ];
    for (args, input) in runs {
        let (reader, writer) = std::io::pipe().unwrap();
        // No reader left: every write to the pipe fails with EPIPE.
        drop(reader);
        let mut child = ember()
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(input).unwrap();
        }
        let out = child.wait_with_output().unwrap();
        let err = stderr(&out);
        assert!(!err.contains("panicked"), "ember {args:?}: {err}");
        assert!(
            out.status.success(),
            "ember {args:?}: {:?} {err}",
            out.status
        );
    }
}

/// A closed stderr (`ember ... 2>&-`, or a log reader that went away) used to turn the first status line or the
/// error message into a panic (`failed printing to stderr`, exit 101). The exit status must still say what
/// happened: 0 for a run that worked, 1 for one that failed.
#[test]
fn a_closed_stderr_does_not_turn_a_message_into_a_panic() {
    let model = model_fixture("llama3");
    let runs: [(&[&str], i32); 2] = [
        (&["info", "--model", model.to_str().unwrap()], 0),
        (&["info", "--model", "/nonexistent/model"], 1),
    ];
    for (args, expected) in runs {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = ember().args(args).stderr(writer).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(expected),
            "ember {args:?}: {:?}",
            out.status
        );
    }
}

#[test]
fn a_config_value_out_of_range_names_the_file_the_key_and_the_range() {
    let dir = tempfile::tempdir().unwrap();
    for (yaml, key, range) in [
        (
            "training:\n  weight_decay: .nan\n",
            "training.weight_decay",
            ">= 0",
        ),
        (
            "training:\n  time_limit_min: 1.0e300\n",
            "training.time_limit_min",
            "525600",
        ),
        ("model:\n  norm_eps: 0\n", "model.norm_eps", "(0, 1)"),
        (
            "training:\n  devices: 18446744073709551615\n",
            "training.devices",
            "1..=16",
        ),
    ] {
        let config = dir.path().join("hostile.yaml");
        std::fs::write(&config, yaml).unwrap();
        let out = run(&["train", "--config", config.to_str().unwrap()]);
        let err = stderr(&out);
        assert!(!out.status.success(), "{yaml}");
        assert!(
            err.contains("hostile.yaml") && err.contains(key) && err.contains(range),
            "{yaml}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn a_kernel_bench_too_large_for_memory_is_refused_before_allocating() {
    let out = run(&[
        "--backend",
        "cpu",
        "--quiet",
        "bench",
        "--suite",
        "kernels",
        "--seq-lens",
        "1048576",
    ]);
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(
        err.contains("--seq-lens 1048576") && err.contains("GiB"),
        "{err}"
    );
}

//! Every range-checked flag against its bad values, parsed with clap's `try_parse_from` (no process, no model):
//! each must be refused with a message naming the flag and the range, and the edges of each range accepted.

use clap::{CommandFactory, Parser};

use crate::cli::Cli;

/// Arguments that make each subcommand parse, before the flag under test.
fn base(sub: &str) -> Vec<&'static str> {
    match sub {
        "generate" => vec!["generate", "--model", "m", "--tokens", "1"],
        "eval" => vec!["eval", "--model", "m"],
        "bench" => vec!["bench", "--model", "m"],
        "train" => vec!["train", "--config", "c.yaml"],
        "prepare" => vec![
            "prepare",
            "--tokenizer",
            "t",
            "--input",
            "i",
            "--output",
            "o",
        ],
        "train-tokenizer" => vec!["train-tokenizer", "--input", "i", "--output", "o"],
        "info" => vec!["info", "--model", "m"],
        other => panic!("no base arguments for {other}"),
    }
}

fn parse(sub: &str, flag: &str, value: &str) -> Result<Cli, clap::Error> {
    let mut args = vec!["ember"];
    args.extend(base(sub));
    let pair = format!("{flag}={value}");
    args.push(&pair);
    Cli::try_parse_from(args)
}

/// (subcommand, flag, values refused, values accepted at the edges of the range).
const TABLE: &[(&str, &str, &[&str], &[&str])] = &[
    (
        "info",
        "--threads",
        &["0", "100000", "-1", "two"],
        &["1", "1024"],
    ),
    (
        "generate",
        "--temperature",
        &["NaN", "inf", "-inf", "-0.1", "1e40", "warm"],
        &["0", "0.8", "1000"],
    ),
    ("generate", "--top-k", &["0", "-3", "1.5"], &["1", "50"]),
    (
        "generate",
        "--top-p",
        &["0", "2", "1.0001", "-0.5", "NaN"],
        &["1", "0.9", "1e-9"],
    ),
    (
        "generate",
        "--min-p",
        &["1", "1.5", "-0.01", "NaN"],
        &["0", "0.05", "0.999"],
    ),
    (
        "generate",
        "--repetition-penalty",
        &["0", "-1.1", "NaN", "inf"],
        &["1", "1.1", "0.5"],
    ),
    (
        "generate",
        "--frequency-penalty",
        &["NaN", "inf", "-inf"],
        &["0", "-2", "2"],
    ),
    (
        "generate",
        "--presence-penalty",
        &["NaN", "inf"],
        &["0", "1.5"],
    ),
    (
        "generate",
        "--max-new-tokens",
        &["0", "1048577", "18446744073709551616"],
        &["1", "1048576"],
    ),
    (
        "generate",
        "--kv-budget-mib",
        &["0", "16777217", "18446744073709551615"],
        &["1", "16777216"],
    ),
    ("eval", "--window", &["0", "1", "1048577"], &["2", "256"]),
    ("eval", "--batch", &["0", "1025"], &["1", "1024"]),
    ("eval", "--tail", &["0", "1.5", "NaN", "-1"], &["1", "0.1"]),
    ("eval", "--max-tokens", &["0"], &["1", "100"]),
    ("bench", "--batch", &["0", "1025"], &["1", "1024"]),
    (
        "bench",
        "--prompt-len",
        &["0", "1048577"],
        &["1", "1048576"],
    ),
    ("bench", "--gen-len", &["0", "1", "1048577"], &["2", "64"]),
    ("bench", "--runs", &["0", "10001"], &["1", "10000"]),
    ("bench", "--warmup", &["-1", "10001"], &["0", "10000"]),
    (
        "bench",
        "--seq-lens",
        &["0", "128,0", "2000000"],
        &["1", "16,32"],
    ),
    ("bench", "--seq-len", &["0", "1048577"], &["1"]),
    (
        "bench",
        "--noise",
        &["-0.1", "1.5", "NaN"],
        &["0", "1", "0.05"],
    ),
    (
        "train",
        "--time-limit",
        &["0", "-5", "NaN", "inf", "1e300", "525600.1"],
        &["0.5", "525600"],
    ),
    ("train", "--max-steps", &["0"], &["1"]),
    ("prepare", "--val-fraction", &["0", "1", "NaN"], &["0.5"]),
    ("prepare", "--shard-tokens", &["0"], &["1"]),
    (
        "train-tokenizer",
        "--vocab-size",
        &["0", "255", "1048577"],
        &["256", "1048576"],
    ),
];

#[test]
fn every_bad_value_is_refused_naming_the_flag_and_the_range() {
    for &(sub, flag, bad, good) in TABLE {
        for value in bad {
            let Err(err) = parse(sub, flag, value) else {
                panic!("ember {sub} {flag} {value} was accepted");
            };
            assert_eq!(
                err.exit_code(),
                2,
                "{sub} {flag} {value}: a usage error exits 2"
            );
            let text = err.to_string();
            assert!(
                text.contains(flag) && text.contains("expected"),
                "ember {sub} {flag} {value}: the message must name the flag and the range:\n{text}"
            );
        }
        for value in good {
            if let Err(err) = parse(sub, flag, value) {
                panic!("ember {sub} {flag} {value} was refused: {err}");
            }
        }
    }
}

/// The help of `sub`'s `flag`, as `ember <sub> --help` prints it.
fn help_of(sub: &str, flag: &str) -> String {
    let mut cli = Cli::command();
    let name = flag.trim_start_matches("--");
    let command = if sub == "info" && name == "threads" {
        &mut cli
    } else {
        cli.find_subcommand_mut(sub)
            .unwrap_or_else(|| panic!("no subcommand {sub}"))
    };
    command
        .get_arguments()
        .find(|a| a.get_long() == Some(name))
        .and_then(|a| a.get_help())
        .unwrap_or_else(|| panic!("{sub} {flag} has no help"))
        .to_string()
}

#[test]
fn help_states_every_range() {
    use ember_inference::sampling::ranges;
    let integer_ranges = [
        ("info", "--threads", format!("1..={}", super::MAX_THREADS)),
        (
            "generate",
            "--max-new-tokens",
            format!("1..={}", super::MAX_TOKENS),
        ),
        (
            "generate",
            "--kv-budget-mib",
            format!("1..={}", super::MAX_KV_BUDGET_MIB),
        ),
        ("eval", "--window", format!("2..={}", super::MAX_TOKENS)),
        ("eval", "--batch", format!("1..={}", super::MAX_BATCH)),
        ("bench", "--batch", format!("1..={}", super::MAX_BATCH)),
        ("bench", "--runs", format!("1..={}", super::MAX_RUNS)),
        ("bench", "--warmup", format!("0..={}", super::MAX_RUNS)),
        ("bench", "--gen-len", format!("2..={}", super::MAX_TOKENS)),
        (
            "train-tokenizer",
            "--vocab-size",
            format!("256..={}", crate::config::limits::MAX_VOCAB),
        ),
        ("train", "--time-limit", "(0, 525600]".to_string()),
    ];
    for (sub, flag, range) in integer_ranges {
        let help = help_of(sub, flag);
        assert!(
            help.contains(&range),
            "{sub} {flag}: `{range}` not in {help:?}"
        );
    }
    for (flag, range) in [
        ("--temperature", ranges::TEMPERATURE_RANGE),
        ("--top-k", ranges::TOP_K_RANGE),
        ("--top-p", ranges::TOP_P_RANGE),
        ("--min-p", ranges::MIN_P_RANGE),
        ("--repetition-penalty", ranges::REPETITION_PENALTY_RANGE),
        ("--frequency-penalty", ranges::ADDITIVE_PENALTY_RANGE),
        ("--presence-penalty", ranges::ADDITIVE_PENALTY_RANGE),
    ] {
        let help = help_of("generate", flag);
        assert!(help.contains(range), "{flag}: `{range}` not in {help:?}");
    }
    assert_eq!(super::MAX_MINUTES, 525_600.0, "MINUTES_RANGE spells it out");
}

#[test]
fn the_values_accepted_are_the_values_used() {
    let cli = Cli::try_parse_from([
        "ember",
        "--threads",
        "3",
        "generate",
        "--model",
        "m",
        "--tokens",
        "1",
        "--temperature",
        "0",
        "--top-p",
        "1",
        "--min-p",
        "0",
    ])
    .unwrap();
    assert_eq!(cli.threads, Some(3));
    let crate::commands::Command::Generate(args) = cli.command else {
        panic!("parsed as another command");
    };
    assert_eq!(
        (
            args.temperature,
            args.top_p,
            args.min_p,
            args.max_new_tokens
        ),
        (0.0, Some(1.0), Some(0.0), 128)
    );
}

//! Range-checked parsers for command-line values, used as clap `value_parser`s so that a value out of range is a
//! usage error (exit 2) naming the flag and the accepted range, before any model is opened. The same ranges are
//! stated in each flag's `--help` text; `tests::help_states_every_range` keeps the two in step.
//!
//! The bounds, and why each is where it is:
//! - [`MAX_THREADS`]: more rayon threads than cores only adds contention, and spawning ~100,000 of them (which
//!   `--threads 100000` used to do) stalls the whole machine in thread creation. 1024 is above the hardware
//!   thread count of the largest machines ember targets (two-socket servers have up to 768).
//! - [`MAX_TOKENS`]: token counts (`--max-new-tokens`, `--prompt-len`, windows, sequence lengths). 2^20 is 8x the
//!   longest context of any model ember loads (128k); generation stops at the context window anyway.
//! - [`MAX_BATCH`]: sequences per forward pass. Beyond 1024 no backend gains throughput, and the logits alone
//!   (batch x tokens x vocabulary f32) pass tens of GB for a 50k vocabulary.
//! - [`MAX_RUNS`]: measured or warm-up repetitions of `ember bench`; more only makes a bench that never ends.
//! - [`MAX_MINUTES`]: a time limit of a year; above about 3e17 minutes `Duration` cannot hold it at all.
//! - [`MAX_KV_BUDGET_MIB`]: 16 TiB, far above any device; the budget is converted to bytes (`<< 20`), which
//!   larger values would overflow.

use ember_inference::sampling::ranges;

/// Most CPU threads `--threads` accepts (see the module documentation).
pub const MAX_THREADS: usize = 1024;
/// Most tokens any token-count flag accepts.
pub const MAX_TOKENS: usize = 1 << 20;
/// Most sequences per batch.
pub const MAX_BATCH: usize = 1024;
/// Most repetitions of a benchmark.
pub const MAX_RUNS: usize = 10_000;
/// Longest time limit, in minutes (365 days).
pub const MAX_MINUTES: f64 = 525_600.0;
/// Largest paged KV-cache budget, in MiB.
pub const MAX_KV_BUDGET_MIB: usize = 1 << 24;

/// `text` as an integer in `min..=max`; the message states the range (open-ended when `max` is `usize::MAX`).
fn integer_in(text: &str, min: usize, max: usize) -> Result<usize, String> {
    let range = if max == usize::MAX {
        format!("an integer >= {min}")
    } else {
        format!("an integer in {min}..={max}")
    };
    match text.trim().parse::<usize>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        Ok(n) => Err(format!("expected {range}, found {n}")),
        Err(_) => Err(format!("expected {range}, found `{text}`")),
    }
}

/// `text` as a finite float; `check` says whether it is in range, `range` says what the range is.
fn float_where(text: &str, range: &str, check: impl Fn(f64) -> bool) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && check(x) => Ok(x),
        // Debug writes `1e300`, not 301 digits.
        Ok(x) => Err(format!("expected {range}, found {x:?}")),
        Err(_) => Err(format!("expected {range}, found `{text}`")),
    }
}

/// A sampling value through the library's own range check ([`ranges`]), so the flag and a library caller refuse
/// the same values in the same words.
fn sampling<T>(
    text: &str,
    range: &str,
    check: impl Fn(T) -> Result<T, ranges::SamplingError>,
) -> Result<T, String>
where
    T: std::str::FromStr,
{
    let value = text
        .trim()
        .parse::<T>()
        .map_err(|_| format!("expected {range}, found `{text}`"))?;
    check(value).map_err(|e| format!("expected {}, found {}", e.expected, e.value))
}

/// `--threads`: 1..=[`MAX_THREADS`].
pub fn threads(text: &str) -> Result<usize, String> {
    integer_in(text, 1, MAX_THREADS)
}

/// A count of tokens to generate or process: 1..=[`MAX_TOKENS`].
pub fn token_count(text: &str) -> Result<usize, String> {
    integer_in(text, 1, MAX_TOKENS)
}

/// A window or generation length that needs two tokens (one of context, one scored or decoded): 2..=[`MAX_TOKENS`].
pub fn two_or_more_tokens(text: &str) -> Result<usize, String> {
    integer_in(text, 2, MAX_TOKENS)
}

/// A batch size: 1..=[`MAX_BATCH`].
pub fn batch(text: &str) -> Result<usize, String> {
    integer_in(text, 1, MAX_BATCH)
}

/// Measured benchmark runs: 1..=[`MAX_RUNS`].
pub fn runs(text: &str) -> Result<usize, String> {
    integer_in(text, 1, MAX_RUNS)
}

/// Warm-up benchmark runs: 0..=[`MAX_RUNS`].
pub fn warmup(text: &str) -> Result<usize, String> {
    integer_in(text, 0, MAX_RUNS)
}

/// A positive count with no useful upper bound (steps, tokens per shard): it only limits a loop or a file.
pub fn positive(text: &str) -> Result<usize, String> {
    integer_in(text, 1, usize::MAX)
}

/// `--shard-tokens`: a positive count (u64, since shards are counted in tokens on disk).
pub fn shard_tokens(text: &str) -> Result<u64, String> {
    integer_in(text, 1, usize::MAX).map(|n| n as u64)
}

/// `--kv-budget-mib`: 1..=[`MAX_KV_BUDGET_MIB`].
pub fn kv_budget_mib(text: &str) -> Result<usize, String> {
    integer_in(text, 1, MAX_KV_BUDGET_MIB)
}

/// `--vocab-size` of a trained tokenizer: the 256 byte tokens up to [`crate::config::limits::MAX_VOCAB`].
pub fn vocab_size(text: &str) -> Result<usize, String> {
    integer_in(text, 256, crate::config::limits::MAX_VOCAB)
}

/// Range text of [`minutes`].
pub const MINUTES_RANGE: &str = "a number of minutes in (0, 525600] (at most a year)";

/// `--time-limit`, in minutes: finite, positive, at most [`MAX_MINUTES`].
pub fn minutes(text: &str) -> Result<f64, String> {
    float_where(text, MINUTES_RANGE, |m| m > 0.0 && m <= MAX_MINUTES)
}

/// A fraction in (0, 1] (`eval --tail`).
pub fn fraction_up_to_one(text: &str) -> Result<f64, String> {
    float_where(text, "a fraction in (0, 1]", |x| x > 0.0 && x <= 1.0)
}

/// A fraction strictly inside (0, 1) (`prepare --val-fraction`).
pub fn open_fraction(text: &str) -> Result<f64, String> {
    float_where(text, "a fraction in (0, 1)", |x| x > 0.0 && x < 1.0)
}

/// `bench --noise`: a relative change in [0, 1].
pub fn noise(text: &str) -> Result<f64, String> {
    float_where(text, "a fraction in [0, 1]", |x| (0.0..=1.0).contains(&x))
}

/// `--temperature`.
pub fn temperature(text: &str) -> Result<f32, String> {
    sampling(text, ranges::TEMPERATURE_RANGE, ranges::check_temperature)
}

/// `--top-k`.
pub fn top_k(text: &str) -> Result<usize, String> {
    sampling(text, ranges::TOP_K_RANGE, ranges::check_top_k)
}

/// `--top-p`.
pub fn top_p(text: &str) -> Result<f32, String> {
    sampling(text, ranges::TOP_P_RANGE, ranges::check_top_p)
}

/// `--min-p`.
pub fn min_p(text: &str) -> Result<f32, String> {
    sampling(text, ranges::MIN_P_RANGE, ranges::check_min_p)
}

/// `--repetition-penalty`.
pub fn repetition_penalty(text: &str) -> Result<f32, String> {
    sampling(
        text,
        ranges::REPETITION_PENALTY_RANGE,
        ranges::check_repetition_penalty,
    )
}

/// `--frequency-penalty` and `--presence-penalty`.
pub fn additive_penalty(text: &str) -> Result<f32, String> {
    sampling(text, ranges::ADDITIVE_PENALTY_RANGE, |p| {
        ranges::check_additive_penalty("penalty", p)
    })
}

#[cfg(test)]
mod tests;

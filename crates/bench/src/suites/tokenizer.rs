//! Tokenizer encode throughput on a text corpus.

use std::path::Path;

use ember_tokenizer::Tokenizer;

use crate::report::TokenizerSuite;
use crate::timing::{Clock, Repetitions, time_runs};
use crate::{BenchError, stats};

/// Loads the tokenizer at `tokenizer_path`, encodes the whole of `corpus_path` `reps.warmup + reps.runs` times
/// (special-token handling as [`Tokenizer::encode`]) and reports the median throughput.
pub fn run_tokenizer_suite(
    tokenizer_path: &Path,
    corpus_path: &Path,
    reps: Repetitions,
    clock: &dyn Clock,
) -> Result<TokenizerSuite, BenchError> {
    let tokenizer = Tokenizer::from_path(tokenizer_path).map_err(|e| {
        BenchError::Workload(format!(
            "loading tokenizer {}: {e}",
            tokenizer_path.display()
        ))
    })?;
    let text = std::fs::read_to_string(corpus_path).map_err(|source| BenchError::Io {
        path: corpus_path.into(),
        source,
    })?;
    if text.is_empty() {
        return Err(BenchError::InvalidSettings(format!(
            "corpus {} is empty",
            corpus_path.display()
        )));
    }
    let encode = || {
        tokenizer
            .encode(&text)
            .map_err(|e| BenchError::Workload(format!("encoding: {e}")))
    };
    let tokens = encode()?.len() as u64;
    let times = time_runs(clock, reps, encode)?;
    let secs: Vec<f64> = times.iter().map(|d| d.as_secs_f64()).collect();
    let median_s = stats::median(&secs)?;
    if median_s <= 0.0 {
        return Err(BenchError::InvalidSamples(
            "encoding took no measurable time; use a larger corpus".into(),
        ));
    }
    let bytes = text.len() as u64;
    Ok(TokenizerSuite {
        tokenizer: tokenizer_path.display().to_string(),
        corpus: corpus_path.display().to_string(),
        corpus_bytes: bytes,
        tokens,
        runs: reps.runs,
        encode_mb_per_s: bytes as f64 / 1e6 / median_s,
        encode_tokens_per_s: tokens as f64 / median_s,
    })
}

//! The generation loop: a prefill pass over the prompts, then one token per row per step over the KV cache.
//!
//! Prompts of different lengths share a batch by left padding; each row stops on its own (EOS, a stop string or
//! the token limit) and then only idles until the others finish.

use std::time::{Duration, Instant};

use ember_tokenizer::Tokenizer;

use crate::error::InferenceError;
use crate::model::Decoder;
use crate::row::Row;
use crate::sampling::{Sampler, SamplingConfig};

/// What to generate and when to stop.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationConfig {
    /// Upper bound on generated tokens per row.
    pub max_new_tokens: usize,
    /// How tokens are chosen; row `b` of a batch samples with seed `sampling.seed + b`.
    pub sampling: SamplingConfig,
    /// Generation stops when the decoded text contains one of these; the text is cut before it.
    pub stop: Vec<String>,
    /// Token ids that end generation (the EOS token is kept in `ids` but adds no text).
    pub eos: Vec<u32>,
    /// Drop the oldest prompt tokens when a prompt does not fit the context instead of failing.
    pub truncate: bool,
}

impl Default for GenerationConfig {
    fn default() -> Self {
        Self {
            max_new_tokens: 128,
            sampling: SamplingConfig::default(),
            stop: Vec::new(),
            eos: Vec::new(),
            truncate: false,
        }
    }
}

/// Why a row stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An EOS token was generated.
    Eos,
    /// A stop string appeared in the text.
    Stop,
    /// `max_new_tokens` were generated or the context window is full.
    Length,
}

impl FinishReason {
    /// The lower-case name used in JSON output (`eos`, `stop`, `length`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Eos => "eos",
            Self::Stop => "stop",
            Self::Length => "length",
        }
    }
}

/// The result for one prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// The prompt as run (after any truncation).
    pub prompt_ids: Vec<u32>,
    /// Generated ids (including a final EOS, or the token that completed a stop string).
    pub ids: Vec<u32>,
    /// Generated text, cut before a stop string; empty without a tokenizer.
    pub text: String,
    /// Why generation ended.
    pub finish_reason: FinishReason,
    /// Time from the start of the call to the first generated token (the prefill).
    pub time_to_first_token: Duration,
    /// Time spent generating the tokens after the first.
    pub decode_time: Duration,
    /// Peak bytes of KV-cache storage of the batch this row ran in (shared by its rows; 0 where the model does
    /// not report it).
    pub kv_cache_bytes: usize,
}

impl Generation {
    /// Prefill throughput: prompt tokens per second of time to first token.
    pub fn prefill_tokens_per_second(&self) -> f64 {
        self.prompt_ids.len() as f64
            / self
                .time_to_first_token
                .as_secs_f64()
                .max(f64::MIN_POSITIVE)
    }

    /// Decode throughput: tokens after the first per second of decode time (0 when only one was generated).
    pub fn decode_tokens_per_second(&self) -> f64 {
        let n = self.ids.len().saturating_sub(1);
        if n == 0 {
            0.0
        } else {
            n as f64 / self.decode_time.as_secs_f64().max(f64::MIN_POSITIVE)
        }
    }
}

/// Generates a continuation of every prompt in one batch. `on_text(row, piece)` receives each row's text as soon
/// as it is final: complete UTF-8 characters that cannot be the start of a stop string. A sampling setting out of
/// range is [`InferenceError::InvalidSampling`], before anything runs.
pub fn generate<M: Decoder>(
    model: &M,
    tokenizer: Option<&Tokenizer>,
    prompts: &[Vec<u32>],
    config: &GenerationConfig,
    on_text: &mut dyn FnMut(usize, &str),
) -> Result<Vec<Generation>, InferenceError> {
    // Checked before the state is allocated: a bad setting fails fast, whatever the batch.
    config.sampling.validate()?;
    let mut state = model.new_state(prompts.len())?;
    let prompts = prompts
        .iter()
        .enumerate()
        .map(|(row, p)| fit_prompt(row, p, 0, model.context_length(), config))
        .collect::<Result<Vec<_>, _>>()?;
    let histories = prompts.clone();
    let mut samplers: Vec<Sampler> = (0..prompts.len())
        .map(|row| {
            Sampler::new(&SamplingConfig {
                seed: config.sampling.seed.wrapping_add(row as u64),
                ..config.sampling.clone()
            })
        })
        .collect();
    run(
        model,
        &mut state,
        prompts,
        histories,
        &mut samplers,
        tokenizer,
        config,
        on_text,
    )
}

/// Checks that `prompt` fits after `cached` positions with room for one new token, truncating from the left when
/// `config.truncate` is set.
fn fit_prompt(
    row: usize,
    prompt: &[u32],
    cached: usize,
    context_length: usize,
    config: &GenerationConfig,
) -> Result<Vec<u32>, InferenceError> {
    if prompt.is_empty() {
        return Err(InferenceError::EmptyPrompt { row });
    }
    let room = context_length.saturating_sub(cached);
    if prompt.len() < room {
        return Ok(prompt.to_vec());
    }
    if !config.truncate || room < 2 {
        return Err(InferenceError::PromptTooLong {
            row,
            prompt_len: cached + prompt.len(),
            context_length,
        });
    }
    // Keep as much of the end of the prompt as leaves room for the requested tokens, and at least half the window.
    let keep = room
        .saturating_sub(config.max_new_tokens.max(1))
        .max(room / 2)
        .min(room - 1);
    Ok(prompt[prompt.len() - keep..].to_vec())
}

/// The loop shared by batch generation and conversations: `feed` (per row) is run over `state`, then tokens are
/// sampled until every row is finished. `histories` (what penalties look at) already include `feed`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run<M: Decoder>(
    model: &M,
    state: &mut M::State,
    feed: Vec<Vec<u32>>,
    histories: Vec<Vec<u32>>,
    samplers: &mut [Sampler],
    tokenizer: Option<&Tokenizer>,
    config: &GenerationConfig,
    on_text: &mut dyn FnMut(usize, &str),
) -> Result<Vec<Generation>, InferenceError> {
    let start = Instant::now();
    let mut rows: Vec<Row> = histories
        .into_iter()
        .zip(&feed)
        .map(|(history, prompt)| Row::new(prompt.clone(), history, tokenizer, config))
        .collect();

    // Left padding: every row ends at the same position, so the last column is every row's newest token.
    let width = feed.iter().map(Vec::len).max().unwrap_or(0);
    let mut tokens: Vec<Vec<u32>> = feed
        .iter()
        .map(|f| [vec![0; width - f.len()], f.clone()].concat())
        .collect();
    let mut padding: Vec<Vec<bool>> = feed
        .iter()
        .map(|f| (0..width).map(|i| i < width - f.len()).collect())
        .collect();

    // Batch position -> row. Rows leave the batch (and the cache) as they finish, unless none would remain: a
    // conversation keeps its one row's cache for the next turn.
    // Every active row is unfinished when a step starts (none is, with `max_new_tokens == 0`).
    let mut active: Vec<usize> = (0..rows.len())
        .filter(|&b| rows[b].finish.is_none())
        .collect();
    let mut cache_bytes = 0;
    while !active.is_empty() {
        let logits = model.step(state, &tokens, &padding)?;
        cache_bytes = cache_bytes.max(model.cache_bytes(state));
        let full = model.state_len(state) >= model.context_length();
        for (&b, logits) in active.iter().zip(&logits) {
            let row = &mut rows[b];
            let id = samplers[b].sample(logits, &row.history);
            row.accept(id, config, &mut |piece| on_text(b, piece))?;
            if row.finish.is_none() && full {
                row.finish(FinishReason::Length, &mut |piece| on_text(b, piece));
            }
        }
        let kept: Vec<usize> = (0..active.len())
            .filter(|&i| rows[active[i]].finish.is_none())
            .collect();
        if kept.is_empty() {
            break;
        }
        if kept.len() < active.len() {
            model.retain_rows(state, &kept)?;
            active = kept.iter().map(|&i| active[i]).collect();
        }
        tokens = active
            .iter()
            .map(|&b| vec![*rows[b].ids.last().unwrap_or(&0)])
            .collect();
        padding = vec![vec![false]; active.len()];
    }

    Ok(rows
        .into_iter()
        .map(|r| {
            let first = r.first_token_at.unwrap_or(start);
            Generation {
                prompt_ids: r.prompt_ids,
                ids: r.ids,
                text: r.text,
                finish_reason: r.finish.unwrap_or(FinishReason::Length),
                time_to_first_token: first - start,
                decode_time: r.last_token_at.unwrap_or(first) - first,
                kv_cache_bytes: cache_bytes,
            }
        })
        .collect())
}

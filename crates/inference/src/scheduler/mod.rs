//! Continuous batching: one [`Scheduler`] owns a model's paged KV pool and runs every request submitted to it,
//! step by step. Requests join the running batch between decode steps (their prompts prefilled in chunks, so a
//! long prompt does not stall the others for more than one chunk), leave it as soon as they finish or their client
//! goes, and their blocks are freed at once or kept as a [prefix cache](prefix) entry for the next prompt that
//! starts the same way.
//!
//! Admission is optimistic, as vLLM's: a request is admitted when its prompt fits in the free blocks, and when
//! the running requests later outgrow the pool, the newest is preempted (its blocks freed, its prompt and output
//! so far queued first to be recomputed), so running requests are delayed, never failed, by a full pool. A request
//! that could not fit even alone (prompt plus `max_new_tokens` over the pool's capacity) is refused at submission.

mod prefix;
mod request;
mod step;

use std::collections::VecDeque;
use std::time::Instant;

use ember_model::ModelError;
use ember_optimization::{PagedKvPool, SeqId};
use ember_tokenizer::Tokenizer;

use crate::error::InferenceError;
use crate::generate::{FinishReason, GenerationConfig};
use crate::model::PooledDecoder;
use crate::row::Row;
use crate::sampling::Sampler;
use prefix::PrefixCache;
pub use request::{Completion, Request, RequestSink, TokenLogprob};

/// Limits of a [`Scheduler`].
#[derive(Clone, Debug, PartialEq)]
pub struct SchedulerConfig {
    /// Requests running at once (prefilling or decoding); the rest wait in submission order.
    pub max_batch: usize,
    /// Prompt tokens run per step, across the requests being prefilled (shorter chunks counted as padded to the
    /// step's longest): the most newcomers delay the running batch by.
    pub prefill_chunk: usize,
    /// Positions per KV block.
    pub block_size: usize,
    /// Bytes of K/V storage the pool may hold (it grows on demand up to this).
    pub kv_budget_bytes: usize,
    /// Cached sequences kept for prefix reuse after their requests end (0 turns the prefix cache off).
    pub max_cached_prefixes: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_batch: 8,
            prefill_chunk: 256,
            block_size: 16,
            kv_budget_bytes: 512 << 20,
            max_cached_prefixes: 64,
        }
    }
}

/// Counters of a [`Scheduler`] since it started, and its state now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SchedulerStats {
    /// Requests waiting to be admitted.
    pub waiting: usize,
    /// Requests admitted (prefilling or decoding).
    pub running: usize,
    /// Rows of the last decode step.
    pub last_batch: usize,
    /// Requests submitted and accepted.
    pub submitted: u64,
    /// Requests that ran to completion.
    pub finished: u64,
    /// Requests whose client went away.
    pub cancelled: u64,
    /// Requests refused or failed.
    pub failed: u64,
    /// Times a running request was preempted to make room.
    pub preemptions: u64,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: u64,
    /// Of those, tokens reused from the prefix cache instead of run.
    pub cached_prompt_tokens: u64,
    /// Tokens run by prefill steps (prompt tokens not cached, plus recomputation after preemption).
    pub prefilled_tokens: u64,
    /// Prefill steps run: each takes the prompt chunks of every request that fits the budget at once.
    pub prefill_steps: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// KV blocks referenced by a sequence (running or cached).
    pub used_blocks: usize,
    /// KV blocks the budget holds.
    pub max_blocks: usize,
    /// Sequences in the prefix cache.
    pub cached_prefixes: usize,
}

/// A request the scheduler holds.
struct Live<'t> {
    sink: Box<dyn RequestSink>,
    config: GenerationConfig,
    top_logprobs: Option<usize>,
    logprobs: Vec<TokenLogprob>,
    sampler: Sampler,
    row: Row<'t>,
    /// The tokens the sequence must hold before the next token is sampled: the prompt, or after a preemption the
    /// prompt and everything generated.
    pending: Vec<u32>,
    /// Positions of `pending` the sequence holds.
    fed: usize,
    seq: Option<SeqId>,
    prompt_tokens: usize,
    cached_tokens: usize,
    admitted_once: bool,
    submitted: Instant,
    preemptions: usize,
}

/// Runs requests over one model and one paged KV pool: continuous batching with chunked prefill, preemption of
/// the newest request when the pool fills, and a prefix cache of finished sequences (docs/ARCHITECTURE.md,
/// "continuous batching"). Not thread-safe by design: one worker thread owns it, submits what clients send and
/// calls [`step`](Self::step) in a loop.
pub struct Scheduler<'m, M: PooledDecoder> {
    model: &'m M,
    tokenizer: Option<&'m Tokenizer>,
    config: SchedulerConfig,
    pool: PagedKvPool<M::Backend>,
    prefix: PrefixCache,
    waiting: VecDeque<Live<'m>>,
    prefilling: VecDeque<Live<'m>>,
    decoding: Vec<Live<'m>>,
    stats: SchedulerStats,
}

impl<'m, M: PooledDecoder> Scheduler<'m, M> {
    /// A scheduler for `model`, decoding text with `tokenizer` (without one, completions carry ids only and
    /// stop strings never match).
    pub fn new(
        model: &'m M,
        tokenizer: Option<&'m Tokenizer>,
        config: SchedulerConfig,
    ) -> Result<Self, InferenceError> {
        if config.max_batch == 0 || config.prefill_chunk == 0 {
            return Err(InferenceError::InvalidBatch(format!(
                "max_batch {} and prefill_chunk {}: both must be at least 1",
                config.max_batch, config.prefill_chunk
            )));
        }
        let pool = model.new_pool(config.block_size, config.kv_budget_bytes)?;
        Ok(Self {
            model,
            tokenizer,
            prefix: PrefixCache::new(config.block_size, config.max_cached_prefixes),
            config,
            pool,
            waiting: VecDeque::new(),
            prefilling: VecDeque::new(),
            decoding: Vec::new(),
            stats: SchedulerStats::default(),
        })
    }

    /// Positions the pool can hold in all.
    pub fn capacity_tokens(&self) -> usize {
        self.pool.max_blocks() * self.config.block_size
    }

    /// Queues `request`; its output goes to `sink`. A request that cannot run (empty or over-long prompt, an id
    /// outside the vocabulary, a sampling value out of range, more KV than the whole pool) is finished at once
    /// with the error.
    pub fn submit(&mut self, request: Request, mut sink: Box<dyn RequestSink>) {
        match self.check(&request) {
            Ok(sampler) => {
                let Request {
                    prompt,
                    config,
                    top_logprobs,
                } = request;
                self.stats.submitted += 1;
                let live = Live {
                    sink,
                    row: Row::new(prompt.clone(), prompt.clone(), self.tokenizer, &config),
                    config,
                    top_logprobs,
                    logprobs: Vec::new(),
                    sampler,
                    prompt_tokens: prompt.len(),
                    pending: prompt,
                    fed: 0,
                    seq: None,
                    cached_tokens: 0,
                    admitted_once: false,
                    submitted: Instant::now(),
                    preemptions: 0,
                };
                // Nothing to generate: done without touching the pool.
                if live.row.finish.is_some() {
                    self.complete(live);
                } else {
                    self.waiting.push_back(live);
                }
            }
            Err(e) => {
                self.stats.failed += 1;
                sink.finish(Err(e));
            }
        }
    }

    fn check(&self, request: &Request) -> Result<Sampler, InferenceError> {
        let sampler = Sampler::try_new(&request.config.sampling)?;
        let context_length = self.model.context_length();
        let len = request.prompt.len();
        if len == 0 {
            return Err(InferenceError::EmptyPrompt { row: 0 });
        }
        if len >= context_length {
            return Err(InferenceError::PromptTooLong {
                row: 0,
                prompt_len: len,
                context_length,
            });
        }
        let vocab_size = self.model.vocab_size();
        if let Some(position) = request
            .prompt
            .iter()
            .position(|&id| id as usize >= vocab_size)
        {
            return Err(InferenceError::Model(ModelError::TokenOutOfRange {
                id: request.prompt[position],
                position,
                vocab_size,
            }));
        }
        // The most positions it can hold: its prompt and every token but the last, which is never run.
        let needed = (len + request.config.max_new_tokens.saturating_sub(1)).min(context_length);
        if needed > self.capacity_tokens() {
            return Err(InferenceError::KvBudget {
                needed,
                capacity: self.capacity_tokens(),
            });
        }
        Ok(sampler)
    }

    /// Whether nothing is queued or running.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.prefilling.is_empty() && self.decoding.is_empty()
    }

    /// The counters, and the queue and pool as they are now.
    pub fn stats(&self) -> SchedulerStats {
        SchedulerStats {
            waiting: self.waiting.len(),
            running: self.prefilling.len() + self.decoding.len(),
            used_blocks: self.used_blocks(),
            max_blocks: self.pool.max_blocks(),
            cached_prefixes: self.prefix.len(),
            ..self.stats.clone()
        }
    }

    /// One scheduling step: drops cancelled requests, admits waiting ones, runs up to
    /// [`prefill_chunk`](SchedulerConfig::prefill_chunk) prompt tokens and one decode step of every decoding
    /// request. Returns whether the model ran.
    pub fn step(&mut self) -> bool {
        self.reap_cancelled();
        self.admit();
        let prefilled = self.prefill();
        let decoded = self.decode();
        prefilled || decoded
    }

    fn used_blocks(&self) -> usize {
        let blocks = self.pool.blocks();
        blocks.total_blocks() - blocks.free_list().len()
    }

    /// Frees cached prefixes, least recently used first, until `blocks` blocks are free; whether they are.
    fn make_room(&mut self, blocks: usize) -> bool {
        loop {
            if self.pool.max_blocks() - self.used_blocks() >= blocks {
                return true;
            }
            match self.prefix.evict_lru() {
                Some(seq) => self.free(seq),
                None => return false,
            }
        }
    }

    fn free(&mut self, seq: SeqId) {
        // A sequence the scheduler holds is live by construction; a failure here would be a bookkeeping bug that
        // only leaks blocks, not a reason to stop serving.
        let _ = self.pool.free_sequence(seq);
    }

    /// Blocks spanning positions `from..to` of a sequence, counting the partly filled block at `from` (it may be
    /// shared and copied on write).
    fn blocks_spanning(&self, from: usize, to: usize) -> usize {
        let b = self.config.block_size;
        to.div_ceil(b) - from / b
    }

    fn reap_cancelled(&mut self) {
        let mut gone = Vec::new();
        for queue in [&mut self.waiting, &mut self.prefilling] {
            let (keep, cancelled): (VecDeque<_>, VecDeque<_>) =
                queue.drain(..).partition(|l| !l.sink.cancelled());
            *queue = keep;
            gone.extend(cancelled);
        }
        let (keep, cancelled): (Vec<_>, Vec<_>) =
            self.decoding.drain(..).partition(|l| !l.sink.cancelled());
        self.decoding = keep;
        gone.extend(cancelled);
        for live in gone {
            self.stats.cancelled += 1;
            if let Some(seq) = live.seq {
                self.free(seq);
            }
        }
    }

    fn admit(&mut self) {
        while self.prefilling.len() + self.decoding.len() < self.config.max_batch {
            let Some(mut live) = self.waiting.pop_front() else {
                break;
            };
            let (seq, cached) = match self.start_sequence(&live.pending) {
                Ok(started) => started,
                Err(e) => {
                    self.fail(live, e);
                    continue;
                }
            };
            let need = self.blocks_spanning(cached, live.pending.len());
            // Room for this prompt and the next token of every running request.
            let running = self.prefilling.len() + self.decoding.len();
            if !self.make_room(need + running) {
                self.free(seq);
                self.waiting.push_front(live);
                break;
            }
            live.seq = Some(seq);
            live.fed = cached;
            if !live.admitted_once {
                live.admitted_once = true;
                live.cached_tokens = cached;
                self.stats.prompt_tokens += live.prompt_tokens as u64;
                self.stats.cached_prompt_tokens += cached as u64;
            }
            self.prefilling.push_back(live);
        }
    }

    /// A sequence for `tokens`: a fork of the cached sequence sharing their longest prefix, cut to that prefix,
    /// or an empty one. Returns it and the positions it already holds.
    fn start_sequence(&mut self, tokens: &[u32]) -> Result<(SeqId, usize), InferenceError> {
        let pool_error = |e| InferenceError::KvCache(Box::new(e));
        if let Some((source, common)) = self.prefix.lookup(tokens) {
            let seq = self.pool.fork(source).map_err(pool_error)?;
            self.pool.truncate(seq, common).map_err(pool_error)?;
            return Ok((seq, common));
        }
        Ok((self.pool.add_sequence(), 0))
    }

    /// Frees `live`'s blocks and queues it first, to recompute its prompt and output so far when there is room.
    fn preempt(&mut self, mut live: Live<'m>) {
        if let Some(seq) = live.seq.take() {
            self.free(seq);
        }
        live.pending = live.row.history.clone();
        live.fed = 0;
        live.preemptions += 1;
        self.stats.preemptions += 1;
        self.waiting.push_front(live);
    }

    fn complete(&mut self, mut live: Live<'m>) {
        self.stats.finished += 1;
        if let Some(seq) = live.seq.take() {
            // The conversation so far stays in the prefix cache: the sequence holds every token but the last.
            let held = self.pool.seq_len(seq).unwrap_or(0);
            if self.config.max_cached_prefixes > 0 && held <= live.row.history.len() {
                let tokens = live.row.history[..held].to_vec();
                for released in self.prefix.insert(seq, tokens) {
                    self.free(released);
                }
            } else {
                self.free(seq);
            }
        }
        let first = live.row.first_token_at.unwrap_or_else(Instant::now);
        let completion = Completion {
            prompt_tokens: live.prompt_tokens,
            cached_tokens: live.cached_tokens,
            ids: std::mem::take(&mut live.row.ids),
            text: std::mem::take(&mut live.row.text),
            finish_reason: live.row.finish.unwrap_or(FinishReason::Length),
            logprobs: live
                .top_logprobs
                .map(|_| std::mem::take(&mut live.logprobs)),
            time_to_first_token: first.saturating_duration_since(live.submitted),
            preemptions: live.preemptions,
        };
        live.sink.finish(Ok(completion));
    }

    fn fail(&mut self, mut live: Live<'m>, error: InferenceError) {
        self.stats.failed += 1;
        if let Some(seq) = live.seq.take() {
            self.free(seq);
        }
        live.sink.finish(Err(error));
    }
}

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

    /// Runs the next prompt chunks: the first prefilling requests whose chunks fit the
    /// [`prefill_chunk`](SchedulerConfig::prefill_chunk) budget, as one batched step (rows left-padded to the
    /// longest chunk, the padding counted against the budget so a long prompt runs alone rather than padding
    /// short ones). Requests whose prompt is then complete sample their first token and join the decoding batch.
    fn prefill(&mut self) -> bool {
        loop {
            let batch = self.next_prefill_batch();
            if batch.is_empty() {
                return false;
            }
            if self.run_prefill(batch) {
                return true;
            }
            // The step failed, and its requests with it: the next ones may still run.
        }
    }

    /// Takes the requests of the next prefill step off the queue with the length of each one's chunk; empty when
    /// none can run (no prefilling request, or no room for the first one's chunk).
    fn next_prefill_batch(&mut self) -> Vec<(Live<'m>, usize)> {
        let budget = self.config.prefill_chunk;
        let mut batch: Vec<(Live<'m>, usize)> = Vec::new();
        let (mut longest, mut blocks) = (0, 0);
        while batch.len() < self.config.max_batch {
            let Some(live) = self.prefilling.front() else {
                break;
            };
            let (fed, total) = (live.fed, live.pending.len());
            let chunk = (total - fed).min(budget);
            let wider = longest.max(chunk);
            if !batch.is_empty() && wider * (batch.len() + 1) > budget {
                break;
            }
            // The blocks of the chunks taken so far are only allocated when the step runs: count them too.
            let needed = blocks + self.blocks_spanning(fed, fed + chunk);
            if !self.make_room(needed) {
                // Nothing decoding will free blocks: make them by preempting the newest other prefill.
                if batch.is_empty() && self.decoding.is_empty() && self.prefilling.len() > 1 {
                    if let Some(newest) = self.prefilling.pop_back() {
                        self.preempt(newest);
                    }
                    continue;
                }
                break;
            }
            let Some(live) = self.prefilling.pop_front() else {
                break;
            };
            if live.seq.is_none() {
                self.fail(live, InferenceError::NoOutput);
                continue;
            }
            (longest, blocks) = (wider, needed);
            batch.push((live, chunk));
        }
        batch
    }

    /// One prefill step over `batch`; whether the model ran. A failed step fails its requests.
    fn run_prefill(&mut self, batch: Vec<(Live<'m>, usize)>) -> bool {
        let seqs: Vec<SeqId> = batch.iter().filter_map(|(live, _)| live.seq).collect();
        let tokens: Vec<Vec<u32>> = batch
            .iter()
            .map(|(live, chunk)| live.pending[live.fed..live.fed + chunk].to_vec())
            .collect();
        let logits = match self.model.step_pooled(&mut self.pool, &seqs, &tokens) {
            Ok(logits) if logits.len() == batch.len() => logits,
            Ok(_) => {
                for (live, _) in batch {
                    self.fail(live, InferenceError::NoOutput);
                }
                return true;
            }
            Err(e) => {
                let message = e.to_string();
                for (live, _) in batch {
                    self.fail(live, InferenceError::Backend(message.clone()));
                }
                return false;
            }
        };
        self.stats.prefill_steps += 1;
        // Requests still prefilling go back to the front in their order.
        let mut unfinished = Vec::new();
        for ((mut live, chunk), logits) in batch.into_iter().zip(logits) {
            live.fed += chunk;
            self.stats.prefilled_tokens += chunk as u64;
            if live.fed < live.pending.len() {
                unfinished.push(live);
                continue;
            }
            if let Some(seq) = live.seq {
                self.remember_prompt(seq, &live.pending);
            }
            if let Err(e) = self.sample(&mut live, &logits) {
                self.fail(live, e);
                continue;
            }
            // A request recomputed after preemption may already fill the context.
            self.end_if_full(&mut live);
            if live.row.finish.is_some() {
                self.complete(live);
            } else {
                self.decoding.push(live);
            }
        }
        for live in unfinished.into_iter().rev() {
            self.prefilling.push_front(live);
        }
        true
    }

    /// Keeps a prompt that was just prefilled in the prefix cache (a fork: its blocks are shared, not copied), so
    /// concurrent requests with the same system prompt share it while this one is still running.
    fn remember_prompt(&mut self, seq: SeqId, tokens: &[u32]) {
        if self.config.max_cached_prefixes == 0 || tokens.len() < self.config.block_size {
            return;
        }
        let Ok(copy) = self.pool.fork(seq) else {
            return;
        };
        for released in self.prefix.insert(copy, tokens.to_vec()) {
            self.free(released);
        }
    }

    fn decode(&mut self) -> bool {
        if self.decoding.is_empty() {
            return false;
        }
        // Every row may need a new block (its last is full, or shared and copied on write). Cached prefixes go
        // first, then partly prefilled requests, then the newest decoding rows are preempted, until the rest fit.
        loop {
            let need: usize = self
                .decoding
                .iter()
                .filter_map(|l| l.seq)
                .map(|seq| self.needs_block(seq))
                .sum();
            if self.make_room(need) {
                break;
            }
            // Partly prefilled prompts hold blocks without producing tokens: they yield first.
            if let Some(newest) = self.prefilling.pop_back() {
                self.preempt(newest);
                continue;
            }
            if self.decoding.len() == 1 {
                // Cannot happen: a request alone fits the pool (checked at submission).
                break;
            }
            if let Some(newest) = self.decoding.pop() {
                self.preempt(newest);
            }
        }
        let seqs: Vec<SeqId> = self.decoding.iter().filter_map(|l| l.seq).collect();
        let tokens: Vec<Vec<u32>> = self
            .decoding
            .iter()
            .map(|l| vec![l.row.ids.last().copied().unwrap_or(0)])
            .collect();
        self.stats.last_batch = seqs.len();
        let result = if seqs.len() == self.decoding.len() {
            self.model.step_pooled(&mut self.pool, &seqs, &tokens)
        } else {
            Err(InferenceError::NoOutput)
        };
        let logits = match result {
            Ok(logits) => logits,
            Err(e) => {
                // The batch's state is unknown after a failed step: fail its requests, keep serving the rest.
                let message = e.to_string();
                for live in std::mem::take(&mut self.decoding) {
                    self.fail(live, InferenceError::Backend(message.clone()));
                }
                return true;
            }
        };
        let mut rows = std::mem::take(&mut self.decoding).into_iter().zip(logits);
        for (mut live, logits) in rows.by_ref() {
            if let Err(e) = self.sample(&mut live, &logits) {
                self.fail(live, e);
                continue;
            }
            self.end_if_full(&mut live);
            if live.row.finish.is_some() {
                self.complete(live);
            } else {
                self.decoding.push(live);
            }
        }
        true
    }

    /// Ends `live` by length once its sequence fills the context: its next token would have no position.
    fn end_if_full(&mut self, live: &mut Live<'m>) {
        let context_length = self.model.context_length();
        let held = live
            .seq
            .and_then(|seq| self.pool.seq_len(seq).ok())
            .unwrap_or(context_length);
        if live.row.finish.is_none() && held >= context_length {
            let mut text = String::new();
            live.row
                .finish(FinishReason::Length, &mut |piece| text.push_str(piece));
            if !text.is_empty() {
                let id = live.row.ids.last().copied().unwrap_or(0);
                live.sink.token(id, &text, None);
            }
        }
    }

    /// Whether `seq`'s next position needs a block it does not own alone.
    fn needs_block(&self, seq: SeqId) -> usize {
        let blocks = self.pool.blocks();
        let len = blocks.seq_len(seq).unwrap_or(0);
        if len.is_multiple_of(self.config.block_size) {
            return 1;
        }
        let shared = blocks
            .block_table(seq)
            .ok()
            .and_then(|t| t.last())
            .is_some_and(|&b| blocks.refcount(b) > 1);
        usize::from(shared)
    }

    /// Samples the next token of `live` from `logits` and sends it, with the text it completes, to the sink.
    fn sample(&mut self, live: &mut Live<'m>, logits: &[f32]) -> Result<(), InferenceError> {
        let id = live.sampler.sample(logits, &live.row.history);
        if let Some(k) = live.top_logprobs {
            live.logprobs.push(token_logprob(logits, id, k));
        }
        let mut text = String::new();
        live.row
            .accept(id, &live.config, &mut |piece| text.push_str(piece))?;
        self.stats.generated_tokens += 1;
        let logprob = live.top_logprobs.and(live.logprobs.last());
        live.sink.token(id, &text, logprob);
        Ok(())
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

/// `id`'s log-probability under the softmax of `logits`, and the `k` most likely ids.
fn token_logprob(logits: &[f32], id: u32, k: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_sum = logits
        .iter()
        .map(|&l| f64::from(l - max).exp())
        .sum::<f64>()
        .ln() as f32
        + max;
    let logprob = |i: usize| logits.get(i).map_or(f32::NEG_INFINITY, |&l| l - log_sum);
    let mut order: Vec<usize> = (0..logits.len()).collect();
    let k = k.min(logits.len());
    if k > 0 {
        order.select_nth_unstable_by(k - 1, |&a, &b| logits[b].total_cmp(&logits[a]));
    }
    order.truncate(k);
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    TokenLogprob {
        id,
        logprob: logprob(id as usize),
        top: order.into_iter().map(|i| (i as u32, logprob(i))).collect(),
    }
}

//! The scheduler's model steps: prompt chunks prefilled in batches, decode steps over every running request,
//! and the sampling that turns a step's logits into each request's next token. A failed step fails the
//! requests of its batch with the step's own error, shared ([`InferenceError::Step`]), and the others keep running.

use std::sync::Arc;

use ember_optimization::SeqId;

use super::{Live, Scheduler, TokenLogprob};
use crate::error::InferenceError;
use crate::generate::FinishReason;
use crate::model::PooledDecoder;

impl<'m, M: PooledDecoder> Scheduler<'m, M> {
    /// Runs the next prompt chunks: the first prefilling requests whose chunks fit the
    /// [`prefill_chunk`](super::SchedulerConfig::prefill_chunk) budget, as one batched step (rows left-padded to the
    /// longest chunk, the padding counted against the budget so a long prompt runs alone rather than padding
    /// short ones). Requests whose prompt is then complete sample their first token and join the decoding batch.
    pub(super) fn prefill(&mut self) -> bool {
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
                let error = Arc::new(e);
                for (live, _) in batch {
                    self.fail(live, InferenceError::Step(error.clone()));
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
            // A request recomputed after preemption may already fill the context: `advance` ends it then.
            self.advance(live, &logits);
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

    /// One decode step over every decoding request, after making room for their next positions (preempting
    /// the newest where the pool is full); whether there was anything to decode.
    pub(super) fn decode(&mut self) -> bool {
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
                let error = Arc::new(e);
                for live in std::mem::take(&mut self.decoding) {
                    self.fail(live, InferenceError::Step(error.clone()));
                }
                return true;
            }
        };
        for (live, logits) in std::mem::take(&mut self.decoding).into_iter().zip(logits) {
            self.advance(live, &logits);
        }
        true
    }

    /// Samples `live`'s next token from `logits`, then completes it if that finished it (or filled the
    /// context) and otherwise keeps it decoding.
    fn advance(&mut self, mut live: Live<'m>, logits: &[f32]) {
        if let Err(e) = self.sample(&mut live, logits) {
            self.fail(live, e);
            return;
        }
        self.end_if_full(&mut live);
        if live.row.finish.is_some() {
            self.complete(live);
        } else {
            self.decoding.push(live);
        }
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

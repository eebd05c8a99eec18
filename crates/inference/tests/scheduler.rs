//! Continuous batching: requests that join and leave a running batch, share cached prefixes, are preempted by a
//! full pool or cancelled by their client produce what each produces run alone, and free their blocks.

mod common;
mod hooked;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::tiny;
use ember_inference::sampling::SamplingConfig;
use ember_inference::{
    Completion, FinishReason, GenerationConfig, InferenceError, KvCacheKind, Request, RequestSink,
    Scheduler, SchedulerConfig, TokenLogprob, generate,
};
use ember_model::ModelError;
use hooked::Hooked;

/// One position of the tiny model's cache: 2 layers x 2 KV heads x (8 + 8) f32.
const TOKEN_BYTES: usize = 256;

/// What a request's sink received.
#[derive(Default)]
struct Received {
    tokens: Vec<u32>,
    /// The log-probabilities streamed with the tokens.
    logprobs: Vec<TokenLogprob>,
    result: Option<Result<Completion, InferenceError>>,
    finishes: usize,
}

struct Sink {
    received: Arc<Mutex<Received>>,
    cancel: Arc<AtomicBool>,
}

impl RequestSink for Sink {
    fn token(&mut self, id: u32, _text: &str, logprob: Option<&TokenLogprob>) {
        let mut r = self.received.lock().unwrap();
        r.tokens.push(id);
        r.logprobs.extend(logprob.cloned());
    }

    fn finish(&mut self, result: Result<Completion, InferenceError>) {
        let mut r = self.received.lock().unwrap();
        r.finishes += 1;
        r.result = Some(result);
    }

    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }
}

struct Handle {
    received: Arc<Mutex<Received>>,
    cancel: Arc<AtomicBool>,
}

impl Handle {
    fn completion(&self) -> Completion {
        let r = self.received.lock().unwrap();
        assert_eq!(r.finishes, 1, "finish must be called exactly once");
        match r.result.as_ref().expect("the request has not finished") {
            Ok(c) => {
                assert_eq!(
                    c.ids, r.tokens,
                    "streamed tokens differ from the completion's"
                );
                assert_eq!(
                    c.logprobs.clone().unwrap_or_default(),
                    r.logprobs,
                    "streamed log-probabilities differ from the completion's"
                );
                c.clone()
            }
            Err(e) => panic!("the request failed: {e}"),
        }
    }

    fn error(&self) -> String {
        let r = self.received.lock().unwrap();
        match r.result.as_ref() {
            Some(Err(e)) => e.to_string(),
            other => panic!(
                "expected an error, got {:?}",
                other.map(|r| r.as_ref().ok())
            ),
        }
    }
}

fn submit<M: ember_inference::PooledDecoder>(
    scheduler: &mut Scheduler<'_, M>,
    prompt: &[u32],
    max_new_tokens: usize,
) -> Handle {
    let request = Request {
        prompt: prompt.to_vec(),
        config: greedy(max_new_tokens),
        top_logprobs: Some(3),
    };
    let received = Arc::new(Mutex::new(Received::default()));
    let cancel = Arc::new(AtomicBool::new(false));
    scheduler.submit(
        request,
        Box::new(Sink {
            received: received.clone(),
            cancel: cancel.clone(),
        }),
    );
    Handle { received, cancel }
}

fn greedy(max_new_tokens: usize) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens,
        sampling: SamplingConfig::greedy(),
        ..GenerationConfig::default()
    }
}

fn config(max_batch: usize, block_size: usize, capacity_tokens: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_batch,
        prefill_chunk: 5,
        block_size,
        kv_budget_bytes: capacity_tokens * TOKEN_BYTES,
        max_cached_prefixes: 8,
    }
}

fn run_to_end<M: ember_inference::PooledDecoder>(scheduler: &mut Scheduler<'_, M>) {
    for _ in 0..10_000 {
        if scheduler.is_idle() {
            return;
        }
        scheduler.step();
    }
    panic!("the scheduler did not finish its requests");
}

/// The request run alone by batch generation over a contiguous cache: the oracle.
fn alone(prompt: &[u32], max_new_tokens: usize) -> (Vec<u32>, FinishReason) {
    let lm = tiny(KvCacheKind::Contiguous);
    let mut out = generate(
        &lm,
        None,
        &[prompt.to_vec()],
        &greedy(max_new_tokens),
        &mut |_, _| {},
    )
    .unwrap();
    let g = out.remove(0);
    (g.ids, g.finish_reason)
}

fn prompts() -> Vec<(Vec<u32>, usize)> {
    vec![
        ((1..12).collect(), 9),
        (vec![40], 14),
        ((20..27).collect(), 3),
        ((50..62).rev().collect(), 12),
        // 40 prompt tokens in a 48-position context: ends by length at the context, not at 100 tokens.
        ((0..40).map(|i| (i * 7 + 3) % 96).collect(), 100),
        (vec![5, 5, 5, 5], 1),
    ]
}

/// Greedy ids must be equal, not close: the batched step and a lone contiguous step differ only in summation
/// order (f32, a few ulps on logits of magnitude ~10), and the tiny model's std-0.3 weights keep its top-2 logit
/// gaps far above that, so a flip here means a wrong position, mask or block.
#[test]
fn requests_joining_and_leaving_a_running_batch_equal_each_run_alone() {
    let lm = tiny(KvCacheKind::paged());
    let mut scheduler = Scheduler::new(&lm, None, config(4, 4, 48 * 8)).unwrap();
    let prompts = prompts();
    let mut handles = Vec::new();
    // Half arrive at once (more than the batch holds: some wait), the rest while the first decode.
    for (prompt, max_new) in &prompts[..3] {
        handles.push(submit(&mut scheduler, prompt, *max_new));
    }
    for _ in 0..4 {
        scheduler.step();
    }
    for (prompt, max_new) in &prompts[3..] {
        handles.push(submit(&mut scheduler, prompt, *max_new));
        scheduler.step();
    }
    run_to_end(&mut scheduler);
    for ((prompt, max_new), handle) in prompts.iter().zip(&handles) {
        let got = handle.completion();
        let (ids, finish) = alone(prompt, *max_new);
        assert_eq!(got.ids, ids, "prompt {prompt:?}");
        assert_eq!(got.finish_reason, finish, "prompt {prompt:?}");
        assert_eq!(got.prompt_tokens, prompt.len());
        let logprobs = got.logprobs.expect("logprobs were asked for");
        assert_eq!(logprobs.len(), ids.len());
        for lp in logprobs {
            // Greedy picks the most likely token, so it heads its own top list.
            assert_eq!(lp.top.len(), 3);
            assert_eq!(lp.top[0].0, lp.id);
            assert!(lp.logprob <= 0.0 && lp.logprob == lp.top[0].1);
            assert!(lp.top[1].1 <= lp.top[0].1 && lp.top[2].1 <= lp.top[1].1);
        }
    }
    let (_, finish) = alone(&prompts[4].0, 100);
    assert_eq!(finish, FinishReason::Length);
    let stats = scheduler.stats();
    assert_eq!((stats.finished, stats.failed, stats.preemptions), (6, 0, 0));
    assert!(stats.last_batch <= 4);
    // Nothing runs, so only cached prefixes hold blocks.
    assert_eq!(stats.running, 0);
    assert!(stats.cached_prefixes > 0 && stats.used_blocks > 0);
}

/// Prompts that arrive together are prefilled as one left-padded step when they fit the budget, each output
/// still what the request gives alone (same reasoning as above: the padding is neither stored nor attended to);
/// a prompt too long to share the budget runs in a step of its own.
#[test]
fn prompts_arriving_together_are_prefilled_in_one_step() {
    let lm = tiny(KvCacheKind::paged());
    let config = SchedulerConfig {
        prefill_chunk: 40,
        ..config(8, 4, 48 * 8)
    };
    let mut scheduler = Scheduler::new(&lm, None, config).unwrap();
    let prompts = prompts();
    // 11, 1 and 7 tokens: 3 rows of 11 fit the budget of 40.
    let handles: Vec<Handle> = prompts[..3]
        .iter()
        .map(|(prompt, max_new)| submit(&mut scheduler, prompt, *max_new))
        .collect();
    scheduler.step();
    let stats = scheduler.stats();
    assert_eq!((stats.prefill_steps, stats.prefilled_tokens), (1, 19));
    // Both are admitted; 40 tokens fill the budget alone, so the 12-token prompt behind waits for the next step.
    let later: Vec<Handle> = [&prompts[4], &prompts[3]]
        .iter()
        .map(|(prompt, max_new)| submit(&mut scheduler, prompt, *max_new))
        .collect();
    scheduler.step();
    assert_eq!(scheduler.stats().prefill_steps, 2);
    assert_eq!(scheduler.stats().prefilled_tokens, 19 + 40);
    run_to_end(&mut scheduler);
    let order = [
        &prompts[0],
        &prompts[1],
        &prompts[2],
        &prompts[4],
        &prompts[3],
    ];
    for ((prompt, max_new), handle) in order.into_iter().zip(handles.iter().chain(&later)) {
        let (ids, _) = alone(prompt, *max_new);
        assert_eq!(handle.completion().ids, ids, "prompt {prompt:?}");
    }
}

#[test]
fn a_repeated_system_prompt_is_prefilled_once_with_identical_output() {
    let lm = tiny(KvCacheKind::paged());
    let system: Vec<u32> = (0..20).map(|i| (i * 5 + 1) % 96).collect();
    let first = [system.clone(), vec![70, 71, 72]].concat();
    let second = [system.clone(), vec![80, 81]].concat();

    let mut scheduler = Scheduler::new(&lm, None, config(4, 4, 48 * 8)).unwrap();
    submit(&mut scheduler, &first, 6);
    run_to_end(&mut scheduler);
    let before = scheduler.stats();
    let handle = submit(&mut scheduler, &second, 6);
    run_to_end(&mut scheduler);
    let after = scheduler.stats();
    let got = handle.completion();
    // 20 shared tokens (five whole 4-position blocks): only the two new prompt tokens run.
    assert_eq!(got.cached_tokens, system.len());
    assert_eq!(after.prefilled_tokens - before.prefilled_tokens, 2);
    assert_eq!(after.cached_prompt_tokens - before.cached_prompt_tokens, 20);

    // Without the cache the same request runs all 22 tokens and says the same.
    let mut cold = Scheduler::new(
        &lm,
        None,
        SchedulerConfig {
            max_cached_prefixes: 0,
            ..config(4, 4, 48 * 8)
        },
    )
    .unwrap();
    let cold_handle = submit(&mut cold, &second, 6);
    run_to_end(&mut cold);
    assert_eq!(cold.stats().prefilled_tokens, second.len() as u64);
    assert_eq!(cold.stats().used_blocks, 0, "no cache, nothing running");
    assert_eq!(got.ids, cold_handle.completion().ids);
    assert_eq!(got.ids, alone(&second, 6).0);

    // The whole first conversation is cached too: a follow-up turn reuses prompt and reply.
    let turn: Vec<u32> = [first.clone(), handle_ids(&mut scheduler, &first)].concat();
    let before = scheduler.stats();
    let follow_up = submit(&mut scheduler, &[turn.clone(), vec![90]].concat(), 2);
    run_to_end(&mut scheduler);
    assert!(
        follow_up.completion().cached_tokens >= turn.len() - 1,
        "the follow-up reran {} tokens",
        scheduler.stats().prefilled_tokens - before.prefilled_tokens
    );
}

/// Runs `prompt` for 6 tokens and returns them (each run is cached, so this also refreshes the entry).
fn handle_ids<M: ember_inference::PooledDecoder>(
    scheduler: &mut Scheduler<'_, M>,
    prompt: &[u32],
) -> Vec<u32> {
    let handle = submit(scheduler, prompt, 6);
    run_to_end(scheduler);
    handle.completion().ids
}

#[test]
fn a_full_pool_preempts_the_newest_request_and_every_output_is_unchanged() {
    let lm = tiny(KvCacheKind::paged());
    // 48 positions, the whole context: three of the requests below run to the end of the context, so any two
    // running at once outgrow the pool, and one preempted near the end is recomputed up to a full context.
    let mut scheduler = Scheduler::new(
        &lm,
        None,
        SchedulerConfig {
            max_cached_prefixes: 0,
            ..config(3, 4, 48)
        },
    )
    .unwrap();
    let requests: Vec<(Vec<u32>, usize)> = vec![
        ((1..9).collect(), 25),
        ((30..38).collect(), 100),
        ((60..68).collect(), 100),
        ((70..90).collect(), 100),
    ];
    let handles: Vec<Handle> = requests
        .iter()
        .map(|(p, n)| submit(&mut scheduler, p, *n))
        .collect();
    run_to_end(&mut scheduler);
    let stats = scheduler.stats();
    assert!(stats.preemptions > 0, "the pool never filled: {stats:?}");
    for handle in &handles {
        if let Some(Err(e)) = &handle.received.lock().unwrap().result {
            panic!("a request failed: {e}");
        }
    }
    assert_eq!((stats.finished, stats.failed), (4, 0));
    for ((prompt, n), handle) in requests.iter().zip(&handles) {
        let got = handle.completion();
        let (ids, finish) = alone(prompt, *n);
        assert_eq!(got.ids, ids, "prompt {prompt:?}");
        assert_eq!(got.finish_reason, finish, "prompt {prompt:?}");
    }
    assert_eq!(stats.used_blocks, 0);
}

#[test]
fn a_cancelled_request_leaves_the_batch_and_frees_its_blocks() {
    let lm = tiny(KvCacheKind::paged());
    let mut scheduler = Scheduler::new(
        &lm,
        None,
        SchedulerConfig {
            max_cached_prefixes: 0,
            ..config(4, 4, 48 * 8)
        },
    )
    .unwrap();
    let kept = submit(&mut scheduler, &[1, 2, 3], 20);
    let gone = submit(&mut scheduler, &(10..30).collect::<Vec<_>>(), 20);
    for _ in 0..8 {
        scheduler.step();
    }
    let busy = scheduler.stats();
    assert_eq!(busy.running, 2);
    gone.cancel.store(true, Ordering::Relaxed);
    scheduler.step();
    let stats = scheduler.stats();
    assert_eq!((stats.running, stats.cancelled), (1, 1));
    // The cancelled row held at least its 20-token prompt: five blocks of 4 are back.
    assert!(
        busy.used_blocks - stats.used_blocks >= 5,
        "{busy:?} -> {stats:?}"
    );
    assert_eq!(gone.received.lock().unwrap().finishes, 0);
    run_to_end(&mut scheduler);
    assert_eq!(scheduler.stats().used_blocks, 0);
    assert_eq!(kept.completion().ids, alone(&[1, 2, 3], 20).0);
}

#[test]
fn requests_that_cannot_run_fail_at_submission_with_the_reason() {
    let lm = tiny(KvCacheKind::paged());
    let mut scheduler = Scheduler::new(&lm, None, config(4, 4, 32)).unwrap();
    let empty = submit(&mut scheduler, &[], 4);
    assert!(empty.error().contains("empty"), "{}", empty.error());
    let long = submit(&mut scheduler, &[1; 48], 4);
    assert!(
        long.error().contains("context window holds 48"),
        "{}",
        long.error()
    );
    let vocab = submit(&mut scheduler, &[1, 96], 4);
    assert!(vocab.error().contains("96"), "{}", vocab.error());
    // 10 + 29 positions do not fit a 32-position pool, even alone.
    let big = submit(&mut scheduler, &[1; 10], 30);
    assert!(big.error().contains("pool holds 32"), "{}", big.error());
    let received = Arc::new(Mutex::new(Received::default()));
    scheduler.submit(
        Request {
            prompt: vec![1],
            config: GenerationConfig {
                sampling: SamplingConfig {
                    top_p: Some(0.0),
                    ..SamplingConfig::default()
                },
                ..GenerationConfig::default()
            },
            top_logprobs: None,
        },
        Box::new(Sink {
            received: received.clone(),
            cancel: Arc::new(AtomicBool::new(false)),
        }),
    );
    let handle = Handle {
        received,
        cancel: Arc::new(AtomicBool::new(false)),
    };
    assert!(
        handle.error().contains("top_p") || handle.error().contains("top-p"),
        "{}",
        handle.error()
    );
    assert!(scheduler.is_idle());
    assert_eq!(scheduler.stats().failed, 5);
    // Nothing to generate is not an error: an empty completion at once.
    let nothing = submit(&mut scheduler, &[1, 2], 0);
    let done = nothing.completion();
    assert_eq!(
        (done.ids.len(), done.finish_reason),
        (0, FinishReason::Length)
    );
    assert!(scheduler.is_idle());
}

/// Every request of a failed step gets the model's own error, reachable as the error's source, rather than its
/// message in a generic backend error: a client can still tell a refused input from a server fault.
#[test]
fn a_failed_step_fails_every_request_of_its_batch_with_the_models_error() {
    // Step 0 prefills both two-token prompts at once (4 tokens of the 5-token chunk); step 1 decodes both.
    for fail_at in [0, 1] {
        // The model refusing its input, as a model past its positions does.
        let steps = AtomicUsize::new(0);
        let lm = Hooked {
            inner: tiny(KvCacheKind::paged()),
            before_step: |_: &[Vec<u32>]| {
                if steps.fetch_add(1, Ordering::Relaxed) == fail_at {
                    return Err(InferenceError::Model(ModelError::ContextOverflow {
                        len: 49,
                        context_length: 48,
                    }));
                }
                Ok(())
            },
        };
        let config = SchedulerConfig {
            max_cached_prefixes: 0,
            ..config(4, 4, 48 * 8)
        };
        let mut scheduler = Scheduler::new(&lm, None, config).unwrap();
        let handles = [
            submit(&mut scheduler, &[1, 2], 5),
            submit(&mut scheduler, &[3, 4], 5),
        ];
        run_to_end(&mut scheduler);
        for handle in &handles {
            let received = handle.received.lock().unwrap();
            let Some(Err(error)) = &received.result else {
                panic!("step {fail_at} failed, yet a request of its batch did not");
            };
            let source =
                std::error::Error::source(error).and_then(|e| e.downcast_ref::<ModelError>());
            assert!(
                matches!(
                    source,
                    Some(ModelError::ContextOverflow {
                        len: 49,
                        context_length: 48
                    })
                ),
                "step {fail_at}: {error:?}"
            );
        }
        assert_eq!(scheduler.stats().failed, 2, "step {fail_at}");
        assert_eq!(scheduler.stats().used_blocks, 0, "step {fail_at}");
    }
}

/// Random schedules (pool sizes, batch limits, chunk and block sizes, arrival times, cancellations, prefix cache on
/// or off) over one fixed seed: every request that is not cancelled ends with what it produces alone, and a pool
/// with nothing running or cached holds no block. Catches bookkeeping slips no hand-written schedule reaches.
#[test]
fn random_schedules_keep_every_output_and_leak_no_block() {
    use rand::{Rng, SeedableRng};
    let lm = tiny(KvCacheKind::paged());
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let (mut preemptions, mut hits, mut cancelled) = (0, 0, 0);
    for trial in 0..12 {
        let cached = rng.random_bool(0.5);
        let config = SchedulerConfig {
            max_batch: rng.random_range(1..6),
            prefill_chunk: rng.random_range(1..12),
            block_size: rng.random_range(1..9),
            kv_budget_bytes: rng.random_range(48..200) * TOKEN_BYTES,
            max_cached_prefixes: if cached { 4 } else { 0 },
        };
        let mut scheduler = Scheduler::new(&lm, None, config.clone()).unwrap();
        let requests: Vec<(Vec<u32>, usize, bool)> = (0..10)
            .map(|_| {
                // A few shared openings, so the prefix cache gets hits.
                let head: Vec<u32> = (0..rng.random_range(0..12)).map(|i| i * 3 % 96).collect();
                let tail_len = rng.random_range(1..20);
                let tail: Vec<u32> = (0..tail_len).map(|_| rng.random_range(0..96)).collect();
                let prompt = [head, tail].concat();
                (prompt, rng.random_range(1..40), rng.random_bool(0.2))
            })
            .collect();
        let mut handles = Vec::new();
        for (prompt, max_new, _) in &requests {
            handles.push(submit(&mut scheduler, prompt, *max_new));
            for _ in 0..rng.random_range(0..4) {
                scheduler.step();
            }
        }
        for ((_, _, cancel), handle) in requests.iter().zip(&handles) {
            if *cancel {
                handle.cancel.store(true, Ordering::Relaxed);
            }
        }
        run_to_end(&mut scheduler);
        for ((prompt, max_new, cancel), handle) in requests.iter().zip(&handles) {
            let r = handle.received.lock().unwrap();
            match &r.result {
                Some(Ok(c)) => {
                    let (ids, finish) = alone(prompt, *max_new);
                    assert_eq!(c.ids, ids, "trial {trial} {config:?}: prompt {prompt:?}");
                    assert_eq!(c.finish_reason, finish);
                }
                Some(Err(e)) => {
                    // Only a request that could never fit may fail: its KV need is over the pool.
                    assert!(
                        matches!(
                            e,
                            InferenceError::KvBudget { .. } | InferenceError::PromptTooLong { .. }
                        ),
                        "trial {trial} {config:?}: {e}"
                    );
                }
                None => assert!(
                    *cancel,
                    "trial {trial}: a request neither finished nor was cancelled"
                ),
            }
        }
        let stats = scheduler.stats();
        if !cached {
            assert_eq!(stats.used_blocks, 0, "trial {trial}: {stats:?}");
        }
        preemptions += stats.preemptions;
        hits += stats.cached_prompt_tokens;
        cancelled += stats.cancelled;
    }
    // The schedules reach the paths they are for.
    assert!(
        preemptions > 0 && hits > 0 && cancelled > 0,
        "{preemptions} {hits} {cancelled}"
    );
}

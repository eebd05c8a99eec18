//! The bridge between tokio handlers and the model's worker thread: a queue of requests in, a channel of
//! [`Event`]s back per request, and the scheduler's counters shared for `/metrics` and admission.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ember_inference::{
    Completion, InferenceError, PooledDecoder, Request, RequestSink, Scheduler, SchedulerConfig,
    SchedulerStats, TokenLogprob,
};
use ember_tokenizer::Tokenizer;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use crate::error::ApiError;
use crate::metrics::Metrics;

/// What a request's channel carries.
#[derive(Debug)]
pub enum Event {
    /// A generated token and the text that became final with it (may be empty).
    Token {
        /// The id.
        id: u32,
        /// Text released with it.
        text: String,
        /// Its log-probability, when the request asked for them.
        logprob: Option<TokenLogprob>,
    },
    /// The end: the completion or the error. Nothing follows.
    Done(Result<Completion, InferenceError>),
}

struct Job {
    request: Request,
    sink: ChannelSink,
}

/// State both sides see.
struct Shared {
    /// Jobs sent but not yet taken by the worker.
    in_flight: AtomicUsize,
    /// The scheduler's counters after its last step.
    stats: Mutex<SchedulerStats>,
    /// Positions the KV pool holds, once the worker has built it.
    capacity_tokens: AtomicUsize,
    /// False once the worker has stopped (its model failed to start, or it panicked twice in a row).
    alive: AtomicBool,
}

/// The handlers' side: submits requests to the worker, refusing them when `max_queue` are already waiting.
pub struct Engine {
    jobs: Mutex<mpsc::Sender<Job>>,
    shared: Arc<Shared>,
    max_queue: usize,
    metrics: Arc<Metrics>,
}

/// The worker's side: the queue it takes requests from. [`Worker::run`] on the thread that owns the model.
pub struct Worker {
    jobs: mpsc::Receiver<Job>,
    shared: Arc<Shared>,
}

impl Engine {
    /// An engine queueing at most `max_queue` requests beyond the running batch, and the worker end of its queue.
    pub fn new(max_queue: usize, metrics: Arc<Metrics>) -> (Self, Worker) {
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            in_flight: AtomicUsize::new(0),
            stats: Mutex::new(SchedulerStats::default()),
            capacity_tokens: AtomicUsize::new(0),
            alive: AtomicBool::new(true),
        });
        (
            Self {
                jobs: Mutex::new(tx),
                shared: shared.clone(),
                max_queue,
                metrics,
            },
            Worker { jobs: rx, shared },
        )
    }

    /// Queues `request`; its events arrive on the returned channel. Dropping the receiver cancels it.
    pub fn submit(&self, request: Request) -> Result<UnboundedReceiver<Event>, ApiError> {
        if !self.is_alive() {
            return Err(ApiError::internal("the model worker has stopped"));
        }
        let queued = self.queued();
        if queued >= self.max_queue {
            self.metrics.rejected();
            return Err(ApiError::overloaded(queued));
        }
        let (tx, rx) = unbounded_channel();
        let sink = ChannelSink {
            tx,
            metrics: self.metrics.clone(),
            submitted: Instant::now(),
            last_token: None,
        };
        self.shared.in_flight.fetch_add(1, Ordering::SeqCst);
        let sent = self
            .jobs
            .lock()
            .map_err(|_| ApiError::internal("the request queue is poisoned"))?
            .send(Job { request, sink });
        if sent.is_err() {
            self.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
            return Err(ApiError::internal("the model worker has stopped"));
        }
        Ok(rx)
    }

    /// Requests waiting for a place in the batch (sent to the worker or queued in its scheduler).
    pub fn queued(&self) -> usize {
        self.shared.in_flight.load(Ordering::SeqCst) + self.stats().waiting
    }

    /// The scheduler's counters after its last step.
    pub fn stats(&self) -> SchedulerStats {
        self.shared
            .stats
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    /// Positions the KV pool holds (0 until the worker has started).
    pub fn capacity_tokens(&self) -> usize {
        self.shared.capacity_tokens.load(Ordering::SeqCst)
    }

    /// Whether the worker is running.
    pub fn is_alive(&self) -> bool {
        self.shared.alive.load(Ordering::SeqCst)
    }
}

impl Worker {
    /// Runs requests on `model` until every [`Engine`] handle is dropped. A panic inside a step (a bug, not a
    /// request's fault) drops that scheduler with its requests, whose clients get a server error, and serving
    /// goes on with a fresh one: the server never dies of a request.
    pub fn run<M: PooledDecoder>(
        self,
        model: &M,
        tokenizer: Option<&Tokenizer>,
        config: SchedulerConfig,
    ) -> Result<(), InferenceError> {
        let result = self.serve(model, tokenizer, config);
        self.shared.alive.store(false, Ordering::SeqCst);
        result
    }

    fn serve<M: PooledDecoder>(
        &self,
        model: &M,
        tokenizer: Option<&Tokenizer>,
        config: SchedulerConfig,
    ) -> Result<(), InferenceError> {
        loop {
            let mut scheduler = Scheduler::new(model, tokenizer, config.clone())?;
            self.shared
                .capacity_tokens
                .store(scheduler.capacity_tokens(), Ordering::SeqCst);
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| self.drive(&mut scheduler)));
            match outcome {
                Ok(()) => return Ok(()),
                Err(_) => {
                    let stats = scheduler.stats();
                    drop(scheduler);
                    // Carry the counters over so /metrics stays monotonic.
                    if let Ok(mut shared) = self.shared.stats.lock() {
                        *shared = SchedulerStats {
                            failed: stats.failed + stats.running as u64 + stats.waiting as u64,
                            ..stats
                        };
                    }
                }
            }
        }
    }

    /// The scheduling loop: sleeps on the queue while idle, otherwise takes every new request and steps.
    fn drive<M: PooledDecoder>(&self, scheduler: &mut Scheduler<'_, M>) {
        loop {
            if scheduler.is_idle() {
                match self.jobs.recv() {
                    Ok(job) => self.take(scheduler, job),
                    Err(_) => return,
                }
            }
            while let Ok(job) = self.jobs.try_recv() {
                self.take(scheduler, job);
            }
            if !scheduler.step() {
                // Requests are held but none could run (waiting for blocks): do not spin a core on it.
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            if let Ok(mut shared) = self.shared.stats.lock() {
                *shared = scheduler.stats();
            }
        }
    }

    fn take<M: PooledDecoder>(&self, scheduler: &mut Scheduler<'_, M>, job: Job) {
        scheduler.submit(job.request, Box::new(job.sink));
        // Counted as waiting by the scheduler from here on.
        if let Ok(mut shared) = self.shared.stats.lock() {
            *shared = scheduler.stats();
        }
        self.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Sends a request's output to its handler and times it for `/metrics`.
struct ChannelSink {
    tx: UnboundedSender<Event>,
    metrics: Arc<Metrics>,
    submitted: Instant,
    last_token: Option<Instant>,
}

impl RequestSink for ChannelSink {
    fn token(&mut self, id: u32, text: &str, logprob: Option<&TokenLogprob>) {
        let now = Instant::now();
        match self.last_token {
            None => self.metrics.time_to_first_token(now - self.submitted),
            Some(last) => self.metrics.inter_token_latency(now - last),
        }
        self.last_token = Some(now);
        // A closed channel is a client gone: the scheduler sees it through `cancelled`.
        let _ = self.tx.send(Event::Token {
            id,
            text: text.to_string(),
            logprob: logprob.cloned(),
        });
    }

    fn finish(&mut self, result: Result<Completion, InferenceError>) {
        let _ = self.tx.send(Event::Done(result));
    }

    fn cancelled(&self) -> bool {
        self.tx.is_closed()
    }
}

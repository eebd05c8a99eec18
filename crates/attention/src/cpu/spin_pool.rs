//! A pool of threads that spin between the kernels of a decode step: the integer products with ggml blocks, a
//! decode step's attention heads (flash and paged), the paged pool's row gathers and the middling element-wise
//! kernels.
//!
//! A decode step is ~200 small products of ~50 us each. Handed to rayon, each one wakes a pool thread that went
//! to sleep after the last (measured: 28% of a SmolLM2 step in the kernel scheduler, `sched_yield` and
//! wake-ups). These workers instead spin on one atomic word for a short while after each job, so the next
//! product, microseconds later, finds them awake, as llama.cpp's threads do between operations; after
//! [`SPIN`] without work they sleep on a condition variable and cost nothing.
//!
//! One word, `claim`, carries the job's epoch, its task count and the next unclaimed task. A thread owns task
//! `k` of epoch `e` only by moving the word from `(e, n, k)` to `(e, n, k + 1)`, so a thread holding a stale view
//! can never run a task of another job; and a job's closure is read only by a thread that owns one of its
//! tasks, while the dispatcher waits for every task to finish before the closure goes away.

use std::cell::UnsafeCell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock, TryLockError};
use std::time::{Duration, Instant};

/// How long an idle worker spins (yielding to other runnable threads) before it sleeps.
const SPIN: Duration = Duration::from_micros(300);

const TASK_BITS: u32 = 20;
const TASK_MASK: u64 = (1 << TASK_BITS) - 1;

/// The most tasks one job may have.
pub(crate) const MAX_TASKS: usize = TASK_MASK as usize;

fn pack(epoch: u64, tasks: u64, next: u64) -> u64 {
    (epoch << (2 * TASK_BITS)) | (tasks << TASK_BITS) | next
}

fn unpack(word: u64) -> (u64, u64, u64) {
    (
        word >> (2 * TASK_BITS),
        (word >> TASK_BITS) & TASK_MASK,
        word & TASK_MASK,
    )
}

/// The closure of the current job, erased to a raw pointer (valid while the job runs; see the module doc).
#[derive(Clone, Copy)]
struct JobRef(*const (dyn Fn(usize) + Sync));

struct Pool {
    claim: AtomicU64,
    job: UnsafeCell<Option<JobRef>>,
    completed: AtomicUsize,
    panicked: AtomicBool,
    sleepers: AtomicUsize,
    sleep: Mutex<()>,
    wake: Condvar,
    /// One dispatcher at a time; another caller meanwhile runs its job on the rayon pool.
    dispatch: Mutex<()>,
    workers: usize,
}

// SAFETY: `job` is written only by the dispatcher holding `dispatch`, between jobs (no task of the previous job
// is claimed or running), and read only by a thread that owns an unfinished task of the current job; the
// closure it points to is `Sync`.
unsafe impl Sync for Pool {}
unsafe impl Send for JobRef {}

static POOL: OnceLock<&'static Pool> = OnceLock::new();

fn pool() -> &'static Pool {
    POOL.get_or_init(|| {
        let workers = rayon::current_num_threads().saturating_sub(1);
        let pool: &'static Pool = Box::leak(Box::new(Pool {
            claim: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            completed: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
            dispatch: Mutex::new(()),
            workers,
        }));
        for i in 0..workers {
            let spawned = std::thread::Builder::new()
                .name(format!("ember-decode-{i}"))
                .spawn(move || pool.work());
            // Without the thread the pool still works: the dispatcher runs every task it cannot hand off.
            drop(spawned);
        }
        pool
    })
}

impl Pool {
    /// Claims and runs tasks of the job `word` belongs to until none is left; returns whether it ran any.
    fn run_tasks(&self, mut word: u64) -> bool {
        let mut ran = false;
        loop {
            let (epoch, tasks, next) = unpack(word);
            if next >= tasks {
                return ran;
            }
            match self.claim.compare_exchange_weak(
                word,
                pack(epoch, tasks, next + 1),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    // SAFETY: owning task `next` of this job keeps it unfinished, so the dispatcher neither
                    // rewrites `job` nor drops the closure until this task is counted complete below.
                    let job = unsafe { *self.job.get() };
                    if let Some(JobRef(f)) = job {
                        // SAFETY: as above, the closure outlives this call.
                        let f = unsafe { &*f };
                        if catch_unwind(AssertUnwindSafe(|| f(next as usize))).is_err() {
                            self.panicked.store(true, Ordering::Release);
                        }
                    }
                    self.completed.fetch_add(1, Ordering::AcqRel);
                    ran = true;
                    word = self.claim.load(Ordering::Acquire);
                }
                Err(current) => {
                    if unpack(current).0 != epoch {
                        return ran;
                    }
                    word = current;
                }
            }
        }
    }

    /// A worker's life: run what is claimable, spin a while for the next job, then sleep until one comes.
    fn work(&self) {
        let mut seen = unpack(self.claim.load(Ordering::Acquire)).0;
        loop {
            let started = Instant::now();
            let mut spins = 0u32;
            let word = loop {
                let word = self.claim.load(Ordering::Acquire);
                if unpack(word).0 != seen {
                    break Some(word);
                }
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(64) {
                    if started.elapsed() > SPIN {
                        break None;
                    }
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            };
            let word = word.unwrap_or_else(|| self.sleep_until_new(seen));
            seen = unpack(word).0;
            self.run_tasks(word);
        }
    }

    /// Sleeps until the epoch differs from `seen`; returns the new word.
    fn sleep_until_new(&self, seen: u64) -> u64 {
        let mut guard = self.sleep.lock().unwrap_or_else(|e| e.into_inner());
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let word = loop {
            let word = self.claim.load(Ordering::SeqCst);
            if unpack(word).0 != seen {
                break word;
            }
            guard = self.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
        };
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        word
    }
}

/// Runs `task(0..tasks)` across the calling thread and the spinning workers, returning once every task has run.
/// Returns `false` without running anything when the pool is busy with another caller's job or has no workers
/// (the caller then uses rayon), or when `tasks` is 0 or above [`MAX_TASKS`].
pub(crate) fn run(tasks: usize, task: &(dyn Fn(usize) + Sync)) -> bool {
    let pool = pool();
    if pool.workers == 0 || tasks == 0 || tasks > MAX_TASKS {
        return false;
    }
    let _dispatch = match pool.dispatch.try_lock() {
        Ok(guard) => guard,
        Err(TryLockError::WouldBlock) => return false,
        Err(TryLockError::Poisoned(e)) => e.into_inner(),
    };
    // SAFETY: the lifetime is erased for the duration of this call only: every task that reads the pointer has
    // completed before this function returns (the wait below), and no task of an earlier job is still running.
    let erased: *const (dyn Fn(usize) + Sync) = unsafe {
        std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const (dyn Fn(usize) + Sync)>(
            task,
        )
    };
    // SAFETY: no task is claimable or running between jobs, and `dispatch` excludes other dispatchers.
    unsafe { *pool.job.get() = Some(JobRef(erased)) };
    pool.completed.store(0, Ordering::Release);
    pool.panicked.store(false, Ordering::Release);
    let epoch = unpack(pool.claim.load(Ordering::Acquire)).0.wrapping_add(1) & ((1 << 24) - 1);
    let word = pack(epoch, tasks as u64, 0);
    pool.claim.store(word, Ordering::SeqCst);
    if pool.sleepers.load(Ordering::SeqCst) > 0 {
        let _guard = pool.sleep.lock().unwrap_or_else(|e| e.into_inner());
        pool.wake.notify_all();
    }
    pool.run_tasks(word);
    while pool.completed.load(Ordering::Acquire) < tasks {
        std::hint::spin_loop();
    }
    // SAFETY: every task has completed; nothing reads the job until the next dispatch rewrites it.
    unsafe { *pool.job.get() = None };
    if pool.panicked.load(Ordering::Acquire) {
        panic!("a decode kernel task panicked on a pool thread");
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_exactly_once_across_many_jobs() {
        for tasks in [1usize, 2, 3, 17, 200] {
            for _ in 0..200 {
                let counts: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
                let ran = run(tasks, &|t| {
                    counts[t].fetch_add(1, Ordering::Relaxed);
                });
                if !ran {
                    // A single-threaded pool: nothing to test beyond the refusal.
                    return;
                }
                assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
            }
        }
    }

    #[test]
    fn a_sleeping_pool_wakes_for_the_next_job() {
        let done = AtomicUsize::new(0);
        std::thread::sleep(SPIN * 4);
        if run(8, &|_| {
            done.fetch_add(1, Ordering::Relaxed);
        }) {
            assert_eq!(done.load(Ordering::Relaxed), 8);
        }
    }
}

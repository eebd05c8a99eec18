//! A background thread that builds training batches ahead of the trainer.

use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use crate::batch::{Batch, RandomBatches, ReaderState};
use crate::error::Result;

/// Hands out the batches of a [`RandomBatches`] reader, built up to `depth` batches ahead on a background thread,
/// so reading the mapped shards (and page faults) overlaps with the training step.
///
/// The batches are exactly those the reader itself would give, in the same order, and [`Prefetcher::state`] is
/// the position of the next batch *handed out* (not of the thread's lookahead), so a checkpoint taken between
/// steps resumes without skipping or repeating a batch.
pub struct Prefetcher {
    /// The reader at the consumer's position; used to report state and as a fallback if the thread is gone.
    reader: RandomBatches,
    receiver: Option<Receiver<(u64, Result<Batch>)>>,
    worker: Option<JoinHandle<()>>,
}

impl Prefetcher {
    /// Starts a thread that builds `reader`'s batches, keeping up to `depth` (at least 1) ready.
    pub fn spawn(reader: RandomBatches, depth: usize) -> Self {
        let (sender, receiver) = sync_channel(depth.max(1));
        let ahead = reader.clone();
        let worker = std::thread::Builder::new()
            .name("ember-prefetch".into())
            .spawn(move || produce(ahead, sender))
            .ok();
        // Without a thread (spawn refused by the OS) the receiver would never yield; `next_batch` then builds
        // batches inline.
        let receiver = worker.as_ref().map(|_| receiver);
        Self {
            reader,
            receiver,
            worker,
        }
    }

    /// The next batch.
    pub fn next_batch(&mut self) -> Result<Batch> {
        let expected = self.reader.state().next_batch;
        let received = self.receiver.as_ref().and_then(|r| r.recv().ok());
        let batch = match received {
            Some((index, batch)) if index == expected => batch,
            // The worker stopped (it only does so on a panic): build the batch here rather than fail training.
            _ => {
                self.receiver = None;
                self.reader.batch_at(expected)
            }
        };
        self.reader.advance();
        batch
    }

    /// The reader position to save in a checkpoint.
    pub fn state(&self) -> ReaderState {
        self.reader.state()
    }
}

fn produce(mut reader: RandomBatches, sender: SyncSender<(u64, Result<Batch>)>) {
    loop {
        let index = reader.state().next_batch;
        let batch = reader.batch_at(index);
        reader.advance();
        // A send error means the consumer is gone: stop.
        if sender.send((index, batch)).is_err() {
            return;
        }
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        // Dropping the receiver makes the worker's pending or next `send` fail, which ends its loop.
        self.receiver = None;
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

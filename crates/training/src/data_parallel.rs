//! Data-parallel gradients on burn's collective engine (`burn-collective`): one model replica per device, each
//! computing the gradients of its share of every batch, averaged across replicas with an all-reduce.
//!
//! The trainer's thread is replica 0 and owns the model and optimizer; replicas 1.. run on worker threads. Each
//! optimiser step sends every worker the current model (a cheap clone: parameters are shared, immutable tensors),
//! which it forks onto its device so that its autodiff graph is its own. Every replica all-reduces its gradients
//! (a sum, parameters in name order) and replica 0 applies AdamW.
//!
//! `batch_size` is the global batch: every machine draws the same rows (the same data seed), takes the share of
//! its rank and splits it among its replicas. Each replica scales its mean loss by its share of the batch's counted targets before
//! the backward pass, so the summed gradients are those of the whole batch's mean loss: N replicas (on any number
//! of machines) follow the single-device run of the same batch up to floating-point summation order, and a run
//! resumes on any number of machines from the same data position.
//!
//! burn-collective keeps one session per backend type and process, so [`DataParallel`] takes a process-wide lock:
//! a second data-parallel run in the same process waits for the first to finish.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;

use burn::module::AutodiffModule;
use burn::tensor::backend::{AutodiffBackend, Backend, Device as _, DeviceId};
use burn::tensor::{Tensor, TensorPrimitive};
use burn_collective::{
    CollectiveConfig, CollectiveError, GlobalCollectiveError, PeerId, ReduceOperation, all_reduce,
    finish_collective, register, reset_collective,
};

use crate::backprop::{Backprop, micro_batch_gradients};
use crate::loss::counted_targets;
use crate::model_io::TrainableModel;
use crate::params::Gradients;
use crate::{StopReason, TrainError};

/// Where the replicas of a data-parallel run live.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DataParallelSettings {
    /// One entry per replica, the first being the model's own device. Empty, or a single entry, trains on the
    /// model's device alone. On a CPU backend every entry is the one CPU device: the replicas are threads.
    pub devices: Vec<DeviceId>,
    /// Several machines, each running this many `devices`, joined through a burn-collective orchestrator.
    pub nodes: Option<NodeSettings>,
}

impl DataParallelSettings {
    /// Replicas on this machine (at least 1).
    pub fn replicas(&self) -> usize {
        self.devices.len().max(1)
    }
}

/// One machine's place in a multi-machine run (burn-collective's global level). A run config's `training.nodes`
/// deserializes into it directly; every field is required (no machine's rank or address has a safe default).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSettings {
    /// Machines taking part (each with its own `address`, `data_port` and `rank`, everything else the same).
    pub count: u32,
    /// WebSocket address of the orchestrator every node registers with, e.g. `ws://10.0.0.1:3000`.
    pub orchestrator: String,
    /// This node's own address as the others reach it, e.g. `ws://10.0.0.2:3001`.
    pub address: String,
    /// Port of this node's tensor data service, which `address` reaches.
    pub data_port: u16,
    /// This machine's index, `0..count`: which share of every global batch it trains on.
    pub rank: u32,
}

/// One data-parallel step's result, the same on every replica of every machine.
pub struct ParallelStep<B: Backend> {
    /// The whole batch's mean loss.
    pub loss: f64,
    /// The gradients of that loss.
    pub gradients: Gradients<B>,
    /// A stop some replica requested with this step (a Ctrl-C or time limit on one machine), which every machine
    /// then acts on: `Interrupted` when any machine was interrupted.
    pub stop: Option<StopReason>,
}

/// One step's work for a worker replica.
struct Job<M> {
    model: M,
    /// The worker's rows of each micro-batch, with what their mean loss is multiplied by (see
    /// [`shard_gradients`]).
    shards: Vec<(Vec<u32>, f64)>,
    backprop: Backprop,
}

struct Worker<M> {
    jobs: Sender<Job<M>>,
    /// Whether the worker's step (forward, backward and all-reduces) succeeded.
    results: Receiver<Result<(), String>>,
    thread: JoinHandle<()>,
}

/// A running data-parallel session: the worker replicas and their collective registration.
pub struct DataParallel<AB: AutodiffBackend, M> {
    workers: Vec<Worker<M>>,
    devices: Vec<AB::Device>,
    /// This machine's rank and the machine count (`(0, 1)` on one machine).
    node: (usize, usize),
    /// CPU kernel threads each replica uses ([`ember_attention::with_kernel_threads`]).
    kernel_threads: usize,
    _session: MutexGuard<'static, ()>,
}

/// burn-collective's server is one per backend type and process; a run holds this for its lifetime.
static SESSION: Mutex<()> = Mutex::new(());

fn collective_error(what: &str, error: impl std::fmt::Debug) -> TrainError {
    TrainError::External {
        context: format!("data-parallel {what}"),
        source: format!("{error:?}").into(),
    }
}

impl<AB, M> DataParallel<AB, M>
where
    AB: AutodiffBackend,
    M: AutodiffModule<AB> + TrainableModel<AB> + Send + 'static,
{
    /// Starts one worker thread per device after the first and registers every replica with burn-collective.
    /// Returns `None` when the settings ask for a single replica on a single node.
    pub fn start(settings: &DataParallelSettings) -> Result<Option<Self>, TrainError> {
        if settings.replicas() == 1 && settings.nodes.is_none() {
            return Ok(None);
        }
        let node = match &settings.nodes {
            Some(nodes) if nodes.rank >= nodes.count => {
                return Err(TrainError::Unsupported {
                    key: "training.nodes.rank".into(),
                    message: format!(
                        "expected a rank below the machine count {}, found {}",
                        nodes.count, nodes.rank
                    ),
                });
            }
            Some(nodes) => (nodes.rank as usize, nodes.count as usize),
            None => (0, 1),
        };
        let session = SESSION
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        reset_collective::<AB::InnerBackend>();
        let config = collective_config(settings)?;
        let devices: Vec<AB::Device> = if settings.devices.is_empty() {
            vec![AB::Device::default()]
        } else {
            settings
                .devices
                .iter()
                .map(|&id| AB::Device::from_id(id))
                .collect()
        };
        // Replicas on one CPU split its cores rather than all handing their products to one shared pool.
        let kernel_threads = (ember_attention::kernel_threads() / devices.len()).max(1);
        let mut workers = Vec::with_capacity(devices.len() - 1);
        for (index, device) in devices.iter().enumerate().skip(1) {
            let (jobs, job_rx) = channel::<Job<M>>();
            let (result_tx, results) = channel();
            let device = device.clone();
            let config = config.clone();
            let peer = PeerId::from(index as u32);
            let thread = std::thread::Builder::new()
                .name(format!("ember-replica-{index}"))
                .spawn(move || {
                    ember_attention::with_kernel_threads(kernel_threads, || {
                        worker_loop::<AB, M>(peer, device, config, job_rx, result_tx)
                    })
                })
                .map_err(|e| collective_error("worker start", e))?;
            workers.push(Worker {
                jobs,
                results,
                thread,
            });
        }
        register::<AB::InnerBackend>(PeerId::from(0), devices[0].clone(), config)
            .map_err(|e| collective_error("registration", e))?;
        Ok(Some(DataParallel {
            workers,
            devices,
            node,
            kernel_threads,
            _session: session,
        }))
    }

    /// Replicas on this machine.
    pub fn replicas(&self) -> usize {
        self.devices.len()
    }

    /// The gradients of one optimiser step's whole batch (every replica on every machine) and its mean loss.
    ///
    /// `micro_batches` are the global batch's micro-batches of `rows x (backprop.block_size + 1)` tokens, the same on every
    /// machine; this machine trains on its rank's share of each, split row-wise into one equal shard per replica
    /// (the row count must divide evenly). Replica 0's shard runs on this thread. `stop` is this machine's request
    /// to stop after this step ([`StopReason::Interrupted`] or [`StopReason::TimeLimit`]), shared with the others.
    pub fn gradients(
        &mut self,
        model: &M,
        micro_batches: &[Vec<u32>],
        backprop: Backprop,
        stop: Option<StopReason>,
    ) -> Result<ParallelStep<AB::InnerBackend>, TrainError> {
        let block_size = backprop.block_size;
        let replicas = self.replicas();
        let (rank, machines) = self.node;
        let shares = replicas * machines;
        let width = block_size + 1;
        let mut shards: Vec<Vec<(Vec<u32>, f64)>> =
            vec![Vec::with_capacity(micro_batches.len()); replicas];
        // Every machine holds the whole step's rows, so each shard's weight is its share of all the step's
        // targets (equal shares for text; chat rows differ in how many reply tokens they hold).
        let total = micro_batches
            .iter()
            .map(|rows| counted_targets(rows, block_size))
            .sum::<usize>()
            .max(1) as f64;
        for rows in micro_batches {
            let batch = rows.len() / width;
            if !batch.is_multiple_of(shares) {
                let across = if machines > 1 {
                    format!("{replicas} data-parallel replicas on each of {machines} machines")
                } else {
                    format!("{replicas} data-parallel replicas")
                };
                return Err(TrainError::Unsupported {
                    key: "training.batch_size".into(),
                    message: format!(
                        "{batch} rows per micro-batch cannot be split evenly across {across}"
                    ),
                });
            }
            let per = batch / shares * width;
            let own = &rows[rank * per * replicas..(rank + 1) * per * replicas];
            for (replica, shard) in own.chunks_exact(per).enumerate() {
                let weight = counted_targets(shard, block_size) as f64 / total;
                shards[replica].push((shard.to_vec(), weight));
            }
        }
        let mut shards = shards.into_iter();
        let own = shards.next().unwrap_or_default();
        for (worker, shard) in self.workers.iter().zip(shards) {
            worker
                .jobs
                .send(Job {
                    model: model.clone(),
                    shards: shard,
                    backprop,
                })
                .map_err(|_| collective_error("step", "a worker replica stopped"))?;
        }
        let device = self.devices[0].clone();
        let local = catch_unwind(AssertUnwindSafe(|| {
            ember_attention::with_kernel_threads(self.kernel_threads, || {
                shard_gradients::<AB, M>(model, &own, backprop, &device)
            })
        }))
        .unwrap_or_else(|panic| Err(panic_message(panic)));
        let reduced = reduce_step::<AB::InnerBackend>(PeerId::from(0), local, stop, &device);
        let mut first_error = None;
        for worker in &self.workers {
            match worker.results.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(_) => {
                    first_error.get_or_insert("a worker replica stopped".into());
                }
            }
        }
        // A worker's own error says more than replica 0's "another replica failed".
        match (reduced, first_error) {
            (Ok(step), None) => Ok(step),
            (_, Some(message)) | (Err(message), None) => Err(TrainError::External {
                context: "data-parallel step".into(),
                source: message.into(),
            }),
        }
    }
}

impl<AB: AutodiffBackend, M> Drop for DataParallel<AB, M> {
    fn drop(&mut self) {
        for worker in self.workers.drain(..) {
            drop(worker.jobs);
            let _ = worker.thread.join();
        }
        // burn-collective's client unwraps its send to the collective server, which panics if that server's
        // thread is gone (after a lost peer); a panic while a failed step unwinds would abort the process.
        let _ = catch_unwind(|| finish_collective::<AB::InnerBackend>(PeerId::from(0)));
    }
}

fn collective_config(settings: &DataParallelSettings) -> Result<CollectiveConfig, TrainError> {
    let config = CollectiveConfig::default().with_num_devices(settings.replicas());
    let Some(nodes) = &settings.nodes else {
        return Ok(config);
    };
    let address = |key: &str, value: &str| {
        value.parse().map_err(|e: String| TrainError::Unsupported {
            key: format!("training.nodes.{key}"),
            message: format!("`{value}` is not an address: {e}"),
        })
    };
    Ok(config
        .with_num_nodes(nodes.count)
        .with_global_address(address("orchestrator", &nodes.orchestrator)?)
        .with_node_address(address("address", &nodes.address)?)
        .with_data_service_port(nodes.data_port))
}

fn worker_loop<AB, M>(
    peer: PeerId,
    device: AB::Device,
    config: CollectiveConfig,
    jobs: Receiver<Job<M>>,
    results: Sender<Result<(), String>>,
) where
    AB: AutodiffBackend,
    M: AutodiffModule<AB> + TrainableModel<AB>,
{
    if let Err(e) = register::<AB::InnerBackend>(peer, device.clone(), config) {
        let _ = results.send(Err(format!("registering replica {peer}: {e:?}")));
        return;
    }
    for job in jobs {
        let local = catch_unwind(AssertUnwindSafe(|| {
            // Forking gives the replica its own autodiff leaves on its device, so its backward pass never touches
            // the graph of the trainer's thread.
            let model = job.model.fork(&device);
            shard_gradients::<AB, M>(&model, &job.shards, job.backprop, &device)
        }))
        .unwrap_or_else(|panic| Err(panic_message(panic)));
        let result = reduce_step::<AB::InnerBackend>(peer, local, None, &device).map(|_| ());
        if results.send(result).is_err() {
            break;
        }
    }
    let _ = finish_collective::<AB::InnerBackend>(peer);
}

/// Forward and backward of one replica's shards: the summed loss and the accumulated gradients, each shard's mean
/// loss multiplied by its weight (its fraction of the step's counted targets) first, so that the sum over every
/// replica is the step's mean loss and its gradient.
fn shard_gradients<AB, M>(
    model: &M,
    shards: &[(Vec<u32>, f64)],
    backprop: Backprop,
    device: &AB::Device,
) -> Result<(f64, Gradients<AB::InnerBackend>), String>
where
    AB: AutodiffBackend,
    M: AutodiffModule<AB> + TrainableModel<AB>,
{
    let mut grads: Option<Gradients<AB::InnerBackend>> = None;
    let mut loss_sum = 0.0;
    for (rows, weight) in shards {
        let (loss, micro) = micro_batch_gradients::<AB, M>(model, rows, *weight, backprop, device)
            .map_err(|e| format!("forward pass: {e}"))?;
        loss_sum += loss;
        match grads.as_mut() {
            Some(total) => total.accumulate(micro),
            None => grads = Some(micro),
        }
    }
    grads
        .map(|g| (loss_sum, g))
        .ok_or_else(|| "a replica received no rows".to_string())
}

/// All-reduces one replica's step and returns the step over every replica. Every replica first all-reduces its
/// status in one tensor (failure flag, scaled loss, stop requests), so that when one replica's forward pass failed
/// none of them waits forever in the gradient all-reduce; then its gradients, concatenated in parameter-name order
/// (the same order on every replica). Sums: each replica scaled its loss by its share of the batch.
fn reduce_step<B: Backend>(
    peer: PeerId,
    local: Result<(f64, Gradients<B>), String>,
    stop: Option<StopReason>,
    device: &B::Device,
) -> Result<ParallelStep<B>, String> {
    let (failed, loss) = match &local {
        Ok((loss, _)) => (0.0, *loss as f32),
        Err(_) => (1.0, 0.0),
    };
    let requested = |reason| if stop == Some(reason) { 1.0 } else { 0.0 };
    let status = Tensor::<B, 1>::from_floats(
        [
            failed,
            loss,
            requested(StopReason::Interrupted),
            requested(StopReason::TimeLimit),
        ],
        device,
    );
    let status = reduce_tensor(peer, status, ReduceOperation::Sum)
        .map_err(|e| format!("all-reduce: {e}"))?
        .into_data()
        .to_vec::<f32>()
        .map_err(|e| format!("all-reduce: {e:?}"))?;
    let (_, grads) = local?;
    if status[0] > 0.0 {
        return Err("another replica failed".into());
    }
    // One all-reduce of every gradient back to back rather than one per parameter: each collective operation has a
    // fixed cost (a round of messages between the replicas, and between machines a sync over the network) that
    // dominated a step of a small model (measured on two loopback machines: 6,530 vs 9,614 tokens/s for the
    // same two replicas as threads, with 39 all-reduces a step).
    let tensors = grads.into_tensors();
    let lengths: Vec<(String, usize)> = tensors
        .iter()
        .map(|(name, grad)| (name.clone(), grad.dims()[0]))
        .collect();
    let flat = Tensor::cat(tensors.into_values().collect(), 0);
    let sum = reduce_tensor(peer, flat, ReduceOperation::Sum)
        .map_err(|e| format!("all-reduce of the gradients: {e}"))?;
    let mut reduced = std::collections::BTreeMap::new();
    let mut start = 0;
    for (name, len) in lengths {
        reduced.insert(name, sum.clone().slice(start..start + len));
        start += len;
    }
    let stop = if status[2] > 0.0 {
        Some(StopReason::Interrupted)
    } else if status[3] > 0.0 {
        Some(StopReason::TimeLimit)
    } else {
        None
    };
    Ok(ParallelStep {
        loss: f64::from(status[1]),
        gradients: Gradients::from_tensors(reduced),
        stop,
    })
}

/// burn-collective's all-reduce between machines is a ring: it splits each tensor into one slice per machine and
/// refuses tensors with fewer elements than machines. Shorter tensors are zero-padded to this length (which bounds
/// the machines a run can have with tensors this small; every real parameter is far larger).
const MIN_REDUCED_LEN: usize = 64;

/// All-reduces a flat tensor, padding it to [`MIN_REDUCED_LEN`] elements first when it is shorter.
fn reduce_tensor<B: Backend>(
    peer: PeerId,
    tensor: Tensor<B, 1>,
    op: ReduceOperation,
) -> Result<Tensor<B, 1>, String> {
    let len = tensor.dims()[0];
    let padded = if len < MIN_REDUCED_LEN {
        let zeros = Tensor::zeros([MIN_REDUCED_LEN - len], &tensor.device());
        Tensor::cat(vec![tensor, zeros], 0)
    } else {
        tensor
    };
    let reduced = all_reduce::<B>(peer, padded.into_primitive().tensor(), op).map_err(describe)?;
    let reduced = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(reduced));
    Ok(if len < MIN_REDUCED_LEN {
        reduced.narrow(0, 0, len)
    } else {
        reduced
    })
}

/// A failed collective operation in words; a machine that went away is the failure a user can act on.
fn describe(error: CollectiveError) -> String {
    match error {
        CollectiveError::Global(GlobalCollectiveError::PeerLost(node)) => format!(
            "lost the connection to another machine of the run ({node:?}): did its process stop? This machine \
             stops too; resume every machine from its last checkpoint with --resume"
        ),
        other => format!("{other:?}"),
    }
}

fn panic_message(panic: Box<dyn std::any::Any + Send>) -> String {
    let text = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into());
    format!("a replica panicked: {text}")
}

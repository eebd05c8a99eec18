//! `ember serve`: the OpenAI-compatible HTTP server ([`ember_server`]) over any model `generate` accepts. The
//! model's worker runs on this thread (continuous batching over one paged KV pool); the HTTP side runs on a tokio
//! runtime on its own thread until Ctrl-C or SIGTERM.

use std::net::TcpListener;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use ember_inference::{ModelAssets, SchedulerConfig, TransformerLm};
use ember_model::EmberBackend;
use ember_server::{Engine, Metrics, ServedModel, ServerState};

use super::model_args::ModelArgs;
use crate::Context;
use crate::backend::BackendJob;

/// Flags of `ember serve`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on; 127.0.0.1 keeps the server local (0.0.0.0 exposes it to the network).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// TCP port to listen on.
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Requests decoded together at most; the rest wait in the queue.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub max_batch: u32,
    /// Requests waiting for a place in the batch before new ones are refused with 429.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_queue: u32,
    /// MiB of KV cache shared by all requests (the pool grows on demand up to this).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
    pub kv_budget_mib: u64,
    /// Positions per KV block (the unit of allocation and of prefix reuse).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub block_size: u32,
    /// Prompt tokens prefilled per step, the prompts of a step counted as padded to the longest: the most
    /// newcomers delay the running requests by.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub prefill_chunk: u32,
    /// Finished sequences kept for prefix reuse (0 turns the prefix cache off).
    #[arg(long, default_value_t = 64)]
    pub prefix_cache: u32,
    /// Require `Authorization: Bearer KEY` on every route but /health.
    #[arg(long, env = "EMBER_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// The model's name in the API [default: the model path's file name without extension].
    #[arg(long)]
    pub model_name: Option<String>,
}

fn default_name(path: &Path) -> String {
    path.file_stem()
        .or_else(|| path.file_name())
        .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned())
}

struct ServeJob {
    assets: ModelAssets,
    args: Args,
    listener: TcpListener,
    quiet: bool,
}

impl BackendJob for ServeJob {
    type Output = anyhow::Result<()>;

    fn run<B: EmberBackend>(self, device: B::Device) -> Self::Output {
        let ServeJob {
            mut assets,
            args,
            listener,
            quiet,
        } = self;
        let model = args.model.load::<B>(&assets, &device, quiet)?;
        let lm = TransformerLm::new(model, device);
        let Some(tokenizer) = assets.tokenizer.take().map(Arc::new) else {
            bail!(
                "{}: the model has no tokenizer; ember serve needs one to read prompts",
                args.model.model.display()
            );
        };
        let config = SchedulerConfig {
            max_batch: args.max_batch as usize,
            prefill_chunk: args.prefill_chunk as usize,
            block_size: args.block_size as usize,
            kv_budget_bytes: usize::try_from(args.kv_budget_mib << 20).unwrap_or(usize::MAX),
            max_cached_prefixes: args.prefix_cache as usize,
        };
        let name = args
            .model_name
            .clone()
            .unwrap_or_else(|| default_name(&args.model.model));
        let served = ServedModel {
            id: name.clone(),
            tokenizer: tokenizer.clone(),
            chat_template: assets.chat_template.take(),
            eos: assets.eos.clone(),
            context_length: assets.spec.context_length,
            block_size: config.block_size,
        };
        let metrics = Arc::new(Metrics::default());
        let (engine, worker) = Engine::new(args.max_queue as usize, metrics.clone());
        let state = ServerState::new(served, engine, metrics, args.api_key.clone());
        let address = listener.local_addr().map_or_else(
            |_| format!("{}:{}", args.host, args.port),
            |a| a.to_string(),
        );
        listener
            .set_nonblocking(true)
            .context("setting the listening socket non-blocking")?;
        let http = std::thread::Builder::new()
            .name("ember-http".into())
            .spawn(move || -> anyhow::Result<()> {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .context("starting the server's async runtime")?;
                runtime.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener)
                        .context("handing the listening socket to tokio")?;
                    ember_server::serve(listener, ember_server::router(state), shutdown_signal())
                        .await
                        .context("serving HTTP")
                })
            })
            .context("starting the HTTP thread")?;
        if !quiet {
            stderr!(
                "serving `{name}` on http://{address} (OpenAI API under /v1, metrics at /metrics; Ctrl-C stops)"
            );
        }
        // Returns once the HTTP side has stopped and dropped its engine handle.
        worker
            .run(&lm, Some(&tokenizer), config)
            .context("the model worker stopped")?;
        http.join()
            .map_err(|_| anyhow::anyhow!("the HTTP thread panicked"))?
    }
}

/// Completes on Ctrl-C or (on Unix) SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}

/// Runs `ember serve` until interrupted.
pub fn run(args: Args, ctx: &Context) -> anyhow::Result<()> {
    // Bound before the model loads, so a port in use fails in a second, not after the weights are read.
    let listener = TcpListener::bind((args.host.as_str(), args.port)).with_context(|| {
        format!(
            "--host {} --port {}: cannot listen there",
            args.host, args.port
        )
    })?;
    let assets = args.model.open()?;
    let job = ServeJob {
        assets,
        args,
        listener,
        quiet: ctx.quiet,
    };
    ctx.dispatch(None, job)?
}

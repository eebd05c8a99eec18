//! ember's OpenAI-compatible HTTP server: `POST /v1/chat/completions` (streaming as server-sent events),
//! `POST /v1/completions`, `GET /v1/models`, `GET /health` and `GET /metrics` (Prometheus text), over the
//! continuous-batching [`ember_inference::Scheduler`].
//!
//! The HTTP side ([`router`]) runs on tokio and never touches tensors: it validates a request, renders and
//! tokenizes it, and hands it to the [`Engine`], a queue in front of the one worker thread that owns the model and
//! its KV pool ([`Worker::run`]). Tokens come back over a channel per request; a client that disconnects drops
//! its end, which cancels the request at the scheduler's next step.
//!
//! A separate crate (not the binary) so the whole HTTP surface is testable in-process with a tiny model, and so
//! an embedder can mount the router in its own axum app; the binary only parses flags and loads the model.

mod api;
mod engine;
mod error;
mod metrics;
mod response;
mod routes;
mod stream;

pub use engine::{Engine, Event, Worker};
pub use error::ApiError;
pub use metrics::Metrics;
pub use routes::{ServedModel, ServerState, router};

/// Serves `router` on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

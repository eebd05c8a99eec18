//! The in-process server the HTTP tests drive: the model crate's tiny llama.cpp-converted LLaMA (a byte-level
//! BPE tokenizer and a ChatML template) on the CPU backend behind the axum router, a request helper per method,
//! and the oracle a greedy reply is compared with.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use burn::backend::Flex;
use ember_inference::sampling::SamplingConfig;
use ember_inference::{
    GenerationConfig, Message, ModelAssets, PooledDecoder, SchedulerConfig, TransformerLm, generate,
};
use ember_server::{Engine, Metrics, ServedModel, ServerState, router};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

pub fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../model/tests/fixtures/gguf_families/llama.gguf.bin")
}

pub fn load() -> (ModelAssets, TransformerLm<Flex>) {
    let assets = ModelAssets::open(&fixture()).unwrap();
    let device = Default::default();
    let model = assets.load::<Flex>(&device, None).unwrap();
    (assets, TransformerLm::new(model, device))
}

/// The router of a server, driven in-process.
pub struct Server {
    /// The routes over the server's state.
    pub router: Router,
}

pub fn server(config: SchedulerConfig, max_queue: usize, api_key: Option<&str>) -> Server {
    let (server, start) = unstarted_server(config, max_queue, api_key);
    start();
    server
}

/// A server whose model worker starts when the returned closure is called: until then every request it accepts
/// stays queued.
pub fn unstarted_server(
    config: SchedulerConfig,
    max_queue: usize,
    api_key: Option<&str>,
) -> (Server, impl FnOnce()) {
    unstarted_server_over(config, max_queue, api_key, |lm| lm)
}

/// [`unstarted_server`] whose worker runs the model `wrap` makes of the tiny one.
pub fn unstarted_server_over<M: PooledDecoder + 'static>(
    config: SchedulerConfig,
    max_queue: usize,
    api_key: Option<&str>,
    wrap: impl FnOnce(TransformerLm<Flex>) -> M + Send + 'static,
) -> (Server, impl FnOnce()) {
    let (mut assets, _) = load();
    let metrics = Arc::new(Metrics::default());
    let (engine, worker) = Engine::new(max_queue, metrics.clone());
    let served = ServedModel {
        id: "tiny".into(),
        tokenizer: Arc::new(assets.tokenizer.take().unwrap()),
        chat_template: assets.chat_template.take(),
        eos: assets.eos.clone(),
        context_length: assets.spec.context_length,
        block_size: config.block_size,
    };
    // The worker owns its own copy of the model, as `ember serve`'s main thread does; it stops when the router
    // (and with it the engine) is dropped at the end of the test.
    let start = move || {
        std::thread::spawn(move || {
            let (assets, lm) = load();
            worker
                .run(&wrap(lm), assets.tokenizer.as_ref(), config)
                .unwrap();
        });
    };
    let state = ServerState::new(served, engine, metrics, api_key.map(String::from));
    (
        Server {
            router: router(state),
        },
        start,
    )
}

pub fn default_server() -> Server {
    server(
        SchedulerConfig {
            block_size: 4,
            kv_budget_bytes: 64 << 20,
            ..SchedulerConfig::default()
        },
        64,
        None,
    )
}

impl Server {
    pub async fn send(&self, request: Request<Body>) -> (StatusCode, String) {
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    pub async fn post(&self, path: &str, body: &str) -> (StatusCode, String) {
        self.send(
            Request::post(path)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body.to_string()))
                .unwrap(),
        )
        .await
    }

    pub async fn post_json(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let (status, text) = self.post(path, &body.to_string()).await;
        (
            status,
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")),
        )
    }

    pub async fn get(&self, path: &str) -> (StatusCode, String) {
        self.send(Request::get(path).body(Body::empty()).unwrap())
            .await
    }

    pub async fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.get("/metrics").await;
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no metric {name} in\n{text}"))
    }
}

/// What `ember generate --chat --temperature 0` produces for `messages`: the same template, tokenizer and EOS ids,
/// batch generation on a contiguous cache.
pub fn generate_alone(
    messages: &[Message],
    max_new_tokens: usize,
) -> (String, usize, &'static str) {
    let (assets, lm) = load();
    let tokenizer = assets.tokenizer.as_ref().unwrap();
    let text = assets
        .chat_template
        .as_ref()
        .unwrap()
        .render(messages, true)
        .unwrap();
    let prompt = tokenizer.encode(&text).unwrap();
    let config = GenerationConfig {
        max_new_tokens,
        sampling: SamplingConfig::greedy(),
        eos: assets.eos.clone(),
        ..GenerationConfig::default()
    };
    let g = generate(&lm, Some(tokenizer), &[prompt], &config, &mut |_, _| {})
        .unwrap()
        .remove(0);
    let finish = match g.finish_reason {
        ember_inference::FinishReason::Length => "length",
        _ => "stop",
    };
    (g.text, g.ids.len(), finish)
}

pub fn chat_body(user: &str, max_tokens: usize) -> Value {
    json!({"model": "tiny", "messages": [{"role": "user", "content": user}], "max_tokens": max_tokens,
           "temperature": 0})
}

pub async fn wait_for(s: &Server, name: &str, value: f64) {
    let start = Instant::now();
    while s.metric(name).await != value {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{name} never reached {value}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

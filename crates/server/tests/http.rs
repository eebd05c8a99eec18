//! The HTTP API in-process: every endpoint and error through the axum router, with a tiny random LLaMA converted
//! to GGUF by llama.cpp (the model crate's fixture; it has a byte-level BPE tokenizer and a ChatML template) on the
//! CPU backend. Greedy outputs are compared with `ember_inference::generate` run on the same prompt alone, which
//! is what `ember generate --chat --temperature 0` runs.

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use burn::backend::Flex;
use ember_inference::sampling::SamplingConfig;
use ember_inference::{
    GenerationConfig, InferenceError, Message, ModelAssets, PooledDecoder, SchedulerConfig,
    TransformerLm, generate,
};
use ember_optimization::{PagedKvPool, SeqId};
use ember_server::{Engine, Metrics, ServedModel, ServerState, router};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../model/tests/fixtures/gguf_families/llama.gguf.bin")
}

fn load() -> (ModelAssets, TransformerLm<Flex>) {
    let assets = ModelAssets::open(&fixture()).unwrap();
    let device = Default::default();
    let model = assets.load::<Flex>(&device, None).unwrap();
    (assets, TransformerLm::new(model, device))
}

struct Server {
    router: Router,
}

fn server(config: SchedulerConfig, max_queue: usize, api_key: Option<&str>) -> Server {
    let (server, start) = unstarted_server(config, max_queue, api_key);
    start();
    server
}

/// A server whose model worker starts when the returned closure is called: until then every request it accepts
/// stays queued.
fn unstarted_server(
    config: SchedulerConfig,
    max_queue: usize,
    api_key: Option<&str>,
) -> (Server, impl FnOnce()) {
    unstarted_server_over(config, max_queue, api_key, |lm| lm)
}

/// [`unstarted_server`] whose worker runs the model `wrap` makes of the tiny one.
fn unstarted_server_over<M: PooledDecoder + 'static>(
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

fn default_server() -> Server {
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
    async fn send(&self, request: Request<Body>) -> (StatusCode, String) {
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    async fn post(&self, path: &str, body: &str) -> (StatusCode, String) {
        self.send(
            Request::post(path)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body.to_string()))
                .unwrap(),
        )
        .await
    }

    async fn post_json(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let (status, text) = self.post(path, &body.to_string()).await;
        (
            status,
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")),
        )
    }

    async fn get(&self, path: &str) -> (StatusCode, String) {
        self.send(Request::get(path).body(Body::empty()).unwrap())
            .await
    }

    async fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.get("/metrics").await;
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no metric {name} in\n{text}"))
    }
}

/// What `ember generate --chat --temperature 0` produces for `messages`: the same template, tokenizer and EOS ids,
/// batch generation on a contiguous cache.
fn generate_alone(messages: &[Message], max_new_tokens: usize) -> (String, usize, &'static str) {
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

fn chat_body(user: &str, max_tokens: usize) -> Value {
    json!({"model": "tiny", "messages": [{"role": "user", "content": user}], "max_tokens": max_tokens,
           "temperature": 0})
}

/// Greedy text must be equal, not close: the batched paged step and the lone contiguous one differ only in f32
/// summation order, far below the random model's top-2 logit gaps.
#[tokio::test]
async fn chat_completion_equals_generate_and_reports_usage() {
    let s = default_server();
    let (status, body) = s
        .post_json("/v1/chat/completions", chat_body("Hello there", 10))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (text, n, finish) = generate_alone(&[Message::new("user", "Hello there")], 10);
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "tiny");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(body["choices"][0]["message"]["content"], text);
    assert_eq!(body["choices"][0]["finish_reason"], finish);
    assert_eq!(body["usage"]["completion_tokens"], n);
    let prompt = body["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt > 5);
    assert_eq!(
        body["usage"]["total_tokens"].as_u64().unwrap(),
        prompt + n as u64
    );
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
}

/// Parses an SSE body into its `data:` payloads.
fn sse_data(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(String::from)
        .collect()
}

#[tokio::test]
async fn streaming_sends_openai_chunks_that_add_up_to_the_whole_reply() {
    let s = default_server();
    let mut body = chat_body("Stream me", 12);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let (status, text) = s.post("/v1/chat/completions", &body.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let data = sse_data(&text);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk" && c["id"] == chunks[0]["id"])
    );
    let streamed: String = chunks
        .iter()
        .filter_map(|c| {
            c["choices"].get(0)?["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .collect();
    let (whole, n, finish) = generate_alone(&[Message::new("user", "Stream me")], 12);
    assert_eq!(streamed, whole);
    let last_choice = &chunks[chunks.len() - 2]["choices"][0];
    assert_eq!(last_choice["finish_reason"], finish);
    let usage = &chunks[chunks.len() - 1];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], n);
}

/// `a` and `b` equal, numbers within 1e-5: two requests for the same text meet the model in different batches
/// (and the second finds its prompt in the prefix cache), so their logits differ by f32 summation order (~1e-7
/// here), never by a token.
fn assert_close(a: &Value, b: &Value, what: &str) {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!((x - y).abs() <= 1e-5, "{what}: {x} vs {y}");
        }
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len(), "{what}: lengths");
            x.iter().zip(y).for_each(|(x, y)| assert_close(x, y, what));
        }
        (Value::Object(x), Value::Object(y)) => {
            assert_eq!(
                x.keys().collect::<Vec<_>>(),
                y.keys().collect::<Vec<_>>(),
                "{what}"
            );
            x.iter().for_each(|(k, v)| assert_close(v, &y[k], what));
        }
        _ => assert_eq!(a, b, "{what}"),
    }
}

/// The chunks' `logprobs`, streamed with the text they belong to, add up to the whole response's: the same
/// tokens and values in the same order, for chat (`content` lists) and completions (parallel arrays, the
/// `text_offset`s continuing across chunks).
#[tokio::test]
async fn streamed_chunks_carry_the_logprobs_of_their_tokens() {
    let s = default_server();
    for (path, mut body, key) in [
        (
            "/v1/chat/completions",
            {
                let mut b = chat_body("Stream me", 12);
                b["logprobs"] = json!(true);
                b["top_logprobs"] = json!(2);
                b
            },
            "content",
        ),
        (
            "/v1/completions",
            json!({"prompt": "Once upon", "max_tokens": 12, "temperature": 0, "logprobs": 2}),
            "tokens",
        ),
    ] {
        let (status, whole) = s.post_json(path, body.clone()).await;
        assert_eq!(status, StatusCode::OK, "{whole}");
        let whole = &whole["choices"][0]["logprobs"];
        body["stream"] = json!(true);
        let (status, text) = s.post(path, &body.to_string()).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let data = sse_data(&text);
        let chunks: Vec<Value> = data[..data.len() - 1]
            .iter()
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        let carried: Vec<&Value> = chunks
            .iter()
            .map(|c| &c["choices"][0]["logprobs"])
            .filter(|l| !l.is_null())
            .collect();
        assert!(
            carried.len() > 1,
            "{path}: logprobs in {} chunks",
            carried.len()
        );
        if key == "content" {
            let streamed: Vec<Value> = carried
                .iter()
                .flat_map(|l| l["content"].as_array().unwrap().clone())
                .collect();
            assert_close(&Value::Array(streamed), &whole["content"], path);
        } else {
            for field in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
                let streamed: Vec<Value> = carried
                    .iter()
                    .flat_map(|l| l[field].as_array().unwrap().clone())
                    .collect();
                assert_close(&Value::Array(streamed), &whole[field], field);
            }
        }
    }
}

#[tokio::test]
async fn completions_take_text_or_ids_and_report_logprobs() {
    let s = default_server();
    let (status, by_text) = s
        .post_json(
            "/v1/completions",
            json!({"prompt": "Once upon", "max_tokens": 6, "temperature": 0, "logprobs": 3}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{by_text}");
    assert_eq!(by_text["object"], "text_completion");
    let choice = &by_text["choices"][0];
    let logprobs = &choice["logprobs"];
    assert_eq!(logprobs["tokens"].as_array().unwrap().len(), 6);
    for (lp, top) in logprobs["token_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .zip(logprobs["top_logprobs"].as_array().unwrap())
    {
        // Greedy picks the most likely token, so its log-probability is the largest of its top list.
        let best = top
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        assert!((lp.as_f64().unwrap() - best).abs() < 1e-6 && best <= 0.0);
    }
    // The same prompt as ids gives the same text.
    let (assets, _) = load();
    let ids = assets
        .tokenizer
        .as_ref()
        .unwrap()
        .encode_with_special("Once upon")
        .unwrap();
    let (_, by_ids) = s
        .post_json(
            "/v1/completions",
            json!({"prompt": ids, "max_tokens": 6, "temperature": 0}),
        )
        .await;
    assert_eq!(by_ids["choices"][0]["text"], choice["text"]);
    assert_eq!(
        by_ids["usage"]["prompt_tokens"],
        by_text["usage"]["prompt_tokens"]
    );
}

#[tokio::test]
async fn models_health_metrics_and_unknown_routes() {
    let s = default_server();
    let (status, models) = s.get("/v1/models").await;
    assert_eq!(status, StatusCode::OK);
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["id"], "tiny");
    assert_eq!(models["data"][0]["object"], "model");
    assert_eq!(
        s.get("/health").await,
        (StatusCode::OK, r#"{"status":"ok"}"#.into())
    );
    s.post_json("/v1/chat/completions", chat_body("count me", 3))
        .await;
    // The worker publishes its counters after the step that answered the request.
    wait_for(&s, "ember_requests_finished_total", 1.0).await;
    assert_eq!(s.metric("ember_generation_tokens_total").await, 3.0);
    assert_eq!(
        s.metric("ember_time_to_first_token_seconds_count").await,
        1.0
    );
    assert_eq!(
        s.metric("ember_inter_token_latency_seconds_count").await,
        2.0
    );
    for name in [
        "ember_queue_depth",
        "ember_batch_size",
        "ember_kv_blocks_used",
        "ember_prefix_cache_hit_rate",
    ] {
        s.metric(name).await;
    }
    let (status, body) = s.get("/v2/nothing").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.contains("no route /v2/nothing"), "{body}");
    let (status, body) = s.get("/v1/chat/completions").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{body}");
}

#[tokio::test]
async fn bad_requests_get_openai_errors_naming_the_field_and_the_server_keeps_serving() {
    let s = default_server();
    let user = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "hi"}]});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b.to_string()
    };
    let long = "word ".repeat(200);
    let cases: Vec<(String, StatusCode, Option<&str>)> = vec![
        ("{not json".into(), StatusCode::BAD_REQUEST, None),
        ("[]".into(), StatusCode::BAD_REQUEST, None),
        (
            json!({"messages": [{"role": "wizard", "content": "x"}]}).to_string(),
            StatusCode::BAD_REQUEST,
            Some("messages[0].role"),
        ),
        (
            json!({"messages": [{"role": "user", "content": 5}]}).to_string(),
            StatusCode::BAD_REQUEST,
            Some("messages[0].content"),
        ),
        (
            user(json!({"temperature": "hot"})),
            StatusCode::BAD_REQUEST,
            Some("temperature"),
        ),
        (
            user(json!({"temperature": -1})),
            StatusCode::BAD_REQUEST,
            Some("temperature"),
        ),
        (
            user(json!({"top_p": 1.5})),
            StatusCode::BAD_REQUEST,
            Some("top_p"),
        ),
        (
            user(json!({"max_tokens": 0})),
            StatusCode::BAD_REQUEST,
            Some("max_tokens"),
        ),
        (
            user(json!({"max_tokens": 1_000_000})),
            StatusCode::BAD_REQUEST,
            Some("max_tokens"),
        ),
        (user(json!({"n": 3})), StatusCode::BAD_REQUEST, Some("n")),
        (
            user(json!({"model": "gpt-9"})),
            StatusCode::NOT_FOUND,
            Some("model"),
        ),
        (
            json!({"messages": [{"role": "user", "content": long}]}).to_string(),
            StatusCode::BAD_REQUEST,
            Some("messages"),
        ),
    ];
    for (body, status, param) in cases {
        let (got, text) = s.post("/v1/chat/completions", &body).await;
        let error: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(got, status, "{body}: {text}");
        assert_eq!(error["error"]["param"].as_str(), param, "{body}: {text}");
        assert!(!error["error"]["message"].as_str().unwrap().is_empty());
        assert!(error["error"]["type"].is_string());
    }
    let (status, text) = s
        .post("/v1/completions", r#"{"prompt": [1, 100000]}"#)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert!(text.contains("vocabulary"), "{text}");
    let (status, _) = s
        .post_json("/v1/chat/completions", chat_body("still alive?", 2))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(s.metric("ember_http_errors_total").await >= 13.0);
}

#[tokio::test]
async fn an_api_key_guards_every_route_but_health() {
    let s = server(SchedulerConfig::default(), 8, Some("sesame"));
    let (status, body) = s
        .post("/v1/chat/completions", &chat_body("hi", 2).to_string())
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert!(body.contains("authentication_error"));
    let wrong = Request::get("/v1/models")
        .header(header::AUTHORIZATION, "Bearer sesamE")
        .body(Body::empty())
        .unwrap();
    assert_eq!(s.send(wrong).await.0, StatusCode::UNAUTHORIZED);
    let right = Request::get("/v1/models")
        .header(header::AUTHORIZATION, "Bearer sesame")
        .body(Body::empty())
        .unwrap();
    assert_eq!(s.send(right).await.0, StatusCode::OK);
    assert_eq!(s.get("/health").await.0, StatusCode::OK);
}

/// Eight clients at once, batched by the scheduler, get what each gets alone (see the first test for why
/// equality is exact).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_equal_the_same_requests_one_at_a_time() {
    let s = Arc::new(server(
        SchedulerConfig {
            max_batch: 4,
            block_size: 4,
            prefill_chunk: 8,
            ..SchedulerConfig::default()
        },
        64,
        None,
    ));
    let prompts: Vec<String> = (0..8)
        .map(|i| format!("Tell me about number {i}{}", "!".repeat(i)))
        .collect();
    let mut sequential = Vec::new();
    for p in &prompts {
        let (_, body) = s
            .post_json("/v1/chat/completions", chat_body(p, 8 + prompts.len()))
            .await;
        sequential.push(body["choices"][0]["message"]["content"].clone());
    }
    let tasks: Vec<_> = prompts
        .iter()
        .map(|p| {
            let (s, body) = (s.clone(), chat_body(p, 8 + prompts.len()));
            tokio::spawn(async move { s.post_json("/v1/chat/completions", body).await })
        })
        .collect();
    for (task, want) in tasks.into_iter().zip(&sequential) {
        let (status, body) = task.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(&body["choices"][0]["message"]["content"], want);
    }
    assert!(s.metric("ember_batch_size").await >= 1.0);
    // The worker counts a request as finished after it has handed over the last tokens, so a reply can reach the
    // client just before the counter moves (CI saw 12 of 16 at once): wait for it, bounded against a hang.
    wait_for(&s, "ember_requests_finished_total", 16.0).await;
}

#[tokio::test]
async fn a_repeated_system_prompt_is_served_from_the_prefix_cache() {
    let s = default_server();
    // The fixture's context is 64 tokens and its tokenizer nearly one token per byte: a short system prompt.
    let system = "Answer in one short line.";
    let body = |q: &str| {
        json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
                                 "max_tokens": 5, "temperature": 0})
    };
    let (_, first) = s.post_json("/v1/chat/completions", body("first?")).await;
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let (_, second) = s.post_json("/v1/chat/completions", body("second?")).await;
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    // The system turn is most of the prompt: every whole block of it is reused.
    assert!(cached >= 24, "{second}");
    let cold = generate_alone(
        &[
            Message::new("system", system),
            Message::new("user", "second?"),
        ],
        5,
    );
    assert_eq!(second["choices"][0]["message"]["content"], cold.0);
    assert!(s.metric("ember_prefix_cache_hit_rate").await > 0.3);
}

async fn wait_for(s: &Server, name: &str, value: f64) {
    let start = Instant::now();
    while s.metric(name).await != value {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{name} never reached {value}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The tiny model behind a gate: after its first `free_steps` steps every step waits until the gate opens. The
/// tiny model runs 30 tokens in milliseconds, faster than a test can drop a stream after its first frame; held at
/// the gate, the request is still decoding when the client goes, whatever the machine's load.
struct Gated {
    lm: TransformerLm<Flex>,
    free_steps: usize,
    state: Arc<(Mutex<(usize, bool)>, Condvar)>,
}

impl Gated {
    fn open(gate: &(Mutex<(usize, bool)>, Condvar)) {
        gate.0.lock().unwrap().1 = true;
        gate.1.notify_all();
    }
}

impl PooledDecoder for Gated {
    type Backend = Flex;

    fn context_length(&self) -> usize {
        self.lm.context_length()
    }

    fn vocab_size(&self) -> usize {
        self.lm.vocab_size()
    }

    fn new_pool(
        &self,
        block_size: usize,
        budget_bytes: usize,
    ) -> Result<PagedKvPool<Flex>, InferenceError> {
        self.lm.new_pool(block_size, budget_bytes)
    }

    fn step_pooled(
        &self,
        pool: &mut PagedKvPool<Flex>,
        seqs: &[SeqId],
        tokens: &[Vec<u32>],
    ) -> Result<Vec<Vec<f32>>, InferenceError> {
        let (lock, opened) = &*self.state;
        let mut state = lock.lock().unwrap();
        state.0 += 1;
        while state.0 > self.free_steps && !state.1 {
            state = opened.wait(state).unwrap();
        }
        drop(state);
        self.lm.step_pooled(pool, seqs, tokens)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_stream_cancels_its_request_and_frees_its_blocks() {
    let gate = Arc::new((Mutex::new((0, false)), Condvar::new()));
    let state = gate.clone();
    // One free step: the prefill, whose token opens the response. The first decode step then waits at the gate.
    let (s, start) = unstarted_server_over(
        SchedulerConfig {
            block_size: 4,
            max_cached_prefixes: 0,
            ..SchedulerConfig::default()
        },
        8,
        None,
        move |lm| Gated {
            lm,
            free_steps: 1,
            state,
        },
    );
    start();
    let mut body = chat_body("Go on forever", 30);
    body["stream"] = json!(true);
    body["temperature"] = json!(1.0);
    body["logit_bias"] = json!({"0": -100, "1": -100, "2": -100});
    let request = Request::post("/v1/chat/completions")
        .body(Body::from(body.to_string()))
        .unwrap();
    let response = s.router.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut stream = response.into_body();
    stream.frame().await.unwrap().unwrap();
    drop(stream);
    Gated::open(&gate);
    wait_for(&s, "ember_requests_cancelled_total", 1.0).await;
    assert_eq!(s.metric("ember_running_requests").await, 0.0);
    assert_eq!(s.metric("ember_kv_blocks_used").await, 0.0);
    assert_eq!(s.metric("ember_requests_finished_total").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_429_and_queued_requests_still_run() {
    // The worker starts late, so the first request is still queued when the second arrives: deterministic,
    // where racing a running request against the tiny model's millisecond steps would not be.
    let (s, start) = unstarted_server(SchedulerConfig::default(), 1, None);
    let s = Arc::new(s);
    let queued = {
        let s = s.clone();
        tokio::spawn(async move {
            s.post_json("/v1/chat/completions", chat_body("first", 2))
                .await
        })
    };
    wait_for(&s, "ember_queue_depth", 1.0).await;
    let (status, body) = s
        .post_json("/v1/chat/completions", chat_body("second", 2))
        .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["type"], "rate_limit_error");
    assert_eq!(body["error"]["code"], "queue_full");
    start();
    let (status, body) = queued.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(s.metric("ember_requests_rejected_total").await, 1.0);
}

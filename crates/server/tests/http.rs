//! The HTTP API in-process: every endpoint and error through the axum router, with a tiny random LLaMA converted
//! to GGUF by llama.cpp (the model crate's fixture; it has a byte-level BPE tokenizer and a ChatML template) on the
//! CPU backend. Greedy outputs are compared with `ember_inference::generate` run on the same prompt alone, which
//! is what `ember generate --chat --temperature 0` runs.

mod common;
#[path = "../../inference/tests/hooked/mod.rs"]
mod hooked;

use std::sync::{Arc, Condvar, Mutex};

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use common::{
    chat_body, default_server, generate_alone, load, server, unstarted_server,
    unstarted_server_over, wait_for,
};
use ember_inference::{InferenceError, Message, SchedulerConfig};
use ember_model::ModelError;
use hooked::Hooked;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

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

/// A gate steps wait at: the steps run so far, and whether it is open.
type Gate = Arc<(Mutex<(usize, bool)>, Condvar)>;

/// Holds the step after the first `free_steps` at `gate` until it opens. The tiny model runs 30 tokens in
/// milliseconds, faster than a test can drop a stream after its first frame; held at the gate, the request is
/// still decoding when the client goes, whatever the machine's load.
fn wait_at(gate: &Gate, free_steps: usize) {
    let (lock, opened) = &**gate;
    let mut state = lock.lock().unwrap();
    state.0 += 1;
    while state.0 > free_steps && !state.1 {
        state = opened.wait(state).unwrap();
    }
}

fn open(gate: &Gate) {
    gate.0.lock().unwrap().1 = true;
    gate.1.notify_all();
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
        move |lm| Hooked {
            inner: lm,
            before_step: move |_: &[Vec<u32>]| {
                wait_at(&state, 1);
                Ok(())
            },
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
    open(&gate);
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

/// A decode step the model refuses fails its requests with the model's error, kind and message intact: a 400 naming
/// the prompt's field, whole or streamed, where it used to be flattened to a 500 "backend" error.
#[tokio::test]
async fn a_failed_step_reaches_the_client_with_its_kind() {
    let overflow = "model: sequence of 65 positions exceeds the model's context length 64";
    // Prompts prefill (several tokens a row); the first decode step (one token a row) fails. Without a prefix
    // cache, a repeated prompt is prefilled whole again rather than from its last token.
    let config = SchedulerConfig {
        max_cached_prefixes: 0,
        ..SchedulerConfig::default()
    };
    let (s, start) = unstarted_server_over(config, 8, None, |lm| Hooked {
        inner: lm,
        before_step: |tokens: &[Vec<u32>]| {
            if tokens.iter().all(|t| t.len() == 1) {
                return Err(InferenceError::Model(ModelError::ContextOverflow {
                    len: 65,
                    context_length: 64,
                }));
            }
            Ok(())
        },
    });
    start();
    let completion = json!({"prompt": "Hello there", "max_tokens": 4});
    let requests = [
        (
            "/v1/chat/completions",
            chat_body("Hello there", 4),
            "messages",
        ),
        ("/v1/completions", completion, "prompt"),
    ];
    for (path, body, param) in requests.clone() {
        let (status, body) = s.post_json(path, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{path}");
        assert_eq!(body["error"]["param"], param, "{path}");
        assert_eq!(body["error"]["message"], overflow, "{path}");
    }
    // Streamed, the error is the last event before `[DONE]`, naming the same field.
    for (path, mut body, param) in requests {
        body["stream"] = json!(true);
        let (status, text) = s.post(path, &body.to_string()).await;
        assert_eq!(status, StatusCode::OK, "{path}: {text}");
        let data = sse_data(&text);
        assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{text}");
        let error: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
        assert_eq!(error["error"]["type"], "invalid_request_error", "{text}");
        assert_eq!(error["error"]["param"], param, "{path}: {text}");
        assert_eq!(error["error"]["message"], overflow, "{text}");
    }
}

//! The HTTP routes: validation, prompt rendering and the JSON shapes of OpenAI's responses.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request as HttpRequest, State};
use axum::http::{StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ember_inference::{
    ChatTemplate, Completion, FinishReason, GenerationConfig, Request, TokenLogprob,
};
use ember_tokenizer::Tokenizer;
use serde_json::{Value, json};

use crate::api::{self, Params, Prompt};
use crate::engine::{Engine, Event};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::stream;

/// The model a server serves: what the HTTP side needs to turn requests into prompt ids.
pub struct ServedModel {
    /// The name clients send as `model` (and `GET /v1/models` lists).
    pub id: String,
    /// Its tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// Its chat template; without one, `/v1/chat/completions` is refused.
    pub chat_template: Option<ChatTemplate>,
    /// Ids that end a reply.
    pub eos: Vec<u32>,
    /// Positions the model attends over.
    pub context_length: usize,
    /// Positions per KV block (reported in `/metrics`).
    pub block_size: usize,
}

/// Everything the handlers share.
pub struct ServerState {
    model: ServedModel,
    engine: Engine,
    metrics: Arc<Metrics>,
    api_key: Option<String>,
    created: u64,
}

impl ServerState {
    /// State for [`router`]: `metrics` must be the one `engine` was built with. With `api_key`, every route but
    /// `/health` needs `Authorization: Bearer KEY`.
    pub fn new(
        model: ServedModel,
        engine: Engine,
        metrics: Arc<Metrics>,
        api_key: Option<String>,
    ) -> Arc<Self> {
        Arc::new(Self {
            model,
            engine,
            metrics,
            api_key,
            created: now(),
        })
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The OpenAI-compatible routes over `state`.
pub fn router(state: Arc<ServerState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(|uri: Uri| async move { ApiError::not_found(uri.path()) })
        .method_not_allowed_fallback(|uri: Uri| async move {
            ApiError {
                status: StatusCode::METHOD_NOT_ALLOWED,
                ..ApiError::not_found(uri.path())
            }
        })
        .layer(middleware::from_fn_with_state(state.clone(), authorize))
        .with_state(state)
}

async fn authorize(
    State(state): State<Arc<ServerState>>,
    request: HttpRequest,
    next: Next,
) -> Response {
    if let Some(key) = &state.api_key {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if request.uri().path() != "/health" && !given.is_some_and(|g| same_key(g, key)) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(request).await
}

/// Compares keys in time independent of where they differ, so response timing does not reveal a prefix.
fn same_key(given: &str, key: &str) -> bool {
    given.len() == key.len()
        && given
            .bytes()
            .zip(key.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

async fn health(State(state): State<Arc<ServerState>>) -> Response {
    if state.engine.is_alive() {
        Json(json!({"status": "ok"})).into_response()
    } else {
        ApiError::internal("the model worker has stopped").into_response()
    }
}

async fn models(State(state): State<Arc<ServerState>>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": state.model.id,
            "object": "model",
            "created": state.created,
            "owned_by": "ember",
            "context_length": state.model.context_length,
        }],
    }))
}

async fn metrics(State(state): State<Arc<ServerState>>) -> Response {
    let text = state.metrics.render(
        &state.engine.stats(),
        state.engine.queued(),
        state.model.block_size,
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// Which endpoint a response is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Endpoint {
    Chat,
    Completion,
}

/// What every response and chunk of one request repeats.
#[derive(Clone, Debug)]
pub(crate) struct ResponseMeta {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub include_usage: bool,
}

fn response_id(endpoint: Endpoint) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completion => "cmpl",
    };
    format!(
        "{prefix}-{:x}{:06x}",
        now(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn body_error(e: BytesRejection) -> ApiError {
    ApiError {
        status: e.status(),
        ..ApiError::bad_request(format!("reading the request body: {e}"))
    }
}

async fn chat_completions(
    State(state): State<Arc<ServerState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    state.metrics.request();
    let result = async {
        let body = body.map_err(body_error)?;
        let request = api::chat_request(&api::parse_object(&body)?)?;
        state.check_model(&request.params)?;
        let template = state.model.chat_template.as_ref().ok_or_else(|| {
            ApiError::invalid(
                "messages",
                "this model has no chat template: use /v1/completions with a plain prompt",
            )
        })?;
        let text = template
            .render(&request.messages, true)
            .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
        // Templates write the BOS themselves, as HF's `apply_chat_template` (and `ember generate --chat`) expect.
        let ids = state
            .model
            .tokenizer
            .encode(&text)
            .map_err(|e| ApiError::internal(format!("tokenizing the prompt: {e}")))?;
        state
            .run(Endpoint::Chat, ids, request.params, "messages")
            .await
    }
    .await;
    state.respond(result)
}

async fn completions(
    State(state): State<Arc<ServerState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    state.metrics.request();
    let result = async {
        let body = body.map_err(body_error)?;
        let request = api::completion_request(&api::parse_object(&body)?)?;
        state.check_model(&request.params)?;
        let ids = match request.prompt {
            // A plain prompt starts as the tokenizer declares (its BOS), as `ember generate` does.
            Prompt::Text(text) => state
                .model
                .tokenizer
                .encode_with_special(&text)
                .map_err(|e| ApiError::internal(format!("tokenizing the prompt: {e}")))?,
            Prompt::Ids(ids) => ids,
        };
        state
            .run(Endpoint::Completion, ids, request.params, "prompt")
            .await
    }
    .await;
    state.respond(result)
}

impl ServerState {
    fn respond(&self, result: Result<Response, ApiError>) -> Response {
        result.unwrap_or_else(|e| {
            self.metrics.error();
            e.into_response()
        })
    }

    fn check_model(&self, params: &Params) -> Result<(), ApiError> {
        match &params.model {
            Some(m) if *m != self.model.id => Err(ApiError {
                status: StatusCode::NOT_FOUND,
                ..ApiError::invalid(
                    "model",
                    format!(
                        "the model `{m}` does not exist: this server serves `{}`",
                        self.model.id
                    ),
                )
                .with_code("model_not_found")
            }),
            _ => Ok(()),
        }
    }

    /// Checks the prompt and token limit, submits the request and answers with its output.
    async fn run(
        &self,
        endpoint: Endpoint,
        prompt: Vec<u32>,
        params: Params,
        prompt_param: &str,
    ) -> Result<Response, ApiError> {
        let context = self.model.context_length;
        if prompt.is_empty() {
            return Err(ApiError::invalid(
                prompt_param,
                format!("`{prompt_param}` has no tokens"),
            ));
        }
        if prompt.len() >= context {
            return Err(ApiError::invalid(
                prompt_param,
                format!(
                    "the prompt has {} tokens but this model's context holds {context}, including at least one \
                     generated token",
                    prompt.len()
                ),
            )
            .with_code("context_length_exceeded"));
        }
        let room = context - prompt.len();
        let max_new_tokens = match params.max_tokens {
            Some(n) if n > room => {
                return Err(ApiError::invalid(
                    "max_tokens",
                    format!(
                        "`max_tokens` is {n}, but the prompt has {} of the context's {context} tokens: at most \
                         {room}",
                        prompt.len()
                    ),
                )
                .with_code("context_length_exceeded"));
            }
            Some(n) => n,
            // To the end of the context, or of the KV pool when it holds less: a limit the pool could never
            // hold would refuse the request.
            None => match self.engine.capacity_tokens() {
                0 => room,
                capacity => room.min((capacity + 1).saturating_sub(prompt.len()).max(1)),
            },
        };
        let prompt_tokens = prompt.len();
        let request = Request {
            prompt,
            config: GenerationConfig {
                max_new_tokens,
                sampling: params.sampling,
                stop: params.stop,
                eos: self.model.eos.clone(),
                truncate: false,
            },
            top_logprobs: params.top_logprobs,
        };
        let mut events = self.engine.submit(request)?;
        let first = events.recv().await.ok_or_else(worker_gone)?;
        if let Event::Done(Err(e)) = &first {
            return Err(ApiError::from_inference(e, prompt_param));
        }
        let meta = ResponseMeta {
            endpoint,
            id: response_id(endpoint),
            created: now(),
            model: self.model.id.clone(),
            include_usage: params.include_usage,
        };
        if params.stream {
            let tokenizer = self.model.tokenizer.clone();
            return Ok(stream::events(meta, first, events, tokenizer).into_response());
        }
        let mut next = Some(first);
        loop {
            match next.take() {
                Some(Event::Token { .. }) => {}
                Some(Event::Done(Ok(completion))) => {
                    return Ok(Json(self.body(&meta, &completion, prompt_tokens)).into_response());
                }
                Some(Event::Done(Err(e))) => {
                    return Err(ApiError::from_inference(&e, prompt_param));
                }
                None => return Err(worker_gone()),
            }
            next = events.recv().await;
        }
    }

    /// The whole (non-streamed) response.
    fn body(&self, meta: &ResponseMeta, c: &Completion, prompt_tokens: usize) -> Value {
        let logprobs = c
            .logprobs
            .as_ref()
            .map(|l| logprobs_json(meta.endpoint, l, &self.model.tokenizer, 0));
        let choice = match meta.endpoint {
            Endpoint::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": c.text},
                "logprobs": logprobs,
                "finish_reason": finish_reason(c.finish_reason),
            }),
            Endpoint::Completion => json!({
                "index": 0,
                "text": c.text,
                "logprobs": logprobs,
                "finish_reason": finish_reason(c.finish_reason),
            }),
        };
        json!({
            "id": meta.id,
            "object": match meta.endpoint {
                Endpoint::Chat => "chat.completion",
                Endpoint::Completion => "text_completion",
            },
            "created": meta.created,
            "model": meta.model,
            "choices": [choice],
            "usage": usage(c, prompt_tokens),
        })
    }
}

fn worker_gone() -> ApiError {
    ApiError::internal("the model worker failed while running this request")
}

/// OpenAI's `finish_reason`: an EOS token and a stop string are both `stop`.
pub(crate) fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Eos | FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

/// The `usage` object.
pub(crate) fn usage(c: &Completion, prompt_tokens: usize) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": c.ids.len(),
        "total_tokens": prompt_tokens + c.ids.len(),
        "prompt_tokens_details": {"cached_tokens": c.cached_tokens},
    })
}

/// The `logprobs` object of `logprobs` in `endpoint`'s format; a completion's `text_offset`s start at `offset`
/// (the length of the text before these tokens, for a streamed chunk).
pub(crate) fn logprobs_json(
    endpoint: Endpoint,
    logprobs: &[TokenLogprob],
    tokenizer: &Tokenizer,
    offset: usize,
) -> Value {
    let bytes = |id: u32| tokenizer.decode_bytes(&[id]).unwrap_or_default();
    let token = |id: u32| String::from_utf8_lossy(&bytes(id)).into_owned();
    match endpoint {
        Endpoint::Chat => json!({
            "content": logprobs.iter().map(|l| json!({
                "token": token(l.id),
                "logprob": l.logprob,
                "bytes": bytes(l.id),
                "top_logprobs": l.top.iter().map(|&(id, lp)| json!({
                    "token": token(id), "logprob": lp, "bytes": bytes(id),
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        }),
        Endpoint::Completion => {
            let mut offset = offset;
            let mut offsets = Vec::with_capacity(logprobs.len());
            for l in logprobs {
                offsets.push(offset);
                offset += token(l.id).len();
            }
            json!({
                "tokens": logprobs.iter().map(|l| token(l.id)).collect::<Vec<_>>(),
                "token_logprobs": logprobs.iter().map(|l| l.logprob).collect::<Vec<_>>(),
                "top_logprobs": logprobs.iter().map(|l| l.top.iter()
                    .map(|&(id, lp)| (token(id), json!(lp)))
                    .collect::<serde_json::Map<_, _>>()).collect::<Vec<_>>(),
                "text_offset": offsets,
            })
        }
    }
}

//! The HTTP routes: authorization, validation, prompt rendering and submission; the JSON shapes of the responses
//! are [`crate::response`]'s.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request as HttpRequest, State};
use axum::http::{StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ember_inference::{ChatTemplate, GenerationConfig, Request};
use ember_tokenizer::Tokenizer;
use serde_json::{Value, json};

use crate::api::{self, Params, Prompt};
use crate::engine::{Engine, Event};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::response::{self, Endpoint, ResponseMeta, now};
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
        state.run(Endpoint::Chat, ids, request.params).await
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
        state.run(Endpoint::Completion, ids, request.params).await
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
    ) -> Result<Response, ApiError> {
        let prompt_param = endpoint.prompt_param();
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
        let first = events.recv().await.ok_or_else(ApiError::worker_failed)?;
        if let Event::Done(Err(e)) = &first {
            return Err(ApiError::from_inference(e, prompt_param));
        }
        let meta = ResponseMeta::new(endpoint, self.model.id.clone(), params.include_usage);
        if params.stream {
            let tokenizer = self.model.tokenizer.clone();
            return Ok(stream::events(meta, first, events, tokenizer).into_response());
        }
        let mut next = Some(first);
        loop {
            match next.take() {
                Some(Event::Token { .. }) => {}
                Some(Event::Done(Ok(completion))) => {
                    let body = response::completion(
                        &meta,
                        &completion,
                        prompt_tokens,
                        &self.model.tokenizer,
                    );
                    return Ok(Json(body).into_response());
                }
                Some(Event::Done(Err(e))) => {
                    return Err(ApiError::from_inference(&e, prompt_param));
                }
                None => return Err(ApiError::worker_failed()),
            }
            next = events.recv().await;
        }
    }
}

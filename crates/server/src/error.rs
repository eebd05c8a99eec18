//! OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with the HTTP status.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use ember_inference::InferenceError;

/// An error response. `param` names the request field at fault, as OpenAI's API does.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What went wrong and what was expected.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, `authentication_error`, ...).
    pub kind: &'static str,
    /// The request field at fault.
    pub param: Option<String>,
    /// A machine-readable code (`context_length_exceeded`, `model_not_found`, ...).
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 about field `param`.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.into()),
            code: None,
        }
    }

    /// A 400 about the request as a whole (its body is not JSON, say).
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            param: None,
            ..Self::invalid("", message)
        }
    }

    /// Sets the machine-readable code.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// A 500: the server failed, not the request.
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    /// A 500 for a request whose events stopped before its end: the worker thread died while running it.
    pub(crate) fn worker_failed() -> Self {
        Self::internal("the model worker failed while running this request")
    }

    /// A 429: the queue is full.
    pub fn overloaded(queued: usize) -> Self {
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!("the server is at capacity ({queued} requests queued); retry later"),
            kind: "rate_limit_error",
            param: None,
            code: Some("queue_full"),
        }
    }

    /// A 401.
    pub fn unauthorized() -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            message: "missing or wrong API key: send `Authorization: Bearer KEY` with the key the server was \
                      started with (--api-key)"
                .into(),
            kind: "authentication_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    /// A 404 for a path the server does not have.
    pub fn not_found(path: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "no route {path}: the server has POST /v1/chat/completions, POST /v1/completions, GET /v1/models, \
                 GET /health and GET /metrics"
            ),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// A failure the scheduler reported for a request: the caller's fault (400) where the request could never
    /// run, the server's (500) otherwise. `prompt_param` names the field the prompt came from. A failed batch
    /// step is judged by the error the step failed with, whose kind the scheduler keeps for every request of
    /// the batch.
    pub fn from_inference(error: &InferenceError, prompt_param: &str) -> Self {
        let error = error.root();
        match error {
            InferenceError::PromptTooLong { .. } => {
                Self::invalid(prompt_param, error.to_string()).with_code("context_length_exceeded")
            }
            InferenceError::EmptyPrompt { .. } | InferenceError::Model(_) => {
                Self::invalid(prompt_param, error.to_string())
            }
            InferenceError::KvBudget { .. } => Self::invalid("max_tokens", error.to_string()),
            InferenceError::InvalidSampling(e) => Self::invalid(e.setting.clone(), e.to_string()),
            other => Self::internal(other.to_string()),
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

//! The JSON shapes of OpenAI's responses: the whole completion the routes answer with, and the chunks the stream
//! sends. Both sides build them from here, so the routes and the stream never import each other.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use ember_inference::{Completion, FinishReason, TokenLogprob};
use ember_tokenizer::Tokenizer;
use serde_json::{Value, json};

/// Which endpoint a response is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Endpoint {
    Chat,
    Completion,
}

impl Endpoint {
    /// The request field holding the prompt, which errors about the prompt name.
    pub fn prompt_param(self) -> &'static str {
        match self {
            Endpoint::Chat => "messages",
            Endpoint::Completion => "prompt",
        }
    }
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

impl ResponseMeta {
    /// The meta of a new response of `model` on `endpoint`, with a fresh id and the current time.
    pub fn new(endpoint: Endpoint, model: String, include_usage: bool) -> Self {
        Self {
            endpoint,
            id: response_id(endpoint),
            created: now(),
            model,
            include_usage,
        }
    }
}

/// Seconds since the Unix epoch, OpenAI's `created`.
pub(crate) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// An id unique within this process and unlikely to repeat across restarts (the time comes first).
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

/// The whole (non-streamed) response of completion `c` to a prompt of `prompt_tokens` tokens.
pub(crate) fn completion(
    meta: &ResponseMeta,
    c: &Completion,
    prompt_tokens: usize,
    tokenizer: &Tokenizer,
) -> Value {
    let logprobs = c
        .logprobs
        .as_ref()
        .map(|l| logprobs_json(meta.endpoint, l, tokenizer, 0));
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

/// The one choice of a streamed chunk: `text` released by it, the assistant's `role` (the first chunk of a chat
/// names it), its `logprobs` object and the `finish` reason of the last.
pub(crate) fn chunk_choice(
    endpoint: Endpoint,
    text: Option<&str>,
    role: bool,
    logprobs: Value,
    finish: Option<&str>,
) -> Value {
    match endpoint {
        Endpoint::Chat => {
            let mut delta = serde_json::Map::new();
            if role {
                delta.insert("role".into(), json!("assistant"));
            }
            if let Some(text) = text {
                delta.insert("content".into(), json!(text));
            }
            json!({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
        }
        Endpoint::Completion => json!({
            "index": 0, "text": text.unwrap_or(""), "logprobs": logprobs, "finish_reason": finish,
        }),
    }
}

/// A streamed chunk of `choices`, with `usage` on the extra last chunk `stream_options.include_usage` asks for.
pub(crate) fn chunk(meta: &ResponseMeta, choices: Value, usage: Option<Value>) -> Value {
    let mut body = json!({
        "id": meta.id,
        "object": match meta.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completion => "text_completion",
        },
        "created": meta.created,
        "model": meta.model,
        "choices": choices,
    });
    if let Some(usage) = usage {
        body["usage"] = usage;
    }
    body
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

//! The OpenAI request bodies, read field by field so every wrong value is refused with the field's name and what
//! it accepts (serde's derive would report `invalid type: string "hot", expected f32` without saying where).
//! Unknown fields are ignored, as OpenAI's own clients send ones a server may not know (`user`, `stream_options`
//! members, ...).

use ember_inference::Message;
use ember_inference::sampling::SamplingConfig;
use ember_tokenizer::json_type_name as type_name;
use serde_json::{Map, Value};

use crate::error::ApiError;

/// The settings both endpoints share.
#[derive(Clone, Debug, PartialEq)]
pub struct Params {
    /// The model asked for, if named.
    pub model: Option<String>,
    /// Token limit; `None` lets generation run to the end of the context.
    pub max_tokens: Option<usize>,
    /// Sampling settings (seed random when not given).
    pub sampling: SamplingConfig,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Whether to stream server-sent events.
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the token counts.
    pub include_usage: bool,
    /// Number of alternatives per token to report, when log-probabilities are asked for.
    pub top_logprobs: Option<usize>,
}

/// `POST /v1/chat/completions`.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<Message>,
    /// The rest.
    pub params: Params,
}

/// What `POST /v1/completions` continues.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// Text, tokenized by the model's tokenizer.
    Text(String),
    /// Token ids as given.
    Ids(Vec<u32>),
}

/// `POST /v1/completions`.
#[derive(Clone, Debug, PartialEq)]
pub struct CompletionRequest {
    /// The prompt.
    pub prompt: Prompt,
    /// The rest.
    pub params: Params,
}

/// The roles a chat message may have.
const ROLES: [&str; 3] = ["system", "user", "assistant"];

/// Stop strings accepted per request (OpenAI allows 4; more only costs matching time).
const MAX_STOPS: usize = 16;

/// Alternatives per token at most (OpenAI's limit).
const MAX_TOP_LOGPROBS: usize = 20;

/// The body parsed as a JSON object.
pub fn parse_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
    match value {
        Value::Object(map) => Ok(map),
        other => Err(ApiError::bad_request(format!(
            "the request body must be a JSON object, got {}",
            type_name(&other)
        ))),
    }
}

fn wrong(param: &str, expected: &str, got: &Value) -> ApiError {
    ApiError::invalid(
        param,
        format!("`{param}` must be {expected}, got {}", type_name(got)),
    )
}

/// Reads typed optional fields of one JSON object; `null` counts as absent, as in OpenAI's API.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    fn number(&self, key: &str, min: f64, max: f64) -> Result<Option<f32>, ApiError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let expected = format!("a number in [{min}, {max}]");
        match v.as_f64() {
            Some(x) if (min..=max).contains(&x) => Ok(Some(x as f32)),
            Some(x) => Err(ApiError::invalid(
                key,
                format!("`{key}` is {x}: expected {expected}"),
            )),
            None => Err(wrong(key, &expected, v)),
        }
    }

    fn integer(&self, key: &str, min: u64, max: u64) -> Result<Option<u64>, ApiError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let expected = format!("an integer in [{min}, {max}]");
        match (v.as_u64(), v.as_i64()) {
            (Some(x), _) if (min..=max).contains(&x) => Ok(Some(x)),
            (Some(x), _) => Err(ApiError::invalid(
                key,
                format!("`{key}` is {x}: expected {expected}"),
            )),
            (None, Some(x)) => Err(ApiError::invalid(
                key,
                format!("`{key}` is {x}: expected {expected}"),
            )),
            _ => Err(wrong(key, &expected, v)),
        }
    }

    fn boolean(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(wrong(key, "true or false", v)),
        }
    }

    fn string(&self, key: &str) -> Result<Option<String>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(wrong(key, "a string", v)),
        }
    }
}

/// The shared settings of `body`. `logprobs` is a boolean for chat (with `top_logprobs` the count) and the count
/// itself for completions, as in OpenAI's two APIs.
fn params(body: &Map<String, Value>, chat: bool) -> Result<Params, ApiError> {
    let f = Fields(body);
    let n = f.integer("n", 1, u64::MAX)?;
    if n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid(
            "n",
            "only `n` = 1 is supported: send one request per choice",
        ));
    }
    let max_tokens = match f.integer("max_completion_tokens", 1, u32::MAX.into())? {
        Some(n) => Some(n),
        None => f.integer("max_tokens", 1, u32::MAX.into())?,
    }
    .map(|n| n as usize);
    let stop = match f.get("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => {
            if items.len() > MAX_STOPS {
                return Err(ApiError::invalid(
                    "stop",
                    format!("`stop` has {} strings: at most {MAX_STOPS}", items.len()),
                ));
            }
            items
                .iter()
                .enumerate()
                .map(|(i, s)| match s {
                    Value::String(s) => Ok(s.clone()),
                    other => Err(wrong(&format!("stop[{i}]"), "a string", other)),
                })
                .collect::<Result<_, _>>()?
        }
        Some(v) => return Err(wrong("stop", "a string or an array of strings", v)),
    };
    let top_logprobs = if chat {
        let wanted = f.boolean("logprobs")?.unwrap_or(false);
        let top = f.integer("top_logprobs", 0, MAX_TOP_LOGPROBS as u64)?;
        if top.is_some() && !wanted {
            return Err(ApiError::invalid(
                "top_logprobs",
                "`top_logprobs` needs `logprobs`: true",
            ));
        }
        wanted.then(|| top.unwrap_or(0) as usize)
    } else {
        f.integer("logprobs", 0, MAX_TOP_LOGPROBS as u64)?
            .map(|n| n as usize)
    };
    let include_usage = match f.get("stream_options") {
        None => false,
        Some(Value::Object(o)) => Fields(o).boolean("include_usage")?.unwrap_or(false),
        Some(v) => return Err(wrong("stream_options", "an object", v)),
    };
    let logit_bias = match f.get("logit_bias") {
        None => Vec::new(),
        Some(Value::Object(o)) => o
            .iter()
            .map(|(k, v)| {
                let param = format!("logit_bias.{k}");
                let id = k.parse::<u32>().map_err(|_| {
                    ApiError::invalid(&param, format!("`logit_bias` key `{k}` is not a token id"))
                })?;
                match v.as_f64() {
                    Some(b) if (-100.0..=100.0).contains(&b) => Ok((id, b as f32)),
                    _ => Err(wrong(&param, "a number in [-100, 100]", v)),
                }
            })
            .collect::<Result<_, _>>()?,
        Some(v) => return Err(wrong("logit_bias", "an object of token id -> bias", v)),
    };
    let sampling = SamplingConfig {
        // OpenAI's default temperature is 1.
        temperature: f.number("temperature", 0.0, 2.0)?.unwrap_or(1.0),
        top_p: f.number("top_p", 0.0, 1.0)?.filter(|&p| p < 1.0),
        top_k: f
            .integer("top_k", 0, u32::MAX.into())?
            .filter(|&k| k > 0)
            .map(|k| k as usize),
        min_p: f.number("min_p", 0.0, 1.0)?.filter(|&p| p > 0.0),
        presence_penalty: f
            .number("presence_penalty", -2.0, 2.0)?
            .filter(|&p| p != 0.0),
        frequency_penalty: f
            .number("frequency_penalty", -2.0, 2.0)?
            .filter(|&p| p != 0.0),
        repetition_penalty: f
            .number("repetition_penalty", 0.0, 10.0)?
            .filter(|&p| p != 1.0),
        logit_bias,
        seed: f.integer("seed", 0, u64::MAX)?.unwrap_or_else(rand::random),
    };
    sampling
        .validate()
        .map_err(|e| ApiError::invalid(e.setting.clone(), e.to_string()))?;
    Ok(Params {
        model: f.string("model")?,
        max_tokens,
        sampling,
        stop,
        stream: f.boolean("stream")?.unwrap_or(false),
        include_usage,
        top_logprobs,
    })
}

/// A chat request from its JSON body.
pub fn chat_request(body: &Map<String, Value>) -> Result<ChatRequest, ApiError> {
    let messages = match body.get("messages") {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid("messages", "`messages` is required"));
        }
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::invalid(
                "messages",
                "`messages` is empty: expected at least one message",
            ));
        }
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, m)| message(i, m))
            .collect::<Result<Vec<_>, _>>()?,
        Some(v) => return Err(wrong("messages", "an array of messages", v)),
    };
    Ok(ChatRequest {
        messages,
        params: params(body, true)?,
    })
}

fn message(i: usize, value: &Value) -> Result<Message, ApiError> {
    let at = format!("messages[{i}]");
    let Value::Object(m) = value else {
        return Err(wrong(&at, "an object with `role` and `content`", value));
    };
    let f = Fields(m);
    let role = f
        .string("role")
        .map_err(|_| wrong(&format!("{at}.role"), "a string", &m["role"]))?
        .ok_or_else(|| {
            ApiError::invalid(format!("{at}.role"), format!("`{at}.role` is required"))
        })?;
    // OpenAI's newer name for the system role.
    let role = if role == "developer" {
        "system".to_string()
    } else {
        role
    };
    if !ROLES.contains(&role.as_str()) {
        return Err(ApiError::invalid(
            format!("{at}.role"),
            format!(
                "`{at}.role` is `{role}`: expected one of {}",
                ROLES.join(", ")
            ),
        ));
    }
    let param = format!("{at}.content");
    let content = match m.get("content") {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid(&param, format!("`{param}` is required")));
        }
        Some(Value::String(s)) => s.clone(),
        // Content parts: only text ones can be rendered by a text model's template.
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let p = format!("{param}[{j}]");
                match part.get("type").and_then(Value::as_str) {
                    Some("text") => match part.get("text") {
                        Some(Value::String(s)) => text.push_str(s),
                        Some(v) => return Err(wrong(&format!("{p}.text"), "a string", v)),
                        None => {
                            return Err(ApiError::invalid(&p, format!("`{p}.text` is required")));
                        }
                    },
                    Some(other) => {
                        return Err(ApiError::invalid(
                            &p,
                            format!("`{p}` is a `{other}` part: this model reads text parts only"),
                        ));
                    }
                    None => return Err(ApiError::invalid(&p, format!("`{p}.type` is required"))),
                }
            }
            text
        }
        Some(v) => return Err(wrong(&param, "a string or an array of text parts", v)),
    };
    Ok(Message::new(&role, &content))
}

/// A completion request from its JSON body.
pub fn completion_request(body: &Map<String, Value>) -> Result<CompletionRequest, ApiError> {
    let ids = |items: &[Value], param: &str| -> Result<Vec<u32>, ApiError> {
        items
            .iter()
            .enumerate()
            .map(|(i, v)| match v.as_u64() {
                Some(id) if id <= u32::MAX.into() => Ok(id as u32),
                _ => Err(wrong(&format!("{param}[{i}]"), "a token id", v)),
            })
            .collect()
    };
    let prompt = match body.get("prompt") {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid("prompt", "`prompt` is required"));
        }
        Some(Value::String(s)) => Prompt::Text(s.clone()),
        Some(Value::Array(items)) => match items.as_slice() {
            [Value::String(s)] => Prompt::Text(s.clone()),
            [Value::Array(inner)] => Prompt::Ids(ids(inner, "prompt[0]")?),
            items if items.iter().all(Value::is_number) && !items.is_empty() => {
                Prompt::Ids(ids(items, "prompt")?)
            }
            _ => {
                return Err(ApiError::invalid(
                    "prompt",
                    "`prompt` must be a string, an array of token ids, or an array of one of those (one prompt \
                     per request)",
                ));
            }
        },
        Some(v) => return Err(wrong("prompt", "a string or an array of token ids", v)),
    };
    Ok(CompletionRequest {
        prompt,
        params: params(body, false)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &str) -> Result<ChatRequest, ApiError> {
        chat_request(&parse_object(body.as_bytes())?)
    }

    fn param_of(body: &str) -> Option<String> {
        chat(body).unwrap_err().param
    }

    #[test]
    fn reads_every_setting() {
        let r = chat(
            r#"{"model": "m", "messages": [{"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}],
                "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 5, "min_p": 0.1, "seed": 3,
                "stop": ["\n", "end"], "presence_penalty": 0.5, "frequency_penalty": -0.5,
                "repetition_penalty": 1.1, "n": 1, "stream": true, "stream_options": {"include_usage": true},
                "logprobs": true, "top_logprobs": 2, "logit_bias": {"5": -100}, "user": "ignored"}"#,
        )
        .unwrap();
        assert_eq!(
            r.messages,
            vec![
                Message::new("system", "be brief"),
                Message::new("user", "hi there")
            ]
        );
        let p = r.params;
        assert_eq!(p.model.as_deref(), Some("m"));
        assert_eq!(p.max_tokens, Some(7));
        assert_eq!(p.sampling.temperature, 0.5);
        assert_eq!(
            (p.sampling.top_p, p.sampling.top_k, p.sampling.min_p),
            (Some(0.9), Some(5), Some(0.1))
        );
        assert_eq!(p.sampling.seed, 3);
        assert_eq!(p.sampling.logit_bias, vec![(5, -100.0)]);
        assert_eq!(p.stop, vec!["\n".to_string(), "end".to_string()]);
        assert!(p.stream && p.include_usage);
        assert_eq!(p.top_logprobs, Some(2));
    }

    #[test]
    fn every_bad_field_is_named() {
        let cases = [
            (r#"{"messages": "hi"}"#, "messages"),
            (r#"{"messages": []}"#, "messages"),
            (r#"{}"#, "messages"),
            (
                r#"{"messages": [{"role": "wizard", "content": "x"}]}"#,
                "messages[0].role",
            ),
            (r#"{"messages": [{"content": "x"}]}"#, "messages[0].role"),
            (r#"{"messages": [{"role": "user"}]}"#, "messages[0].content"),
            (
                r#"{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}"#,
                "messages[0].content[0]",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}"#,
                "temperature",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "temperature": 3}"#,
                "temperature",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "top_p": 0}"#,
                "top_p",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}"#,
                "max_tokens",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": -5}"#,
                "max_tokens",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1e30}"#,
                "max_tokens",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "n": 2}"#,
                "n",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "stop": [1]}"#,
                "stop[0]",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}"#,
                "stream",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}"#,
                "top_logprobs",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "logit_bias": {"a": 1}}"#,
                "logit_bias.a",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "repetition_penalty": 0}"#,
                "repetition_penalty",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "seed": -1}"#,
                "seed",
            ),
        ];
        for (body, param) in cases {
            assert_eq!(param_of(body).as_deref(), Some(param), "{body}");
        }
        assert_eq!(chat("[1]").unwrap_err().param, None);
        assert!(
            chat("{not json")
                .unwrap_err()
                .message
                .contains("not valid JSON")
        );
    }

    #[test]
    fn completion_prompts_take_each_openai_form() {
        let prompt = |body: &str| {
            completion_request(&parse_object(body.as_bytes()).unwrap()).map(|r| r.prompt)
        };
        assert_eq!(
            prompt(r#"{"prompt": "hi"}"#).unwrap(),
            Prompt::Text("hi".into())
        );
        assert_eq!(
            prompt(r#"{"prompt": ["hi"]}"#).unwrap(),
            Prompt::Text("hi".into())
        );
        assert_eq!(
            prompt(r#"{"prompt": [1, 2]}"#).unwrap(),
            Prompt::Ids(vec![1, 2])
        );
        assert_eq!(
            prompt(r#"{"prompt": [[1, 2]]}"#).unwrap(),
            Prompt::Ids(vec![1, 2])
        );
        assert_eq!(
            prompt(r#"{"prompt": ["a", "b"]}"#)
                .unwrap_err()
                .param
                .as_deref(),
            Some("prompt")
        );
        assert_eq!(
            prompt(r#"{"prompt": [1, -2]}"#)
                .unwrap_err()
                .param
                .as_deref(),
            Some("prompt[1]")
        );
        assert_eq!(
            prompt(r#"{"prompt": "x", "logprobs": 21}"#)
                .unwrap_err()
                .param
                .as_deref(),
            Some("logprobs")
        );
    }
}

//! What a request asks for, parsed from its JSON body and checked field by field: unknown fields, wrong
//! types and values out of range are 400 errors naming the parameter, as OpenAI answers them.

use serde_json::{Map, Value};

use super::error::ApiError;

/// Most stop sequences a request may give (OpenAI's limit).
pub(crate) const STOP_SEQUENCES_MAX: usize = 4;
/// Longest stop sequence, in bytes.
pub(crate) const STOP_BYTES_MAX: usize = 1024;
/// Most messages in a chat.
pub(crate) const MESSAGES_MAX: usize = 100_000;

/// Fields OpenAI accepts that change nothing here: sampling adjustments the engine's executors do not
/// implement, and bookkeeping.
const IGNORED_FIELDS: &[&str] = &[
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "user",
    "metadata",
    "store",
];

/// A chat or completion request, checked.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct GenRequest {
    /// The model asked for.
    pub model: String,
    /// The prompt.
    pub prompt: Prompt,
    /// Output cap; `None` leaves the rest of the context (up to the server's default cap).
    pub max_tokens: Option<u32>,
    /// 0 is greedy; above 0 samples (with `seed` when given).
    pub temperature: f64,
    /// Sampling seed.
    pub seed: Option<i64>,
    /// Stop sequences: the output ends before the first one it contains.
    pub stop: Vec<String>,
    /// Answer as server-sent events.
    pub stream: bool,
}

/// A request's prompt.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Prompt {
    /// Chat messages: (role, content).
    Chat(Vec<(String, String)>),
    /// Plain text (`/v1/completions`).
    Text(String),
    /// Token ids (`/v1/completions` with a list of integers).
    Tokens(Vec<u32>),
}

/// Parses a `/v1/chat/completions` body.
pub(crate) fn parse_chat(body: &[u8]) -> Result<GenRequest, ApiError> {
    let mut fields = object(body)?;
    let messages = fields
        .remove("messages")
        .ok_or_else(|| missing("messages"))?;
    let messages = chat_messages(&messages)?;
    let max_tokens = match fields.remove("max_completion_tokens") {
        Some(value) => Some(value),
        None => fields.remove("max_tokens"),
    };
    let request = common(&mut fields, max_tokens, Prompt::Chat(messages))?;
    for (name, value) in fields {
        match name.as_str() {
            "logprobs" if value.is_null() || value == Value::Bool(false) => {}
            "tools" | "tool_choice" | "functions" | "response_format" | "logit_bias"
                if value.is_null() => {}
            _ => return Err(unrecognized(&name)),
        }
    }
    Ok(request)
}

/// Parses a `/v1/completions` body.
pub(crate) fn parse_completion(body: &[u8]) -> Result<GenRequest, ApiError> {
    let mut fields = object(body)?;
    let prompt = fields.remove("prompt").ok_or_else(|| missing("prompt"))?;
    let prompt = completion_prompt(&prompt)?;
    let max_tokens = fields.remove("max_tokens");
    let request = common(&mut fields, max_tokens, prompt)?;
    for (name, value) in fields {
        match name.as_str() {
            "echo" if value.is_null() || value == Value::Bool(false) => {}
            "logprobs" | "suffix" | "logit_bias" if value.is_null() => {}
            "best_of" if value.is_null() || value.as_u64() == Some(1) => {}
            _ => return Err(unrecognized(&name)),
        }
    }
    Ok(request)
}

/// The fields chat and completion requests share, removed from `fields`.
fn common(
    fields: &mut Map<String, Value>,
    max_tokens: Option<Value>,
    prompt: Prompt,
) -> Result<GenRequest, ApiError> {
    let model = match fields.remove("model") {
        Some(Value::String(model)) => model,
        Some(_) => return Err(wrong_type("model", "a string")),
        None => return Err(missing("model")),
    };
    let max_tokens = match max_tokens {
        None | Some(Value::Null) => None,
        Some(value) => Some(positive_u32("max_tokens", &value)?),
    };
    let temperature = match fields.remove("temperature") {
        None | Some(Value::Null) => 1.0,
        Some(value) => number_in("temperature", &value, 0.0, 2.0)?,
    };
    let seed = match fields.remove("seed") {
        None | Some(Value::Null) => None,
        Some(value) => Some(
            value
                .as_i64()
                .ok_or_else(|| wrong_type("seed", "an integer"))?,
        ),
    };
    match fields.remove("n") {
        None | Some(Value::Null) => {}
        Some(value) if value.as_u64() == Some(1) => {}
        Some(Value::Number(_)) => {
            return Err(ApiError::invalid(
                "n",
                "n must be 1: one choice per request",
            ));
        }
        Some(_) => return Err(wrong_type("n", "an integer")),
    }
    let stream = match fields.remove("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(stream)) => stream,
        Some(_) => return Err(wrong_type("stream", "a boolean")),
    };
    match fields.remove("stream_options") {
        None | Some(Value::Null) | Some(Value::Object(_)) => {}
        Some(_) => return Err(wrong_type("stream_options", "an object")),
    }
    let stop = match fields.remove("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(value) => stop_sequences(&value)?,
    };
    for name in IGNORED_FIELDS {
        fields.remove(*name);
    }
    Ok(GenRequest {
        model,
        prompt,
        max_tokens,
        temperature,
        seed,
        stop,
        stream,
    })
}

/// The body as a JSON object.
fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(fields)) => Ok(fields),
        Ok(_) => Err(ApiError::status(
            axum::http::StatusCode::BAD_REQUEST,
            "the request body must be a JSON object",
        )),
        Err(error) => Err(ApiError::status(
            axum::http::StatusCode::BAD_REQUEST,
            format!("the request body is not valid JSON: {error}"),
        )),
    }
}

fn missing(param: &str) -> ApiError {
    ApiError::invalid(param, format!("missing required parameter: '{param}'"))
}

fn unrecognized(param: &str) -> ApiError {
    ApiError::invalid(
        param,
        format!("Unrecognized request argument supplied: {param}"),
    )
}

fn wrong_type(param: &str, expected: &str) -> ApiError {
    ApiError::invalid(param, format!("'{param}' must be {expected}")).with_code("invalid_type")
}

/// An integer from 1 to `u32::MAX`.
fn positive_u32(param: &str, value: &Value) -> Result<u32, ApiError> {
    if let Some(n) = value.as_i64() {
        if n < 1 {
            return Err(ApiError::invalid(
                param,
                format!("'{param}' must be at least 1, got {n}"),
            ));
        }
        return u32::try_from(n).map_err(|_| {
            ApiError::invalid(param, format!("'{param}' = {n} is larger than any context"))
        });
    }
    if value.as_u64().is_some() {
        return Err(ApiError::invalid(
            param,
            format!("'{param}' is larger than any context"),
        ));
    }
    Err(wrong_type(param, "an integer"))
}

/// A number from `low` to `high`.
fn number_in(param: &str, value: &Value, low: f64, high: f64) -> Result<f64, ApiError> {
    let n = value
        .as_f64()
        .ok_or_else(|| wrong_type(param, "a number"))?;
    if !(low..=high).contains(&n) {
        return Err(ApiError::invalid(
            param,
            format!("'{param}' must be from {low} to {high}, got {n}"),
        ));
    }
    Ok(n)
}

/// `stop`: a string or a list of up to `STOP_SEQUENCES_MAX` non-empty strings.
fn stop_sequences(value: &Value) -> Result<Vec<String>, ApiError> {
    let stops: Vec<String> = match value {
        Value::String(stop) => vec![stop.clone()],
        Value::Array(items) => items
            .iter()
            .map(|item| {
                item.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| wrong_type("stop", "a string or a list of strings"))
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(wrong_type("stop", "a string or a list of strings")),
    };
    if stops.len() > STOP_SEQUENCES_MAX {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "at most {STOP_SEQUENCES_MAX} stop sequences, got {}",
                stops.len()
            ),
        ));
    }
    if stops
        .iter()
        .any(|stop| stop.is_empty() || stop.len() > STOP_BYTES_MAX)
    {
        return Err(ApiError::invalid(
            "stop",
            format!("a stop sequence must be 1 to {STOP_BYTES_MAX} bytes"),
        ));
    }
    Ok(stops)
}

/// `messages`: a non-empty list of `{"role", "content"}`, the content a string or a list of text parts.
fn chat_messages(value: &Value) -> Result<Vec<(String, String)>, ApiError> {
    let items = value
        .as_array()
        .ok_or_else(|| wrong_type("messages", "a list of messages"))?;
    if items.is_empty() || items.len() > MESSAGES_MAX {
        return Err(ApiError::invalid(
            "messages",
            format!("'messages' must hold 1 to {MESSAGES_MAX} messages"),
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(idx, item)| chat_message(idx, item))
        .collect()
}

fn chat_message(idx: usize, item: &Value) -> Result<(String, String), ApiError> {
    let param = format!("messages.[{idx}]");
    let fields = item
        .as_object()
        .ok_or_else(|| wrong_type(&param, "an object"))?;
    for name in fields.keys() {
        if !matches!(name.as_str(), "role" | "content" | "name") {
            return Err(unrecognized(&format!("{param}.{name}")));
        }
    }
    let role = match fields.get("role").and_then(Value::as_str) {
        Some(role @ ("system" | "developer" | "user" | "assistant")) => role.to_owned(),
        Some(role) => {
            return Err(ApiError::invalid(
                &format!("{param}.role"),
                format!("unknown role '{role}': system, developer, user or assistant"),
            ));
        }
        None => return Err(missing(&format!("{param}.role"))),
    };
    let content = match fields.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => text_parts(&param, parts)?,
        Some(Value::Null) | None if role == "assistant" => String::new(),
        Some(_) => return Err(wrong_type(&format!("{param}.content"), "a string")),
        None => return Err(missing(&format!("{param}.content"))),
    };
    Ok((role, content))
}

/// The text of a content given as parts (`[{"type": "text", "text": ...}]`); other part types are refused.
fn text_parts(param: &str, parts: &[Value]) -> Result<String, ApiError> {
    let mut text = String::new();
    for part in parts {
        match (
            part.get("type").and_then(Value::as_str),
            part.get("text").and_then(Value::as_str),
        ) {
            (Some("text"), Some(piece)) => text.push_str(piece),
            _ => {
                return Err(ApiError::invalid(
                    &format!("{param}.content"),
                    "only text content parts are supported",
                ));
            }
        }
    }
    Ok(text)
}

/// `prompt`: a string, a list of one string, or a list of token ids.
fn completion_prompt(value: &Value) -> Result<Prompt, ApiError> {
    match value {
        Value::String(text) => Ok(Prompt::Text(text.clone())),
        Value::Array(items) => match items.as_slice() {
            [Value::String(text)] => Ok(Prompt::Text(text.clone())),
            [] => Err(ApiError::invalid("prompt", "'prompt' must not be empty")),
            _ if items.iter().all(Value::is_u64) => items
                .iter()
                .map(|item| {
                    item.as_u64()
                        .and_then(|id| u32::try_from(id).ok())
                        .ok_or_else(|| ApiError::invalid("prompt", "a token id is out of range"))
                })
                .collect::<Result<_, _>>()
                .map(Prompt::Tokens),
            _ => Err(ApiError::invalid(
                "prompt",
                "'prompt' must be a string or a list of token ids: one prompt per request",
            )),
        },
        _ => Err(wrong_type("prompt", "a string")),
    }
}

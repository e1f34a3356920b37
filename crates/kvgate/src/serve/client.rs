//! A small OpenAI API client over HTTP/1 (hyper's client), for `kvgate agents --target` and the tests:
//! a streamed chat completion read event by event, timed as the client sees it, and plain GETs.

use std::time::{Duration, Instant};

use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use crate::error::{Error, Result};

/// Longest a request may take before the client gives up.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// An OpenAI-compatible server at a base URL (`http://HOST:PORT`).
#[derive(Clone, Debug)]
pub struct ApiClient {
    base: String,
    http: Client<HttpConnector, Full<Bytes>>,
}

/// What one streamed completion gave, as the client measured it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StreamedAnswer {
    /// The HTTP status.
    pub status: u16,
    /// The answer's text.
    pub text: String,
    /// Content events (chunks with text).
    pub n_chunks: u32,
    /// `finish_reason` of the last choice.
    pub finish_reason: Option<String>,
    /// `usage` as the server reported it (the last chunk's).
    pub usage: Option<Value>,
    /// Seconds to the first content chunk.
    pub ttft_s: Option<f64>,
    /// Seconds to the end of the stream.
    pub total_s: f64,
    /// The error body of a refused or failed request (or an `error` event of the stream).
    pub error: Option<Value>,
    /// The `Retry-After` header, in seconds.
    pub retry_after_s: Option<u64>,
    /// Whether the stream ended with `data: [DONE]`.
    pub done: bool,
}

impl StreamedAnswer {
    /// `usage.prompt_tokens_details.cached_tokens` (0 when absent).
    pub fn cached_tokens(&self) -> u64 {
        self.usage_field(&["prompt_tokens_details", "cached_tokens"])
    }

    /// `usage.prompt_tokens`.
    pub fn prompt_tokens(&self) -> u64 {
        self.usage_field(&["prompt_tokens"])
    }

    /// `usage.completion_tokens`.
    pub fn completion_tokens(&self) -> u64 {
        self.usage_field(&["completion_tokens"])
    }

    fn usage_field(&self, path: &[&str]) -> u64 {
        let mut value = self.usage.as_ref();
        for key in path {
            value = value.and_then(|v| v.get(*key));
        }
        value.and_then(Value::as_u64).unwrap_or(0)
    }
}

impl ApiClient {
    /// A client of the server at `base` (`http://HOST:PORT`, no trailing path). Errors: `Client` for
    /// another scheme.
    pub fn new(base: &str) -> Result<ApiClient> {
        let base = base.trim_end_matches('/');
        if !base.starts_with("http://") {
            return Err(Error::Client(format!(
                "{base}: the target must be http://HOST:PORT"
            )));
        }
        let http = Client::builder(TokioExecutor::new()).build_http();
        Ok(ApiClient {
            base: base.to_owned(),
            http,
        })
    }

    /// GETs `path`; returns the status and the body.
    pub async fn get(&self, path: &str) -> Result<(u16, String)> {
        let request = hyper::Request::get(format!("{}{path}", self.base))
            .body(Full::new(Bytes::new()))
            .map_err(|e| Error::Client(format!("GET {path}: {e}")))?;
        let response = tokio::time::timeout(REQUEST_TIMEOUT, self.http.request(request))
            .await
            .map_err(|_| Error::Client(format!("GET {path}: timed out")))?
            .map_err(|e| Error::Client(format!("GET {path}: {e}")))?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| Error::Client(format!("GET {path}: {e}")))?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }

    /// The first model `/v1/models` lists.
    pub(crate) async fn first_model(&self) -> Result<String> {
        let (status, body) = self.get("/v1/models").await?;
        let value: Value = serde_json::from_str(&body).map_err(|e| {
            Error::Client(format!("/v1/models answered {status} with no JSON: {e}"))
        })?;
        value["data"][0]["id"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| Error::Client(format!("/v1/models lists no model: {body}")))
    }

    /// POSTs `body` to `path` as a streamed request and reads its events as they come. Errors only for
    /// transport failures; a refusal is an answer with its status and error body.
    pub async fn stream(&self, path: &str, body: &Value) -> Result<StreamedAnswer> {
        let start = Instant::now();
        let request = hyper::Request::post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(|e| Error::Client(format!("POST {path}: {e}")))?;
        let response = tokio::time::timeout(REQUEST_TIMEOUT, self.http.request(request))
            .await
            .map_err(|_| Error::Client(format!("POST {path}: timed out")))?
            .map_err(|e| Error::Client(format!("POST {path}: {e}")))?;
        let mut answer = StreamedAnswer {
            status: response.status().as_u16(),
            retry_after_s: response
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok()),
            ..StreamedAnswer::default()
        };
        let mut body = response.into_body();
        let mut buffer: Vec<u8> = Vec::new();
        while let Some(frame) = tokio::time::timeout(REQUEST_TIMEOUT, body.frame())
            .await
            .map_err(|_| Error::Client(format!("POST {path}: the stream stalled")))?
        {
            let frame = frame.map_err(|e| Error::Client(format!("POST {path}: {e}")))?;
            if let Ok(data) = frame.into_data() {
                // Servers end lines with \n or \r\n (SSE allows both): keep \n alone.
                buffer.extend(data.iter().filter(|byte| **byte != b'\r'));
                if answer.status == 200 {
                    take_events(&mut buffer, &mut answer, start);
                }
            }
        }
        if answer.status != 200 {
            answer.error = serde_json::from_slice(&buffer).ok();
        }
        answer.total_s = start.elapsed().as_secs_f64();
        Ok(answer)
    }
}

/// Takes the complete events at the front of `buffer` into `answer`.
fn take_events(buffer: &mut Vec<u8>, answer: &mut StreamedAnswer, start: Instant) {
    while let Some(end) = find(buffer, b"\n\n") {
        let event: Vec<u8> = buffer.drain(..end + 2).collect();
        for line in String::from_utf8_lossy(&event).lines() {
            let Some(data) = line.strip_prefix("data:") else {
                continue;
            };
            let data = data.trim();
            if data == "[DONE]" {
                answer.done = true;
                continue;
            }
            let Ok(chunk) = serde_json::from_str::<Value>(data) else {
                continue;
            };
            take_chunk(&chunk, answer, start);
        }
    }
}

fn take_chunk(chunk: &Value, answer: &mut StreamedAnswer, start: Instant) {
    if chunk.get("error").is_some() {
        answer.error = Some(chunk.clone());
        return;
    }
    if let Some(usage) = chunk.get("usage").filter(|u| !u.is_null()) {
        answer.usage = Some(usage.clone());
    }
    let Some(choice) = chunk["choices"].get(0) else {
        return;
    };
    let text = choice["delta"]["content"]
        .as_str()
        .or_else(|| choice["text"].as_str())
        .unwrap_or("");
    if !text.is_empty() {
        answer.n_chunks += 1;
        answer.ttft_s.get_or_insert(start.elapsed().as_secs_f64());
        answer.text.push_str(text);
    }
    if let Some(reason) = choice["finish_reason"].as_str() {
        answer.finish_reason = Some(reason.to_owned());
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

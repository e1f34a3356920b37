//! A request's answer as it comes: `Generation` turns the engine thread's token events into text pieces
//! and an end (finish reason, usage), cancelling the request when its client goes away or its text reaches
//! a stop sequence; `sse_body` frames it as OpenAI's server-sent events (`data: {chunk}`, then
//! `data: [DONE]`), with a comment line as keep-alive while no token comes, which is also how a client that
//! went away is noticed.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::Response;
use crossbeam::channel::Sender;
use kv_pool::RequestId;
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

use super::engine_thread::{Control, Event};
use super::error::ApiError;
use super::routes::{AppState, InFlight};
use super::text::Detokenizer;

/// Token counts of a request's `usage`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Output tokens.
    pub completion_tokens: u32,
    /// Prompt tokens from the prefix cache or a restore.
    pub cached_tokens: u32,
}

impl Usage {
    /// The OpenAI `usage` object.
    pub(crate) fn json(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }
}

/// A piece of an answer.
#[derive(Debug)]
pub(crate) enum Piece {
    /// Text to append.
    Text(String),
    /// The answer ended.
    End {
        /// `stop`, `length` or `abort` (cancelled by the server's shutdown).
        finish_reason: &'static str,
        /// Its token counts.
        usage: Usage,
    },
    /// The request failed.
    Error(ApiError),
}

/// Cancels its request when dropped before the request ended (the client went away).
#[derive(Debug)]
struct CancelGuard {
    request: RequestId,
    control: Sender<Control>,
    armed: bool,
}

impl CancelGuard {
    fn cancel(&mut self) {
        if self.armed {
            self.armed = false;
            let _ = self.control.send(Control::Cancel(self.request));
        }
    }

    /// The text reached a stop sequence at output token `tokens`: the engine ends the request there.
    fn stop(&mut self, tokens: u32) {
        if self.armed {
            self.armed = false;
            let _ = self.control.send(Control::Stop {
                request: self.request,
                tokens,
            });
        }
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        self.cancel();
    }
}

/// One request's answer as the engine produces it.
#[derive(Debug)]
pub(crate) struct Generation {
    state: Arc<AppState>,
    events: UnboundedReceiver<Event>,
    detokenizer: Detokenizer,
    guard: CancelGuard,
    pending: VecDeque<Piece>,
    stop_token: bool,
    ended: bool,
    _in_flight: InFlight,
}

impl Generation {
    /// The answer to request `request`, whose events come on `events`.
    pub(crate) fn new(
        state: Arc<AppState>,
        request: RequestId,
        events: UnboundedReceiver<Event>,
        stops: Vec<String>,
        in_flight: InFlight,
    ) -> Generation {
        let control = state.control.clone();
        Generation {
            state,
            events,
            detokenizer: Detokenizer::new(stops),
            guard: CancelGuard {
                request,
                control,
                armed: true,
            },
            pending: VecDeque::new(),
            stop_token: false,
            ended: false,
            _in_flight: in_flight,
        }
    }

    /// The next piece; `None` after the end. Cancel-safe: only the wait for an event is awaited.
    pub(crate) async fn next(&mut self) -> Option<Piece> {
        loop {
            if let Some(piece) = self.pending.pop_front() {
                return Some(piece);
            }
            if self.ended {
                return None;
            }
            let event = self.events.recv().await;
            self.absorb(event);
        }
    }

    fn absorb(&mut self, event: Option<Event>) {
        match event {
            Some(Event::Tokens(tokens)) => self.take_tokens(&tokens),
            Some(Event::Finished(outcome)) => {
                let rest = self.detokenizer.finish(&self.state.codec);
                if !rest.is_empty() {
                    self.pending.push_back(Piece::Text(rest));
                }
                let ended_here = self.stop_token || self.detokenizer.stopped();
                let finish_reason = if ended_here {
                    "stop"
                } else if outcome.cancelled {
                    "abort"
                } else {
                    "length"
                };
                // The engine thread's count, which `/metrics` shows too: through the stop sequence when the
                // `Control::Stop` reached it before the request ended.
                let completion_tokens = outcome.output_tokens;
                self.end(Piece::End {
                    finish_reason,
                    usage: Usage {
                        prompt_tokens: outcome.prompt_tokens,
                        completion_tokens,
                        cached_tokens: outcome.cached_tokens,
                    },
                });
            }
            Some(Event::Failed(error)) => self.end(Piece::Error(error)),
            None => self.end(Piece::Error(ApiError::status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the engine thread stopped",
            ))),
        }
    }

    fn take_tokens(&mut self, tokens: &[u32]) {
        for &token in tokens {
            if self.stop_token || self.detokenizer.stopped() {
                return;
            }
            if self.state.codec.is_stop(token) {
                // The engine ended the request at its stop token; the outcome follows.
                self.stop_token = true;
                return;
            }
            let piece = self.detokenizer.push(&self.state.codec, token);
            if !piece.is_empty() {
                self.pending.push_back(Piece::Text(piece));
            }
            if self.detokenizer.stopped() {
                self.guard.stop(self.detokenizer.n_tokens() as u32);
            }
        }
    }

    fn end(&mut self, piece: Piece) {
        self.guard.armed = false;
        self.ended = true;
        self.pending.push_back(piece);
    }
}

/// How an endpoint frames its chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `/v1/chat/completions`: `chat.completion.chunk` with a `delta`.
    Chat,
    /// `/v1/completions`: `text_completion` with `text`.
    Completion,
}

/// What every chunk of one answer repeats.
#[derive(Clone, Debug)]
pub(crate) struct ChunkHeader {
    /// `chatcmpl-N` or `cmpl-N`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The model's name.
    pub model: String,
    /// The endpoint.
    pub kind: Kind,
}

impl ChunkHeader {
    /// A chunk with `choices` (and `usage` when given).
    pub(crate) fn chunk(&self, choices: &Value, usage: Option<Value>) -> Value {
        let object = match self.kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Completion => "text_completion",
        };
        let mut chunk = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let (Some(usage), Some(fields)) = (usage, chunk.as_object_mut()) {
            fields.insert("usage".into(), usage);
        }
        chunk
    }

    /// The choice of a chunk carrying `text` (and `finish_reason`).
    pub(crate) fn choice(&self, text: Option<&str>, finish_reason: Option<&str>) -> Value {
        match self.kind {
            Kind::Chat => {
                let delta = match text {
                    Some(text) => json!({"content": text}),
                    None => json!({}),
                };
                json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason}])
            }
            Kind::Completion => json!([{
                "index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish_reason,
            }]),
        }
    }
}

/// One server-sent event carrying `value`.
pub(crate) fn event(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// Where a stream is.
enum Stage {
    Start,
    Body,
    Done,
    Closed,
}

/// The streamed response: the chunks of `generation` as server-sent events, a `: keep-alive` comment each
/// `keepalive` without one, `data: [DONE]` at the end.
pub(crate) fn sse_body(
    generation: Generation,
    header: ChunkHeader,
    keepalive: Duration,
) -> Response {
    let stream = futures_util::stream::unfold(
        (generation, header, Stage::Start),
        move |(mut generation, header, stage)| async move {
            let (bytes, next) = match stage {
                Stage::Closed => return None,
                Stage::Done => (Bytes::from_static(b"data: [DONE]\n\n"), Stage::Closed),
                Stage::Start => {
                    let choice = match header.kind {
                        Kind::Chat => {
                            json!([{"index": 0, "delta": {"role": "assistant", "content": ""},
                                               "logprobs": null, "finish_reason": null}])
                        }
                        Kind::Completion => header.choice(Some(""), None),
                    };
                    (event(&header.chunk(&choice, None)), Stage::Body)
                }
                Stage::Body => match tokio::time::timeout(keepalive, generation.next()).await {
                    Err(_) => (Bytes::from_static(b": keep-alive\n\n"), Stage::Body),
                    Ok(Some(Piece::Text(text))) => (
                        event(&header.chunk(&header.choice(Some(&text), None), None)),
                        Stage::Body,
                    ),
                    Ok(Some(Piece::End {
                        finish_reason,
                        usage,
                    })) => {
                        let last = header.chunk(&header.choice(None, Some(finish_reason)), None);
                        let usage = header.chunk(&json!([]), Some(usage.json()));
                        let mut bytes = event(&last).to_vec();
                        bytes.extend_from_slice(&event(&usage));
                        (Bytes::from(bytes), Stage::Done)
                    }
                    Ok(Some(Piece::Error(error))) => (event(&error.body()), Stage::Done),
                    Ok(None) => (Bytes::from_static(b"data: [DONE]\n\n"), Stage::Closed),
                },
            };
            Some((
                Ok::<_, std::convert::Infallible>(bytes),
                (generation, header, next),
            ))
        },
    );
    let mut response = Response::new(Body::from_stream(stream));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-cache"),
    );
    response
}

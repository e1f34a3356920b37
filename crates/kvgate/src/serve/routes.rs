//! The HTTP routes: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`, `GET /health`,
//! `GET /metrics`; anything else is an OpenAI-style 404. A generation request is parsed and checked,
//! tokenized, admitted (at most `max_in_flight` at once, else 429), handed to the engine thread's bounded
//! channel (full: 503) and answered as JSON or server-sent events.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use crossbeam::channel::{Sender, TrySendError};
use kv_pool::RequestId;
use prometheus_client::registry::Registry;
use serde_json::json;

use super::api::{self, GenRequest, Prompt};
use super::engine_thread::{Control, Submission};
use super::error::ApiError;
use super::latency::ServeMetrics;
use super::sse::{ChunkHeader, Generation, Kind, Piece, Usage, sse_body};
use super::text::TextCodec;
use crate::model::Sampling;

/// What every handler shares.
#[derive(Debug)]
pub(crate) struct AppState {
    /// The tokenizer.
    pub codec: TextCodec,
    /// The model's name (`model` in requests and `/v1/models`).
    pub model_name: String,
    /// The executor serving (`sim`, `reference`, `model`).
    pub executor: &'static str,
    /// The admission policy.
    pub policy: &'static str,
    /// Longest prompt plus output, in tokens.
    pub max_model_len: u32,
    /// Output cap when a request gives none.
    pub default_max_tokens: u32,
    /// Requests to the engine thread.
    pub submissions: Sender<Submission>,
    /// Cancels and the drain order to the engine thread.
    pub control: Sender<Control>,
    /// Requests answered or answering at most.
    pub max_in_flight: usize,
    /// Keep-alive interval of a stream.
    pub keepalive: Duration,
    /// The server's metrics.
    pub metrics: ServeMetrics,
    /// Every metric, for `/metrics`.
    pub registry: Registry,
    /// Set at shutdown: new requests get 503.
    pub draining: AtomicBool,
    next_id: AtomicU64,
    in_flight: Arc<AtomicUsize>,
    created: u64,
}

impl AppState {
    /// The shared state of a server.
    #[allow(
        clippy::too_many_arguments,
        reason = "one constructor, called once, every field named"
    )]
    pub(crate) fn new(
        codec: TextCodec,
        model_name: String,
        executor: &'static str,
        policy: &'static str,
        max_model_len: u32,
        default_max_tokens: u32,
        channels: (Sender<Submission>, Sender<Control>),
        max_in_flight: usize,
        keepalive: Duration,
        metrics: ServeMetrics,
        registry: Registry,
    ) -> AppState {
        AppState {
            codec,
            model_name,
            executor,
            policy,
            max_model_len,
            default_max_tokens,
            submissions: channels.0,
            control: channels.1,
            max_in_flight,
            keepalive,
            metrics,
            registry,
            draining: AtomicBool::new(false),
            next_id: AtomicU64::new(0),
            in_flight: Arc::new(AtomicUsize::new(0)),
            created: unix_now(),
        }
    }
}

/// A request counted in flight until dropped.
#[derive(Debug)]
pub(crate) struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The router over `state`, with bodies limited to `body_limit_bytes`.
pub(crate) fn router(state: Arc<AppState>, body_limit_bytes: usize) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completion))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(body_limit_bytes))
        .with_state(state)
}

async fn chat(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    generate(state, body, Kind::Chat)
        .await
        .unwrap_or_else(|error| error.into_response())
}

async fn completion(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate(state, body, Kind::Completion)
        .await
        .unwrap_or_else(|error| error.into_response())
}

async fn generate(
    state: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    kind: Kind,
) -> Result<Response, ApiError> {
    let received = Instant::now();
    let body = body.map_err(|rejection| {
        let error = ApiError::status(rejection.status(), rejection.body_text());
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            error.with_code("request_too_large")
        } else {
            error
        }
    })?;
    let request = parse_request(&state, &body, kind)?;
    let prompt = state.codec.encode(&request.prompt)?;
    let max_tokens = output_cap(&state, &request, prompt.len())?;
    let in_flight = admit(&state)?;
    let (events_tx, events) = tokio::sync::mpsc::unbounded_channel();
    let id = RequestId(state.next_id.fetch_add(1, Ordering::Relaxed));
    let submission = Submission {
        id,
        prompt,
        max_tokens,
        is_later_turn: matches!(&request.prompt, Prompt::Chat(messages)
            if messages.iter().any(|(role, _)| role == "assistant")),
        received,
        sampling: Sampling {
            temperature: request.temperature,
            // Without a seed, each request draws its own.
            seed: request
                .seed
                .map_or_else(|| unseeded(id), |seed| seed as u64),
        },
        events: events_tx,
    };
    match state.submissions.try_send(submission) {
        Ok(()) => {}
        Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
            state.metrics.count_refused(503);
            return Err(ApiError::status(
                StatusCode::SERVICE_UNAVAILABLE,
                "the engine's queue is full; retry after the Retry-After seconds",
            ));
        }
    }
    let generation = Generation::new(
        Arc::clone(&state),
        id,
        events,
        request.stop.clone(),
        in_flight,
    );
    let header = ChunkHeader {
        id: match kind {
            Kind::Chat => format!("chatcmpl-{}", id.0),
            Kind::Completion => format!("cmpl-{}", id.0),
        },
        created: unix_now(),
        model: state.model_name.clone(),
        kind,
    };
    if request.stream {
        return Ok(sse_body(generation, header, state.keepalive));
    }
    whole_answer(generation, &header, &state).await
}

/// The request in `body` as `kind` says, for the model this server serves.
fn parse_request(state: &AppState, body: &[u8], kind: Kind) -> Result<GenRequest, ApiError> {
    let request = match kind {
        Kind::Chat => api::parse_chat(body)?,
        Kind::Completion => api::parse_completion(body)?,
    };
    if request.model != state.model_name {
        return Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "The model `{}` does not exist; this server serves `{}`",
                request.model, state.model_name
            ),
            param: Some("model".into()),
            code: Some("model_not_found"),
        });
    }
    Ok(request)
}

/// The output cap of `request`: its `max_tokens`, which must fit the context with the prompt, or the
/// server's default within what is left.
fn output_cap(state: &AppState, request: &GenRequest, prompt_len: usize) -> Result<u32, ApiError> {
    let param = match request.prompt {
        Prompt::Chat(_) => "messages",
        _ => "prompt",
    };
    let prompt_len = u32::try_from(prompt_len).unwrap_or(u32::MAX);
    if prompt_len == 0 {
        return Err(ApiError::invalid(param, "the prompt is empty"));
    }
    if prompt_len >= state.max_model_len {
        return Err(ApiError::invalid(
            param,
            format!(
                "This model's maximum context length is {} tokens. However, your prompt has {prompt_len} \
                 tokens, leaving no room for an answer. Please reduce the length of the prompt.",
                state.max_model_len
            ),
        )
        .with_code("context_length_exceeded"));
    }
    let room = state.max_model_len - prompt_len;
    match request.max_tokens {
        None => Ok(state.default_max_tokens.min(room)),
        Some(max_tokens) if max_tokens <= room => Ok(max_tokens),
        Some(max_tokens) => Err(ApiError::invalid(
            "max_tokens",
            format!(
                "This model's maximum context length is {} tokens. However, you requested {} tokens \
                 ({prompt_len} in the prompt, {max_tokens} for the answer). Please reduce the length of \
                 the prompt or max_tokens.",
                state.max_model_len,
                u64::from(prompt_len) + u64::from(max_tokens)
            ),
        )
        .with_code("context_length_exceeded")),
    }
}

/// Counts the request in flight, or refuses it: 503 while shutting down, 429 above `max_in_flight`.
fn admit(state: &AppState) -> Result<InFlight, ApiError> {
    if state.draining.load(Ordering::Acquire) {
        state.metrics.count_refused(503);
        return Err(ApiError::status(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is shutting down; try another replica",
        ));
    }
    let before = state.in_flight.fetch_add(1, Ordering::AcqRel);
    let in_flight = InFlight(Arc::clone(&state.in_flight));
    if before >= state.max_in_flight {
        state.metrics.count_refused(429);
        return Err(ApiError::status(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "{} requests are in flight, the most this server takes; retry after the Retry-After seconds",
                state.max_in_flight
            ),
        ));
    }
    Ok(in_flight)
}

/// The whole answer as one JSON object.
async fn whole_answer(
    mut generation: Generation,
    header: &ChunkHeader,
    state: &AppState,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let (finish_reason, usage) = loop {
        match generation.next().await {
            Some(Piece::Text(piece)) => text.push_str(&piece),
            Some(Piece::End {
                finish_reason,
                usage,
            }) => break (finish_reason, usage),
            Some(Piece::Error(error)) => return Err(error),
            None => {
                return Err(ApiError::status(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the answer ended without an outcome",
                ));
            }
        }
    };
    let choice = match header.kind {
        Kind::Chat => json!({"index": 0, "message": {"role": "assistant", "content": text},
                             "logprobs": null, "finish_reason": finish_reason}),
        Kind::Completion => {
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason})
        }
    };
    let object = match header.kind {
        Kind::Chat => "chat.completion",
        Kind::Completion => "text_completion",
    };
    let usage: Usage = usage;
    Ok(axum::Json(json!({
        "id": header.id,
        "object": object,
        "created": header.created,
        "model": header.model,
        "system_fingerprint": format!("kvgate-{}", state.executor),
        "choices": [choice],
        "usage": usage.json(),
    }))
    .into_response())
}

async fn models(State(state): State<Arc<AppState>>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": state.model_name,
            "object": "model",
            "created": state.created,
            "owned_by": "kvgate",
            "max_model_len": state.max_model_len,
            "executor": state.executor,
            "policy": state.policy,
        }],
    }))
    .into_response()
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    if state.draining.load(Ordering::Acquire) {
        return ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "shutting down").into_response();
    }
    axum::Json(json!({"status": "ok"})).into_response()
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let mut text = String::new();
    if let Err(error) = prometheus_client::encoding::text::encode(&mut text, &state.registry) {
        return ApiError::status(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode the metrics: {error}"),
        )
        .into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn not_found() -> Response {
    ApiError::status(
        StatusCode::NOT_FOUND,
        "no such route: this server answers POST /v1/chat/completions, POST /v1/completions, GET \
         /v1/models, GET /health and GET /metrics",
    )
    .into_response()
}

/// A seed for a request that gave none: its id mixed with the wall clock's nanoseconds.
fn unseeded(request: RequestId) -> u64 {
    #[allow(
        clippy::disallowed_methods,
        reason = "an unseeded request's seed comes from the wall clock"
    )]
    let now = std::time::SystemTime::now();
    let nanos = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.subsec_nanos());
    request.0.rotate_left(32) ^ u64::from(nanos)
}

fn unix_now() -> u64 {
    #[allow(
        clippy::disallowed_methods,
        reason = "`created` fields are wall-clock Unix seconds"
    )]
    let now = std::time::SystemTime::now();
    now.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}

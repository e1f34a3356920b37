//! `kvgate serve`: an OpenAI-compatible HTTP server (axum on tokio) in front of one engine.
//!
//! - `routes`: the endpoints, request admission (429 above the in-flight limit, 503 when the engine's
//!   queue is full or the server is shutting down), JSON answers;
//! - `api`: request bodies parsed and checked field by field; `error`: OpenAI-style error bodies;
//! - `text`: the real model's tokenizer and chat template, streaming detokenization, stop sequences;
//! - `sse`: an answer as it comes, framed as server-sent events; a client that goes away cancels its request;
//! - `engine_thread`: the engine on its own thread on the wall clock, fed by a bounded channel;
//! - `latency`: vLLM-shaped latency histograms (`kvgate_`-prefixed) beside the engine's metrics.
//!
//! Nothing in the API names a session: a multi-turn chat resends its history, and the prefix cache, the
//! checkpoint store and the policy's restore admission serve what they hold of it
//! (`usage.prompt_tokens_details.cached_tokens`).
#![allow(
    clippy::disallowed_methods,
    reason = "a server reads the wall clock for its latencies, keep-alives and deadlines; the engine's own \
              decisions still read only its clock (a WallClock here)"
)]

pub(crate) mod api;
pub mod client;
pub(crate) mod engine_thread;
pub mod error;
pub mod latency;
pub mod remote_agents;
pub(crate) mod routes;
pub(crate) mod sse;
pub mod text;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use engine::{ClockKind, Executor, Policy, ReferenceExecutor, SimExecutor};
use prometheus_client::registry::Registry;

pub use self::engine_thread::DrainReport;
use self::engine_thread::{Control, EngineFactory, EngineLoop, Submission};
use self::latency::ServeMetrics;
use self::routes::AppState;
use self::text::TextCodec;
use crate::builder::engine_builder;
use crate::config::EngineConfig;
use crate::error::{Error, Result};
use crate::model::{ModelExecutor, SamplingTable, VerifyTime};
use crate::prometheus::MetricFamilies;

/// The model name requests give and `/v1/models` lists unless told otherwise.
pub const MODEL_NAME: &str = "SmolLM2-135M-Instruct";

/// Which executor computes the answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecutorKind {
    /// The simulated executor: modeled step times, slept in real time; output tokens are the engine's
    /// deterministic ones, not a language model's.
    Sim,
    /// The reference model (a small seeded transformer) computing real KV into the pool's pages.
    Reference,
    /// The real model of the model file (SmolLM2-135M-Instruct): real text, greedy or seeded sampling, an
    /// answer ending at its end-of-turn token.
    Model,
}

impl ExecutorKind {
    /// Its name (`sim`, `reference`).
    pub fn name(self) -> &'static str {
        match self {
            ExecutorKind::Sim => "sim",
            ExecutorKind::Reference => "reference",
            ExecutorKind::Model => "model",
        }
    }
}

/// How the server runs, besides the engine's config.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Address to listen on (port 0 picks a free one).
    pub addr: String,
    /// The GGUF model file whose tokenizer and chat template the server speaks (and whose model answers,
    /// with `ExecutorKind::Model`).
    pub model_file: PathBuf,
    /// The model's name in requests and `/v1/models`.
    pub model_name: String,
    /// The executor.
    pub executor: ExecutorKind,
    /// The admission policy.
    pub policy: Policy,
    /// Requests in flight at most; more get 429.
    pub max_in_flight: usize,
    /// Requests queued for the engine thread at most; more get 503.
    pub queue_capacity: usize,
    /// Largest request body, in bytes; larger get 413.
    pub body_limit_bytes: usize,
    /// Output cap of a request that gives no `max_tokens`.
    pub default_max_tokens: u32,
    /// At shutdown, how long running requests may take to finish before they are cancelled.
    pub shutdown_grace: Duration,
    /// A stream sends a keep-alive comment after this long without a token.
    pub keepalive: Duration,
    /// Every restore copy completes this much later (fault tests; zero normally; `inline` copies only).
    pub copy_delay: Duration,
}

impl ServeOptions {
    /// The defaults, with the model file at `model_file`: 127.0.0.1:8000, the simulated executor under
    /// `reserved`, 256 requests in flight, a queue of 256, 4 MiB bodies, 256 output tokens by default, 30 s
    /// of grace at shutdown, a keep-alive each second.
    pub fn new(model_file: PathBuf) -> ServeOptions {
        ServeOptions {
            addr: "127.0.0.1:8000".into(),
            model_file,
            model_name: MODEL_NAME.into(),
            executor: ExecutorKind::Sim,
            policy: Policy::Reserved,
            max_in_flight: 256,
            queue_capacity: 256,
            body_limit_bytes: 4 << 20,
            default_max_tokens: 256,
            shutdown_grace: Duration::from_secs(30),
            keepalive: Duration::from_secs(1),
            copy_delay: Duration::ZERO,
        }
    }
}

/// A running server.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    state: Arc<AppState>,
    runtime: tokio::runtime::Runtime,
    stop_http: Option<tokio::sync::oneshot::Sender<()>>,
    http: tokio::task::JoinHandle<std::io::Result<()>>,
    engine: std::thread::JoinHandle<DrainReport>,
    shutdown_grace: Duration,
}

impl Server {
    /// Builds the engine from `config` on its own thread and starts serving. Errors: the model file, the
    /// engine's config, or the address.
    pub fn start(config: &EngineConfig, options: &ServeOptions) -> Result<Server> {
        let mut codec = TextCodec::from_model_file(&options.model_file)?;
        let mut registry = Registry::default();
        let engine_metrics = MetricFamilies::register(&mut registry).engine(options.policy.name());
        let metrics = ServeMetrics::register(&mut registry);
        let (submit_tx, submit_rx) =
            crossbeam::channel::bounded::<Submission>(options.queue_capacity.max(1));
        let (control_tx, control_rx) = crossbeam::channel::unbounded::<Control>();
        let (engine, max_model_len) = match options.executor {
            ExecutorKind::Sim => {
                let mut params = config.engine_params(options.policy)?;
                params.clock = ClockKind::Wall;
                let max_model_len = params.geometry.max_model_len();
                let config = config.clone();
                let factory: EngineFactory<SimExecutor> = Box::new(move || {
                    let executor = SimExecutor::new(params.cost.clone());
                    Ok(engine_builder(&config, params.clone(), executor, None)?.build()?)
                });
                let thread = spawn(
                    factory,
                    engine_metrics,
                    &metrics,
                    true,
                    options,
                    (submit_rx, control_rx),
                )?;
                (thread, max_model_len)
            }
            ExecutorKind::Reference => {
                crate::run::check_live_geometry(config)?;
                let params = crate::run::live_params(config, options.policy)?;
                let model = crate::run::reference_model(config);
                let max_model_len = params.geometry.max_model_len();
                let config = config.clone();
                let factory: EngineFactory<ReferenceExecutor> = Box::new(move || {
                    let executor = ReferenceExecutor::new(model)?;
                    Ok(engine_builder(&config, params.clone(), executor, None)?.build()?)
                });
                let thread = spawn(
                    factory,
                    engine_metrics,
                    &metrics,
                    false,
                    options,
                    (submit_rx, control_rx),
                )?;
                (thread, max_model_len)
            }
            ExecutorKind::Model => {
                let (thread, max_model_len, end_of_turn) = spawn_model(
                    config,
                    options,
                    engine_metrics,
                    &metrics,
                    (submit_rx, control_rx),
                )?;
                codec = codec.ending_at(end_of_turn);
                (thread, max_model_len)
            }
        };
        let state = Arc::new(AppState::new(
            codec,
            options.model_name.clone(),
            options.executor.name(),
            options.policy.name(),
            max_model_len,
            options.default_max_tokens,
            (submit_tx, control_tx),
            options.max_in_flight,
            options.keepalive,
            metrics,
            registry,
        ));
        Self::listen(state, engine, options)
    }

    fn listen(
        state: Arc<AppState>,
        engine: std::thread::JoinHandle<DrainReport>,
        options: &ServeOptions,
    ) -> Result<Server> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("kvgate-http")
            .enable_all()
            .build()
            .map_err(|e| Error::Serve(format!("cannot start the async runtime: {e}")))?;
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(&options.addr))
            .map_err(|e| {
                Error::Serve(format!(
                    "cannot listen on {}: {e}; give a free address",
                    options.addr
                ))
            })?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::Serve(format!("no local address: {e}")))?;
        let (stop_http, stopped) = tokio::sync::oneshot::channel::<()>();
        let app = routes::router(Arc::clone(&state), options.body_limit_bytes);
        let http = runtime.spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
        });
        Ok(Server {
            addr,
            state,
            runtime,
            stop_http: Some(stop_http),
            http,
            engine,
            shutdown_grace: options.shutdown_grace,
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until SIGTERM or SIGINT, then shuts down (`shutdown`).
    pub fn run_until_signal(self) -> Result<DrainReport> {
        self.runtime.block_on(async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .map_err(|e| Error::Serve(format!("cannot watch SIGTERM: {e}")))?;
            tokio::select! {
                _ = term.recv() => {},
                _ = tokio::signal::ctrl_c() => {},
            }
            Ok::<(), Error>(())
        })?;
        self.shutdown()
    }

    /// Graceful shutdown: new requests get 503, running ones have the grace time to finish and are then
    /// cancelled, copies in flight drain, the engine shuts down, open connections close.
    pub fn shutdown(mut self) -> Result<DrainReport> {
        self.state.draining.store(true, Ordering::Release);
        let _ = self.state.control.send(Control::Drain {
            grace: self.shutdown_grace,
        });
        let report = self
            .engine
            .join()
            .map_err(|_| Error::Serve("the engine thread panicked".into()))?;
        if let Some(stop) = self.stop_http.take() {
            let _ = stop.send(());
        }
        let http = self.http;
        let served = self
            .runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(10), http).await });
        self.runtime.shutdown_timeout(Duration::from_secs(1));
        match served {
            Ok(Ok(Ok(()))) | Err(_) => Ok(report),
            Ok(Ok(Err(e))) => Err(Error::Serve(format!("the HTTP server failed: {e}"))),
            Ok(Err(e)) => Err(Error::Serve(format!("the HTTP server task failed: {e}"))),
        }
    }
}

/// Starts the engine thread of the real model in `options.model_file`: its executor picks each request's
/// tokens as the shared sampling table says, and the engine ends an answer at the model's end-of-turn token.
/// Returns the thread, the longest context and that token. Errors: the model file, the engine's config.
fn spawn_model(
    config: &EngineConfig,
    options: &ServeOptions,
    engine_metrics: crate::prometheus::EngineMetrics,
    metrics: &ServeMetrics,
    channels: (
        crossbeam::channel::Receiver<Submission>,
        crossbeam::channel::Receiver<Control>,
    ),
) -> Result<(std::thread::JoinHandle<DrainReport>, u32, u32)> {
    let model = crate::model::LoadedModel::load(&options.model_file)?;
    let mut params = crate::run::model_params(config, &model, options.policy)?;
    let max_model_len = params.geometry.max_model_len();
    let end_of_turn = model.tokenizer.end_of_turn();
    // The engine ends an answer at the end of turn itself, leaving its response checkpoint (E2).
    params.stop_token = Some(end_of_turn);
    let sampling = SamplingTable::default();
    let table = sampling.clone();
    let config = config.clone();
    let factory: EngineFactory<ModelExecutor> = Box::new(move || {
        let executor = ModelExecutor::new(Arc::clone(&model), VerifyTime::default())
            .with_sampling(table.clone());
        Ok(engine_builder(&config, params.clone(), executor, None)?.build()?)
    });
    let metrics = metrics.clone();
    let copy_delay = options.copy_delay;
    let thread = engine_thread::spawn(
        move || {
            EngineLoop::new(factory, engine_metrics, metrics, false, copy_delay)
                .map(|engine| engine.for_model(sampling, end_of_turn))
        },
        channels.0,
        channels.1,
    )?;
    Ok((thread, max_model_len, end_of_turn))
}

/// Starts the engine thread around `factory`'s engine.
fn spawn<E: Executor + 'static>(
    factory: EngineFactory<E>,
    engine_metrics: crate::prometheus::EngineMetrics,
    metrics: &ServeMetrics,
    pace: bool,
    options: &ServeOptions,
    channels: (
        crossbeam::channel::Receiver<Submission>,
        crossbeam::channel::Receiver<Control>,
    ),
) -> Result<std::thread::JoinHandle<DrainReport>> {
    let metrics = metrics.clone();
    let copy_delay = options.copy_delay;
    engine_thread::spawn(
        move || EngineLoop::new(factory, engine_metrics, metrics, pace, copy_delay),
        channels.0,
        channels.1,
    )
}

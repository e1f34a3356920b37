//! The kvgate facade: `EngineConfig` (TOML, validated), the `EngineBuilder`, the workloads (`agents`, the
//! Mooncake trace), their drivers (one engine, or a cluster of engines sharing one store), reports,
//! scenarios, Prometheus metrics, and the `kvgate` binary. It re-exports the types an embedding server needs,
//! so a server depends on this crate alone; the layers below stay embeddable one by one. The `cli` feature (on
//! by default) adds what only the binaries need (argument parsing, the charts of `plot`, the allocator); a
//! server takes the library without it (`default-features = false`).
//!
//! Driving an engine from your own loop, as a server would: submit requests, step, collect what finished,
//! and submit the next turn of a session (its prompt extends the previous turn's, so its prefix is restored
//! from the checkpoint store, or found in the pool):
//!
//! ```
//! use std::time::Duration;
//!
//! use kvgate::{EngineBuilder, EngineConfig, Policy, Registry, RequestSpec, Timestamp};
//!
//! let mut config = EngineConfig::default();
//! config.pool.pages = 256;
//! let mut registry = Registry::default();
//! let (mut engine, mut metrics) = EngineBuilder::new(config)
//!     .policy(Policy::Reserved)
//!     .build_with_metrics(&mut registry)?;
//! let first_prompt: Vec<u32> = (0..1_000).map(|i| i % 30_000 + 1).collect();
//! engine.submit(RequestSpec::new(1, first_prompt.clone(), 16, Timestamp::ZERO))?;
//! while !engine.is_idle() {
//!     let report = engine.step()?;
//!     kvgate::run::Observer::step(&mut metrics, &engine, &report);
//!     for done in engine.take_finished() {
//!         if done.id.get() == 1 {
//!             // The next turn: the whole context so far and 50 new tokens, a second of think time later.
//!             let mut prompt = first_prompt.clone();
//!             prompt.extend(&done.output);
//!             prompt.extend(40_000..40_050);
//!             let arrival = engine.now().after(Duration::from_secs(1));
//!             engine.submit(RequestSpec::new(2, prompt, 16, arrival).later_turn())?;
//!         }
//!     }
//! }
//! let run = engine.metrics();
//! assert_eq!(run.later_turns, 1);
//! assert_eq!(run.leaked_pages, 0);
//! // The second turn's prompt came from the cache: found in the pool or restored, not recomputed.
//! assert!(run.prompt_tokens_local_hit + run.prompt_tokens_restored >= 1_000);
//! // What a `/metrics` endpoint serves (`prometheus::serve`, or any server with `prometheus::encode`).
//! let text = kvgate::prometheus::encode(&registry, kvgate::prometheus::Format::Classic)?;
//! assert!(text.contains("kvgate_prompt_tokens_total{policy=\"reserved\",source=\"recomputed\"}"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod builder;
pub mod cluster;
mod config;
mod error;
pub mod fidelity;
pub mod limits;
pub mod model;
#[cfg(feature = "cli")]
pub mod plot;
pub mod prometheus;
pub mod report;
pub mod run;
pub mod scenario;
#[cfg(feature = "cli")]
pub mod serve;
pub mod setup;
pub mod workload;

pub use builder::EngineBuilder;
pub use config::{
    EngineConfig, GroupConfig, MODEL_PRESETS, ModelConfig, PoolConfig, RestoreConfig,
    SchedulerConfig, StoreConfig,
};
pub use error::{Error, Result};
pub use prometheus_client::registry::Registry;

pub use checkpoint_transfer::{
    CheckpointStore, DiskStore, Error as TransferError, Fault, HostStore, RedisStore, SharedStore,
};
/// KV events in vLLM's format (`Engine::enable_kv_events`, `Engine::take_kv_events`).
pub use engine::{BlockRemoved, BlockStored, KvEvent};
pub use engine::{
    CostModel, Engine, EngineParams, Error as EngineError, Executor, FallbackReason,
    FinishedRequest, KeyedRequest, Policy, PromptSource, ReferenceExecutor, RejectReason,
    RequestMetrics, RequestPhase, RequestSpec, RequestView, RunMetrics, STOP_TOKEN, ShutdownReport,
    SimExecutor, StepReport, output_token,
};
pub use kv_pool::{
    BlockKey, CacheGroup, Error as PoolError, Geometry, GroupKind, PageId, RequestId, Timestamp,
};
/// The reference model's shape, to build the `ReferenceExecutor` above.
pub use reference_model::{LocalAttention, ReferenceConfig};

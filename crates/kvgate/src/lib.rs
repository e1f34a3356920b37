//! The kvgate facade: `EngineConfig` (TOML, validated), the `EngineBuilder`, the workloads (`agents`, the
//! Mooncake trace), their drivers (one engine, or a cluster of engines sharing one store), reports,
//! scenarios, and the `kvgate` binary. It re-exports the types an embedding server needs, so a server
//! depends on this crate alone; the layers below stay embeddable one by one.

mod builder;
pub mod cluster;
pub mod config;
mod error;
pub mod fidelity;
pub mod limits;
pub mod metrics;
pub mod model;
pub mod plot;
pub mod report;
pub mod run;
pub mod scenario;
pub mod workload;

pub use builder::EngineBuilder;
pub use config::{ConfigFile, EngineConfig};
pub use error::{Error, Result};

pub use checkpoint_transfer::{
    CheckpointStore, DiskStore, Fault, HostStore, RedisStore, SharedStore,
};
pub use engine::{
    CostModel, Engine, EngineParams, FallbackReason, FinishedRequest, KeyedRequest, Policy,
    PromptSource, RejectReason, RequestMetrics, RequestPhase, RequestSpec, RequestView, RunMetrics,
    STOP_TOKEN, StepReport, output_token,
};
pub use kv_pool::{BlockKey, CacheGroup, Geometry, GroupKind, PageId, RequestId, Timestamp};

//! The step loop, the restore coordinator, the `Executor` trait with the simulated executor, the three
//! policies (`ordinary`, `pages-only`, `reserved`) and the run metrics.

mod engine;
mod error;
mod executor;
mod kv_events;
mod metrics;
mod params;
mod policy;
mod request;

pub use engine::{
    Builder, Clock, Engine, RequestPhase, RequestView, RestoreGauges, ShutdownReport, SimClock,
    StepReport, WALL_IDLE_WAIT, WallClock,
};
pub use error::{Error, Result};
pub use executor::{
    CostModel, DecodeWork, Executor, MeasuredCost, PageOnRanks, PageTables, PageWrite, PrefillWork,
    RecomputedPages, ReferenceExecutor, SimExecutor, StepBatch, StepOutput, page_content,
};
pub use kv_events::{BlockRemoved, BlockStored, KvEvent};
pub use metrics::{FallbackReason, RejectReason, RequestMetrics, RunMetrics};
pub use params::{
    ClockKind, CopyEngineKind, EngineParams, LOOKUP_LATENCY_DEFAULT, Preemption,
    STATE_SNAPSHOT_PAGES_DEFAULT,
};
pub use policy::Policy;
pub use request::{
    FinishedRequest, KeyedRequest, PromptSource, RequestSpec, STOP_TOKEN, Segments, output_token,
};

#[cfg(test)]
mod tests;

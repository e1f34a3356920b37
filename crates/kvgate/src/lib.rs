//! The kvgate facade: `EngineConfig`, the `Engine` builder, workloads, reports and the `kvgate` binary.

pub mod workload;

//! The workspace's end-to-end tests: scenario traces and a small agents run as insta snapshots, the cluster
//! replay through the binary, and the `kvgate` binary's answers to bad input (a few by hand, and the corpus
//! under `tests/bad_inputs/`), and what a new user runs first (`newcomer`: the README's figures, printed
//! configs, metrics, warm stores). Every run verifies every restored page against recompute (E3, L5), in release
//! builds too: configs start from [`verified_config`], and runs of the binary pass `--verify`.
#![allow(
    clippy::disallowed_methods,
    reason = "end-to-end tests time the binary and set its environment"
)]

mod agents;
mod bad_inputs;
mod cli;
mod cluster;
mod incidents;
mod model;
mod newcomer;
mod presets;
mod redis;
mod scenarios;
mod serve;

use serde_json::Value;

/// `EngineConfig::default()` with restore verification on (L5): the default verifies only in debug builds.
fn verified_config() -> kvgate::EngineConfig {
    let mut config = kvgate::EngineConfig::default();
    config.restore.verify = true;
    config
}

/// The `kvgate` binary: `$KVGATE_EXE` where these tests run away from the target directory they were built
/// in (the GPU bundle of `cargo xtask gpu --bundle`), else cargo's build of it.
fn kvgate_exe() -> std::ffi::OsString {
    std::env::var_os("KVGATE_EXE").unwrap_or_else(|| env!("CARGO_BIN_EXE_kvgate").into())
}

/// The repository root (this binary is built from `crates/kvgate`).
fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `value` without its wall-clock fields, which are the only non-deterministic part of a trace.
fn without_wall_time(mut value: Value) -> Value {
    fn strip(value: &mut Value) {
        match value {
            Value::Object(map) => {
                map.remove("wall_seconds");
                map.values_mut().for_each(strip);
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut value);
    value
}

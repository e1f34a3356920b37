//! The engine's integration tests: contract behaviours through the public API (Q4-Q7, X1, X2, G1-G5,
//! E1-E3), restores of a longer checkpoint's matching blocks (G2, O7, E3), the deterministic simulation under
//! every policy, the agents comparison of the policies, what a decode step with drafts yields (H5, H7), and
//! the engine on CUDA page storage (skipped, saying
//! why, without a driver). Every engine these tests build verifies every restored page against recompute
//! (E3, L5), in release builds too: parameters start from [`verified_defaults`].
#![allow(
    clippy::disallowed_methods,
    reason = "tests read their seeds and case counts from the environment"
)]

mod admission;
mod agents;
mod contract;
mod credits;
mod cuda;
mod drafts;
mod hybrid;
mod kv_events;
mod live;
mod live_presets;
mod offload;
mod prefix;
mod restart;
mod reuse;
mod robustness;
mod sim;
mod store_thread;

/// `EngineParams::default()` with restore verification on (L5): every engine these tests build checks every
/// restored page byte for byte against recompute, in release builds too (the default verifies only in
/// debug builds).
pub(crate) fn verified_defaults() -> engine::EngineParams {
    engine::EngineParams {
        verify_restores: true,
        ..engine::EngineParams::default()
    }
}

/// Steps `engine` until a step fails and returns that error; the engine going idle first fails the test,
/// saying `what` went unnoticed.
pub(crate) fn first_error<E: engine::Executor>(
    engine: &mut engine::Engine<E>,
    what: &str,
) -> engine::Error {
    loop {
        match engine.step() {
            Ok(_) => assert!(!engine.is_idle(), "{what} went unnoticed"),
            Err(error) => return error,
        }
    }
}

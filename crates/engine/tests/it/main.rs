//! The engine's integration tests: contract behaviours through the public API (Q4-Q7, X1, X2, G1-G5,
//! E1-E3), restores of a longer checkpoint's matching blocks (G2, O7, E3), the deterministic simulation under
//! every policy, and the agents comparison of the policies.
#![allow(
    clippy::disallowed_methods,
    reason = "tests read their seeds and case counts from the environment"
)]

mod admission;
mod agents;
mod contract;
mod credits;
mod hybrid;
mod live;
mod offload;
mod prefix;
mod restart;
mod reuse;
mod robustness;
mod sim;

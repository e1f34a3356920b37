//! Crate-level tests: the credit behaviours C1-C6 driven through a simulated consumer, and the property
//! tests over random ledger operation sequences.

mod credits;
mod props;

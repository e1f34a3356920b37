//! The kv-pool integration test binary: property tests of the public `PagePool` API against a reference
//! model.
#![allow(clippy::disallowed_methods, reason = "tests read PROPTEST_CASES")]

mod pool_model;

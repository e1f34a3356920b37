//! The kv-pool integration test binary: property tests of the public `PagePool` API against a reference
//! model.

mod pool_model;

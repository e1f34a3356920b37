//! The one error type of kv-pool. Misuse (null page, double free, out-of-range id, bad geometry) is an error
//! that names the value, never corruption.

/// Result of kv-pool operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in kv-pool.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    // --- pool and prefix index (pool.rs, prefix.rs) ---

    // --- geometry (geometry.rs) ---

    // --- page storage (storage/) ---
}

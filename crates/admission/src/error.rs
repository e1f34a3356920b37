//! The one error type of admission: misuse of the waiting queue. Pressure, impossible and invalid restore
//! answers are `Decision`s and `BlockReason`s of a step, not errors.

use kv_pool::RequestId;

/// Result of admission operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in admission.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// `push` of a request already waiting.
    #[error("{request} is already in the waiting queue")]
    AlreadyQueued {
        /// The request.
        request: RequestId,
    },
    /// An operation on a request that is not waiting.
    #[error("{request} is not in the waiting queue")]
    NotQueued {
        /// The request.
        request: RequestId,
    },
}

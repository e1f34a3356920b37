//! The one error type of the engine. Invalid input and operations the state forbids are errors that name the
//! value; pressure is never an error here (requests wait), and bugs are debug assertions.

use reservation::RequestId;

/// Result of engine operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong when driving the engine.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A parameter is out of its allowed range.
    #[error("invalid engine parameter {name}: {reason}")]
    InvalidParam {
        /// The parameter.
        name: &'static str,
        /// Why it is invalid and what is allowed.
        reason: String,
    },
    /// The geometry has a cache group the simulated step loop does not model yet.
    #[error("unsupported geometry: {reason}")]
    UnsupportedGeometry {
        /// What is unsupported.
        reason: String,
    },
    /// No policy has this name.
    #[error("unknown policy {name:?}: expected ordinary, pages-only, reserved or oracle")]
    UnknownPolicy {
        /// The name given.
        name: String,
    },
    /// A request with this id is still live.
    #[error("request {id} is already live: ids may be reused only after the request finished")]
    DuplicateRequest {
        /// The id.
        id: RequestId,
    },
    /// The request's prompt is empty.
    #[error("request {id} has an empty prompt")]
    EmptyPrompt {
        /// The id.
        id: RequestId,
    },
    /// The request can never fit: its prompt plus output exceeds the model length or the whole pool.
    #[error("request {id} needs {tokens} tokens, more than the limit of {limit}")]
    RequestTooLong {
        /// The id.
        id: RequestId,
        /// Tokens it needs.
        tokens: u64,
        /// The limit.
        limit: u64,
    },
    /// No live request has this id.
    #[error("no live request {id}")]
    UnknownRequest {
        /// The id.
        id: RequestId,
    },
    /// The request is not a paused streaming session.
    #[error("request {id} is not a paused streaming session")]
    NotPaused {
        /// The id.
        id: RequestId,
    },
    /// A non-forced prefix-cache reset found imports staged or owned (X2).
    #[error("prefix-cache reset refused: {n_imports} import(s) staged or owned; retry or force it")]
    ResetRefusedImports {
        /// Imports staged or owned.
        n_imports: usize,
    },
    /// A non-forced prefix-cache reset found pages in use by running requests.
    #[error("prefix-cache reset refused: {n_pages} page(s) in use by requests; retry or force it")]
    ResetRefusedPagesInUse {
        /// Pages in use.
        n_pages: u32,
    },
    /// The page pool failed (a bug if it happens while driving the engine correctly).
    #[error(transparent)]
    Pool(#[from] kv_pool::Error),
    /// The checkpoint store or transfer layer failed.
    #[error(transparent)]
    Transfer(#[from] checkpoint_transfer::Error),
}

//! The one error type of the engine. Invalid input and operations the state forbids are errors that name the
//! value; pressure is never an error here (requests wait), and bugs are debug assertions.

use kv_pool::RequestId;

use crate::metrics::RejectReason;

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
    #[error("request {request} is already live: ids may be reused only after the request finished")]
    DuplicateRequest {
        /// The request.
        request: RequestId,
    },
    /// The request's prompt is empty.
    #[error("request {request} has an empty prompt")]
    EmptyPrompt {
        /// The request.
        request: RequestId,
    },
    /// The request can never run (K1): its prompt plus output exceeds the model length or the whole pool.
    /// It is rejected alone and counted in `RunMetrics::rejected_requests`; the engine goes on.
    #[error(
        "request {request} rejected ({reason}): it needs {tokens} tokens, more than the limit of {limit}"
    )]
    Rejected {
        /// The request.
        request: RequestId,
        /// Why it can never run.
        reason: RejectReason,
        /// Tokens it needs.
        tokens: u64,
        /// The limit.
        limit: u64,
    },
    /// No live request has this id.
    #[error("no live request {request}")]
    UnknownRequest {
        /// The request.
        request: RequestId,
    },
    /// The request is not a paused streaming session.
    #[error("request {request} is not a paused streaming session")]
    NotPaused {
        /// The request.
        request: RequestId,
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
    /// No live request produced a token or ended for `stalled_s` seconds of engine time or `steps` steps
    /// (K3: the liveness watchdog, `EngineParams::stall_timeout`). Names every stuck request and where it is.
    #[error(
        "no progress for {stalled_s:.1} s of engine time and {steps} steps; stuck requests: {requests}"
    )]
    Stalled {
        /// Engine seconds since the last progress.
        stalled_s: f64,
        /// Steps since the last progress.
        steps: u64,
        /// The stuck requests with their phase, restore state and store lookups.
        requests: String,
    },
    /// A restored page differs from what recomputing its prefix writes (E3, L5): the run stops.
    #[error(
        "restored block {block} of {request} (page {page:?} on rank {rank}) differs from recompute at byte {byte}: a corrupt restore"
    )]
    RestoreMismatch {
        /// The request.
        request: RequestId,
        /// Block index in the request's prompt.
        block: u32,
        /// The context-parallel rank whose copy of the page differs.
        rank: u32,
        /// The pool page.
        page: kv_pool::PageId,
        /// Offset of the first differing byte in the page.
        byte: usize,
    },
    /// The engine found its own state inconsistent (a bug in kvgate, K2): names the broken invariant. The
    /// engine must not be stepped again; drop it.
    #[error("internal error (a bug in kvgate, please report it): {invariant}")]
    Internal {
        /// The broken invariant.
        invariant: String,
    },
    /// The page pool failed (a bug if it happens while driving the engine correctly).
    #[error(transparent)]
    Pool(#[from] kv_pool::Error),
    /// The checkpoint store or transfer layer failed.
    #[error(transparent)]
    Transfer(#[from] checkpoint_transfer::Error),
    /// The reference model refused its configuration or a batch, or failed to read or write its pages (L3).
    /// The source is the model's own error (`reference_model::ModelError`), boxed: the engine's error does
    /// not name a model crate's types, so another model's executor reports through the same variant.
    #[error("reference executor: {0}")]
    Model(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl Error {
    /// An internal-inconsistency error naming `invariant`.
    pub(crate) fn internal(invariant: impl Into<String>) -> Error {
        Error::Internal {
            invariant: invariant.into(),
        }
    }
}

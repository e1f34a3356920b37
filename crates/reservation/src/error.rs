//! The one error type of the ledger. Its variants fall in four kinds callers branch on (`Error::kind`):
//! pressure (wait: nothing changed), impossible (never fits the empty pool: recompute at once), expired (the
//! bounded wait is over: recompute) and invalid (the input names a problem: nothing changed).

use std::time::Duration;

use crate::ledger::TicketState;
use kv_pool::RequestId;

/// Result of ledger operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which of the four answers an error is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Temporary pressure: nothing changed; a restore is remembered as a capacity waiter.
    Pressure,
    /// The need exceeds the whole usable pool: the pool is untouched, no waiter; recompute at once.
    Impossible,
    /// The bounded wait is over: refused even when space exists; recompute.
    Expired,
    /// Invalid input or misuse: names the problem, nothing changed.
    Invalid,
}

/// Everything the ledger can refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A consistency check (`check_invariants`) found the state broken: a bug, never the caller's input.
    #[error("invariant broken: {0}")]
    InvariantBroken(#[from] kv_pool::InvariantBroken),
    // --- pressure ---
    /// Not enough free pages or running slots now, after credits, in-flight prefills, the watermark and the
    /// space of earlier capacity waiters.
    #[error(
        "pressure: need {need_pages} pages and 1 running slot, {available_pages} pages and {free_slots} slots available"
    )]
    Pressure {
        /// Pages asked for.
        need_pages: u32,
        /// Pages available to this request.
        available_pages: u32,
        /// Running slots available to this request.
        free_slots: u32,
    },

    // --- impossible ---
    /// The need exceeds the whole usable pool (null page excluded): waiting cannot help.
    #[error(
        "impossible: need {need_pages} pages but the whole pool has {usable_pages} usable pages; recompute"
    )]
    Impossible {
        /// Pages asked for.
        need_pages: u32,
        /// Usable pages of the pool.
        usable_pages: u32,
    },

    // --- expired ---
    /// The restore waited past `restore_max_wait`; it must recompute.
    #[error("restore of {request} gave up after waiting {:.1} s for capacity; recompute", waited.as_secs_f64())]
    Expired {
        /// The request.
        request: RequestId,
        /// How long it waited since its first refusal.
        waited: Duration,
    },

    // --- invalid ---
    /// A restore of zero tokens or a prompt of zero tokens.
    #[error("invalid restore: zero tokens (boundary {boundary_tokens}, prompt {prompt_tokens})")]
    ZeroTokens {
        /// The checkpoint boundary.
        boundary_tokens: u32,
        /// The prompt length.
        prompt_tokens: u32,
    },
    /// The checkpoint boundary lies past the request's prompt.
    #[error(
        "invalid restore: boundary {boundary_tokens} is past the prompt's {prompt_tokens} tokens"
    )]
    BoundaryPastPrompt {
        /// The checkpoint boundary.
        boundary_tokens: u32,
        /// The prompt length.
        prompt_tokens: u32,
    },
    /// The draft prefix is longer than the checkpoint boundary.
    #[error(
        "invalid restore: draft prefix {draft_prefix_tokens} is longer than the boundary {boundary_tokens}"
    )]
    DraftPrefixPastBoundary {
        /// The checkpoint's draft prefix length.
        draft_prefix_tokens: u32,
        /// The checkpoint boundary.
        boundary_tokens: u32,
    },
    /// The prompt is longer than the model accepts.
    #[error(
        "invalid restore: prompt of {prompt_tokens} tokens exceeds max_model_len {max_model_len}"
    )]
    PromptPastModelLen {
        /// The prompt length.
        prompt_tokens: u32,
        /// The model's maximum length.
        max_model_len: u32,
    },
    /// A prefill chunk of zero tokens.
    #[error("invalid restore: prefill chunk of 0 tokens")]
    ZeroChunk,
    /// A checkpoint written on zero ranks.
    #[error("invalid restore: the checkpoint has 0 ranks")]
    ZeroRanks,
    /// The checkpoint's rank count differs from the pool's context-parallel factor.
    #[error("invalid restore: the checkpoint has {ranks} ranks, the pool {pool_ranks}")]
    RanksMismatch {
        /// Ranks of the checkpoint.
        ranks: u32,
        /// Context-parallel ranks of the pool.
        pool_ranks: u32,
    },
    /// The checkpoint's page width differs from the pool's.
    #[error(
        "invalid restore: the checkpoint has {tokens_per_page} tokens per page, the pool {pool_tokens_per_page}"
    )]
    PageWidthMismatch {
        /// Tokens per page of the checkpoint.
        tokens_per_page: u32,
        /// Tokens per page of the pool.
        pool_tokens_per_page: u32,
    },
    /// The checkpoint's cache groups differ from the pool's.
    #[error(
        "invalid restore: the checkpoint has {n_groups} cache groups, the pool {pool_n_groups}"
    )]
    GroupsMismatch {
        /// Cache groups of the checkpoint.
        n_groups: u32,
        /// Cache groups of the pool.
        pool_n_groups: u32,
    },
    /// The request already holds a ticket (its checkpoint id is in use).
    #[error("invalid restore: {request} already holds a ticket")]
    TicketExists {
        /// The request.
        request: RequestId,
    },
    /// An operation on a request that holds no ticket.
    #[error("{request} holds no ticket")]
    NoTicket {
        /// The request.
        request: RequestId,
    },
    /// An operation that needs the ticket in another state.
    #[error("{request}'s ticket is {state:?}, the operation needs {expected:?}")]
    WrongTicketState {
        /// The request.
        request: RequestId,
        /// The ticket's state.
        state: TicketState,
        /// The state the operation needs.
        expected: TicketState,
    },
    /// The consumer frees more window pages than it holds from its ticket's credits.
    #[error("{request} frees {n_pages} window pages but holds {held_pages} from its credits")]
    WindowFreeExceedsHeld {
        /// The request.
        request: RequestId,
        /// Pages it said it freed.
        n_pages: u32,
        /// Pages it holds from its credits.
        held_pages: u32,
    },
    /// The pool refused an operation (a bug in the caller's page accounting).
    #[error("page pool: {0}")]
    Pool(#[from] kv_pool::Error),
}

impl Error {
    /// Which of the four answers this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Pressure { .. } => ErrorKind::Pressure,
            Error::Impossible { .. } => ErrorKind::Impossible,
            Error::Expired { .. } => ErrorKind::Expired,
            // Listed one by one, so that a new variant must be classified here.
            Error::ZeroTokens { .. }
            | Error::BoundaryPastPrompt { .. }
            | Error::DraftPrefixPastBoundary { .. }
            | Error::PromptPastModelLen { .. }
            | Error::ZeroChunk
            | Error::ZeroRanks
            | Error::RanksMismatch { .. }
            | Error::PageWidthMismatch { .. }
            | Error::GroupsMismatch { .. }
            | Error::TicketExists { .. }
            | Error::NoTicket { .. }
            | Error::WrongTicketState { .. }
            | Error::WindowFreeExceedsHeld { .. }
            | Error::InvariantBroken(_)
            | Error::Pool(_) => ErrorKind::Invalid,
        }
    }
}

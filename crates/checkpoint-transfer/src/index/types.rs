//! The vocabulary of the resident index: import ids and states, the stage request, the events `poll`
//! reports, what an acquisition hands the consumer, and the bounded retry budget of a failed restore (O7).

use std::sync::Arc;

use kv_pool::PageId;
use kv_pool::RequestId;

use crate::checkpoint::{Checkpoint, CheckpointMeta};

/// Most store lookups one restore makes (the first plus retries of shorter checkpoints) before recomputing.
pub const RESTORE_LOOKUPS_MAX: u32 = 4;

/// Identifies one import for its whole life; never reused, so a request that reuses an id never inherits
/// an older import's state (O5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ImportId(pub(crate) u64);

/// Where an import is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ImportState {
    /// Copying; not a cache hit (O1).
    Staged,
    /// Every rank acknowledged; its blocks are prefix hits, still owned by the import (O3).
    Published,
    /// Cancelled while copying; its pages stay pinned until the copies drain (O5).
    Cancelled,
    /// A rank's copy failed; discarded once the other ranks drain (O7).
    Failed,
}

impl ImportState {
    /// Lower-case name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            ImportState::Staged => "staged",
            ImportState::Published => "published",
            ImportState::Cancelled => "cancelled",
            ImportState::Failed => "failed",
        }
    }
}

/// Input of `ResidentIndex::stage`.
#[derive(Clone, Copy, Debug)]
pub struct StageRequest<'a> {
    /// The consumer.
    pub request: RequestId,
    /// The consumer's prompt length in tokens.
    pub request_tokens: usize,
    /// The checkpoint to restore (from a store's `get`).
    pub checkpoint: &'a Checkpoint,
    /// Pool pages the import builds on (for example a local prefix the consumer already holds); each must
    /// be owned (ref count above zero) now and at publication.
    pub dependency_pages: &'a [PageId],
}

/// Something that happened to an import, reported by `poll`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImportEvent {
    /// A rank finished copying.
    Acknowledged {
        /// The consumer.
        request: RequestId,
        /// The import.
        import: ImportId,
        /// The rank.
        rank: u32,
    },
    /// The last rank acknowledged: the import's blocks are prefix hits, owned until acquired (O2, O3).
    Published {
        /// The consumer.
        request: RequestId,
        /// The import.
        import: ImportId,
        /// Tokens it restores.
        n_tokens: usize,
    },
    /// Publication refused: a destination page was invalidated mid-copy or a dependency page was lost. Its
    /// pages are released; the restore looks up again (O2).
    Invalidated {
        /// The consumer.
        request: RequestId,
        /// The import.
        import: ImportId,
        /// The invalidated page.
        page: PageId,
    },
    /// A rank's copy failed; the other ranks drained and the pages are released. Retry a shorter
    /// checkpoint (within `RESTORE_LOOKUPS_MAX` lookups) or recompute (O7).
    Failed {
        /// The consumer.
        request: RequestId,
        /// The import.
        import: ImportId,
        /// The failing rank.
        rank: u32,
        /// Why.
        reason: String,
        /// Tokens the failed checkpoint covered: a retry asks for a shorter one.
        n_tokens: usize,
    },
    /// A cancelled import's copies drained; its pages are free (O5).
    Drained {
        /// The request it was for (the id may already serve a new request).
        request: RequestId,
        /// The import.
        import: ImportId,
    },
}

/// What a consumer gets from `ResidentIndex::acquire`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcquiredImport {
    /// The import.
    pub import: ImportId,
    /// Its checkpoint.
    pub meta: Arc<CheckpointMeta>,
    /// One page per checkpoint page, in checkpoint order, each holding one reference owned by the consumer.
    pub pages: Vec<PageId>,
    /// Of those, the pages found through the prefix-hit path (keyed blocks).
    pub n_hit_pages: usize,
}

/// What `ResidentIndex::cancel` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelOutcome {
    /// Cancelled while copying: its pages stay pinned until `n_jobs` copies drain (`ImportEvent::Drained`).
    Draining {
        /// The import.
        import: ImportId,
        /// Copies still to drain.
        n_jobs: usize,
    },
    /// A ready import: ownership released at once, its pages are evictable cached pages (O6).
    Released {
        /// The import.
        import: ImportId,
        /// Pages released.
        n_pages: usize,
    },
}

/// Counts the store lookups of one restore (O7): the first lookup and at most `RESTORE_LOOKUPS_MAX - 1`
/// retries of shorter checkpoints, then recompute.
#[cfg(test)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LookupBudget {
    n_used: u32,
}

#[cfg(test)]
impl LookupBudget {
    /// A budget with no lookup used.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Takes one lookup; `false` (taking nothing) when all are used: recompute.
    pub(crate) fn try_take(&mut self) -> bool {
        if self.n_used >= RESTORE_LOOKUPS_MAX {
            return false;
        }
        self.n_used += 1;
        true
    }

    /// Lookups used.
    pub(crate) fn n_used(&self) -> u32 {
        self.n_used
    }
}

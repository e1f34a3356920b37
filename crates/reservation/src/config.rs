//! The ledger's configuration (running-slot limit, bounded restore wait) and the `Preflight` context a caller
//! passes to each reservation. The ledger reads no environment: the facade applies
//! `KVGATE_RESTORE_MAX_WAIT_S` to the engine's configuration.

use std::time::Duration;

/// Limits of the ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LedgerConfig {
    /// Most requests running at once (admitted requests and tickets together).
    pub max_running_slots: u32,
    /// Longest a restore waits for capacity from its first refusal (W1); zero means recompute at once.
    pub restore_max_wait: Duration,
}

impl LedgerConfig {
    /// The default bounded wait: 60 s.
    pub(crate) const DEFAULT_RESTORE_MAX_WAIT: Duration = Duration::from_secs(60);
    /// A config with `max_running_slots` and the default 60 s wait.
    pub fn new(max_running_slots: u32) -> LedgerConfig {
        LedgerConfig {
            max_running_slots,
            restore_max_wait: Self::DEFAULT_RESTORE_MAX_WAIT,
        }
    }
}

/// What else competes for the pool and the running slots this step (contract R2). The ledger adds the credits
/// of other tickets and the space of earlier capacity waiters itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Preflight {
    /// Requests running (admitted), not counting tickets that still hold their own slot.
    pub running_requests: u32,
    /// Remaining page needs of in-flight prefills that hold no ticket (cold admissions).
    pub unticketed_prefill_pages: u32,
    /// The admission watermark in pages.
    pub watermark_pages: u32,
    /// Whether other work is scheduled this step; the watermark applies only then.
    pub other_work_scheduled: bool,
}

impl Preflight {
    /// Pages of the watermark that apply: `watermark_pages` while other work is scheduled, else 0.
    pub(crate) fn applied_watermark_pages(&self) -> u32 {
        if self.other_work_scheduled {
            self.watermark_pages
        } else {
            0
        }
    }
}
